"""One benchmark harness for every cutequant kernel.

Timing: each measured call is captured ``CALLS_PER_GRAPH`` times into a CUDA graph; the graph is
replayed ``REPLAYS`` times, each replay timed with CUDA events, and the median replay divided by
``CALLS_PER_GRAPH`` is the time per call (host launch overhead excluded; it is reported
separately as ``host_us``). Inputs rotate over two buffers so the 50-60 MB L2 never holds a
whole input. Bandwidth = bytes the op must move (counted per op below) / time, compared with
the device-to-device copy bandwidth measured in the same run (bytes read + written).

    python perf/bench.py [--ops amax,...] [--json out.json] [--plot out.png]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import torch

CALLS_PER_GRAPH = 10
REPLAYS = 30


@dataclass
class Result:
    op: str
    case: str
    us: float
    gbps: float
    pct_copy: float
    host_us: float
    bytes: int
    host_ref_us: float = 0.0  # torch's own two-kernel op in the same run (``host_reference``)


def graph_time_us(fn, calls: int = CALLS_PER_GRAPH, replays: int = REPLAYS) -> float:
    """Median time of one ``fn()`` call, from CUDA-graph replays timed with events."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()  # warm-up: compile / load, allocator
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0 / calls)
    return statistics.median(times)


# ~20 ms of GPU work queued ahead of the timed calls (torch.cuda._sleep spins this many cycles;
# H100 / H200 SMs run at 1.7-2 GHz): the calls are issued while the GPU is busy, as in a
# training loop whose CPU runs ahead, and none of them waits for the GPU. Without it, calls on
# large inputs measure the GPU: once the launch queue (~1000 entries) is full, every launch
# waits for a kernel to finish (seventh session: 256-group calls at 25-40 us "host" time).
_BUSY_CYCLES = 40_000_000


def interleaved_medians(time_side, rounds: int) -> tuple[float, float]:
    """Medians of ``rounds`` alternating timings of the two sides of an A/B
    (``time_side(False)``, then ``time_side(True)``, ...), so that clock and thermal drift hit
    both alike (the probes' A/Bs)."""
    a, b = [], []
    for _ in range(rounds):
        a.append(time_side(False))
        b.append(time_side(True))
    return statistics.median(a), statistics.median(b)


def host_time_us(fn, calls: int = 50, rounds: int = 1) -> float:
    """Median CPU time to issue one call: ``rounds`` rounds of ``calls`` back-to-back calls (no
    synchronization inside a round; at most ~2 launches a call, so a round of <= 200 calls stays
    below the launch queue's depth) issued behind a long GPU sleep, after one warm-up call."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        torch.cuda._sleep(_BUSY_CYCLES)
        for _ in range(calls):
            t = time.perf_counter_ns()
            fn()
            times.append((time.perf_counter_ns() - t) / 1e3)
        torch.cuda.synchronize()
    return statistics.median(times)


def host_reference():
    """Torch's own two-kernel op on a small tensor (``t.abs().amax()``: two launches, two
    allocations), timed next to each op's host time: the pool's hosts (and one host between
    rounds) differ by up to 2x in what any launch costs, so a host time reads against this."""
    t = torch.ones(1024, dtype=torch.bfloat16, device="cuda")
    return lambda: t.abs().amax()


def copy_bandwidth_gbps(nbytes: int = 1 << 31) -> float:
    """Device-to-device copy bandwidth (bytes read + bytes written) of 2 GiB buffers: the best of
    cudaMemcpy (copy engines; inside a graph a memcpy node) and an SM copy kernel."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    src.fill_(1.0)
    for _ in range(5):
        dst.copy_(src)
    best = 0.0
    for fn in (lambda: dst.copy_(src), lambda: torch.mul(src, 1.0, out=dst)):
        us = graph_time_us(fn, calls=4, replays=15)
        best = max(best, 2 * nbytes / us / 1e3)
    return best


CASES = {
    "dense 8192x5120": (5120, [8192]),
    "16384x4096 / 8 uneven": (4096, None, 16384, 8),
    "65536x2048 / 64": (2048, None, 65536, 64),
    "65536x2048 / 256": (2048, None, 65536, 256),
}
# Further shapes for plan sweeps (perf/probes/plan_sweep.py --cases), so that a tile-plan choice is
# not tuned to the four table cases alone.
EXTRA_CASES = {
    "dense 4096x7168": (7168, [4096]),
    "dense 16384x1024": (1024, [16384]),
    "32768x7168 / 16 uneven": (7168, None, 32768, 16),
    "65536x1536 / 128": (1536, None, 65536, 128),
    "64 x 1040 x 2048": (2048, [1040] * 64),
    "2 x 8192 x 4096": (4096, [8192, 8192]),
    "4 x 4096 x 4096": (4096, [4096] * 4),
    "8 x 2048 x 4096": (4096, [2048] * 8),
}


def case_splits(case, gen):
    from cutequant.testing import random_splits

    spec = CASES[case] if case in CASES else EXTRA_CASES[case]
    if spec[1] is not None:
        return spec[0], list(spec[1])
    n_cols, _, rows, groups = spec
    return n_cols, random_splits(groups, rows, gen)


def make_inputs(case, gen):
    from cutequant.testing import grouped_input

    n_cols, splits = case_splits(case, gen)
    return n_cols, splits, [grouped_input(splits, n_cols, gen) for _ in range(2)]


def _rotating(calls):
    state = {"i": 0}

    def fn():
        calls[state["i"] % len(calls)]()
        state["i"] += 1

    return fn


def bench_amax(case, gen, rht=True):
    import cutequant

    n_cols, splits, xs = make_inputs(case, gen)
    calls = [lambda x=x: cutequant.group_amax(x, splits, rht=rht) for x in xs]
    return _rotating(calls), xs[0].numel() * 2


def nvfp4_bytes(splits, n_cols, rowwise=True, columnwise=True):
    """Bytes the quantize kernel must move: read x (2 B/elem), write e2m1 data (0.5 B/elem per
    direction) and the padded e4m3 scale blocks."""
    m = sum(splits)
    total = 2 * m * n_cols
    if rowwise:
        total += m * n_cols // 2 + sum(-(-s // 128) * 128 for s in splits) * (
            -(-(n_cols // 16) // 4) * 4
        )
    if columnwise:
        total += m * n_cols // 2 + (-(-n_cols // 128) * 128) * sum(
            -(-(s // 16) // 4) * 4 for s in splits
        )
    return total


def bench_nvfp4(case, gen, with_amax_pass, device_splits=False, **opts):
    """Time nvfp4_group_quantize; without the amax pass the amax is precomputed (kernel only).
    ``device_splits``: the splits as an int32 CUDA tensor (the amax pass builds the tables)."""
    import cutequant

    n_cols, splits, xs = make_inputs(case, gen)
    if with_amax_pass:
        s = torch.tensor(splits, dtype=torch.int32, device="cuda") if device_splits else splits
        calls = [lambda x=x: cutequant.nvfp4_group_quantize(x, s, **opts) for x in xs]
    else:
        amaxes = [torch.stack(cutequant.group_amax(x, splits)) for x in xs]
        calls = [
            lambda x=x, a=a: cutequant.nvfp4_group_quantize(x, splits, amax=a, **opts)
            for x, a in zip(xs, amaxes, strict=True)
        ]
    nbytes = nvfp4_bytes(splits, n_cols, opts.get("rowwise", True), opts.get("columnwise", True))
    if with_amax_pass:
        nbytes += xs[0].numel() * 2  # the amax pass reads x once more
    return _rotating(calls), nbytes


def bench_fp8(
    case, gen, scaling, dtype=torch.bfloat16, rowwise=True, columnwise=True, device_splits=False
):
    """fp8_group_quantize (rowwise + columnwise unless told). "delayed" is the cast kernel alone
    (it also records the amax); "current" adds the grouped amax pass (x read twice).
    ``device_splits``: the splits as an int32 CUDA tensor."""
    import cutequant

    n_cols, host_splits, xs = make_inputs(case, gen)
    splits = host_splits
    if device_splits:
        splits = torch.tensor(host_splits, dtype=torch.int32, device="cuda")
    xs = [x.to(dtype) for x in xs]
    scale = torch.full((len(host_splits),), 3.0, device="cuda")
    opts = dict(
        scaling=scaling,
        scale=scale if scaling == "delayed" else None,
        rowwise=rowwise,
        columnwise=columnwise,
    )
    calls = [lambda x=x: cutequant.fp8_group_quantize(x, splits, **opts) for x in xs]
    m = sum(host_splits)
    nbytes = m * n_cols * (xs[0].element_size() + int(rowwise) + int(columnwise))
    if scaling == "current":
        nbytes += m * n_cols * xs[0].element_size()
    return _rotating(calls), nbytes


def bench_torch_compile_reference(case, gen):
    """torch.compile of the reference math (dense only: one group, fp32 RHT matmul)."""
    from cutequant import reference

    n_cols, splits, xs = make_inputs(case, gen)
    if len(splits) != 1:
        raise NotImplementedError("torch.compile baseline: dense cases only")
    r = reference.rht_matrix().float().cuda()

    def quantize(x):
        m, n = x.shape
        amax_r = x.abs().amax().float()
        xt = x.t().reshape(n, m // 16, 16).float()
        y = (xt @ r).to(torch.bfloat16).reshape(n, m)
        amax_c = y.abs().amax().float()
        return reference.nvfp4_quantize_rows(x, amax_r), reference.nvfp4_quantize_rows(y, amax_c)

    fn = torch.compile(quantize)
    calls = [lambda x=x: fn(x) for x in xs]
    return _rotating(calls), nvfp4_bytes(splits, n_cols) + xs[0].numel() * 2


def bench_fp8_torch_compile_reference(case, gen):
    """torch.compile of the reference FP8 current-scaling math (dense only: one group):
    amax, scale, rowwise cast and transposed cast, same bytes as fp8_current."""
    from cutequant import reference

    n_cols, splits, xs = make_inputs(case, gen)
    if len(splits) != 1:
        raise NotImplementedError("torch.compile baseline: dense cases only")
    fp8 = torch.float8_e4m3fn

    def quantize(x):
        scale, scale_inv = reference.fp8_scale_from_amax(x.abs().amax().float(), fp8)
        row = reference.fp8_cast(x, scale, fp8)
        col = reference.fp8_cast(x.t(), scale, fp8).contiguous()
        return row, col, scale_inv

    fn = torch.compile(quantize)
    calls = [lambda x=x: fn(x) for x in xs]
    return _rotating(calls), xs[0].numel() * (2 * xs[0].element_size() + 2)


def bench_nvfp4_dequantize(
    case, gen, columnwise=False, undo_rht=True, swizzled=False, device_splits=False
):
    """cutequant.dequant.nvfp4_group_dequantize to bf16 (one direction): reads the e2m1 data
    (0.5 B/elem) and the padded scale blocks, writes 2 B/elem."""
    import cutequant
    from cutequant import dequant

    n_cols, splits, xs = make_inputs(case, gen)
    s = torch.tensor(splits, device="cuda") if device_splits else splits
    qs = [cutequant.nvfp4_group_quantize(x, s, swizzled_scales=swizzled) for x in xs]
    calls = [
        lambda q=q: dequant.nvfp4_group_dequantize(q, columnwise=columnwise, undo_rht=undo_rht)
        for q in qs
    ]
    m = sum(splits)
    quantized = nvfp4_bytes(splits, n_cols, not columnwise, columnwise) - 2 * m * n_cols
    return _rotating(calls), quantized + 2 * m * n_cols


def bench_fp8_dequantize(case, gen, columnwise=False):
    """cutequant.dequant.fp8_group_dequantize to bf16: reads 1 B/elem, writes 2 B/elem."""
    import cutequant
    from cutequant import dequant

    n_cols, splits, xs = make_inputs(case, gen)
    scale = torch.full((len(splits),), 3.0, device="cuda")
    qs = [cutequant.fp8_group_quantize(x, splits, scaling="delayed", scale=scale) for x in xs]
    calls = [lambda q=q: dequant.fp8_group_dequantize(q, columnwise=columnwise) for q in qs]
    return _rotating(calls), sum(splits) * n_cols * 3


def bench_nvfp4_2d(case, gen, with_amax_pass=True, swizzled=False):
    """nvfp4_quantize_weights_2d of the case's shape as E = (groups) experts of [M/E, N]
    (rows rounded down to 16), both directions: reads the weights (twice with the amax pass),
    writes 2 x 0.5 B/elem and both scale blocks."""
    from cutequant import nvfp4_2d

    n_cols, splits, _ = make_inputs(case, gen)
    e = len(splits)
    rows = sum(splits) // e // 16 * 16
    ws = [torch.randn(e, rows, n_cols, device="cuda").to(torch.bfloat16) for _ in range(2)]
    amaxes = [w.float().abs().amax(dim=(1, 2)) for w in ws]
    calls = [
        lambda w=w, a=a: nvfp4_2d.nvfp4_quantize_weights_2d(
            w, swizzled_scales=swizzled, amax=None if with_amax_pass else a
        )
        for w, a in zip(ws, amaxes, strict=True)
    ]
    shapes = nvfp4_2d.output_shapes(e, rows, n_cols)
    nbytes = ws[0].numel() * (2 * (2 if with_amax_pass else 1) + 1)
    for key in ("row_scales", "col_scales"):
        nbytes += e * shapes[key][1] * shapes[key][2]
    return _rotating(calls), nbytes


def bench_fake_quant(case, gen, slot):
    """NVFP4 fake-quant, bf16 out, amax pass included, through the public ops (so that the host
    column is the eager call a user makes). ``slot``: "rows" (fused kernel: x read twice, y
    written), "rows_sr", "columnwise" (RHT domain: the amax pass reads x, the fused kernel
    reads x and writes y), "columnwise_sr", "columnwise_norht", "columnwise_kernel" (the fused
    kernel alone with a given amax: x read once, y written), "columnwise_kernel_sr",
    "weights_2d" (the case's shape as E experts)."""
    import cutequant

    n_cols, splits, xs = make_inputs(case, gen)
    m = sum(splits)
    rng = torch.tensor([7, 0], dtype=torch.int64, device="cuda")
    if slot in ("rows", "rows_sr"):
        sr = slot == "rows_sr"
        calls = [
            lambda x=x: cutequant.nvfp4_fake_quantize(
                x, splits, stochastic_rounding=sr, rng_state=rng if sr else None
            )
            for x in xs
        ]
        return _rotating(calls), 3 * 2 * m * n_cols
    if slot.startswith("columnwise"):
        sr = slot.endswith("_sr")
        rht = slot != "columnwise_norht"
        given = slot.startswith("columnwise_kernel")
        amaxes = [cutequant.group_amax(x, splits)[1] if given else None for x in xs]
        calls = [
            lambda x=x, a=a: cutequant.nvfp4_fake_quantize(
                x,
                splits,
                columnwise=True,
                rht=rht,
                sign_mask=0xD7E8,
                stochastic_rounding=sr,
                rng_state=rng if sr else None,
                amax=a,
            )
            for x, a in zip(xs, amaxes, strict=True)
        ]
        return _rotating(calls), (2 if given else 3) * 2 * m * n_cols
    e = len(splits)
    rows = m // e // 16 * 16
    ws = [x[: e * rows].view(e, rows, n_cols) for x in xs]
    calls = [lambda w=w: cutequant.nvfp4_fake_quantize_weights_2d(w) for w in ws]
    return _rotating(calls), 3 * 2 * e * rows * n_cols


OPS = {
    "group_amax_rht": lambda c, g: bench_amax(c, g, rht=True),
    "group_amax": lambda c, g: bench_amax(c, g, rht=False),
    "nvfp4_quantize": lambda c, g: bench_nvfp4(c, g, False),
    "nvfp4_quantize_swizzled": lambda c, g: bench_nvfp4(c, g, False, swizzled_scales=True),
    "nvfp4_quantize_fastmath": lambda c, g: bench_nvfp4(c, g, False, fast_math=True),
    "nvfp4_quantize+amax": lambda c, g: bench_nvfp4(c, g, True),
    "nvfp4_quantize+amax_device_splits": lambda c, g: bench_nvfp4(c, g, True, True),
    "nvfp4_quantize+amax_estimated": lambda c, g: bench_nvfp4(
        c, g, True, amax_estimation_scale=2.0
    ),
    "nvfp4_quantize_sr": lambda c, g: bench_nvfp4(
        c, g, False, stochastic_rounding=True, rng_state=torch.tensor([7, 0], device="cuda")
    ),
    "nvfp4_rowwise_only": lambda c, g: bench_nvfp4(c, g, False, columnwise=False, rht=False),
    "nvfp4_columnwise_only": lambda c, g: bench_nvfp4(c, g, False, rowwise=False),
    "nvfp4_dequantize_device_splits": lambda c, g: bench_nvfp4_dequantize(c, g, device_splits=True),
    "nvfp4_torch_compile_ref": bench_torch_compile_reference,
    "fp8_cast(delayed)": lambda c, g: bench_fp8(c, g, "delayed"),
    "fp8_cast_rowwise_only": lambda c, g: bench_fp8(c, g, "delayed", columnwise=False),
    "fp8_cast_columnwise_only": lambda c, g: bench_fp8(c, g, "delayed", rowwise=False),
    "fp8_current(amax+cast)": lambda c, g: bench_fp8(c, g, "current"),
    "fp8_current_device_splits": lambda c, g: bench_fp8(c, g, "current", device_splits=True),
    "fp8_torch_compile_ref": bench_fp8_torch_compile_reference,
    "nvfp4_dequantize_row": lambda c, g: bench_nvfp4_dequantize(c, g),
    "nvfp4_dequantize_row_swizzled": lambda c, g: bench_nvfp4_dequantize(c, g, swizzled=True),
    "nvfp4_dequantize_col": lambda c, g: bench_nvfp4_dequantize(c, g, True, False),
    "nvfp4_dequantize_col_unrht": lambda c, g: bench_nvfp4_dequantize(c, g, True, True),
    "fp8_dequantize_row": lambda c, g: bench_fp8_dequantize(c, g),
    "fp8_dequantize_col": lambda c, g: bench_fp8_dequantize(c, g, True),
    "nvfp4_2d_weights(amax+quantize)": lambda c, g: bench_nvfp4_2d(c, g),
    "nvfp4_2d_weights_quantize_only": lambda c, g: bench_nvfp4_2d(c, g, False),
    "nvfp4_2d_weights_swizzled": lambda c, g: bench_nvfp4_2d(c, g, True, True),
    "fake_quant_rows": lambda c, g: bench_fake_quant(c, g, "rows"),
    "fake_quant_rows_sr": lambda c, g: bench_fake_quant(c, g, "rows_sr"),
    "fake_quant_columnwise_rht": lambda c, g: bench_fake_quant(c, g, "columnwise"),
    "fake_quant_columnwise_rht_sr": lambda c, g: bench_fake_quant(c, g, "columnwise_sr"),
    "fake_quant_columnwise_no_rht": lambda c, g: bench_fake_quant(c, g, "columnwise_norht"),
    "fake_quant_columnwise_kernel": lambda c, g: bench_fake_quant(c, g, "columnwise_kernel"),
    "fake_quant_columnwise_kernel_sr": lambda c, g: bench_fake_quant(c, g, "columnwise_kernel_sr"),
    "fake_quant_weights_2d": lambda c, g: bench_fake_quant(c, g, "weights_2d"),
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--json", default=None)
    p.add_argument("--plot", default=None, metavar="PNG", help="bar chart of %% of copy (plot.py)")
    args = p.parse_args(argv)
    copy = copy_bandwidth_gbps()
    dev = torch.cuda.get_device_name()
    print(f"device: {dev}; copy bandwidth (read+write): {copy:.0f} GB/s")
    results = []
    ref = host_reference()
    for op in args.ops.split(","):
        for case in args.cases.split(","):
            # reseeded per (op, case): every op sees the same splits and data for a case
            gen = torch.Generator().manual_seed(1234)
            try:
                fn, nbytes = OPS[op](case, gen)
            except NotImplementedError:
                continue
            us = graph_time_us(fn)
            host = host_time_us(fn, 50, 3)  # 3 rounds: one round's median moved by up to 1.5x
            host_ref = host_time_us(ref, 50, 3)
            gbps = nbytes / us / 1e3
            results.append(Result(op, case, us, gbps, 100 * gbps / copy, host, nbytes, host_ref))
            print(
                f"  {op:28s} {case:24s} {us:9.1f} us {gbps:7.0f} GB/s {100 * gbps / copy:5.1f}%"
                f"  host {host:6.1f} us (torch's abs().amax() {host_ref:5.1f} us)",
                flush=True,
            )
    print(
        f"\n| op | case | us | GB/s | % of copy ({copy:.0f} GB/s) | host us "
        "| host us of torch's t.abs().amax() |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r.op} | {r.case} | {r.us:.1f} | {r.gbps:.0f} | {r.pct_copy:.1f} "
            f"| {r.host_us:.1f} | {r.host_ref_us:.1f} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"device": dev, "copy_gbps": copy, "results": [asdict(r) for r in results]},
                f,
                indent=1,
            )
    if args.plot:
        from plot import plot_results  # perf/plot.py; matplotlib only when asked for

        plot_results(
            [{"device": dev, "copy_gbps": copy, "results": [asdict(r) for r in results]}], args.plot
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
