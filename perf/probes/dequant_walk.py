"""A/B of the columnwise dequantize kernels' CTA order (``dequant.COLUMNWISE_ROW_TILES_FIRST``,
a kernel argument: no recompile): column tiles fastest vs a column strip's row tiles first,
interleaved rounds on the bench's cases; checks first that both orders give the same bits.

    python perf/probes/dequant_walk.py [--rounds 2] [--ops nvfp4_dequantize_col,...]
    python perf/probes/dequant_walk.py --rows-first perf/bench.py --ops ...   # any script
    python perf/probes/dequant_walk.py --rows-first -m pytest tests/test_gpu_dequant.py
"""

import argparse
import runpy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import bench  # noqa: E402

from cutequant import dequant  # noqa: E402

COL_OPS = "nvfp4_dequantize_col,nvfp4_dequantize_col_unrht,fp8_dequantize_col"


def _first_output(op: str, case: str) -> torch.Tensor:
    """The output of the op's first call on the case (its bits as integers)."""
    calls = []
    orig = dequant.nvfp4_group_dequantize, dequant.fp8_group_dequantize
    dequant.nvfp4_group_dequantize = lambda *a, **k: calls.append(orig[0](*a, **k))
    dequant.fp8_group_dequantize = lambda *a, **k: calls.append(orig[1](*a, **k))
    try:
        fn, _ = bench.OPS[op](case, torch.Generator().manual_seed(1234))
        fn()
    finally:
        dequant.nvfp4_group_dequantize, dequant.fp8_group_dequantize = orig
    return calls[0].view(torch.int16 if calls[0].element_size() == 2 else torch.int32)


def _same_bits(op: str, case: str) -> None:
    """Both orders write the same output."""
    outs = []
    for first in (False, True):
        dequant.COLUMNWISE_ROW_TILES_FIRST = first
        outs.append(_first_output(op, case))
    assert torch.equal(outs[0], outs[1]), f"{op} {case}: the two orders differ"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--ops", default=COL_OPS)
    p.add_argument("--cases", default=",".join(bench.CASES))
    args = p.parse_args(argv)
    copy = bench.copy_bandwidth_gbps()
    print(f"device: {torch.cuda.get_device_name()}; copy {copy:.0f} GB/s")
    print(
        "| op | case | "
        + " | ".join(f"cols first / rows first, round {r + 1}" for r in range(args.rounds))
        + " |"
    )
    for op in args.ops.split(","):
        for case in args.cases.split(","):
            _same_bits(op, case)
            cells = []
            for _ in range(args.rounds):
                pair = []
                for first in (False, True):
                    dequant.COLUMNWISE_ROW_TILES_FIRST = first
                    fn, nbytes = bench.OPS[op](case, torch.Generator().manual_seed(1234))
                    us = bench.graph_time_us(fn)
                    pair.append(f"{us:.1f} us {100 * nbytes / us / 1e3 / copy:.1f}%")
                cells.append(" / ".join(pair))
            print(f"| {op} | {case} | " + " | ".join(cells) + " |", flush=True)
    dequant.COLUMNWISE_ROW_TILES_FIRST = False
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rows-first":
        dequant.COLUMNWISE_ROW_TILES_FIRST = True
        if sys.argv[2] == "-m":
            sys.argv = [sys.argv[3]] + sys.argv[4:]
            runpy.run_module(sys.argv[0], run_name="__main__")
        else:
            sys.argv = sys.argv[2:]
            runpy.run_path(sys.argv[0], run_name="__main__")
    else:
        sys.exit(main())
