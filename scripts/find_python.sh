# Sourced by the set-up scripts: PYTHON (as given, or python3.11, else
# python3), which must be Python 3.11 or 3.12; exits naming the script
# that sourced it otherwise.
_who=$(basename "$0")
PYTHON=${PYTHON:-}
if [ -z "$PYTHON" ]; then
  for cand in python3.11 python3; do
    if command -v "$cand" >/dev/null 2>&1; then PYTHON=$cand; break; fi
  done
fi
[ -n "$PYTHON" ] || { echo "$_who: no python3.11 / python3 found" >&2; exit 1; }
"$PYTHON" - <<'PY' || { echo "$_who: Python 3.11 or 3.12 is required" >&2; exit 1; }
import sys
sys.exit(0 if (3, 11) <= sys.version_info[:2] <= (3, 12) else 1)
PY
