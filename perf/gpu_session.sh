#!/usr/bin/env bash
# One device call: install, GPU tests, optional compute-sanitizer runs, benchmarks. Logs go to
# $OUT (or ./gpu-out).
#   bash .gpu-bundle/setup.sh && . /opt/cutedsl/env.sh && python3 -m pip install -q --no-deps \
#     --no-build-isolation -e . && SAN=1 bash perf/gpu_session.sh [pytest -k expr] [bench ops]
# SAN=1: memcheck, racecheck and synccheck over perf/sanitize_run.py (~30 s each).
# Bench ops "all": every op of perf/bench.py, with bench.json.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUTEQUANT_CACHE_DIR=${CUTEQUANT_CACHE_DIR:-/tmp/cq-cache}
K=${1:-}
OPS=${2:-}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv | tee "$OUT/gpu.txt"
timeout 400 python3 -m pytest tests -m gpu -q -rf --tb=short ${K:+-k "$K"} -p no:cacheprovider 2>&1 \
  | tee "$OUT/pytest.txt" | tail -5
if [ "${SAN:-0}" = 1 ]; then
  for tool in memcheck racecheck synccheck; do
    timeout 200 compute-sanitizer --tool "$tool" python3 perf/sanitize_run.py >"$OUT/san_$tool.txt" 2>&1
    # With a cold JIT cache the DSL compiles under the sanitizer, and memcheck counts its
    # host-side cuGetProcAddress_v2 reports as errors: the kernel errors are the "Invalid" lines.
    echo "$tool rc=$?: $(grep -h "SUMMARY" "$OUT/san_$tool.txt" | tail -2 | tr '\n' ' ')" \
      "kernel errors: $(grep -c "^========= Invalid" "$OUT/san_$tool.txt")" | tee -a "$OUT/san.txt"
  done
fi
if [ "$OPS" = all ]; then
  python3 perf/bench.py --json "$OUT/bench.json" >"$OUT/bench.txt" 2>&1
  tail -70 "$OUT/bench.txt"
elif [ -n "$OPS" ]; then
  python3 perf/bench.py --ops "$OPS" --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.txt"
fi
