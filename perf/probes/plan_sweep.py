"""Sweep TilePlan settings (``stages``: TMA ring depth, ``walk_band``: row tiles per band of the
tile walk, ``ctas_per_sm``, ``chunk``: round-robin chunks of the FP8 cast) of the kernels.

Usage (GPU): python perf/probes/plan_sweep.py
    --configs "walk_band=1 walk_band=0 stages=6,ctas_per_sm=2"
    [--ops fp8,fp8_current,nvfp4,...] [--cases all | extra | name,name]
Patches the runtime's spec builders so each run compiles the chosen value (a family that
refuses a setting keeps its plan), then times the op (the cast kernels alone unless the op
says otherwise: FP8 delayed scaling, NVFP4 with a precomputed amax) with perf/bench.py's
harness. Check a plan's numerics first with perf/probes/plan_tests.py.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # perf/

import bench  # noqa: E402
import torch  # noqa: E402

from cutequant import amax, fp8, nvfp4, replay  # noqa: E402
from cutequant.testing import with_plan  # noqa: E402

OPS = {
    "amax_rht": lambda c, g: bench.bench_amax(c, g, rht=True),
    "amax_plain": lambda c, g: bench.bench_amax(c, g, rht=False),
    "fp8": lambda c, g: bench.bench_fp8(c, g, "delayed"),
    "fp8_rowwise": lambda c, g: bench.bench_fp8(c, g, "delayed", columnwise=False),
    "fp8_colwise": lambda c, g: bench.bench_fp8(c, g, "delayed", rowwise=False),
    "fp8_current": lambda c, g: bench.bench_fp8(c, g, "current"),
    "nvfp4": lambda c, g: bench.bench_nvfp4(c, g, False, swizzled_scales=True),
    "nvfp4_compact": lambda c, g: bench.bench_nvfp4(c, g, False),
    "nvfp4_rowwise": lambda c, g: bench.bench_nvfp4(c, g, False, columnwise=False, rht=False),
    "nvfp4_colwise": lambda c, g: bench.bench_nvfp4(c, g, False, rowwise=False),
    "nvfp4_call": lambda c, g: bench.bench_nvfp4(c, g, True),
}


def _or_default(patched, builder):
    def build(*args, **kwargs):
        try:
            return patched(*args, **kwargs)
        except ValueError:
            return builder(*args, **kwargs)

    return build


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--configs", default="stages=3 stages=4 stages=6 stages=8")
    p.add_argument("--ops", default="fp8,nvfp4")
    p.add_argument("--cases", default=",".join(bench.CASES), help='names, or "all" / "extra"')
    args = p.parse_args()
    named = {"all": [*bench.CASES, *bench.EXTRA_CASES], "extra": list(bench.EXTRA_CASES)}
    cases = named.get(args.cases) or args.cases.split(",")
    copy = bench.copy_bandwidth_gbps()
    print(f"device: {torch.cuda.get_device_name()}; copy {copy:.0f} GB/s")
    builders = {m: m._spec for m in (amax, fp8, nvfp4)}
    fp8.TILE_CAST = False  # the plans are the TMA-ring cast's (the tile cast has none)
    for config in args.configs.split():
        settings = {k: int(v) for k, v in (kv.split("=") for kv in config.split(","))}
        for module, builder in builders.items():
            # settings a family refuses (e.g. chunk for the amax pass) leave its plan alone
            module._spec = _or_default(with_plan(builder, **settings), builder)
        # the runtime caches its spec choices and replays recorded launches: forget both, or
        # every config after the first would time the first one's kernels
        nvfp4._SPECS.clear()
        amax._LAUNCH_FACTS.clear()
        replay.invalidate()
        for op in args.ops.split(","):
            for case in cases:
                gen = torch.Generator().manual_seed(1234)
                fn, nbytes = OPS[op](case, gen)
                us = bench.graph_time_us(fn)
                gbps = nbytes / us / 1e3
                print(
                    f"{config:24s} {op:14s} {case:24s} {us:8.1f} us {100 * gbps / copy:5.1f}%",
                    flush=True,
                )
            plans = {(type(s).__name__, s.plan, grid) for s, grid in nvfp4._SPECS.values()}
            for name, plan, grid in sorted(plans, key=str):  # what actually ran
                print(f"{config:24s} {op:14s} ran {name} {plan} grid {grid}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
