#!/usr/bin/env bash
# The one GPU script: the test suite on the GPU (kernels compiled for the device, GPU-only tests
# enabled) and the benchmark suites, in three device calls of at most 10 minutes each:
#
#   bash benchmarks/gpu_check.sh tests   # the whole test suite, 8 workers (its own call)
#   bash benchmarks/gpu_check.sh part1   # the suites of part 1 (layer, host_cost)
#   bash benchmarks/gpu_check.sh part2   # the suites of part 2 (index_shuffle, token_movement,
#                                        # grouped_gemm, grouped_gemm_sweep, e2e_hf)
#   bash benchmarks/gpu_check.sh quick | bench [suite ...]
#
# Estimated H100 time per suite (`shufflemoe bench --list`), from the suite times of the last two
# full runs (8c6cb20, 8aca447: index_shuffle ~40 s with tiling variants, now dropped;
# token_movement 38-44 s; grouped_gemm 5-23 s; grouped_gemm_sweep 14-31 s; layer ~240 s; e2e_hf
# 64-89 s at twice the depth) plus what this version adds (ceilings after each suite ~5 s; eager
# and compiled rows; decode at T = 2 and 4; weight copies; the e2e compile paths, ~15-25 s per
# compile of the reduced-depth models): tests ~270 s with 8 workers (run them alone: `tests`;
# measured since: 338 s at 0d023a5, over 450 s at 89e3250 on a fresh H100, its last torch.compile
# test still running; over 380 s at 8db53ec, 374 s at 59f9f6f, 318 s at 5edc05d with 14 workers: keep
# TEST_TIMEOUT at its 540 s default), layer ~280 s (measured since: 361 s at ade96e0, 430 s at
# c113f25, 503 s at 8db53ec, 497 s at 59f9f6f, 395 s at 5edc05d, 460 s at 9a9ee39 on H100s: a call
# of its own, with CALL_LIMIT_S=588 and the device call's timeout_s 600; at 560 the run at aeda6f2
# spent its budget at 474 s, leaving out Mixtral fp8_block T = 64, mxfp4 and the shoot-out);
# part 2 ~385 s (index_shuffle 30, token_movement 50, grouped_gemm 30, grouped_gemm_sweep 35,
# e2e_hf 240). These are estimates, not measurements: each part runs under a deadline
# (BENCH_BUDGET_S) that skips late cases (rows say "skipped: time budget") rather than lose the
# call, and the results of finished suites are packed even when a suite fails.
#
# $OUT receives up to 5 files: gpu.txt, tests.log, gpu_tests.json, bench.log, results.tgz. results.tgz holds
# <suite>.json/.md/.png and history/<suite>.jsonl (the committed history plus this run's line).
# Pass SHUFFLEMOE_COMMIT=<commit> (here: `git rev-parse HEAD`), so results name it: the script stops
# without it, since the device's copy of the tree can hold a stale .git (its `git rev-parse` named
# acabf6e for a run of 2076e6c's source on 2026-11-28).
# To publish: tar xzf results.tgz -C benchmarks/results (both parts), then
# `python benchmarks/readme_results.py` rebuilds README.md's measured section.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -z "${SHUFFLEMOE_COMMIT:-}" ]; then
  echo "gpu_check.sh: set SHUFFLEMOE_COMMIT to the commit being measured" >&2
  exit 2
fi
export PYTHONPATH=src PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-gpu}
export SHUFFLEMOE_RUN_ID=${SHUFFLEMOE_RUN_ID:-$(date -u +%Y%m%dT%H%M%SZ)-$RANDOM}  # one per GPU call
OUT=${OUT:-/tmp/shufflemoe_out}
MODE=${1:-part1}
shift || true
RES=$(mktemp -d)
mkdir -p "$OUT"
START=$(date +%s)
CALL_LIMIT_S=${CALL_LIMIT_S:-585}  # the device tool ends a call at 600 s: keep time to pack
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv | tee "$OUT/gpu.txt"
echo "run $SHUFFLEMOE_RUN_ID, mode $MODE" | tee -a "$OUT/gpu.txt"
status=0
if [ "$MODE" = tests ] || [ "$MODE" = quick ]; then
  # Every test file, 8 xdist workers sharing the GPU (the whole suite: ~270 s on an H100);
  # gpu_tests.json summarises the run for benchmarks/results/.
  t0=$(date +%s)
  timeout ${TEST_TIMEOUT:-540} python -m pytest tests -v -n ${TEST_WORKERS:-8} -p no:cacheprovider \
    --durations=15 2>&1 | tee "$OUT/tests.log" | grep -v " PASSED \| SKIPPED " | tail -60
  status=${PIPESTATUS[0]}
  python benchmarks/gpu_tests_summary.py "$OUT/tests.log" $(( $(date +%s) - t0 )) $status \
    > "$OUT/gpu_tests.json"
fi
if [ "$MODE" != tests ]; then
  args=(--out "$RES")
  case "$MODE" in
    part1) args+=(--part 1) ;;
    part2) args+=(--part 2) ;;
    quick) args+=(--quick) ;;
    bench) for s in "$@"; do args+=(--suite "$s"); done ;;
    *) echo "unknown mode $MODE (part1 | part2 | quick | tests | bench [suite ...])"; exit 2 ;;
  esac
  left=$(( CALL_LIMIT_S - ($(date +%s) - START) ))
  budget=${BENCH_BUDGET_S:-$(( left - 30 ))}
  # A case that stalls past the call (once, 2026-12-03: e2e_hf's Qwen3 torch.compile group on an
  # H200, ~400 s, not repeated) is ended with SIGABRT, on which -X faulthandler writes every
  # thread's Python stack into bench.log: where it stood.
  timeout -s ABRT $(( left - 10 )) python -X faulthandler -m shufflemoe.cli bench "${args[@]}" \
    --budget-s "$budget" 2>&1 \
    | tee "$OUT/bench.log" | grep -v "^|" | tail -80
  bench_status=${PIPESTATUS[0]}
  [ "$bench_status" -ne 0 ] && status=$bench_status
  tar czf "$OUT/results.tgz" -C "$RES" .
fi
exit $status
