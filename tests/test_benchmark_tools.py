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


def test_verl_rollout_overrides_read_their_values_as_yaml_and_reject_a_bare_key():
    import pytest

    from benchmarks import verl_rollout

    key = "actor_rollout_ref.rollout.engine_kwargs.vllm"
    assert verl_rollout._override(f"{key}.max_num_seqs=64") == (f"{key}.max_num_seqs", 64)
    assert verl_rollout._override(f"{key}.distributed_executor_backend=uni") == (
        f"{key}.distributed_executor_backend", "uni")
    for bad in ("no_value", "=64"):
        with pytest.raises(SystemExit) as exit_:  # (argparse's usage error, before verl)
            verl_rollout.main(["--override", bad])
        assert exit_.value.code == 2
