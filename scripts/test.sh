#!/usr/bin/env bash
# The whole test suite (the README's test command; .ci/run runs it after
# scripts/setup.sh): vLLM 0.32.0's own scheduler tests against the hook
# scheduler (scripts/upstream_conformance.sh; it downloads vLLM's source
# distribution once, into ~/.cache), the project's tests, and the vLLM 0.33
# part (scripts/test_vllm033.sh: 0.33's own scheduler tests, the tests not
# marked slow and the end-to-end ones, in .venv033, which it builds the
# first time with scripts/setup_vllm033.sh). All always run; the exit status
# is non-zero if any fails (pytest's 5, "no tests collected", included).
#
# Two lanes run side by side (with two CPUs or more): the tests keep about
# one of two cores busy (measured over a sequential run: the CPU half idle),
# so the suite takes about the time of the longer lane. The second lane runs the vLLM 0.33 part
# and the files in SECOND_LANE, one after another: every test that starts
# engines with vLLM's default memory (the README's commands as pasted, the
# wheel's, verl's servers) or a Ray cluster is there, so that no two of them
# run at once. Its output is printed after the first lane's.
#
# Extra arguments go to pytest, and then everything runs in one lane (so
# that a path or -k selects what it says); SEQHOOKS_TEST_LANES=1 does the
# same without arguments.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || { echo "test.sh: $PY not found; run ./scripts/setup.sh first" >&2; exit 1; }

SECOND_LANE=(
  tests/test_readme_snippets.py tests/test_wheel.py tests/test_ray.py
  tests/test_verl.py tests/test_verl_between_steps.py
)

vllm033_part() {
  # SEQHOOKS_NO_VLLM033=1 leaves it out (said, not silent); .venv033 is
  # built here the first time (about a minute, 4 GB; not by setup.sh, which
  # users run to install).
  if [ "${SEQHOOKS_NO_VLLM033:-}" = "1" ]; then
    echo "test.sh: SEQHOOKS_NO_VLLM033=1: the vLLM 0.33 tests were NOT run" >&2
  elif [ -x "${VENV033:-.venv033}/bin/python" ] || bash scripts/setup_vllm033.sh; then
    bash scripts/test_vllm033.sh "$@"
  else
    echo "test.sh: building the vLLM 0.33 test venv failed" >&2
    return 1
  fi
}

cpus=$("$PY" -c 'import os; print(" ".join(map(str, sorted(os.sched_getaffinity(0)))))')
if [ $# -gt 0 ] || [ "${SEQHOOKS_TEST_LANES:-2}" = "1" ] || [ "$(wc -w <<<"$cpus")" -lt 2 ]; then
  status=0
  PYTHON="$PY" bash scripts/upstream_conformance.sh || status=$?
  "$PY" -m pytest tests --durations=30 "$@" || status=$?
  vllm033_part "$@" || status=$?
  exit "$status"
fi

second_log=$(mktemp -t seqhooks-second-lane.XXXXXX.log)
(
  # vLLM's CPU workers bind their OpenMP threads: by default ("auto", one
  # core kept for the scheduler) to the first core, in both lanes, where
  # they would take turns; the second lane's go to the last core. (Tests
  # that run several ranks bind them themselves.)
  export VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-${cpus##* }}
  lane_status=0
  vllm033_part || lane_status=$?
  "$PY" -m pytest "${SECOND_LANE[@]}" --durations=15 || lane_status=$?
  exit "$lane_status"
) >"$second_log" 2>&1 &
second_pid=$!
# (a background job ignores Ctrl-C: stop the second lane with the first)
kill_tree() { local child; for child in $(pgrep -P "$1"); do kill_tree "$child"; done
              kill -TERM "$1" 2>/dev/null; }
trap 'kill_tree "$second_pid"; exit 130' INT TERM

status=0
PYTHON="$PY" bash scripts/upstream_conformance.sh || status=$?
ignores=()
for file in "${SECOND_LANE[@]}"; do ignores+=(--ignore "$file"); done
"$PY" -m pytest tests "${ignores[@]}" --durations=30 || status=$?

echo "test.sh: first lane done (status $status); waiting for the second lane ($second_log)"
second_status=0
wait "$second_pid" || second_status=$?
echo "================ second lane: vLLM 0.33 part, then ${SECOND_LANE[*]} ================"
cat "$second_log"
echo "test.sh: second lane status $second_status"
rm -f "$second_log"
[ "$second_status" -eq 0 ] || status=$second_status
exit "$status"
