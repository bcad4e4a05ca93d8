"""Where the host time of one call goes (cProfile of repeated calls, no synchronization)."""

import cProfile
import pstats
import sys

import torch

import cutequant
from cutequant.testing import grouped_input


def main() -> int:
    gen = torch.Generator().manual_seed(0)
    splits = [1024] * 8
    x = grouped_input(splits, 2048, gen)
    for _ in range(3):
        cutequant.group_amax(x, splits)
        cutequant.nvfp4_group_quantize(x, splits)
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(200):
        cutequant.nvfp4_group_quantize(x, splits)
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
