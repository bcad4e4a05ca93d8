"""Time vs size at one width: split an op's per-call cost into a fixed part and a rate.

Usage (GPU): python perf/probes/size_sweep.py [--ops copy,amax_rht,amax,fp8,fp8_row] [--n 5120]

Dense calls of M = 64 ... 32768 rows x N columns, each timed like perf/bench.py (CUDA-graph
replay of back-to-back calls, median). A line through the largest calls gives the op's
steady rate (GB/s and % of the copy bandwidth measured in the same run) and its fixed cost per
call (the intercept: launch, ramp, drain). ``copy`` is torch's own copy kernel for reference.
perf/NOTES.md attempt 58: the dense FP8 cast's gap to 85% is its rate, not a fixed cost.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # perf/

import bench  # noqa: E402
import torch  # noqa: E402

SIZES = [64, 1024, 2048, 4096, 8192, 64 * 132, 16384, 32768]


def copy_op(case, gen):
    n_cols, splits = bench.case_splits(case, gen)
    srcs = [torch.randn(sum(splits), n_cols, device="cuda").bfloat16() for _ in range(2)]
    dsts = [torch.empty_like(s) for s in srcs]
    calls = [lambda s=s, d=d: torch.mul(s, 1.0, out=d) for s, d in zip(srcs, dsts, strict=True)]
    return bench._rotating(calls), 4 * srcs[0].numel()


OPS = {
    "copy": copy_op,
    "amax_rht": lambda c, g: bench.bench_amax(c, g, rht=True),
    "amax": lambda c, g: bench.bench_amax(c, g, rht=False),
    "fp8": lambda c, g: bench.bench_fp8(c, g, "delayed"),
    "fp8_row": lambda c, g: bench.bench_fp8(c, g, "delayed", columnwise=False),
    "fp8_col": lambda c, g: bench.bench_fp8(c, g, "delayed", rowwise=False),
    "nvfp4": lambda c, g: bench.bench_nvfp4(c, g, False),
    # dequantize to bf16 (perf/NOTES.md, "short calls"): rowwise, columnwise (+ inverse RHT), FP8
    "dq_row": lambda c, g: bench.bench_nvfp4_dequantize(c, g),
    "dq_col": lambda c, g: bench.bench_nvfp4_dequantize(c, g, True, False),
    "dq_col_unrht": lambda c, g: bench.bench_nvfp4_dequantize(c, g, True, True),
    "fp8_dq_col": lambda c, g: bench.bench_fp8_dequantize(c, g, True),
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ops", default="copy,amax_rht,amax,fp8,fp8_row")
    p.add_argument("--n", type=int, default=5120)
    args = p.parse_args()
    for m in SIZES:
        bench.EXTRA_CASES[f"dense {m}x{args.n}"] = (args.n, [m])
    copy = bench.copy_bandwidth_gbps()
    print(f"device: {torch.cuda.get_device_name()}; copy {copy:.0f} GB/s")
    for name in args.ops.split(","):
        points = []
        for m in SIZES:
            fn, nbytes = OPS[name](f"dense {m}x{args.n}", torch.Generator().manual_seed(1))
            us = bench.graph_time_us(fn)
            points.append((nbytes / 1e6, us))
            pct = 100 * nbytes / us / 1e3 / copy
            print(f"{name:9s} M={m:6d} {nbytes / 1e6:8.1f} MB {us:8.2f} us {pct:5.1f}%", flush=True)
        (x0, y0), (x1, y1) = points[-3], points[-1]  # the three largest calls
        slope = (y1 - y0) / (x1 - x0)  # us per MB
        rate = 1000 / slope
        print(
            f"{name}: rate {rate:.0f} GB/s ({100 * rate / copy:.1f}% of copy), "
            f"fixed {y0 - slope * x0:.2f} us per call"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
