"""``python -m vllm_seqhooks.check``, the installation check a GPU user runs,
on this machine's defaults (CPU: the V1 runner): three real servers, every
row of its table passes."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_install_check_passes(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "vllm_seqhooks.check", "--problems", "12",
         "--log-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=1200)
    table = out.stdout
    assert out.returncode == 0, table + out.stderr[-3000:]
    rows = [line for line in table.splitlines() if line.endswith(("PASS", "FAIL")) or "  (" in line]
    assert not any(" FAIL" in r for r in rows), table
    for config, check in [("scripted", "continuation == fresh request"),
                          ("scripted", "nothing left allocated"),
                          ("trained", "answers correct"),
                          ("trained+ngram", "draft tokens verified"),
                          ("trained+ngram", "tokens == without speculation")]:
        assert any(r.startswith(config + " ") and check in r and "PASS" in r for r in rows), (
            config, check, table)
    assert table.strip().splitlines()[-1].endswith("0 failed")


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
