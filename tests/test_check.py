"""``python -m vllm_seqhooks.check``'s table. (The check itself runs from the
installed wheel: ``tests/test_wheel.py``.)"""

from __future__ import annotations

import pytest

def test_table_format():
    from vllm_seqhooks.check import Result, format_table

    text = format_table([Result("a", "x", True), Result("bb", "yy", False, "why")], "head")
    assert text.splitlines() == [
        "head",
        "config  check  result",
        "a       x      PASS",
        "bb      yy     FAIL  (why)",
        "1 passed, 1 failed",
    ]
