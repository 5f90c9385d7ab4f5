"""Sample logprobs with hooks (engine/logprob_rows.py), on both model
runners, sync and async: every output token carries a row at its place in the merged output;
a token a parent or a child sampled carries the logprob its sampler
computed, which equals vLLM's own score of that token in the context the
node was conditioned on (its per-call row: stock vLLM's prompt_logprobs
over context + response, and a transformers forward pass; after a splice
join, the transformers oracle with the isolated-path mask and shared
positions); a token the engine inserted carries 0.0, and the rollout rows
give it None."""

from __future__ import annotations

import gc
import math

import pytest

from tests.support.engine_modes import IN_PROCESS, MODES, ModeProcesses

pytestmark = pytest.mark.slow

GOAL = ("<Parallel>\n<Goal>\n<Outline>\n1: x\n</Outline>\n<Outline>\n2: y\n</Outline>\n</Goal>"
        "</Conclusion>\n</Parallel> done")
CASES = {
    "promise": ({"format": "promise", "merge_separator": ","},
                "ab<promise>xy</promise><promise>zw</promise>c<sync>done",
                {"0": "AAA", "1": "BBBB"}),
    # (a "text" merge: the children's tokens are re-tokenized in the parent)
    "threadweaver": ({"format": "threadweaver", "unclosed_child_stop_text": None},
                     "<Outlines>\n<Outline>1: a</Outline>\n<Outline>2: b</Outline>\n"
                     "</Outlines> done", {"0": " alpha</Thread>", "1": " beta"}),
    "multiverse-splice": ({"format": "multiverse", "max_child_depth": 1,
                           "fork_min_tokens": None}, GOAL, {"0": " p\n</Path>", "1": " q"}),
}
#: Each case on the V1 runner with sync scheduling; the splice case also
#: on V2 with async scheduling, vLLM's GPU default (V2 runs in Triton's
#: interpreter). (V1 with async scheduling: test_engine_modes and
#: test_splice_join cover its joins.)
RUNS = [(MODES[0], name) for name in CASES] + [(MODES[3], "multiverse-splice")]
RUN_IDS = [f"{m.id}-{n}" for m, n in RUNS]


@pytest.fixture(scope="module")
def families(request, tiny_model_dir):
    """(mode, case name) -> the family's run, of the runs this session
    selected: each mode's cases one engine after another in one process (an
    in-process engine starts in about a second, a process imports vLLM in
    about 12; the session's process of each mode, shared with the other
    files, :mod:`tests.support.mode_workers`), the modes' processes at once
    (``ModeProcesses``)."""
    selected = {item.callspec.id for item in request.session.items
                if item.originalname == "test_logprobs_with_hooks_are_the_models"}
    calls = {}
    for (mode, name), run_id in zip(RUNS, RUN_IDS):
        if run_id in selected:
            spec, script, children = CASES[name]
            calls.setdefault(mode, {})[name] = dict(spec=spec, script=script, children=children)
    processes = ModeProcesses({
        mode: ("tests.support.logprob_families:run_many",
               dict(model=tiny_model_dir, cases=cases)) for mode, cases in calls.items()},
        env=IN_PROCESS)
    yield lambda mode, name: processes.result(mode)[name]
    processes.close()


@pytest.fixture(scope="module")
def stock(tiny_model_dir):
    import vllm

    from tests.support.forkjoin import scripted_engine_kwargs
    from tests.support.torch_threads import one_torch_thread

    # (the scorers on one thread, beside the engine modes' processes, each
    # on one: see families)
    with pytest.MonkeyPatch.context() as mp, one_torch_thread():
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        llm = vllm.LLM(tiny_model_dir, **scripted_engine_kwargs(tiny_model_dir))
        yield llm
    del llm
    gc.collect()


def _scores(stock, calls) -> list[list[float]]:
    """Stock vLLM's logprob of each response token given what precedes it."""
    from vllm import SamplingParams

    outs = stock.generate([{"prompt_token_ids": c["context_ids"] + c["response_ids"]}
                           for c in calls], SamplingParams(max_tokens=1, prompt_logprobs=0),
                          use_tqdm=False)
    got = []
    for c, out in zip(calls, outs):
        ids = c["context_ids"] + c["response_ids"]
        got.append([out.prompt_logprobs[i][ids[i]].logprob
                    for i in range(len(c["context_ids"]), len(ids))])
    return got


@pytest.mark.parametrize(("mode", "name"), RUNS, ids=RUN_IDS)
def test_logprobs_with_hooks_are_the_models(mode, name, families, stock, tiny_model_dir):
    got = families(mode, name)
    assert not got["leftover"]
    tokens, rows, row = got["token_ids"], got["rows"], got["row"]
    assert len(rows) == len(tokens) == len(row["response_mask"])
    assert got["modes"] == ["splice" if name.endswith("splice") else "reprefill"]
    if name == "threadweaver":  # merged text re-tokenized: no child token in the row
        assert set(row["node_ids"]) == {""} and row["response_mask"].count(0) > 10
    for t, entry, lp, sampled in zip(tokens, rows, row["rollout_logprobs"],
                                     row["response_mask"]):
        assert str(t) in entry
        if sampled:
            assert lp == entry[str(t)]
        else:
            assert lp is None and entry[str(t)] == 0.0  # inserted
    assert math.isfinite(got["cumulative_logprob"])
    # What each node sampled, scored by stock vLLM in that node's context
    # (causal: after a splice join the parent's context is not, so only
    # its tokens before the fork are scored there).
    calls = got["calls"]
    if got["modes"] == ["splice"]:
        calls = [c for c in calls if c["node_id"] or c is calls[0]]
    scores = _scores(stock, calls)
    sampled_by: dict[str, list[float]] = {}
    for lp, m, n in zip(row["rollout_logprobs"], row["response_mask"], row["node_ids"]):
        if m:
            sampled_by.setdefault(n, []).append(lp)
    for node, lps in sampled_by.items():
        want = [s for c, sc in zip(calls, scores) if c["node_id"] == node for s in sc]
        lps = lps[:len(want)]  # (the parent's after a splice join: below)
        assert len(lps) >= 2
        assert max(abs(a - b) for a, b in zip(lps, want)) < 2e-4, _worst(node, lps, want, got)
    # per_call_rows carry each node's own logprobs, children's included
    # (also where a "text" merge re-tokenized them in the parent's row),
    # equal to stock vLLM's score and to a transformers forward pass of the
    # call's context (what a trainer recomputes)
    from tests.support import splice_oracle

    hf = splice_oracle.load(tiny_model_dir)
    for c, sc in zip(calls, scores):
        got_lps = c["rollout_logprobs"]
        assert len(got_lps) == len(sc) and None not in got_lps
        assert max(abs(a - b) for a, b in zip(got_lps, sc)) < 2e-4, _worst(c, got_lps, sc, got)
        ctx = c["context_ids"]
        want = splice_oracle.logprobs_after_join(hf, ctx, (len(ctx),), c["response_ids"])
        assert max(abs(a - b) for a, b in zip(got_lps, want)) < 2e-4, _worst(c, got_lps, want,
                                                                             got, "transformers")
    assert {c["node_id"] for c in calls} == {"", "0", "1"}
    if got["modes"] == ["splice"]:
        _after_splice_join_as_trained(got, tiny_model_dir)


def _worst(node, got_lps, want, got, scorer="stock vLLM") -> str:
    """A failed comparison's message: the node (or call), the token where
    the engine's logprob is farthest from ``scorer``'s, both values, and
    the thread count and CPUs of the engine's process and of this one (the
    scorer's), the first things to compare when a run differs."""
    from tests.support.logprob_families import process_state

    i = max(range(len(want)), key=lambda k: abs(got_lps[k] - want[k]))
    if isinstance(node, dict):
        node = (f"node {node['node_id']!r} context {len(node['context_ids'])} tokens, "
                f"response {node['response_ids']}")
    return (f"{node}: token {i}: engine {got_lps[i]!r} vs {scorer} {want[i]!r}; "
            f"engine process {got['process']}, scorer's process {process_state()}")


def _after_splice_join_as_trained(got, model_dir):
    """The parent's tokens after a splice join carry the logprobs a trainer
    computes with the isolated-path mask and shared positions (the
    transformers oracle of testing/splice_oracle.py), not the causal ones."""
    from vllm_seqhooks.core.splice_layout import Parallel
    from tests.support import splice_oracle

    row = got["row"]
    (join,) = got["joins"]
    ids = row["prompt_ids"] + row["response_ids"]
    context, paths = len(row["prompt_ids"]) + join["at"], join["splice_paths"]
    first = next(i for i in range(len(row["response_ids"]) - 1, -1, -1)
                 if row["node_ids"][i] != "" or not row["response_mask"][i]) + 1
    cut = len(row["prompt_ids"]) + first
    tokens = row["response_ids"][first:]
    assert len(tokens) >= 2 and all(row["response_mask"][first:])
    model = splice_oracle.load(model_dir)
    layout = (context, Parallel(tuple((n,) for n in paths)), cut - context - sum(paths))
    want = splice_oracle.logprobs_after_join(model, ids[:cut], layout, tokens)
    causal = splice_oracle.logprobs_after_join(model, ids[:cut], (cut,), tokens)
    lps = row["rollout_logprobs"][first:]
    assert max(abs(a - b) for a, b in zip(lps, want)) < 2e-4
    assert max(abs(a - b) for a, b in zip(lps, causal)) > 1e-3  # (the test tells them apart)
