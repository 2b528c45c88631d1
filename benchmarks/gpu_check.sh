#!/usr/bin/env bash
# One GPU session checks and times everything: the test suite on the GPU (kernels compiled for
# the device, GPU-only tests enabled), then every benchmark suite. Everything lands in $OUT as a
# few files (the device tool returns at most 8): tests.log, bench.log, results.tgz.
#   bash benchmarks/gpu_check.sh [full|quick|tests|bench] [suite ...]
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=src PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-gpu}
OUT=${OUT:-/tmp/shufflemoe_out}
MODE=${1:-full}
shift || true
RES=$(mktemp -d)
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
  --format=csv | tee "$OUT/gpu.txt"
status=0
if [ "$MODE" != bench ]; then
  timeout ${TEST_TIMEOUT:-240} python -m pytest tests -q -x -p no:cacheprovider --durations=15 \
    2>&1 | tee "$OUT/tests.log" | tail -40
  status=${PIPESTATUS[0]}
fi
if [ "$MODE" != tests ]; then
  args=()
  for s in "$@"; do args+=(--suite "$s"); done
  [ "$MODE" = quick ] && args+=(--quick)
  python -m shufflemoe.cli bench --out "$RES" "${args[@]}" 2>&1 | tee "$OUT/bench.log" | grep -v "^|" | tail -60
  tar czf "$OUT/results.tgz" -C "$RES" .
fi
exit $status
