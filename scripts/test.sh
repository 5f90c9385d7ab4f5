#!/usr/bin/env bash
# The whole test suite (the README's test command; .ci/run runs it after
# scripts/setup.sh): the project's tests, then vLLM 0.32.0's own scheduler
# tests against the hook scheduler (scripts/upstream_conformance.sh; it
# downloads vLLM's source distribution once, into ~/.cache).
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || { echo "test.sh: $PY not found; run ./scripts/setup.sh first" >&2; exit 1; }
"$PY" -m pytest tests "$@"
PYTHON="$PY" bash scripts/upstream_conformance.sh
