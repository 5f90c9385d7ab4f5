#!/usr/bin/env bash
# The vLLM 0.33 part of the test suite (scripts/test.sh runs it after the
# 0.32 suite), in the 0.33 test venv that scripts/setup_vllm033.sh builds
# (.venv033, or $VENV033; a test-only arrangement, see docs/install.md):
# vLLM 0.33.0's own scheduler tests against the hook scheduler
# (scripts/upstream_conformance.sh), then, in one pytest run, the project's
# tests that are not marked slow and reach vLLM (surgical scheduler,
# speculative, splice, ...; the pure ones ran on 0.32 and cannot differ) and
# the end-to-end tests through LLM and `vllm serve` listed in
# tests/support/version_scope.py (pause, resume, sleep and aborts with
# families in flight included; vLLM's request features with families,
# docs/request_features.md's rows; the verl agent loop against ThreadWeaver's
# client loop and verl's server between steps). Both always run; the exit
# status is non-zero if either fails (pytest's 5 included). Extra arguments
# go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV033=${VENV033:-.venv033}
PY=$VENV033/bin/python
[ -x "$PY" ] || { echo "test_vllm033.sh: $PY not found; run scripts/setup_vllm033.sh first" >&2; exit 1; }
status=0
PYTHON="$PY" bash scripts/upstream_conformance.sh || status=$?
# (not the tests that reach no vLLM: they ran on 0.32 and cannot differ here,
# the same torch and transformers: tests/support/version_scope.py)
mkdir -p .test-times
export SEQHOOKS_TEST_STARTUP_LOG=$PWD/.test-times/startups-vllm033.log
: > "$SEQHOOKS_TEST_STARTUP_LOG"
# One pytest run: the tests that reach vLLM and are not slow, and the
# end-to-end ones listed in tests/support/version_scope.py.
SEQHOOKS_TEST_TABLE=.test-times/vllm033.md \
  "$PY" -m pytest tests -m "(not slow and not vllm_independent) or every_release" \
  --durations=15 "$@" || status=$?
exit "$status"
