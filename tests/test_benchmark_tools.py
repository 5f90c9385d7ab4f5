"""The benchmark harness's own logic (no engine)."""

from __future__ import annotations

from benchmarks.common import interleaved


def _orders(configs, repeats):
    seen: list[str] = []
    interleaved(configs, repeats, lambda c, r: seen.append(c))
    n = len(configs)
    return [tuple(seen[i:i + n]) for i in range(0, len(seen), n)]


def test_two_configurations_alternate_which_runs_first():
    # A slow drift (warming caches, a neighbour's load) must not always
    # favour the same configuration.
    assert _orders(["native", "loop"], 4) == [
        ("native", "loop"), ("loop", "native"), ("native", "loop"), ("loop", "native")]


def test_every_configuration_runs_first_equally_often():
    configs = ["a", "b", "c", "d"]
    orders = _orders(configs, 8)
    assert all(sorted(o) == configs for o in orders)
    firsts = [o[0] for o in orders]
    assert all(firsts.count(c) == 2 for c in configs)
