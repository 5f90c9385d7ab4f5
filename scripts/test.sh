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
# Three lanes (SEQHOOKS_TEST_LANES, default 3), every process on one OpenMP
# thread (two lanes of torch's thread per core spun against each other):
# the first runs vLLM 0.32's scheduler suite, then the 0.32 tests but those
# below; the second the vLLM 0.33 part; the third LANE3_032_FILES on 0.32
# (Ray clusters, the wheel's installs, verl's example, the GPU-timed grid's
# servers, the documented commands). Then each lane takes the next unit of
# SHARED_032_UNITS no other lane has taken, until none is left: a unit goes
# to whichever lane is free first, which differs by host (2026-12-03: the
# third lane ended 580 s before the second, which then ran the first unit
# alone; on slower hosts Ray's start-ups made the third the last). The
# second and third lanes' output goes to .test-times/vllm033.log and
# .test-times/lane3.log, printed when all are done. Measured on 2026-12-01
# (docs/testing.md): two lanes left the CPU 17 %
# idle, three with the first lane's files unmoved left it half idle for the
# last 9 minutes, while the first lane finished alone. SEQHOOKS_TEST_LANES=2
# runs the 0.33 part, then LANE2_032_FILES, beside the rest; =1 runs
# everything in one lane, one part after the other (torch's own thread
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
LANES=${SEQHOOKS_TEST_LANES:-3}
[ "$#" -gt 0 ] && LANES=1
# 0.32 files that run outside the first lane's own pytest run: with two
# lanes, LANE2_032_FILES after the 0.33 part; with three, LANE3_032_FILES in
# the third lane and SHARED_032_UNITS (each a pytest run of its files, the
# largest first; none uses the engine-mode workers, which a pytest session
# starts for itself) in whichever lanes are free (sizes from the per-file
# tables). Small units, so that every lane, the first included, takes some
# and the lanes end close together (docs/testing.md, "How long it takes").
LANE2_032_FILES=(tests/test_ray.py tests/test_wheel.py tests/test_verl.py tests/test_gpu_timed_grid.py)
LANE3_032_FILES=("${LANE2_032_FILES[@]}" tests/test_docs_commands.py)
SHARED_032_UNITS=("tests/test_llm_entrypoint.py tests/test_benchmarks_smoke.py"
                  "tests/test_serve_multi.py"
                  "tests/test_readme_snippets.py tests/test_spmd.py"
                  "tests/test_step_benchmark.py"
                  "tests/test_request_features_reasoning.py")
# (unit I is taken by the lane that creates $SHARED_CLAIMS/I first: mkdir is atomic)
SHARED_CLAIMS=.test-times/shared-032-claims
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
# 0.32 files outside the first lane (LANE_NAME, then the files), with their
# own table and start-up log in .test-times/.
lane_032_files() {
  local name=$1
  shift
  local SEQHOOKS_TEST_STARTUP_LOG=$PWD/.test-times/startups-vllm032-$name.log
  : > "$SEQHOOKS_TEST_STARTUP_LOG"
  SEQHOOKS_TEST_STARTUP_LOG=$SEQHOOKS_TEST_STARTUP_LOG SEQHOOKS_TEST_TABLE=.test-times/vllm032-$name.md \
    "$PY" -m pytest "$@" --durations=10
}
# Each unit of SHARED_032_UNITS no other lane has taken (the lane's name:
# first, second or third).
shared_units() {
  local lane_status=0 i
  for i in "${!SHARED_032_UNITS[@]}"; do
    if mkdir "$SHARED_CLAIMS/$i" 2>/dev/null; then
      echo "test.sh: the $1 lane runs ${SHARED_032_UNITS[$i]}"
      # shellcheck disable=SC2086  # (the unit's files, split at spaces)
      lane_032_files "shared$i" ${SHARED_032_UNITS[$i]} || lane_status=$?
    fi
  done
  return "$lane_status"
}
# The second lane: the 0.33 part, then the given 0.32 files (two lanes) or
# the shared units (three).
second_lane() {
  local lane_status=0
  run_vllm033 || lane_status=$?
  if [ "$#" -gt 0 ]; then
    lane_032_files lane2 "$@" || lane_status=$?
  else
    shared_units second || lane_status=$?
  fi
  return "$lane_status"
}
# The third lane: LANE3_032_FILES, then the shared units.
third_lane() {
  local lane_status=0
  lane_032_files lane3 "${LANE3_032_FILES[@]}" || lane_status=$?
  shared_units third || lane_status=$?
  return "$lane_status"
}
LANE_PIDS=()
LANE_LOGS=()
LANE1_IGNORES=()
SHARE_UNITS=  # (three lanes: the first lane takes shared units too)
if [ "${SEQHOOKS_NO_VLLM033:-}" = "1" ]; then
  echo "test.sh: SEQHOOKS_NO_VLLM033=1: the vLLM 0.33 tests were NOT run" >&2
elif [ "$LANES" = "2" ] || [ "$LANES" = "3" ]; then
  export OMP_NUM_THREADS=1
  if [ "$LANES" = "3" ]; then
    echo "test.sh: a second lane runs the vLLM 0.33 part (.test-times/vllm033.log); a third ${LANE3_032_FILES[*]} (.test-times/lane3.log); then each lane the shared units no other has taken: ${SHARED_032_UNITS[*]}; the lanes' output printed at the end" >&2
    rm -rf "$SHARED_CLAIMS"
    mkdir -p "$SHARED_CLAIMS"
    SHARE_UNITS=1
    second_lane > .test-times/vllm033.log 2>&1 &
    LANE_PIDS+=($!); LANE_LOGS+=(.test-times/vllm033.log)
    third_lane > .test-times/lane3.log 2>&1 &
    LANE_PIDS+=($!); LANE_LOGS+=(.test-times/lane3.log)
    # shellcheck disable=SC2206  # (the units' files, split at spaces)
    OUTSIDE=("${LANE3_032_FILES[@]}" ${SHARED_032_UNITS[*]})
  else
    echo "test.sh: a second lane runs the vLLM 0.33 part, then ${LANE2_032_FILES[*]} (output: .test-times/vllm033.log, printed at the end)" >&2
    second_lane "${LANE2_032_FILES[@]}" > .test-times/vllm033.log 2>&1 &
    LANE_PIDS+=($!); LANE_LOGS+=(.test-times/vllm033.log)
    OUTSIDE=("${LANE2_032_FILES[@]}")
  fi
  for f in "${OUTSIDE[@]}"; do LANE1_IGNORES+=("--ignore=$f"); done
elif [ "$LANES" != "1" ]; then
  echo "test.sh: SEQHOOKS_TEST_LANES=$LANES: expected 1, 2 or 3" >&2
  exit 2
fi
PYTHON="$PY" bash scripts/upstream_conformance.sh || status=$?
# Each test file's seconds and engine / vllm serve start-ups, printed at the
# end of each pytest run and kept in .test-times/ (tests/support/startup_log.py).
export SEQHOOKS_TEST_STARTUP_LOG=$PWD/.test-times/startups-vllm032.log
: > "$SEQHOOKS_TEST_STARTUP_LOG"
SEQHOOKS_TEST_TABLE=.test-times/vllm032.md "$PY" -m pytest tests "${LANE1_IGNORES[@]}" --durations=30 "$@" || status=$?
if [ -n "${SHARE_UNITS:-}" ]; then
  shared_units "first" || status=$?
fi
if [ "${#LANE_PIDS[@]}" -gt 0 ]; then
  for i in "${!LANE_PIDS[@]}"; do
    wait "${LANE_PIDS[$i]}" || status=$?
    echo "=== test.sh: lane $((i + 2)) (${LANE_LOGS[$i]}) ==="
    cat "${LANE_LOGS[$i]}"
  done
elif [ "${SEQHOOKS_NO_VLLM033:-}" != "1" ]; then
  run_vllm033 "$@" || status=$?
fi
exit "$status"
