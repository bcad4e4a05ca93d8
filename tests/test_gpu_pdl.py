"""GPU: back-to-back calls on one stream, as programmatic dependent launch (PDL) runs them.

No synchronization between the calls. Each kernel may start while the one before it finishes,
so it must see everything earlier kernels wrote (its input, rewritten by a torch op right
before; the amax pass's output; the device-splits tables that every call rebuilds in the
runtime's per-stream workspace) and must write nothing that an earlier kernel still reads (the
next call's table kernel overwrites the tables the previous cast kernel walks)."""

import pytest
import torch

import cutequant
from cutequant import reference
from cutequant.testing import grouped_input, random_splits

pytestmark = pytest.mark.gpu
E4M3 = torch.float8_e4m3fn


def _bits_equal(got, want) -> bool:
    got = got.cpu().reshape(-1).view(torch.uint8)
    want = want.cpu().reshape(-1).view(torch.uint8)
    return torch.equal(got, want)


@pytest.mark.parametrize("split_kind", ["device", "host"])
def test_back_to_back_calls_see_each_others_results(rng, split_kind):
    """Device splits: every call rebuilds the tables. Host splits: the cached tables let each
    kernel's producer find its first tile before waiting (``EARLY_TABLES``), but x, rewritten
    right before the call, must still be read after the wait; rounds 4-6 reuse the cached
    tables of rounds 1-3, so no host synchronization separates them."""
    n_cols = 256
    rounds = []
    buf = torch.empty(16384 * n_cols, dtype=torch.bfloat16, device="cuda")
    host_lists = [
        random_splits(9 + 5 * i, None, rng, zero_at=(("front",), ("middle",), ("end",))[i])
        for i in range(3)
    ]
    scale = torch.full((64,), 0.75, device="cuda")
    for i in range(6):
        if split_kind == "device":
            splits = random_splits(
                5 + 7 * i, None, rng, zero_at=(("front",), ("middle",), ("end",))[i % 3]
            )
            call_splits = torch.tensor(splits, dtype=torch.int64, device="cuda")
        else:
            splits = call_splits = host_lists[i % 3]
        src = grouped_input(splits, n_cols, rng)
        x = buf[: src.numel()].view(src.shape)
        x.copy_(src)  # the input buffer is rewritten right before every round
        amax_row, amax_col = cutequant.group_amax(x, call_splits)
        amax = torch.stack((amax_row, amax_col))
        nvfp4 = cutequant.nvfp4_group_quantize(x, call_splits, amax=amax)
        fp8 = cutequant.fp8_group_quantize(x, call_splits, scaling="current", fp8_dtype=E4M3)
        delayed = cutequant.fp8_group_quantize(
            x, call_splits, scaling="delayed", scale=scale[: len(splits)], fp8_dtype=E4M3
        )
        rounds.append((splits, src, amax, nvfp4, fp8, delayed))
    torch.cuda.synchronize()
    for i, (splits, src, amax, nvfp4, fp8, delayed) in enumerate(rounds):
        ref_row, ref_col = reference.group_amax(src, splits)
        assert _bits_equal(amax[0], ref_row) and _bits_equal(amax[1], ref_col), i
        want = reference.nvfp4_group_quantize(src, splits, amax=amax)
        for g, (got, w) in enumerate(zip(nvfp4.groups(), want, strict=True)):
            for key in ("row_data", "row_scales", "col_data", "col_scales"):
                assert _bits_equal(got[key], w[key]), (i, g, key)
        want = reference.fp8_group_quantize(src, splits, scaling="current", fp8_dtype=E4M3)
        for g, (got, w) in enumerate(zip(fp8.groups(), want, strict=True)):
            for key in ("row_data", "col_data", "scale", "scale_inv", "amax"):
                assert _bits_equal(got[key], w[key]), (i, g, key)
        want = reference.fp8_group_quantize(
            src, splits, scaling="delayed", scale=scale[: len(splits)], fp8_dtype=E4M3
        )
        for g, (got, w) in enumerate(zip(delayed.groups(), want, strict=True)):
            for key in ("row_data", "col_data", "scale_inv", "amax"):
                assert _bits_equal(got[key], w[key]), (i, g, key)


def test_results_keep_their_own_splits_and_status(rng):
    """With device splits a result reads its split sizes (and the device-side validity) lazily;
    calls made in between build their own tables, which it must not see."""
    n_cols = 128
    first = random_splits(9, None, rng, zero_at=("middle",))
    x1 = grouped_input(first, n_cols, rng)
    res1 = cutequant.fp8_group_quantize(
        x1, torch.tensor(first, device="cuda"), scaling="current", fp8_dtype=E4M3
    )
    bad = torch.tensor([16, 24], device="cuda")  # 24 is not a multiple of 16
    x_bad = torch.zeros(40, n_cols, dtype=torch.bfloat16, device="cuda")
    res_bad = cutequant.nvfp4_group_quantize(x_bad, bad)
    second = random_splits(3, None, rng)
    x2 = grouped_input(second, n_cols, rng)
    res2 = cutequant.nvfp4_group_quantize(x2, torch.tensor(second, device="cuda"))
    assert res1.splits == tuple(first)
    assert res2.splits == tuple(second)
    with pytest.raises(ValueError, match="splits"):
        res_bad.splits  # noqa: B018
    want = reference.fp8_group_quantize(x1, first, scaling="current", fp8_dtype=E4M3)
    for g, (got, w) in enumerate(zip(res1.groups(), want, strict=True)):
        assert _bits_equal(got["row_data"], w["row_data"]), g


def test_chained_calls_replayed_in_a_cuda_graph(rng):
    """Graph capture turns the launches' programmatic dependencies into graph edges; the cast
    kernels' early loads of x (after their call's amax pass) must see each replay's new input."""
    n_cols = 256
    splits = random_splits(6, None, rng, zero_at=("middle",))
    x = grouped_input(splits, n_cols, rng)

    def calls():
        fp8 = cutequant.fp8_group_quantize(x, splits, scaling="current", fp8_dtype=E4M3)
        return fp8, cutequant.nvfp4_group_quantize(x, splits)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        calls()  # compile and warm up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fp8, nvfp4 = calls()
    for _ in range(3):
        src = grouped_input(splits, n_cols, rng)
        x.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        want = reference.fp8_group_quantize(src, splits, scaling="current", fp8_dtype=E4M3)
        for g, (got, w) in enumerate(zip(fp8.groups(), want, strict=True)):
            for key in ("row_data", "col_data", "scale", "amax"):
                assert _bits_equal(got[key], w[key]), (g, key)
        want = reference.nvfp4_group_quantize(src, splits)
        for g, (got, w) in enumerate(zip(nvfp4.groups(), want, strict=True)):
            for key in ("row_data", "row_scales", "col_data", "col_scales", "amax_row", "amax_col"):
                assert _bits_equal(got[key], w[key]), (g, key)
