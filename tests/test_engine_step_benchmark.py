"""``benchmarks/engine_step``: every configuration runs on real engines,
computes the scripted tokens, and each timed part is measured (no timing
asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def test_engine_step_runs_every_configuration(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.engine_step", "--profile", "smoke",
         "--families", "3", "--repeats", "1", "--out", str(tmp_path),
         "--cache-dir", str(tmp_path / "models")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    results = json.loads((tmp_path / "engine_step.json").read_text())
    point = results["points"]["3"]
    for config in ("native", "python", "pairwise", "arrival", "loop"):
        p = point[config]
        assert p["correct"], config
        assert p["scheduler_us_per_step"]["median"] > 0, config
        assert p["reorder_us_per_step"]["median"] > 0, config
        assert p["requests_per_step"]["median"] > 1, config
    assert point["native family reorder / pairwise"]["median"] > 0
    assert point["python family reorder / pairwise"]["median"] > 0
    md = (tmp_path / "engine_step.md").read_text()
    assert "--profile smoke" in md and "Family grouping" in md and "native / pairwise" in md
