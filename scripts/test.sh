#!/usr/bin/env bash
# The whole test suite (the README's test command). Needs scripts/setup.sh first.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || { echo "test.sh: $PY not found; run ./scripts/setup.sh first" >&2; exit 1; }
"$PY" -m pytest tests "$@"
