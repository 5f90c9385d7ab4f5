"""The suite's inventory: every test function of ``tests/test_*.py``, and
where the checks of a test that was merged or removed now live
(``docs/test_inventory.md``; issue 51: tests may merge, nothing is dropped
silently).

The page has two parts. "Tests" (its last section) lists each file with its test functions
(found by parsing the files: ``def test_...`` at module level).
"Merged or removed" has one line per test that no longer exists:
``- tests/test_a.py::test_old -> tests/test_b.py::test_new: why``, where
the target must exist. ``tests/test_inventory.py`` fails when the page and
the files disagree; ``python -m tests.support.suite_inventory --write``
rewrites the "Tests" part from the files (the other part is written by
hand).
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "test_inventory.md"
TESTS_HEADING = "## Tests"
MOVED_HEADING = "## Merged or removed"
_MOVED = re.compile(r"^- (?P<old>tests/\S+::\w+) -> (?P<new>tests/\S+::\w+): \S")


def functions_by_file(root: Path = ROOT) -> dict[str, list[str]]:
    """Each test file (relative path) and its module-level test functions,
    in file order."""
    found: dict[str, list[str]] = {}
    for path in sorted((root / "tests").glob("test_*.py")):
        tree = ast.parse(path.read_text())
        names = [node.name for node in tree.body
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and node.name.startswith("test_")]
        found[str(path.relative_to(root))] = names
    return found


def listing(found: dict[str, list[str]]) -> str:
    lines = [TESTS_HEADING, ""]
    for path, names in found.items():
        lines.append(f"### `{path}` ({len(names)})")
        lines.append("")
        lines.extend(f"- `{name}`" for name in names)
        lines.append("")
    return "\n".join(lines)


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end < 0 else text[start:end + 1]


def moved(text: str) -> dict[str, str]:
    """The "Merged or removed" lines: old test id -> where its checks live."""
    out = {}
    for line in _section(text, MOVED_HEADING).splitlines():
        m = _MOVED.match(line)
        if m:
            out[m["old"]] = m["new"]
    return out


def problems(text: str, found: dict[str, list[str]]) -> list[str]:
    """Where the page and the files disagree (empty when they agree)."""
    out = []
    if _section(text, TESTS_HEADING).strip() != listing(found).strip():
        out.append("the 'Tests' part differs from the files: run "
                   "`python -m tests.support.suite_inventory --write`, and list any "
                   "test that disappeared under 'Merged or removed'")
    existing = {f"{path}::{name}" for path, names in found.items() for name in names}
    for old, new in moved(text).items():
        if old in existing:
            out.append(f"{old} is listed as merged or removed but still exists")
        if new not in existing:
            out.append(f"{old} -> {new}: {new} does not exist")
    return out


def removed_since(before: str, found: dict[str, list[str]]) -> list[str]:
    """Tests the page's 'Tests' part ``before`` lists that the files no
    longer have."""
    listed = set()
    path = None
    for line in _section(before, TESTS_HEADING).splitlines():
        if line.startswith("### `"):
            path = line.split("`")[1]
        elif line.startswith("- `") and path:
            listed.add(f"{path}::{line.split('`')[1]}")
    existing = {f"{p}::{n}" for p, names in found.items() for n in names}
    return sorted(listed - existing)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true",
                    help=f"rewrite the 'Tests' part of {PAGE.relative_to(ROOT)} from the files")
    args = ap.parse_args(argv)
    text = PAGE.read_text()
    found = functions_by_file()
    if args.write:
        gone = [old for old in removed_since(text, found) if old not in moved(text)]
        PAGE.write_text(text[:text.index(TESTS_HEADING)] + listing(found))
        for old in gone:
            print(f"{old}: gone; say where its checks live under '{MOVED_HEADING}'")
    for problem in problems(PAGE.read_text(), found):
        print(problem, file=sys.stderr)
    return 1 if problems(PAGE.read_text(), found) else 0


if __name__ == "__main__":
    sys.exit(main())
