"""Tag formats in the scheduler (surgical harness, the tiny model's
character tokenizer: every tag is several tokens; sync and async
scheduling, and speculative decoding where several tokens arrive at once)."""

from __future__ import annotations

import pytest

from vllm.v1.engine import FinishReason

from vllm_seqhooks.config.special_kwargs import SpecialKwargs
from vllm_seqhooks.config.presets import expand
from tests.support.sched_harness import EOS_ID as EOS
from tests.support.sched_harness import SchedHarness, child_id
from vllm_seqhooks.scripted.tiny_model import build_tokenizer

MODES = pytest.mark.parametrize("async_sched", [False, True], ids=["sync", "async"])
_TOK = build_tokenizer()

TW_PARENT = "<Parallel>\n<Outlines>\n<Outline>1: a</Outline>\n<Outline>2: b</Outline>\n</Outlines>"


def enc(text: str) -> list[int]:
    return _TOK.encode(text, add_special_tokens=False).ids


def dec(ids) -> str:
    return _TOK.decode(list(ids), skip_special_tokens=False)


def hooks(name: str, **overrides) -> SpecialKwargs:
    return SpecialKwargs(**expand({"format": name, "max_child_depth": 1,
                                   "fork_min_tokens": None, **overrides}))


def harness(name: str, async_sched: bool, **kwargs) -> SchedHarness:
    overrides = kwargs.pop("overrides", {})
    return SchedHarness(async_sched, hooks=hooks(name, **overrides), **kwargs)


def assert_idle(h: SchedHarness) -> None:
    sched = h.sched
    assert not sched.requests and not sched.running and not sched.waiting
    sizes = sched.hook_state_sizes()
    assert sizes == {k: 0 for k in sizes}, sizes
    assert sched.kv_cache_manager.usage == 0
    assert not [r for r in h.all_output_ids() if "@seqhooks-child" in r]


@MODES
@pytest.mark.parametrize("spec", [0, 3], ids=["one_token", "spec3"])
def test_threadweaver_fork_and_implicit_join(async_sched, spec):
    # The parent goes on after a child that ended without its end tag.
    h = harness("threadweaver", async_sched, num_spec_tokens=spec,
                overrides={"unclosed_child_stop_text": None})
    h.scripts["r"] = enc(TW_PARENT + "</Parallel> 42") + [EOS]
    # Child 0 ends at its end tag (what it would write after is never
    # sampled); child 1 ends at EOS, which becomes "\n</Thread>".
    h.scripts[child_id("r", 0)] = enc(" alpha</Thread>never")
    h.scripts[child_id("r", 1)] = enc(" beta") + [EOS]
    h.add("r", enc("Q:"), max_tokens=300)
    h.run(600)
    assert dec(h.tokens["r"]) == (
        TW_PARENT + "\n<Thread>\n1: alpha</Thread><Thread>\n2: beta\n</Thread>"
        "\n<Conclusion>\n</Parallel> 42</s>")
    assert h.finish_reasons["r"] == FinishReason.STOP
    trace = h.trace("r")
    assert [c["finish_reason"] for c in trace["children"]] == ["stop", "stop"]
    assert [dec(c["output_token_ids"]) for c in trace["children"]] == [
        " alpha</Thread>", " beta\n</Thread>"]
    (join,) = trace["joins"]
    assert join["children"] == ["0", "1"]
    # The merge starts with child 0's own sequence (context, header, output):
    # the parent resumes through the prefix cache and reuses child 0's KV
    # blocks beyond what it had computed itself (it had computed everything
    # but the fork tag's last token).
    merged = len(enc("\n<Thread>\n1: alpha</Thread><Thread>\n2: beta\n</Thread>\n<Conclusion>\n"))
    context = len(enc("Q:" + TW_PARENT))
    assert join["merged_tokens"] == merged
    assert join["prefilled_tokens"] + join["reused_tokens"] == context + merged
    child0 = context + len(enc("\n<Thread>\n1: alpha</Thread>"))
    assert join["reused_tokens"] == (child0 - 1) // 16 * 16 > context - 1
    assert_idle(h)


@MODES
def test_threadweaver_child_without_end_tag_ends_the_parent(async_sched):
    """ThreadWeaver's orchestrators stop the whole generation when a thread
    ends without </Thread> (EOS or out of tokens): the preset merges every
    thread, closes the parallel block and finishes the parent (length)."""
    h = harness("threadweaver", async_sched)
    h.scripts["r"] = enc(TW_PARENT + "</Parallel> never")
    h.scripts[child_id("r", 0)] = enc(" alpha</Thread>")
    h.scripts[child_id("r", 1)] = enc(" beta") + [EOS]
    h.add("r", enc("Q:"), max_tokens=300)
    h.run(600)
    assert dec(h.tokens["r"]) == (
        TW_PARENT + "\n<Thread>\n1: alpha</Thread><Thread>\n2: beta\n</Thread>"
        "\n<Conclusion>\n</Conclusion>\n</Parallel>")
    assert h.finish_reasons["r"] == FinishReason.LENGTH
    assert_idle(h)


@MODES
def test_children_prompts_are_context_and_header(async_sched):
    h = harness("threadweaver", async_sched)
    h.scripts["r"] = enc(TW_PARENT) + [EOS]
    h.add("r", enc("Q:"), max_tokens=300)
    prompts = {}

    def record(harness, _out):
        for rid, req in harness.sched.requests.items():
            if "@seqhooks-child" in rid:
                prompts.setdefault(rid, dec(req.prompt_token_ids))

    h.after_schedule.append(record)
    h.run(600)
    assert prompts == {child_id("r", 0): "Q:" + TW_PARENT + "\n<Thread>\n1:",
                       child_id("r", 1): "Q:" + TW_PARENT + "\n<Thread>\n2:"}
    assert_idle(h)


@MODES
def test_parallel_r1_fixed_count_eos_and_length(async_sched):
    h = harness("parallel-r1", async_sched, overrides={"child_max_tokens": 4})
    h.scripts["r"] = enc("think<Parallel>") + enc("sum") + [EOS]
    h.scripts[child_id("r", 0)] = enc("A") + [EOS]          # EOS -> </Path>
    h.scripts[child_id("r", 1)] = enc("BBBBBBBB")           # cut at 4 tokens
    h.add("r", enc("Q:"), max_tokens=100)
    h.run(400)
    assert dec(h.tokens["r"]) == ("think<Parallel><Path>A</Path><Path>BBBB</Path>"
                                  "</Parallel>\n<Summary>sum</s>")
    trace = h.trace("r")
    assert [c["finish_reason"] for c in trace["children"]] == ["stop", "length"]
    assert_idle(h)


@MODES
def test_multiverse_and_npr_layouts(async_sched):
    for name, parent, expected in [
        ("multiverse", "<Goal>\n<Outline>\n1: x\n</Outline>\n<Outline>\n2: y\n</Outline>\n</Goal>",
         "\n<Path>\n1: p</Path>\n<Path>\n2: q\n<Conclusion>\n"),
        ("npr", "<guideline>\n<plan>1: x</plan>\n<plan>2: y</plan>\n</guideline>",
         "\n<step>\n1: p</step>\n<step>\n2: q\n<takeaway>\n"),
    ]:
        h = harness(name, async_sched)
        end = "</Path>" if name == "multiverse" else "</step>"
        h.scripts["r"] = enc(parent) + enc("end") + [EOS]
        h.scripts[child_id("r", 0)] = enc(" p" + end)
        h.scripts[child_id("r", 1)] = enc(" q") + [EOS]  # no end tag added
        h.add("r", enc("Q:"), max_tokens=300)
        h.run(600)
        assert dec(h.tokens["r"]) == parent + expected + "end</s>", name
        assert_idle(h)


@MODES
def test_a_fork_without_items_or_budget_is_plain_text(async_sched):
    h = harness("threadweaver", async_sched, overrides={"fork_min_tokens": 50})
    h.scripts["a"] = enc("<Outlines>none</Outlines>ok") + [EOS]
    h.scripts["b"] = enc(TW_PARENT + "ok") + [EOS]
    h.add("a", enc("Q:"), max_tokens=300)
    h.add("b", enc("Q:"), max_tokens=len(enc(TW_PARENT)) + 40)
    h.run(600)
    assert dec(h.tokens["a"]) == "<Outlines>none</Outlines>ok</s>"
    assert dec(h.tokens["b"]) == TW_PARENT + "ok</s>"
    assert [p["reason"] for p in h.trace("a")["ignored_promises"]] == ["no_outline_items"]
    assert [p["reason"] for p in h.trace("b")["ignored_promises"]] == ["fork_min_tokens"] * 2
    assert_idle(h)


@MODES
def test_limits_apply_to_tag_forks(async_sched):
    items = "".join(f"<Outline>{i}: t</Outline>" for i in range(1, 6))
    h = harness("threadweaver", async_sched, overrides={"max_children_per_request": 3})
    h.scripts["r"] = enc("<Outlines>" + items + "</Outlines>") + enc("z") + [EOS]
    for i in range(3):
        h.scripts[child_id("r", i)] = enc("c</Thread>")
    h.add("r", enc("Q:"), max_tokens=300)
    h.run(800)
    trace = h.trace("r")
    assert [c["key"] for c in trace["children"]] == ["0", "1", "2"]
    assert [p["reason"] for p in trace["ignored_promises"]] == ["max_children_per_request"]
    assert dec(h.tokens["r"]).count("<Thread>") == 3
    assert_idle(h)


@MODES
def test_abort_a_parked_parent(async_sched):
    h = harness("threadweaver", async_sched)
    h.scripts["r"] = enc(TW_PARENT) + [EOS]
    h.scripts[child_id("r", 0)] = enc("x" * 200)
    h.add("r", enc("Q:"), max_tokens=300)
    h.run_until(lambda: child_id("r", 0) in h.sched.requests, max_steps=300)
    for _ in range(5):
        h.step()
    assert h.sched.requests["r"].status.name == "WAITING_FOR_STREAMING_REQ"  # parked
    h.abort("r")
    h.drain()
    assert_idle(h)


def _tw_family(async_sched: bool, children: dict[int, str], max_tokens: int = 300,
               extra_args: dict | None = None, **overrides) -> tuple[SchedHarness, list[int]]:
    """A ThreadWeaver family (the parent goes on after every join); returns
    the harness, run to the end, and the live children after each step."""
    h = harness("threadweaver", async_sched,
                overrides={"unclosed_child_stop_text": None, **overrides})
    h.scripts["r"] = enc(TW_PARENT + "</Parallel> 42") + [EOS]
    for i, text in children.items():
        h.scripts[child_id("r", i)] = enc(text)
    live: list[int] = []
    h.after_schedule.append(lambda hh, _out: live.append(len(hh.sched.fork_join.children)))
    h.add("r", enc("Q:"), max_tokens=max_tokens, extra_args=extra_args)
    h.run(600)
    return h, live


@MODES
@pytest.mark.parametrize("limit", [{"max_live_children": 1},
                                   {"max_live_children_per_family": 1}],
                         ids=["engine", "family"])
def test_fork_children_wait_for_the_live_children_limits(async_sched, limit):
    """Past the live-children limits a fork's children wait (in order) and
    start as others end: the parent merges every thread, as without the
    limits; nothing is refused (a fork with a thread missing is a context
    the model never saw)."""
    threads = {0: " alpha</Thread>", 1: " beta</Thread>"}
    free, free_live = _tw_family(async_sched, threads)
    assert max(free_live) == 2
    h, live = _tw_family(async_sched, threads, **limit)
    assert max(live) == 1
    assert h.sched.hook_stats["children_deferred"] == 1
    assert h.tokens["r"] == free.tokens["r"]
    assert dec(h.tokens["r"]).startswith(
        TW_PARENT + "\n<Thread>\n1: alpha</Thread><Thread>\n2: beta</Thread>")
    trace = h.trace("r")
    assert "ignored_promises" not in trace
    assert [c["state"] for c in trace["children"]] == ["merged", "merged"]
    assert_idle(h)


@MODES
def test_abort_with_deferred_children(async_sched):
    h = harness("threadweaver", async_sched, overrides={"max_live_children": 1})
    h.scripts["r"] = enc(TW_PARENT)
    h.scripts[child_id("r", 0)] = enc(" alpha" * 30 + "</Thread>")
    h.add("r", enc("Q:"), max_tokens=300)
    h.run(600, until=lambda: bool(h.sched.fork_join.deferred_children))
    assert len(h.sched.fork_join.children) == 1
    h.abort("r")
    h.run(600)
    assert_idle(h)


@MODES
def test_deferred_child_of_a_family_out_of_budget_fails(async_sched):
    """The family's token budget runs out while a child waits: that child
    fails (its reason in the trace), and the parent joins without it."""
    fork_at = len(enc("Q:" + TW_PARENT)) - 1
    # Descendants may sample 10 tokens: child 0 uses them all.
    h, _ = _tw_family(async_sched, {0: " alpha" * 40 + "</Thread>", 1: " beta</Thread>"},
                      extra_args={"seqhooks_max_family_tokens": 310}, max_live_children=1)
    trace = h.trace("r")
    assert [c["state"] for c in trace["children"]] == ["merged", "failed"]
    assert trace["ignored_promises"] == [{"position": fork_at, "reason": "family_token_budget"}]
    assert len(trace["joins"]) == 1
    assert_idle(h)
