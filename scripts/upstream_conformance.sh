#!/usr/bin/env bash
# Upstream conformance check (docs/conformance.md): runs the installed vLLM
# release's own scheduler tests (0.32.0 or 0.33.0; downloaded from the package
# index into a cache outside the repository) with vLLM's schedulers and with
# ours, and fails on any test that passes with vLLM's but not with ours, or
# when the download fails.
#
#   bash scripts/upstream_conformance.sh [run_conformance.py options] [test paths]
#   PYTHON=.venv033/bin/python bash scripts/upstream_conformance.sh   # vLLM 0.33
#
# Environment: PYTHON (default .venv/bin/python; its vLLM picks the release,
# --vllm-version overrides), SEQHOOKS_UPSTREAM_CACHE (cache directory),
# SEQHOOKS_VLLM_SDIST (a local vllm-VERSION.tar.gz).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
if ! command -v "$PYTHON" >/dev/null 2>&1 && [ ! -x "$PYTHON" ]; then
  echo "[upstream-conformance] ERROR: no Python at '$PYTHON' (set PYTHON=...; run scripts/setup.sh first)" >&2
  exit 2
fi
exec "$PYTHON" tests/upstream/run_conformance.py --python "$PYTHON" "$@"
