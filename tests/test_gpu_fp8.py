"""GPU: grouped FP8 quantize (current / delayed scaling), every byte against the reference."""

import itertools

import pytest
import torch

import cutequant
from cutequant import reference
from cutequant.testing import grouped_input, poisoned_outputs, random_splits

pytestmark = pytest.mark.gpu

IN = [torch.bfloat16, torch.float16, torch.float32]
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


@pytest.fixture(params=[True, False], ids=["fused", "two_launches"])
def fused_current(request, monkeypatch):
    """Current scaling of 16-bit inputs with both outputs, both ways (fp8.FUSED_CURRENT): the
    fused cast (one launch: amax tiles, then cast tiles waiting for their group's amax) and the
    amax pass + tile cast."""
    from cutequant import fp8

    monkeypatch.setattr(fp8, "FUSED_CURRENT", request.param)
    return request.param


def _same_f32(got, ref):
    got, ref = got.float().cpu().reshape(-1), ref.float().cpu().reshape(-1)
    nan = torch.isnan(ref)
    return torch.equal(torch.isnan(got), nan) and torch.equal(
        got[~nan].view(torch.int32), ref[~nan].view(torch.int32)
    )


def check_fp8(x, splits, *, device_splits=None, **opts):
    opts.setdefault("fp8_dtype", torch.float8_e4m3fn)
    with poisoned_outputs():
        res = cutequant.fp8_group_quantize(
            x, device_splits if device_splits is not None else splits, **opts
        )
    torch.cuda.synchronize()
    ref = reference.fp8_group_quantize(x, splits, **opts)
    for g, (got, want) in enumerate(zip(res.groups(), ref, strict=True)):
        for key in ("scale", "scale_inv", "amax"):
            assert _same_f32(got[key], want[key]), (g, key, got[key], want[key])
        for key in ("row_data", "col_data"):
            if key not in want:
                assert getattr(res, key) is None
                continue
            a = got[key].view(torch.uint8).reshape(-1)
            b = want[key].view(torch.uint8).reshape(-1).to(a.device)
            bad = (a != b).nonzero()
            assert len(bad) == 0, (
                f"group {g} ({splits[g]} rows) {key}: {len(bad)} bytes differ; first at "
                f"{int(bad[0])}: got {int(a[bad[0]])} ref {int(b[bad[0]])}"
            )
    return res


@pytest.mark.usefixtures("fused_current")
@pytest.mark.parametrize("in_dtype,fp8_dtype", list(itertools.product(IN, FP8)))
@pytest.mark.parametrize("scaling", ["current", "delayed"])
@pytest.mark.parametrize("dirs", [(True, True), (True, False), (False, True)])
def test_every_variant(in_dtype, fp8_dtype, scaling, dirs, rng):
    splits = random_splits(8, None, rng, zero_at=("front", "end"), mean_rows=160)
    x = grouped_input(splits, 272, rng).to(in_dtype)
    opts = dict(fp8_dtype=fp8_dtype, scaling=scaling, rowwise=dirs[0], columnwise=dirs[1])
    if scaling == "delayed":
        opts["scale"] = torch.rand(8, generator=rng).cuda() * 100 + 0.5
    check_fp8(x, splits, **opts)


@pytest.mark.usefixtures("fused_current")
@pytest.mark.parametrize("groups", [1, 8, 65, 300])
def test_group_counts(groups, rng):
    splits = random_splits(groups, None, rng, zero_at=("middle",))
    x = grouped_input(splits, 1024, rng)
    check_fp8(x, splits)
    dev = torch.tensor(splits, dtype=torch.int32, device="cuda")
    check_fp8(x, splits, device_splits=dev, fp8_dtype=torch.float8_e5m2)


@pytest.mark.usefixtures("fused_current")
def test_dense_and_all_empty(rng):
    x = grouped_input([8192], 5120, rng)
    check_fp8(x, [8192])
    check_fp8(grouped_input([0, 0, 0], 256, rng), [0, 0, 0])


@pytest.mark.usefixtures("fused_current")
def test_scale_options_and_special_values(rng):
    splits = [64, 32, 0, 96]
    x = grouped_input(splits, 256, rng).float()
    x[5, 3] = float("inf")
    x[70, 9] = float("nan")
    x[100, 0] = -float("inf")
    x[96:128] = 0.0  # a group whose amax is 0 -> scale 1
    x[130, 7] = 1e30
    for pow2 in (False, True):
        for eps in (0.0, 1e-3, 1e4):
            check_fp8(x, splits, amax_epsilon=eps, force_pow2_scales=pow2)
            check_fp8(
                x, splits, fp8_dtype=torch.float8_e5m2, amax_epsilon=eps, force_pow2_scales=pow2
            )
    check_fp8(x, splits, scaling="delayed", scale=torch.tensor([1.0, 1e-30, 3.0, 1e30]).cuda())


@pytest.mark.usefixtures("fused_current")
def test_dequantize_round_trip(rng):
    splits = [64, 0, 128]
    x = grouped_input(splits, 512, rng)
    res = cutequant.fp8_group_quantize(x, splits)
    for columnwise in (False, True):
        y = cutequant.fp8_group_dequantize(res, columnwise=columnwise, out_dtype=torch.float32)
        rel = (y - x.float()).norm() / x.float().norm()
        assert rel < 0.05, rel


@pytest.mark.parametrize("band", [1, 3])
def test_walk_bands(band, monkeypatch, rng):
    """Other tile-walk band heights (default: see TilePlan) cover every tile exactly once:
    groups of many 64-row tiles, not multiples of the band, a partial last tile, empty groups."""
    from cutequant import fp8
    from cutequant.testing import with_plan

    monkeypatch.setattr(fp8, "TILE_CAST", False)  # the TMA-ring kernel's plans
    monkeypatch.setattr(fp8, "_spec", with_plan(fp8._spec, walk_band=band))
    splits = [0, 1008, 64, 0, 448, 16, 2000]
    x = grouped_input(splits, 528, rng)
    check_fp8(x, splits, scaling="delayed", scale=torch.rand(7, generator=rng).cuda() + 0.5)
    check_fp8(x, splits, rowwise=False)


@pytest.mark.parametrize("chunk,ctas", [(1, 5), (3, 7), (4, 6)])
def test_round_robin_chunks(chunk, ctas, monkeypatch, rng):
    """Round-robin tile chunks (TilePlan.chunk) on a small grid, so that there are many full
    rounds and a balanced tail (285 tiles on 6 CTAs x 4: 11 rounds, 21 tiles left -> 4, 4, 4,
    4, 4, 1): every tile is written exactly once, including shifted transposed rows
    (M_g % 32 == 16) whose runs now end at every chunk."""
    from cutequant import _launch, fp8
    from cutequant.testing import with_plan

    monkeypatch.setattr(fp8, "TILE_CAST", False)  # the TMA-ring kernel's plans
    monkeypatch.setattr(fp8, "_spec", with_plan(fp8._spec, chunk=chunk))
    monkeypatch.setattr(_launch, "grid_size", lambda spec, device: ctas)
    splits = [0, 1008, 64, 0, 448, 16, 2000]
    x = grouped_input(splits, 528, rng)
    check_fp8(x, splits, scaling="delayed", scale=torch.rand(7, generator=rng).cuda() + 0.5)
    check_fp8(x, splits)
    check_fp8(x, splits, rowwise=False)
    check_fp8(x, splits, columnwise=False)
    # one group
    x = grouped_input([2000], 528, rng)
    check_fp8(x, [2000])
    check_fp8(x, [2000], columnwise=False, scaling="delayed", scale=torch.ones(1, device="cuda"))


@pytest.mark.parametrize("in_dtype", [torch.bfloat16, torch.float16])
def test_tma_ring_kernel_for_16_bit_inputs(in_dtype, monkeypatch, rng):
    """The persistent TMA-ring cast (f32 inputs, and 16-bit ones with TILE_CAST off) against
    the reference: both scalings, every output set, 65 uneven groups with empty ones."""
    from cutequant import fp8

    monkeypatch.setattr(fp8, "TILE_CAST", False)
    splits = random_splits(65, None, rng, zero_at=("front", "middle", "end"), mean_rows=96)
    x = grouped_input(splits, 400, rng).to(in_dtype)
    scale = torch.rand(65, generator=rng).cuda() + 0.5
    check_fp8(x, splits)
    check_fp8(x, splits, scaling="delayed", scale=scale)
    check_fp8(x, splits, rowwise=False)
    check_fp8(x, splits, columnwise=False, scaling="delayed", scale=scale)


@pytest.mark.usefixtures("fused_current")
@pytest.mark.parametrize("in_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n_cols", [272, 384])
def test_tile_cast_shifted_rows(in_dtype, n_cols, rng):
    """The one-CTA-per-tile cast (16-bit inputs, both outputs) stores the odd transposed rows
    of groups with M_g % 32 == 16 16 tokens back, reading the previous tile's last 16 tokens
    again: groups of 1 to 32 tiles with last tiles of 16 and 48 tokens, aligned neighbours,
    empty groups, a partial column tile (272 columns); both scalings."""
    splits = [16, 48, 0, 80, 112, 144, 208, 64, 1040, 128, 656, 0, 2000, 32]
    x = grouped_input(splits, n_cols, rng).to(in_dtype)
    scale = torch.rand(len(splits), generator=rng).cuda() * 10 + 0.5
    check_fp8(x, splits)
    check_fp8(x, splits, fp8_dtype=torch.float8_e5m2, scaling="delayed", scale=scale)
    dev = torch.tensor(splits, dtype=torch.int64, device="cuda")
    check_fp8(x, splits, device_splits=dev, scaling="delayed", scale=scale)


@pytest.mark.usefixtures("fused_current")
@pytest.mark.parametrize("tile_cols", [64, 128, 256])
def test_tile_cast_widths(tile_cols, monkeypatch, rng):
    """Every tile width the tile cast's spec allows (the runtime picks 256 columns with delayed
    scaling, 128 with current): partial column tiles (N = 400), shifted rows, empty groups, host
    and device splits, both scalings."""
    import dataclasses

    from cutequant import fp8

    orig = fp8._tile_spec
    monkeypatch.setattr(
        fp8, "_tile_spec", lambda *a: dataclasses.replace(orig(*a), tile_cols=tile_cols)
    )
    splits = [0, 1008, 48, 0, 464, 16, 2000]
    x = grouped_input(splits, 400, rng)
    scale = torch.rand(len(splits), generator=rng).cuda() + 0.5
    check_fp8(x, splits)
    check_fp8(x, splits, scaling="delayed", scale=scale)
    dev = torch.tensor(splits, device="cuda")
    check_fp8(x, splits, device_splits=dev, scaling="delayed", scale=scale)


def test_delayed_amax_back_to_back_calls(rng):
    """The delayed tile cast folds each group's amax in per-stream workspace words that every
    launch leaves zero (kernels/group_fold.py): calls queued back to back with no sync, with 3,
    300 (the workspace grows), 3 and 1 groups and inputs of very different magnitudes, each
    report their own input's amax; the last call's data is checked byte for byte."""
    runs = []
    for groups, factor in ((3, 1e3), (300, 1.0), (3, 1e-3), (1, 7.0)):
        splits = random_splits(groups, None, rng, mean_rows=96)
        x = grouped_input(splits, 384, rng) * factor
        scale = torch.rand(groups, generator=rng).cuda() + 0.5
        res = cutequant.fp8_group_quantize(x, splits, scaling="delayed", scale=scale)
        runs.append((x, splits, scale, res))
    torch.cuda.synchronize()
    for x, splits, scale, res in runs:
        ref = reference.fp8_group_quantize(
            x, splits, fp8_dtype=torch.float8_e4m3fn, scaling="delayed", scale=scale
        )
        for g, want in enumerate(ref):
            assert _same_f32(res.amax[g], want["amax"]), (len(splits), g)
    check_fp8(x, splits, scaling="delayed", scale=scale)


def test_delayed_amax_in_cuda_graph_follows_new_data(rng):
    """Delayed scaling records amax inside the cast kernel, which zeroes it at its head: replays
    of a captured call on new data (larger, then smaller) report each new input's amax."""
    splits = [128, 0, 320, 64]
    scale = torch.rand(4, generator=rng).cuda() + 0.5
    static_x = grouped_input(splits, 256, rng)
    opts = dict(fp8_dtype=torch.float8_e4m3fn, scaling="delayed", scale=scale)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        cutequant.fp8_group_quantize(static_x, splits, **opts)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        res = cutequant.fp8_group_quantize(static_x, splits, **opts)
    for factor in (1000.0, 1.0, 0.001):
        x = grouped_input(splits, 256, rng) * factor
        static_x.copy_(x)
        res.amax.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = reference.fp8_group_quantize(
            x, splits, fp8_dtype=torch.float8_e4m3fn, scaling="delayed", scale=scale
        )
        for g, want in enumerate(ref):
            assert _same_f32(res.amax[g], want["amax"]), (factor, g, res.amax[g], want["amax"])


@pytest.mark.usefixtures("fused_current")
def test_current_special_values_16_bit(rng):
    """inf, NaN, an all-zero group and huge values in bf16 / f16 input with every scale option
    (the fused cast computes the amax and TE's scale itself)."""
    splits = [64, 32, 0, 96, 16]
    x = grouped_input(splits, 256, rng)
    x[5, 3] = float("inf")
    x[70, 9] = float("nan")
    x[100, 0] = -float("inf")
    x[96:128] = 0.0  # a group whose amax is 0 -> scale 1
    x[130, 7] = 3e4
    for dtype in (torch.bfloat16, torch.float16):
        for pow2 in (False, True):
            for eps in (0.0, 1e-3, 1e4):
                check_fp8(x.to(dtype), splits, amax_epsilon=eps, force_pow2_scales=pow2)
        check_fp8(x.to(dtype), splits, fp8_dtype=torch.float8_e5m2)


def _check_amax_and_data(res, x, splits, fp8_dtype=torch.float8_e4m3fn):
    """``res`` (a call already issued, maybe long ago) against the reference: amax, scale,
    scale_inv and both data outputs of every group, bit for bit."""
    ref = reference.fp8_group_quantize(x, splits, fp8_dtype=fp8_dtype)
    for g, want in enumerate(ref):
        got = res.group(g)
        for key in ("amax", "scale", "scale_inv"):
            assert _same_f32(got[key], want[key]), (len(splits), g, key, got[key], want[key])
        if splits[g]:
            for key in ("row_data", "col_data"):
                a = got[key].view(torch.uint8).cpu()
                assert torch.equal(a, want[key].view(torch.uint8).cpu()), (len(splits), g, key)


@pytest.mark.usefixtures("fused_current")
@pytest.mark.parametrize("n_cols", [400, 128])
def test_300_groups_empty_front_middle_end(n_cols, rng):
    """300 uneven groups with zero-token groups at the front, in the middle and at the end
    (their amax 0 and scale 1 come from the tileless-group threads, the others' from cast
    tiles), shifted rows, partial column tiles; host and device splits, both fp8 formats and
    input dtypes."""
    splits = random_splits(300, None, rng, zero_at=("front", "middle", "end"), mean_rows=48)
    x = grouped_input(splits, n_cols, rng)
    check_fp8(x, splits)
    dev = torch.tensor(splits, dtype=torch.int64, device="cuda")
    check_fp8(x.half(), splits, device_splits=dev, fp8_dtype=torch.float8_e5m2)
    check_fp8(x, splits, device_splits=dev.int())


@pytest.mark.usefixtures("fused_current")
def test_bad_device_splits_poison_current_scaling():
    """Device splits that do not sum to the rows: no tiles at all, amax stays the runtime's NaN
    poison (scale from it: 1), and the layout check reports it; good splits right after on the
    same stream are exact (nothing of the bad call is left in the workspace)."""
    x = torch.randn(128, 256, device="cuda").to(torch.bfloat16)
    bad = torch.tensor([64, 48], dtype=torch.int32, device="cuda")  # sums to 112, not 128
    res = cutequant.fp8_group_quantize(x, bad)
    torch.cuda.synchronize()
    assert torch.isnan(res.amax).all()
    assert torch.equal(res.scale.cpu(), torch.ones(2))
    with pytest.raises(ValueError, match="device-side check failed"):
        res._layout.check()
    check_fp8(x, [64, 64], device_splits=torch.tensor([64, 64], device="cuda"))


@pytest.mark.usefixtures("fused_current")
def test_current_back_to_back_one_stream(rng):
    """Calls queued back to back on one stream with no sync: 3, 300 (the workspace grows), 3 and
    1 groups, inputs of very different magnitudes, device and host splits; each reports its own
    input's amax and data (every launch leaves its ticket, reads and group words zero)."""
    runs = []
    for groups, factor, on_device in ((3, 1e3, False), (300, 1.0, True), (3, 1e-3, False),
                                      (1, 7.0, True), (3, 1e3, False)):  # fmt: skip
        splits = random_splits(groups, None, rng, mean_rows=96)
        x = grouped_input(splits, 384, rng) * factor
        arg = torch.tensor(splits, device="cuda") if on_device else splits
        runs.append((x, splits, cutequant.fp8_group_quantize(x, arg)))
    torch.cuda.synchronize()
    for x, splits, res in runs:
        _check_amax_and_data(res, x, splits)


@pytest.mark.usefixtures("fused_current")
def test_current_two_streams(rng):
    """Calls on two streams at once (each stream has its own workspace words), several rounds
    with no sync in between, different group counts per stream."""
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    inputs = []
    for groups in (7, 300):
        splits = random_splits(groups, None, rng, zero_at=("middle",), mean_rows=64)
        inputs.append((splits, grouped_input(splits, 256, rng)))
    torch.cuda.synchronize()
    runs = []
    for rnd in range(4):
        for stream, (splits, x) in zip(streams, inputs, strict=True):
            with torch.cuda.stream(stream):
                xs = x * (10.0 ** (rnd - 2))
                runs.append((xs, splits, cutequant.fp8_group_quantize(xs, splits)))
    torch.cuda.synchronize()
    for xs, splits, res in runs:
        _check_amax_and_data(res, xs, splits)


@pytest.mark.usefixtures("fused_current")
@pytest.mark.parametrize("device_splits", [False, True])
def test_current_cuda_graph_replayed(device_splits, rng):
    """A captured call replayed 3 times on new data (larger, smaller, with a NaN): every replay
    reports its own input's amax, scales and data (the workspace words reset within each
    launch, so a replay finds zeros)."""
    splits = [128, 0, 320, 64, 16]
    static_x = grouped_input(splits, 256, rng)
    arg = torch.tensor(splits, device="cuda") if device_splits else splits
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        cutequant.fp8_group_quantize(static_x, arg)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        res = cutequant.fp8_group_quantize(static_x, arg)
    for factor in (1000.0, 0.001, 1.0):
        x = grouped_input(splits, 256, rng) * factor
        if factor == 1.0:
            x[200, 5] = float("nan")
        static_x.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        _check_amax_and_data(res, x, splits)


@pytest.mark.usefixtures("fused_current")
def test_current_nan_inf_inputs(rng):
    """NaN and +-inf in several groups (one group all NaN, one with only an inf), bf16 / f16,
    both formats: amax NaN / inf exactly as the amax pass reports them, scale 1."""
    splits = [64, 128, 32, 0, 64]
    x = grouped_input(splits, 512, rng)
    x[3, 100] = float("nan")
    x[64:192, 7] = float("inf")
    x[192:224] = float("nan")
    x[230, 511] = -float("inf")
    for dtype in (torch.bfloat16, torch.float16):
        for fp8_dtype in FP8:
            check_fp8(x.to(dtype), splits, fp8_dtype=fp8_dtype)
