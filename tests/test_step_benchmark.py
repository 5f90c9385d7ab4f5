"""``python -m benchmarks.step``: every workload runs each of its
configurations, does the work it claims and reports it (no timing
asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.step.harness import Options

ROOT = Path(__file__).resolve().parents[1]


def test_scheduler_workload_measures_and_reports_every_configuration():
    from benchmarks.step import scheduler

    results = scheduler.run(Options(sizes=[20], repeats=1, steps=30), log=lambda _: None)
    point = results["points"]["20"]
    assert set(point) == set(scheduler.CONFIGS)
    for config, p in point.items():
        assert p["us_per_step"]["median"] > 0 and p["scheduled_per_step"]["median"] > 0, config
    # Plain configurations keep every request running; the families'
    # parents are parked (only the children run).
    assert point["stock"]["scheduled_per_step"]["median"] == 20
    assert point["families"]["scheduled_per_step"]["median"] == 16
    # The timed steps of `cycles` spawn and join (not only decode).
    assert point["cycles"]["joins_per_step"]["median"] > 0
    assert point["cycles-v2"]["joins_per_step"]["median"] > 0
    text = scheduler.report(results, "python -m benchmarks.step --workload scheduler", {})
    assert "cycles / stock" in text and "stock-cycles" in text
    assert "`benchmarks/step/scheduler.py`" in text


def test_stock_cycles_client_does_the_same_rounds():
    """The client over stock vLLM's scheduler takes its families through
    the same rounds as the hook scheduler: each round adds 4 children and
    one continuation."""
    from benchmarks.step import scheduler
    from benchmarks.step.harness import timed_step

    h = scheduler.harness("stock-cycles", 10)
    client = scheduler.StockCycles(h, 10)
    for _ in range(400):
        timed_step(h, client)
        if all(r >= scheduler.ROUNDS for r in client.rounds.values()):
            break
    assert all(r == scheduler.ROUNDS for r in client.rounds.values())
    n = len(client.rounds)
    children = [rid for rid in h.scripts if "#" in rid]
    assert len(children) == n * scheduler.ROUNDS * scheduler.CHILDREN


def test_fair_share_workload_measures_both_sides_alike():
    """The configurations run the same batch to its end; fair share works
    out a share in the timed steps (its own time is measured) and, the batch
    being given at once, preempts nothing; fair share off spends nothing
    there."""
    from benchmarks.step import fair_share

    point = {c: fair_share.measure(c, 8) for c in ("fair-share", "no-fair-share")}
    families = 2 * 8
    for config, p in point.items():
        # every family's root, children and continuation were scheduled
        assert p["scheduled_per_step"] * p["steps"] > families * (1 + fair_share.CHILDREN)
    assert point["fair-share"]["fair_share_us_per_step"] > 0
    assert point["fair-share"]["preemptions"] == 0
    assert point["no-fair-share"]["fair_share_us_per_step"] == 0
    point["no-fair-share-b"] = point["no-fair-share"]
    points = {"8": {c: {k: {"median": v} for k, v in p.items()} for c, p in point.items()}}
    text = fair_share.report({"repeats": 1, "points": points},
                             "python -m benchmarks.step --workload fair_share", {})
    assert "| 8 |" in text and "fair-share / no-fair-share" in text


def test_the_page_names_the_command_that_regenerates_it():
    from benchmarks.step.__main__ import command, options

    def cmd(*argv: str) -> str:
        return command(options(list(argv)))

    assert cmd("--workload", "scheduler", "--sizes", "64", "256", "--out", "x") == (
        "python -m benchmarks.step --workload scheduler --sizes 64 256 --repeats 5 --steps 40")
    assert cmd("--workload", "engine", "--sizes", "3", "--profile", "smoke",
               "--cache-dir", "y") == (
        "python -m benchmarks.step --workload engine --sizes 3 --repeats 5 --profile smoke")
    assert cmd("--workload", "trained", "--repeats", "15") == (
        "python -m benchmarks.step --workload trained --sizes 96 --repeats 15")
    assert cmd("--workload", "fair_share") == (
        "python -m benchmarks.step --workload fair_share --sizes 64 256 512 --repeats 5")


def test_an_option_the_workload_does_not_read_is_refused():
    from benchmarks.step.__main__ import options

    with pytest.raises(SystemExit):
        options(["--workload", "trained", "--steps", "10"])
    with pytest.raises(SystemExit):
        options(["--workload", "scheduler", "--profile", "smoke"])


def _run(tmp_path: Path, *argv: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.step", *argv, "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads((tmp_path / f"step_{argv[1]}.json").read_text())


@pytest.mark.slow
def test_engine_workload_runs_every_configuration(tmp_path):
    results = _run(tmp_path, "--workload", "engine", "--profile", "smoke", "--sizes", "3",
                   "--repeats", "1", "--cache-dir", str(tmp_path / "models"))
    point = results["points"]["3"]
    for config in ("native", "arrival", "loop"):
        p = point[config]
        assert p["correct"], config  # the scripted tokens, on every engine
        assert p["scheduler_us_per_step"]["median"] > 0, config
        assert p["reorder_us_per_step"]["median"] > 0, config
        assert p["requests_per_step"]["median"] > 1, config
    assert point["native/loop per request-step"]["median"] > 0
    assert point["family grouping us per step"]["median"] > 0
    md = (tmp_path / "step_engine.md").read_text()
    assert "--workload engine --sizes 3 --repeats 1 --profile smoke" in md
    assert "family grouping µs per step" in md


@pytest.mark.slow
def test_trained_workload_runs_native_and_both_loops(tmp_path):
    results = _run(tmp_path, "--workload", "trained", "--sizes", "4", "--repeats", "1")
    point = results["points"]["4"]
    assert point["correct"] == 4  # the trained model solves them natively
    for config in ("native", "loop", "loop_b"):
        p = point[config]
        assert p["same_text"], config  # the loop computes native's text
        assert p["scheduler_us_per_request_step"]["median"] > 0, config
        assert p["requests_per_step"]["median"] > 1, config  # batched
    # Native's fork/join work is in its scheduler; each loop's own work is
    # added to its scheduler time in the second column.
    assert (point["native"]["with_client_us_per_request_step"]
            == point["native"]["scheduler_us_per_request_step"])
    for loop in ("loop", "loop_b"):
        assert (point[loop]["with_client_us_per_request_step"]["median"]
                > point[loop]["scheduler_us_per_request_step"]["median"])
    assert point["native / loop"]["median"] > 0
    assert point["native / loop, loop's own work included"]["median"] > 0
    md = (tmp_path / "step_trained.md").read_text()
    assert "native / loop" in md and "A/A control" in md and "with the loop's own work" in md
