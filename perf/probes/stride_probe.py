"""FP8 cast throughput against the transposed output's row stride and group alignment
(perf/NOTES.md attempt 43): power-of-two strides vs not (dense), and 64 groups of 1024 rows
(every 64-row tile full) vs 1040 rows (a 16-row last tile per group).

Usage (GPU): python perf/probes/stride_probe.py
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # perf/

import bench  # noqa: E402
import torch  # noqa: E402

CASES = {
    "dense 8192x5120": (5120, [8192]),
    "dense 8256x5120": (5120, [8256]),
    "dense 8192x5248": (5248, [8192]),
    "dense 8256x5248": (5248, [8256]),
    "64 x 1024 rows, N 2048": (2048, [1024] * 64),
    "64 x 1040 rows, N 2048": (2048, [1040] * 64),
}
OUTPUTS = {
    "both": {},
    "transposed only": {"rowwise": False},
    "rowwise only": {"columnwise": False},
}


def main() -> int:
    bench.CASES.update(CASES)
    for name, outputs in OUTPUTS.items():
        for case in CASES:
            gen = torch.Generator().manual_seed(1)
            fn, nbytes = bench.bench_fp8(case, gen, "delayed", **outputs)
            us = bench.graph_time_us(fn)
            print(f"{name:16s} {case:24s} {us:8.1f} us {nbytes / us / 1e3:7.0f} GB/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
