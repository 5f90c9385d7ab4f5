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
    for config in ("native", "python", "pairwise", "filed", "arrival", "loop"):
        p = point[config]
        assert p["correct"], config
        assert p["scheduler_us_per_step"]["median"] > 0, config
        assert p["reorder_us_per_step"]["median"] > 0, config
        assert p["requests_per_step"]["median"] > 1, config
    for ratio in ("native family reorder / pairwise", "python family reorder / pairwise",
                  "native family reorder / filed", "pairwise family reorder / filed"):
        assert point[ratio]["median"] > 0, ratio
    md = (tmp_path / "engine_step.md").read_text()
    assert "--profile smoke" in md and "Family grouping" in md
    assert "native / pairwise" in md and "native / filed" in md


def _apply(ids, swaps):
    ids = list(ids)
    for i, j in swaps:
        ids[i], ids[j] = ids[j], ids[i]
    return ids


def test_the_filed_grouping_orders_families_by_their_first_member():
    from benchmarks.filed_grouping import grouping_swaps_as_filed
    from vllm_seqhooks.core.request_tree import CHILD_ID_MARKER as M

    batch = ["a", "b", "c", f"a{M}0", f"b{M}0", f"c{M}0", f"a{M}1", f"b{M}0{M}0", f"c{M}1"]
    swaps = grouping_swaps_as_filed(batch)
    assert _apply(batch, swaps) == [
        "a", f"a{M}0", f"a{M}1", "b", f"b{M}0", f"b{M}0{M}0", "c", f"c{M}0", f"c{M}1"]
    assert grouping_swaps_as_filed(_apply(batch, swaps)) == []
    assert grouping_swaps_as_filed(["x", "y", "z"]) == []


def test_the_filed_grouping_keeps_every_request_on_random_batches():
    import random

    from benchmarks.filed_grouping import grouping_swaps_as_filed
    from vllm_seqhooks.core.batch_order import family_of
    from vllm_seqhooks.core.request_tree import CHILD_ID_MARKER as M

    rng = random.Random(7)
    for _ in range(200):
        batch = [f"f{rng.randrange(6)}{M}{k}" if rng.random() < 0.7 else f"p{k}"
                 for k in range(rng.randrange(1, 30))]
        grouped = _apply(batch, grouping_swaps_as_filed(batch))
        assert sorted(grouped) == sorted(batch)
        families = [family_of(r) for r in grouped]
        runs = [f for k, f in enumerate(families) if k == 0 or families[k - 1] != f]
        assert len(runs) == len(set(runs))  # every family one run
        assert runs == list(dict.fromkeys(family_of(r) for r in batch))  # first-member order
        for f in set(runs):  # members keep their order
            assert [r for r in grouped if family_of(r) == f] == \
                [r for r in batch if family_of(r) == f]


def test_trained_step_runs_native_and_both_loops(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.trained_step", "--prompts", "4", "--repeats", "1",
         "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    results = json.loads((tmp_path / "trained_step.json").read_text())
    assert results["correct"] == 4  # the trained model solves them natively
    for config in ("native", "loop", "loop_b"):
        p = results[config]
        assert p["same_text"], config  # the loop computes native's text
        assert p["scheduler_us_per_request_step"]["median"] > 0, config
        assert p["requests_per_step"]["median"] > 1, config  # batched
    # Native's fork/join work is in its scheduler; each loop's own work is
    # added to its scheduler time in the second column.
    assert (results["native"]["with_client_us_per_request_step"]
            == results["native"]["scheduler_us_per_request_step"])
    for loop in ("loop", "loop_b"):
        assert (results[loop]["with_client_us_per_request_step"]["median"]
                > results[loop]["scheduler_us_per_request_step"]["median"])
    assert results["native / loop"]["median"] > 0
    assert results["native / loop, loop's own work included"]["median"] > 0
    md = (tmp_path / "trained_step.md").read_text()
    assert "native / loop" in md and "A/A control" in md and "with the loop's own work" in md
