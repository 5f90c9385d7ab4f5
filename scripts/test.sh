#!/usr/bin/env bash
# The whole test suite (the README's test command; .ci/run runs it after
# scripts/setup.sh): vLLM 0.32.0's own scheduler tests against the hook
# scheduler (scripts/upstream_conformance.sh; it downloads vLLM's source
# distribution once, into ~/.cache), then the project's tests. Both always
# run; the exit status is non-zero if either fails (pytest's 5, "no tests
# collected", included). Extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || { echo "test.sh: $PY not found; run ./scripts/setup.sh first" >&2; exit 1; }
status=0
PYTHON="$PY" bash scripts/upstream_conformance.sh || status=$?
"$PY" -m pytest tests "$@" || status=$?
exit "$status"
