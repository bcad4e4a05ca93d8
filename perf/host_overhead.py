"""Where the host time of one call goes (cProfile of repeated calls, no synchronization)."""

import cProfile
import pstats
import sys

import torch

import cutequant
from cutequant.testing import grouped_input

OPS = {
    "nvfp4": lambda x, s: cutequant.nvfp4_group_quantize(x, s),
    "fp8": lambda x, s: cutequant.fp8_group_quantize(x, s),
    "amax": lambda x, s: cutequant.group_amax(x, s),
}


def main(argv) -> int:
    gen = torch.Generator().manual_seed(0)
    splits = [1024] * 8
    x = grouped_input(splits, 2048, gen)
    for name in argv or list(OPS):
        op = OPS[name]
        for _ in range(3):
            op(x, splits)
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            op(x, splits)
        prof.disable()
        torch.cuda.synchronize()
        print(f"=== {name}: 200 calls")
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
