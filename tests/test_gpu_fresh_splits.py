"""GPU: host split lists seen for the first time get tables of the call's own, copied
asynchronously from pinned memory (groups._per_call_layout); from the second call on they are
cached. Results must be bit-exact either way, also when many new lists are queued back to back
behind busy GPU work (the pinned staging blocks must not be reused before their copies ran) and
inside a CUDA-graph capture (which must not use the per-call copy)."""

import pytest
import torch
from test_gpu_fp8 import check_fp8
from test_gpu_nvfp4 import check_quantize

import cutequant
from cutequant import groups, reference
from cutequant.testing import grouped_input, poisoned_outputs, random_splits

pytestmark = pytest.mark.gpu

N_COLS = 256


def _fresh_lists(rng, count: int, rows: int) -> list[list[int]]:
    """``count`` distinct split lists of ``rows`` rows never seen by this process (a random
    group count up to 40, a zero-token group in some)."""
    out = []
    while len(out) < count:
        g = int(torch.randint(1, 40, (1,), generator=rng))
        zero_at = ("middle",) if g > 2 and len(out) % 3 == 0 else ()
        s = random_splits(g, rows, rng, zero_at=zero_at)
        key = (tuple(s), rows, torch.cuda.current_device())
        if key not in groups._SEEN and key not in groups._HOST_CACHE and s not in out:
            out.append(s)
    return out


def _same_f32(got, ref) -> bool:
    got, ref = got.float().cpu().reshape(-1), ref.float().cpu().reshape(-1)
    nan = torch.isnan(ref)
    return torch.equal(torch.isnan(got), nan) and torch.equal(
        got[~nan].view(torch.int32), ref[~nan].view(torch.int32)
    )


def _same_bytes(got, ref) -> bool:
    return torch.equal(
        got.view(torch.uint8).reshape(-1).cpu(), ref.view(torch.uint8).reshape(-1).cpu()
    )


def _check_nvfp4(res, x, splits):
    ref = reference.nvfp4_group_quantize(x, splits)
    assert res.splits == tuple(splits)
    for g, (got, want) in enumerate(zip(res.groups(), ref, strict=True)):
        for key in ("amax_row", "amax_col"):
            assert _same_f32(got[key], want[key]), (g, key)
        for key in ("row_data", "row_scales", "col_data", "col_scales"):
            assert _same_bytes(got[key], want[key]), (g, key)


def _check_fp8(res, x, splits):
    ref = reference.fp8_group_quantize(x, splits, fp8_dtype=torch.float8_e4m3fn)
    for g, (got, want) in enumerate(zip(res.groups(), ref, strict=True)):
        for key in ("scale", "scale_inv", "amax"):
            assert _same_f32(got[key], want[key]), (g, key)
        for key in ("row_data", "col_data"):
            assert _same_bytes(got[key], want[key]), (g, key)


def test_new_split_lists_queued_back_to_back(rng):
    """Twelve calls of each op, every one with a split list never seen before, queued without
    synchronization behind ~50 ms of GPU work: every result is bit-exact."""
    rows = 1024
    lists = _fresh_lists(rng, 36, rows)
    x = grouped_input([rows], N_COLS, rng)
    torch.cuda.synchronize()
    results = []
    with poisoned_outputs():
        torch.cuda._sleep(100_000_000)
        for k, splits in enumerate(lists):
            if k % 3 == 0:
                results.append(("amax", splits, cutequant.group_amax(x, splits)))
            elif k % 3 == 1:
                results.append(("nvfp4", splits, cutequant.nvfp4_group_quantize(x, splits)))
            else:
                res = cutequant.fp8_group_quantize(x, splits, fp8_dtype=torch.float8_e4m3fn)
                results.append(("fp8", splits, res))
    torch.cuda.synchronize()
    for kind, splits, res in results:
        if kind == "amax":
            want = reference.group_amax(x, splits, rht=True)
            assert _same_f32(res[0], want[0]) and _same_f32(res[1], want[1]), splits
        elif kind == "nvfp4":
            _check_nvfp4(res, x, splits)
        else:
            _check_fp8(res, x, splits)


def test_first_call_uses_its_own_tables_then_the_cache(rng):
    """First call: per-call tables (the layout is not cached, tables read after the PDL wait);
    second: cached; third: the same cached layout. All three bit-exact, for NVFP4 and for FP8
    (whose tile cast also stages per-tile records)."""
    (splits,) = _fresh_lists(rng, 1, 2048)
    x = grouped_input(splits, N_COLS, rng)
    layouts = [check_quantize(x, splits)._layout for _ in range(3)]
    assert layouts[0].per_call_tables and layouts[0].early_level() == 0
    assert not layouts[1].per_call_tables and layouts[1].early_level() > 0
    assert layouts[2] is layouts[1]
    (splits,) = _fresh_lists(rng, 1, 2048)
    x = grouped_input(splits, N_COLS, rng)
    layouts = [check_fp8(x, splits)._layout for _ in range(3)]
    assert layouts[0].per_call_tables and not layouts[1].per_call_tables


def test_new_split_list_inside_a_cuda_graph(rng):
    """A split list first seen while a CUDA graph is captured takes the cached path (a
    captured copy of a pinned block would replay stale bytes): replays stay bit-exact."""
    (splits,) = _fresh_lists(rng, 1, 1024)
    x = grouped_input(splits, N_COLS, rng)
    cutequant.group_amax(x, [1024])  # compile outside the capture
    out = {}
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out["amax"] = cutequant.group_amax(x, splits)
    want = reference.group_amax(x, splits, rht=True)
    for _ in range(3):
        out["amax"][0].fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert _same_f32(out["amax"][0], want[0]) and _same_f32(out["amax"][1], want[1])
