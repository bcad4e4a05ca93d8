"""Hardware counters for one call of each benchmarked op, for Nsight Compute:

    ncu --clock-control none --profile-from-start off --section SpeedOfLight \\
        --section WarpStateStats --section SchedulerStats python3 perf/ncu_profile.py OP[,OP] [CASE]

Each op is built and warmed up (JIT compile, allocator) outside the profiled range; exactly one
call per (op, case) runs between cudaProfilerStart/Stop, so ncu sees only those launches.
With ``--section SourceCounters -o R``, export ``ncu --import R.ncu-rep --csv --page source
--print-source sass`` (or ``--page details``) and read it with ``perf/ncu_report.py``."""

import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import bench  # noqa: E402


def copy_op(case, gen):
    """The reference point: an SM copy kernel moving 2 x 84 MB (x read, same-size write)."""
    src = torch.ones(8192 * 5120, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    return (lambda: torch.mul(src, 1.0, out=dst)), 4 * src.numel()


def main(argv):
    ops = argv[0].split(",")
    cases = argv[1].split(",") if len(argv) > 1 else ["dense 8192x5120"]
    for op in ops:
        for case in cases:
            gen = torch.Generator().manual_seed(1234)
            fn, _ = (copy_op if op == "copy" else bench.OPS[op])(case, gen)
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
            fn()
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()
            print(f"profiled {op} / {case}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
