"""``benchmarks/scheduler_step``: every configuration runs and does the work
it claims (no timing asserted)."""

from __future__ import annotations

from benchmarks import scheduler_step


def test_every_configuration_measured_and_reported():
    results = scheduler_step.run([20], repeats=1, steps=30, log=lambda _: None)
    point = results["points"]["20"]
    assert set(point) == set(scheduler_step.CONFIGS)
    for config, p in point.items():
        assert p["us_per_step"] > 0 and p["scheduled_per_step"] > 0, config
    # Plain configurations keep every request running; the families'
    # parents are parked (only the children run).
    assert point["stock"]["scheduled_per_step"] == 20
    assert point["families"]["scheduled_per_step"] == 16
    # The timed steps of `cycles` spawn and join (not only decode).
    assert point["cycles"]["joins_per_step"] > 0
    assert point["cycles-v2"]["joins_per_step"] > 0
    text = scheduler_step.report(results, "cmd")
    assert "cycles / stock" in text and "stock-cycles" in text


def test_client_loop_does_the_same_rounds():
    """The stock client loop's families go through the same rounds as the
    hook scheduler's: each round adds 4 children and one continuation."""
    h = scheduler_step._harness("stock-cycles", 10)
    client = scheduler_step._ClientLoop(h, 10)
    for _ in range(400):
        scheduler_step._one_step(h, client)
        if all(r >= scheduler_step.ROUNDS for r in client.rounds.values()):
            break
    assert all(r == scheduler_step.ROUNDS for r in client.rounds.values())
    n = len(client.rounds)
    children = [rid for rid in h.scripts if "#" in rid]
    assert len(children) == n * scheduler_step.ROUNDS * scheduler_step.CHILDREN


def test_fair_share_step_measures_both_sides_alike():
    """``benchmarks/fair_share_step``: the three configurations run the same
    batch to its end; fair share works out a share in the timed steps (its
    own time is measured) and, the batch being given at once, preempts
    nothing; fair share off spends nothing there."""
    from benchmarks import fair_share_step

    point = {c: fair_share_step.measure(c, 8) for c in ("fair-share", "no-fair-share")}
    families = 2 * 8
    for config, p in point.items():
        # every family's root, children and continuation were scheduled
        assert p["scheduled_per_step"] * p["steps"] > families * (1 + fair_share_step.CHILDREN)
    assert point["fair-share"]["fair_share_us_per_step"] > 0
    assert point["fair-share"]["preemptions"] == 0
    assert point["no-fair-share"]["fair_share_us_per_step"] == 0
    point["no-fair-share-b"] = point["no-fair-share"]
    text = fair_share_step.report({"repeats": 1, "points": {"8": point}}, "cmd")
    assert "| 8 |" in text and "fair-share / no-fair-share" in text
