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


@pytest.mark.parametrize("groups", [1, 8, 65, 300])
def test_group_counts(groups, rng):
    splits = random_splits(groups, None, rng, zero_at=("middle",))
    x = grouped_input(splits, 1024, rng)
    check_fp8(x, splits)
    dev = torch.tensor(splits, dtype=torch.int32, device="cuda")
    check_fp8(x, splits, device_splits=dev, fp8_dtype=torch.float8_e5m2)


def test_dense_and_all_empty(rng):
    x = grouped_input([8192], 5120, rng)
    check_fp8(x, [8192])
    check_fp8(grouped_input([0, 0, 0], 256, rng), [0, 0, 0])


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
