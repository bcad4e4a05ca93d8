"""GPU: grouped (RHT) amax kernel, bit-exact against cutequant.reference on fresh data. Every
test runs with the arch's RHT instruction (wgmma on sm_90a) and with mma.sync (conftest
``rht_mma``; tests parametrized rht=False once)."""

import pytest
import torch

import cutequant
from cutequant import jit, reference
from cutequant.testing import grouped_input, poisoned_outputs, random_splits

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("rht_mma")]

CASES = [
    # (N, groups, zero-token groups at, rows or None)
    (16, 1, (), 64),
    (2048, 8, ("front",), 4096),
    (5120, 8, ("middle",), 8192),
    (7168, 8, ("end",), 2048),
    (2048, 64, ("front", "middle", "end"), None),
    (272, 64, (), None),
    (128, 300, ("front", "end"), None),
    (5120, 300, ("middle",), None),
    (4096, 4, ("all",), None),
    (2048, 1, (), 16),
]


def _same(got, ref):
    """Bit-identical, except that any NaN matches any NaN."""
    got, ref = got.float().cpu(), ref.float().cpu()
    nan = torch.isnan(ref)
    return torch.equal(torch.isnan(got), nan) and torch.equal(
        got[~nan].view(torch.int32), ref[~nan].view(torch.int32)
    )


def _check(x, splits, rht, sign_mask=0xD7E8, device_splits=None):
    with poisoned_outputs():  # the kernel must zero amax itself
        got_row, got_col = cutequant.group_amax(
            x, device_splits if device_splits is not None else splits, rht=rht, sign_mask=sign_mask
        )
    ref_row, ref_col = reference.group_amax(x, splits, rht=rht, sign_mask=sign_mask)
    torch.cuda.synchronize()
    assert _same(got_row, ref_row), (got_row, ref_row)
    assert _same(got_col, ref_col), (got_col, ref_col)
    for g, s in enumerate(splits):
        if s == 0:
            assert got_row[g].item() == 0 and got_col[g].item() == 0


@pytest.mark.parametrize("n_cols,groups,zero_at,rows", CASES)
@pytest.mark.parametrize("rht", [True, False])
def test_group_amax_matches_reference(n_cols, groups, zero_at, rows, rht, rng):
    splits = random_splits(groups, rows, rng, zero_at=zero_at)
    x = grouped_input(splits, n_cols, rng)
    _check(x, splits, rht)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_group_amax_device_splits(dtype, rng):
    splits = random_splits(64, None, rng, zero_at=("front", "middle", "end"))
    x = grouped_input(splits, 1024, rng)
    _check(x, splits, True, device_splits=torch.tensor(splits, dtype=dtype, device="cuda"))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("num_groups", [1, 33, 300, 600])
def test_device_splits_tables_built_by_the_amax_pass(dtype, num_groups, rng, monkeypatch):
    """Device splits: up to groups.DEFERRED_TABLES_MAX_GROUPS the amax pass builds the tables
    itself (one launch: every CTA scans the splits), above it the table kernel runs first; both
    give the reference's bits and the snapshot (row starts, status) the result's views use."""
    from cutequant import _launch, groups

    zero_at = ("front", "middle", "end") if num_groups >= 3 else ()  # x keeps rows
    splits = random_splits(num_groups, None, rng, zero_at=zero_at)
    x = grouped_input(splits, 256, rng)
    assert x.shape[0] > 0  # without rows no amax pass runs (the table kernel checks the splits)
    dev = torch.tensor(splits, dtype=dtype, device="cuda")
    families = []
    real_run = _launch.run

    def counting_run(spec, *args, stream):
        families.append(spec.family)
        return real_run(spec, *args, stream=stream)

    monkeypatch.setattr(_launch, "run", counting_run)
    for rht in (True, False):
        families.clear()
        _check(x, splits, rht, device_splits=dev)
        deferred = num_groups <= groups.DEFERRED_TABLES_MAX_GROUPS
        assert families == (["group_amax"] if deferred else ["group_tables", "group_amax"])
    families.clear()
    q = cutequant.nvfp4_group_quantize(x, dev)
    assert families == (["group_amax", "nvfp4_quantize"] if deferred else
                        ["group_tables", "group_amax", "nvfp4_quantize"])  # fmt: skip
    assert q.splits == tuple(splits)  # the snapshot, written by CTA 0 of the amax pass


def test_group_amax_sign_mask_and_16_row_groups(rng):
    splits = [16, 48, 0, 80, 16, 32]
    x = grouped_input(splits, 384, rng)
    for mask in (0, 0xD7E8, 0xFFFF, 0x1234):
        _check(x, splits, True, sign_mask=mask)


def test_group_amax_special_values(rng):
    splits = [64, 64, 64, 64, 64]
    x = grouped_input(splits, 256, rng)
    bf16_max = torch.finfo(torch.bfloat16).max
    x[0:64] = bf16_max * torch.sign(x[0:64].float()).to(torch.bfloat16)  # all +-bf16 max
    x[64:128] = 0.0  # all zeros
    x[128 + 5, 7] = float("inf")
    x[192 + 9, 100] = float("nan")
    x[256:320] = -0.0
    _check(x, splits, True)
    _check(x, splits, False)


def test_bad_device_splits_poison_amax(rng):
    x = grouped_input([64, 64], 256, rng)
    bad = torch.tensor([64, 48], dtype=torch.int32, device="cuda")  # sums to 112, not 128
    row, col = cutequant.group_amax(x, bad)
    assert torch.isnan(row).all() and torch.isnan(col).all()


def test_one_compile_for_any_splits_and_rows(rng):
    jit.clear_memory_cache()
    before = jit.stats.compiles + jit.stats.disk_loads
    for m_groups in ([64, 0, 128], [16] * 40, [1024, 2048]):
        x = grouped_input(m_groups, 512, rng)
        cutequant.group_amax(x, m_groups)
    torch.cuda.synchronize()
    assert jit.stats.compiles + jit.stats.disk_loads - before == 1


def test_no_stale_maxima_between_calls(rng):
    """A large-amax call followed by small-amax calls on the same stream must not leak the first
    call's maxima (the accumulators start from zero every call)."""
    splits = [256, 0, 512, 64]
    big = grouped_input(splits, 1024, rng) * 1000
    small = grouped_input(splits, 1024, rng)
    for x in (big, small, big[:320], small[:320]):
        s = splits if x.shape[0] == 832 else [256, 0, 64, 0]
        _check(x, s, rht=True)
        _check(x, s, rht=False)
    for g in (300, 1):  # more groups than the workspace had, then fewer
        s = [16] * g
        _check(grouped_input(s, 128, rng), s, rht=True)


def test_kernel_zeroes_its_poisoned_outputs_and_counts_launches(rng):
    """The amax kernel zeroes its outputs at its head (kernels/launch_zeroing.py): garbage in
    the output buffer must not survive, and the runtime's launch counter advances by one launch
    (``num_ctas`` tickets) per call, on a fresh stream as well as in a CUDA graph."""
    from cutequant import _checks, _launch, amax, groups

    splits = random_splits(8, 4096, rng, zero_at=("middle",))
    x = grouped_input(splits, 1024, rng)
    ref_row, ref_col = reference.group_amax(x, splits, rht=True)
    layout = groups.prepare_groups(splits, x.shape[0], x.device)
    arch = _checks.check_device(x)
    stream = torch.cuda.Stream()
    num_ctas = _launch.sm_count(x.device)
    counter = groups.launch_counter(x.device, stream, num_ctas)
    out = torch.empty(2, len(splits), device="cuda")
    with torch.cuda.stream(stream):
        for k, poison in enumerate((float("nan"), 3.0e38, -1.0)):
            out.fill_(poison)
            amax.launch_group_amax(x, layout, out, rht=True, sign_mask=0xD7E8, arch=arch)
            stream.synchronize()
            assert _same(out[0], ref_row) and _same(out[1], ref_col), (k, out)
            assert counter.tolist() == [(k + 1) * num_ctas, k + 1]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            amax.launch_group_amax(x, layout, out, rht=True, sign_mask=0xD7E8, arch=arch)
    for replay in range(3):
        out.fill_(float("inf"))
        graph.replay()
        torch.cuda.synchronize()
        assert _same(out[0], ref_row) and _same(out[1], ref_col), (replay, out)


@pytest.mark.parametrize("rht", [False, True])
@pytest.mark.parametrize("band", ["whole_group", 3])
@pytest.mark.parametrize("resident", [1, 2, 5])
def test_l2_handoff_shifted_walk_covers_every_tile(rht, band, resident, rng, monkeypatch):
    """An amax pass that hands L2 to the following cast kernel shifts every CTA's tile range
    back (cyclically) and wraps past the last tile (kernels/schedule.py): every tile must still
    be read exactly by one CTA, for host and device splits, zero-token groups at the front,
    middle and end (the wrap skips them) and ranges that wrap inside a group or at its end."""
    from cutequant import _checks, amax, groups
    from cutequant.codegen.specs import WHOLE_GROUP_BAND

    monkeypatch.setattr(amax, "l2_resident", lambda *args: resident)
    monkeypatch.setattr(amax, "_LAUNCH_FACTS", {})  # cached residents of earlier tests
    walk_band = WHOLE_GROUP_BAND if band == "whole_group" else band
    for n_cols, n_groups, rows, zero_at in (
        (1024, 1, 4096, ()),
        (640, 64, None, ("front", "middle", "end")),
        (2048, 8, 2048, ("front", "end")),
    ):
        splits = random_splits(n_groups, rows, rng, zero_at=zero_at)
        x = grouped_input(splits, n_cols, rng)
        ref_row, ref_col = reference.group_amax(x, splits, rht=rht)
        arch = _checks.check_device(x)
        for dev_splits in (False, True):
            s = torch.tensor(splits, device="cuda") if dev_splits else splits
            layout = groups.prepare_groups(s, x.shape[0], x.device)
            out = torch.full((2, len(splits)), float("nan"), device="cuda")
            amax.launch_group_amax(
                x, layout, out, rht=rht, sign_mask=0xD7E8, arch=arch, cast_walk_band=walk_band
            )
            torch.cuda.synchronize()
            assert _same(out[0], ref_row), (n_groups, dev_splits, out[0], ref_row)
            assert _same(out[1], ref_col), (n_groups, dev_splits, out[1], ref_col)
