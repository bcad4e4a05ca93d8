"""Do cutequant's evict_last L2 lines slow down the kernels that run after a call?

Two lines kinds stay marked evict_last after a call: the x tiles the amax pass hands to the FP8
cast (``amax.L2_HANDOFF_SHARE`` of the L2) and the compact NVFP4 scales. A later kernel's own
lines are evicted before them, so the L2 it can use may shrink. Probe: after a call, a
follower reads a buffer W twice (``W.sum()``); the second read hits L2 only if W still fits in
the part of L2 the follower can use. The time of that second read (graph [call, sum, sum] minus
graph [call, sum], median of replays) is compared across predecessors:

* ``fp8 current``: amax pass + cast with the hand-off (the shipped path);
* ``fp8 current, no hand-off``: the same with ``L2_HANDOFF_SHARE = 0``;
* ``fp8 delayed``: the cast alone (no evict_last lines);
* ``nvfp4 compact`` / ``nvfp4 swizzled``: with / without evict_last scale stores;
* ``none``: W alone (the follower's L2 time).

    python perf/probes/l2_residue.py [--fractions 0.3,0.5,0.7]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

import cutequant
from cutequant import amax as amax_mod

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # perf/
import bench  # noqa: E402


def graph_us(fns) -> float:
    """Median time of one pass over ``fns`` (CUDA-graph replay, perf/bench.py's harness)."""
    return bench.graph_time_us(lambda: [f() for f in fns], calls=5, replays=25)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--fractions", default="0.3,0.5,0.7")
    args = p.parse_args()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    print(f"device: {torch.cuda.get_device_name()}  L2 {l2 / 2**20:.0f} MiB")
    gen = torch.Generator().manual_seed(5)
    from cutequant.testing import grouped_input, random_splits

    splits = random_splits(8, 16384, gen)
    x = grouped_input(splits, 4096, gen)
    scale = torch.full((len(splits),), 3.0, device="cuda")
    share = amax_mod.L2_HANDOFF_SHARE

    def fp8_current():
        cutequant.fp8_group_quantize(x, splits, scaling="current")

    def fp8_current_no_handoff():
        amax_mod.L2_HANDOFF_SHARE = 0.0
        try:
            cutequant.fp8_group_quantize(x, splits, scaling="current")
        finally:
            amax_mod.L2_HANDOFF_SHARE = share

    preds = {
        "none": None,
        "fp8 current": fp8_current,
        "fp8 current, no hand-off": fp8_current_no_handoff,
        "fp8 delayed": lambda: cutequant.fp8_group_quantize(
            x, splits, scaling="delayed", scale=scale
        ),
        "nvfp4 compact": lambda: cutequant.nvfp4_group_quantize(x, splits),
        "nvfp4 swizzled": lambda: cutequant.nvfp4_group_quantize(x, splits, swizzled_scales=True),
    }
    for frac in (float(f) for f in args.fractions.split(",")):
        w = torch.randn(int(frac * l2) // 4, device="cuda")
        out = torch.empty((), device="cuda")

        def follow(w=w, out=out):
            torch.sum(w, dim=0, out=out)

        for name, pred in preds.items():
            base = [pred] if pred else []
            one = graph_us(base + [follow])
            two = graph_us(base + [follow, follow])
            print(
                f"  W = {frac:.1f} L2 ({w.numel() * 4 / 2**20:5.1f} MiB)  after {name:26s}"
                f" second read {two - one:6.2f} us  (call + first read {one:7.2f} us)",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
