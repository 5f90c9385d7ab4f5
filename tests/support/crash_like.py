"""Test-only: what in a script's output looks like a crash, said where it is.

A script that exits 0 can still have crashed on its way out (a traceback
logged at shutdown, vLLM killing an engine process that did not stop in
time); the tests of examples and documented commands fail on these strings
and show where the first one is (the output's end alone may not hold it:
seen 2026-12-02, a documented command under load)."""

from __future__ import annotations

CRASH_LIKE = ("Traceback", "exited unexpectedly", "force killing")


def crash_like(output: str, context: int = 1500) -> str:
    """"" when ``output`` holds none of :data:`CRASH_LIKE`; else which it
    holds and the output around the first."""
    found = [c for c in CRASH_LIKE if c in output]
    if not found:
        return ""
    at = min(output.index(c) for c in found)
    return (f"crash-like output {found} at character {at} of {len(output)}:\n"
            f"{output[max(0, at - context):at + context]}")
