"""Scratch: run a script or pytest with the FP8 tile cast at another tile width.

python perf/probes/with_tile_cols.py 64 perf/bench.py --ops ...
python perf/probes/with_tile_cols.py 64 -m pytest tests/test_gpu_fp8.py
"""

import dataclasses
import runpy
import sys

from cutequant import fp8

cols = int(sys.argv[1])
orig = fp8._tile_spec
fp8._tile_spec = lambda *a: dataclasses.replace(orig(*a), tile_cols=cols)
if sys.argv[2] == "-m":
    sys.argv = [sys.argv[3]] + sys.argv[4:]
    runpy.run_module(sys.argv[0], run_name="__main__")
else:
    sys.argv = sys.argv[2:]
    runpy.run_path(sys.argv[0], run_name="__main__")
