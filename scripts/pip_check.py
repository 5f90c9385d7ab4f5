"""`pip check` of this interpreter's environment, less what
scripts/pip_check_known.txt accepts (and says why).

    .venv/bin/python scripts/pip_check.py      # exit 0: nothing else unmet

Prints every line pip check reports, each marked "known" or "UNEXPECTED",
and exits 1 when any is unexpected (or pip check fails otherwise). pip check
runs without PYTHONPATH: it reads every distribution on sys.path, and the
side directories the tests put there (.verl, .triton) are not the venv's.
Used by scripts/setup.sh (its last check) and tests/test_venv.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

KNOWN_FILE = Path(__file__).resolve().with_name("pip_check_known.txt")
_MISSING = re.compile(r"^(\S+) \S+ requires (\S+), which is not installed\.$")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def known_pairs(path: Path = KNOWN_FILE) -> set[tuple[str, str]]:
    """The accepted (distribution, missing requirement) pairs."""
    pairs = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            dist, req = line.split()
            pairs.add((_norm(dist), _norm(req)))
    return pairs


def classify(output: str, known: set[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """pip check's lines split into (known, unexpected)."""
    ok, bad = [], []
    for line in output.splitlines():
        line = line.strip()
        if not line or line == "No broken requirements found.":
            continue
        m = _MISSING.match(line)
        (ok if m and (_norm(m[1]), _norm(m[2])) in known else bad).append(line)
    return ok, bad


def run(python: str = sys.executable) -> tuple[int, str]:
    """pip check's exit status and output, for ``python``'s environment."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([python, "-m", "pip", "check"], capture_output=True, text=True,
                          env=env)
    return proc.returncode, proc.stdout + proc.stderr


def main() -> int:
    status, output = run()
    ok, bad = classify(output, known_pairs())
    for line in ok:
        print(f"   known: {line}")
    for line in bad:
        print(f"   UNEXPECTED: {line}")
    if status not in (0, 1) or (status == 1 and not (ok or bad)):
        print(f"pip check failed (exit status {status}):\n{output}", file=sys.stderr)
        return 1
    if bad:
        print(f"pip check: {len(bad)} unexpected line(s); {KNOWN_FILE.name} lists what is accepted",
              file=sys.stderr)
        return 1
    print(f"pip check: nothing unmet besides the {len(ok)} known line(s) ({KNOWN_FILE.name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
