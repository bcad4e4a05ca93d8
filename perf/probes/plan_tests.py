"""Run one kernel family's GPU tests with a forced tile plan (GPU only):

    python perf/probes/plan_tests.py fp8 chunk=4 [stages=6 ...]
    python perf/probes/plan_tests.py nvfp4 walk_band=8

Every spec the family's runtime builds carries the given TilePlan settings (each plan is its
own compiled kernel), so the whole bit-exact suite checks a plan before perf/probes/plan_sweep.py
times it. Families: fp8 (FP8 + PDL tests), nvfp4 (NVFP4 + PDL tests), amax.
"""

import sys

import pytest

from cutequant import amax, fp8, nvfp4
from cutequant.testing import with_plan

FAMILIES = {
    "fp8": (fp8, ["tests/test_gpu_fp8.py", "tests/test_gpu_pdl.py"]),
    "nvfp4": (nvfp4, ["tests/test_gpu_nvfp4.py", "tests/test_gpu_pdl.py"]),
    "amax": (amax, ["tests/test_gpu_amax.py"]),
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in FAMILIES:
        print(__doc__)
        return 2
    module, files = FAMILIES[argv[0]]
    settings = {k: int(v) for k, v in (a.split("=") for a in argv[1:])}
    module._spec = with_plan(module._spec, **settings)
    fp8.TILE_CAST = False  # FP8 plans are the TMA-ring cast's (the tile cast has none)
    return pytest.main([*files, "-m", "gpu", "-q", "-p", "no:cacheprovider"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
