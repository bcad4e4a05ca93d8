"""Sweep the TMA ring depth (TilePlan.stages) of the FP8 and NVFP4 quantize kernels.

Usage (GPU): python perf/stage_sweep.py [--stages 3,4,6,8]
Patches the runtime's spec builders so each run compiles the chosen depth, then times the cast
kernel alone (FP8 delayed scaling; NVFP4 with a precomputed amax) with perf/bench.py's harness.
"""

import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import bench  # noqa: E402
import torch  # noqa: E402

from cutequant import fp8, nvfp4  # noqa: E402


def _with_stages(builder, stages):
    def build(*args, **kwargs):
        spec = builder(*args, **kwargs)
        return dataclasses.replace(spec, plan=dataclasses.replace(spec.plan, stages=stages))

    return build


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--stages", default="3,4,6,8")
    p.add_argument("--cases", default=",".join(bench.CASES))
    args = p.parse_args()
    copy = bench.copy_bandwidth_gbps()
    print(f"device: {torch.cuda.get_device_name()}; copy {copy:.0f} GB/s")
    fp8_spec, nvfp4_spec = fp8._spec, nvfp4._spec
    ops = {
        "fp8_cast(delayed)": lambda c, g: bench.bench_fp8(c, g, "delayed"),
        "nvfp4_quantize": lambda c, g: bench.bench_nvfp4(c, g, False),
    }
    for stages in (int(s) for s in args.stages.split(",")):
        fp8._spec = _with_stages(fp8_spec, stages)
        nvfp4._spec = _with_stages(nvfp4_spec, stages)
        for op, make in ops.items():
            for case in args.cases.split(","):
                gen = torch.Generator().manual_seed(1234)
                fn, nbytes = make(case, gen)
                us = bench.graph_time_us(fn)
                gbps = nbytes / us / 1e3
                print(f"stages={stages} {op:20s} {case:24s} {us:8.1f} us {100 * gbps / copy:5.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
