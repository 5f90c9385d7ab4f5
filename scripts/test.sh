#!/usr/bin/env bash
# The whole test suite (the README's test command; .ci/run runs it after
# scripts/setup.sh): vLLM 0.32.0's own scheduler tests against the hook
# scheduler (scripts/upstream_conformance.sh; it downloads vLLM's source
# distribution once, into ~/.cache), then the project's tests, then the vLLM
# 0.33 part (scripts/test_vllm033.sh: 0.33's own scheduler tests, the tests
# not marked slow and the end-to-end ones, in .venv033, which it builds the
# first time with scripts/setup_vllm033.sh). All always run; the
# exit status is non-zero if any fails (pytest's 5, "no tests collected",
# included). Extra arguments go to pytest.
#
# Two lanes: the vLLM 0.33 part runs beside the 0.32 part, its output kept in
# .test-times/vllm033.log and printed when both are done, every process on
# one OpenMP thread (one lane left the 2-core machine's CPU a quarter idle:
# engines starting, subprocesses waited on; two lanes of torch's thread per
# core would spin against each other). The second lane then runs four 0.32
# files that wait on subprocesses for minutes (Ray clusters, the wheel's
# installs, verl's example, the GPU-timed grid's servers), which balances the
# lanes (measured: the 0.33 lane ended 11 minutes before the 0.32 lane
# without the first three, 79 s before with them). SEQHOOKS_TEST_LANES=1
# runs everything in one lane, one part after the other (torch's own thread
# count); so do extra pytest arguments (a selection may leave a lane nothing).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || { echo "test.sh: $PY not found; run ./scripts/setup.sh first" >&2; exit 1; }
status=0
# SEQHOOKS_TEST_BACKGROUND_LOAD=MINUTES: another vLLM engine generates beside
# the run for its first MINUTES minutes (tests/support/background_load.py;
# docs/testing.md, "Under load"). Off by default.
if [ -n "${SEQHOOKS_TEST_BACKGROUND_LOAD:-}" ]; then
  echo "test.sh: SEQHOOKS_TEST_BACKGROUND_LOAD=$SEQHOOKS_TEST_BACKGROUND_LOAD: a background vLLM engine generates for the run's first $SEQHOOKS_TEST_BACKGROUND_LOAD minutes" >&2
  "$PY" -m tests.support.background_load --minutes "$SEQHOOKS_TEST_BACKGROUND_LOAD" &
  LOAD_PID=$!
  trap 'kill "$LOAD_PID" 2>/dev/null' EXIT
fi
LANES=${SEQHOOKS_TEST_LANES:-2}
[ "$#" -gt 0 ] && LANES=1
LANE2_032_FILES=(tests/test_ray.py tests/test_wheel.py tests/test_verl.py tests/test_gpu_timed_grid.py)
mkdir -p .test-times
# vLLM 0.33 (scripts/test_vllm033.sh, in .venv033: scripts/setup_vllm033.sh);
# SEQHOOKS_NO_VLLM033=1 leaves it out (said, not silent).
run_vllm033() {
  # (built here the first time: about a minute, 4 GB; not by setup.sh, which
  # users run to install)
  if [ -x "${VENV033:-.venv033}/bin/python" ] || bash scripts/setup_vllm033.sh; then
    bash scripts/test_vllm033.sh "$@"
  else
    echo "test.sh: building the vLLM 0.33 test venv failed" >&2
    return 1
  fi
}
# The second lane: the 0.33 part, then LANE2_032_FILES on 0.32.
second_lane() {
  local lane_status=0
  run_vllm033 || lane_status=$?
  SEQHOOKS_TEST_STARTUP_LOG=$PWD/.test-times/startups-vllm032-lane2.log
  : > "$SEQHOOKS_TEST_STARTUP_LOG"
  SEQHOOKS_TEST_STARTUP_LOG=$SEQHOOKS_TEST_STARTUP_LOG SEQHOOKS_TEST_TABLE=.test-times/vllm032-lane2.md \
    "$PY" -m pytest "${LANE2_032_FILES[@]}" --durations=10 || lane_status=$?
  return "$lane_status"
}
LANE_PID=
LANE1_IGNORES=()
if [ "${SEQHOOKS_NO_VLLM033:-}" = "1" ]; then
  echo "test.sh: SEQHOOKS_NO_VLLM033=1: the vLLM 0.33 tests were NOT run" >&2
elif [ "$LANES" = "2" ]; then
  export OMP_NUM_THREADS=1
  echo "test.sh: a second lane runs the vLLM 0.33 part, then ${LANE2_032_FILES[*]} (output: .test-times/vllm033.log, printed at the end)" >&2
  second_lane > .test-times/vllm033.log 2>&1 &
  LANE_PID=$!
  for f in "${LANE2_032_FILES[@]}"; do LANE1_IGNORES+=("--ignore=$f"); done
fi
PYTHON="$PY" bash scripts/upstream_conformance.sh || status=$?
# Each test file's seconds and engine / vllm serve start-ups, printed at the
# end of each pytest run and kept in .test-times/ (tests/support/startup_log.py).
export SEQHOOKS_TEST_STARTUP_LOG=$PWD/.test-times/startups-vllm032.log
: > "$SEQHOOKS_TEST_STARTUP_LOG"
SEQHOOKS_TEST_TABLE=.test-times/vllm032.md "$PY" -m pytest tests "${LANE1_IGNORES[@]}" --durations=30 "$@" || status=$?
if [ -n "$LANE_PID" ]; then
  wait "$LANE_PID" || status=$?
  echo "=== test.sh: the second lane: the vLLM 0.33 part, then ${LANE2_032_FILES[*]} on 0.32 (.test-times/vllm033.log) ==="
  cat .test-times/vllm033.log
elif [ "${SEQHOOKS_NO_VLLM033:-}" != "1" ]; then
  run_vllm033 "$@" || status=$?
fi
exit "$status"
