#!/usr/bin/env bash
# One device call: install, GPU tests, SASS facts, benchmarks. Logs go to $OUT (or ./gpu-out).
#   bash .gpu-bundle/setup.sh && . /opt/cutedsl/env.sh && python3 -m pip install -q --no-deps \
#     --no-build-isolation -e . && bash perf/gpu_session.sh [pytest -k expr] [bench ops]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUTEQUANT_CACHE_DIR=${CUTEQUANT_CACHE_DIR:-/tmp/cq-cache}
K=${1:-}
OPS=${2:-}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv | tee "$OUT/gpu.txt"
timeout 400 python3 -m pytest tests -m gpu -q -rf --tb=short --timeout=240 ${K:+-k "$K"} -p no:cacheprovider 2>&1 \
  | tee "$OUT/pytest.txt" | tail -40
if [ -n "$OPS" ]; then
  python3 perf/bench.py --ops "$OPS" --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.txt"
fi
