"""The second embedded model: digit sorting in ThreadWeaver's tag format
(``vllm_seqhooks/tasks/threadweaver.py``, ``vllm_seqhooks/data/threadweaver_model``).

Pure: the training sequences are what the engine builds (child prompts,
merges, the fork and end tags as its scanner finds them), with the tokenizer
the model ships.  End to end: ``LLM(model, special_kwargs="auto")`` answers
held-out problems and gives the tokens of the format's own client loop over
stock vLLM. (``vllm serve`` with this model, as docs/threadweaver_model.md
gives the command, answers held-out problems of every fan-out over HTTP in
tests/test_docs_commands.py, which starts that server anyway.)"""

from __future__ import annotations

import gc
import json

import pytest

from vllm_seqhooks.tasks import threadweaver as task
from vllm_seqhooks.scripted import tiny_model as tm

# ------------------------------------------------------------------ pure


@pytest.fixture(scope="module")
def codec():
    return task.text_codec(tm.build_tokenizer(task.TAGS))


def test_tokenizer_has_each_tag_as_one_visible_token():
    tok = tm.build_tokenizer(task.TAGS)
    for i, tag in enumerate(task.TAGS, start=tm.TOKENIZER_SIZE):
        assert tok.token_to_id(tag) == i
        assert tok.encode(f"1{tag}2", add_special_tokens=False).ids[1] == i
    assert tm.TOKENIZER_SIZE + len(task.TAGS) <= tm.VOCAB_SIZE
    text = task.prompt_text("3917425") + task.expected_text("3917425")
    assert tok.decode(tok.encode(text).ids, skip_special_tokens=True) == text
    # Without extra tokens the tokenizer is the first model's, unchanged.
    assert tm.build_tokenizer().to_str() == tm.build_tokenizer(()).to_str()
    with pytest.raises(ValueError):
        tm.build_tokenizer(("<sync>",))


def test_texts_and_checker():
    assert task.expected_text("391") == "139"
    assert task.expected_text("3917425") == (
        "<Parallel>\n<Outlines>\n<Outline>1: 3917</Outline>\n<Outline>2: 425</Outline>\n"
        "</Outlines>\n<Thread>\n1:1379</Thread><Thread>\n2:245</Thread>\n<Conclusion>\n"
        "1234579</Conclusion>\n</Parallel>")
    p = task.Problem("3917425")
    good = task.expected_text(p.digits)
    assert task.check(p, good) and task.check_full_text(p, good)
    assert task.check(p, "1234579") and task.check(p, "=1234579")
    assert not task.check_full_text(p, "1234579")
    assert not task.check(p, good.replace("1234579</", "1234578</"))
    # The conclusion wins over a wrong '=' text, and the last one counts.
    assert task.check(p, "=99<Conclusion>\n5<Conclusion>\n1234579</Conclusion>")
    assert not task.check(p, "<Conclusion>\n1234579</Conclusion><Conclusion>\n12</Conclusion>")
    assert task.outline_chunks(good) == ["3917", "425"]
    s = task.summarize([p, task.Problem("21")], [good, "12"])
    assert s["correct"] == 2 and s["full_text_exact"] == 2 and s["decomposition_correct"] == 2
    assert s["by_children"] == {0: [1, 1], 2: [1, 1]}


def test_sequences_are_the_engines_layout(codec):
    """Each child's sequence is the engine's child prompt for that outline
    item plus what the child writes; the parent's is its context, the
    engine's merge and its conclusion; the loss covers only sampled tokens;
    and the engine's scanners fork and stop exactly where the texts say."""
    from vllm_seqhooks.core.join_plan import merged_layout
    from vllm_seqhooks.formats.events import EndTagReached, ForkReached
    from vllm_seqhooks.formats.boundaries import child_prompt
    from vllm_seqhooks.formats.tag_format_scanner import TagFormatScanner

    fmt = task.tag_format()
    assert fmt.boundary_tokenization == "text"  # one token per tag: the same as "ids"
    assert fmt.fork_tag == "</Outlines>" and fmt.child_end_tag == "</Thread>"
    dec = lambda ids: codec.text(ids).decode()  # noqa: E731
    for p in task.generate_problems(300, seed=5):
        seqs = task.sequences(codec, p.digits, tm.BOS_ID, tm.EOS_ID)
        parent, children = seqs[0], seqs[1:]
        assert parent.ids[0] == tm.BOS_ID and parent.ids[-1] == tm.EOS_ID
        assert dec(parent.ids[1:-1]) == p.prompt + task.expected_text(p.digits)
        prompt_len = 1 + len(p.prompt)
        assert not any(parent.train[:prompt_len]) and parent.train[-1] == 1
        assert len(children) == len(p.chunks)
        if not p.chunks:
            assert all(parent.train[prompt_len:])
            continue
        outline = codec.encode(task.outline_text(p.chunks))
        context = list(parent.ids[: prompt_len + len(outline)])
        scanner = TagFormatScanner(fmt, codec, may_fork=True, ends_at_tag=False)
        (fork,) = [e for e in scanner.feed(parent.ids[prompt_len:], prompt_len)
                   if isinstance(e, ForkReached)]
        assert fork.pos == len(context) - 1 and fork.tag_start == fork.pos
        starts, headers, outputs = [], [], []
        for i, (child, chunk) in enumerate(zip(children, p.chunks), 1):
            want, _ = child_prompt(codec, fmt, context, fork.tag_start, str(i))
            assert want[: len(context)] == context
            start = want[len(context):]
            n = len(want)
            assert list(child.ids[:n]) == want and child.label == str(i)
            assert dec(child.ids[n:]) == task.solve(chunk) + "</Thread>"
            assert child.train == (0,) * n + (1,) * (len(child.ids) - n)
            assert dec(want[len(context):]) == f"\n<Thread>\n{i}:"
            end = TagFormatScanner(fmt, codec, may_fork=False, ends_at_tag=True)
            assert end.feed(child.ids[n:], n) == [EndTagReached(len(child.ids) - 1)]
            starts.append(start)
            headers.append(codec.encode(fmt.header(str(i))))
            outputs.append(child.ids[n:])
        merged = merged_layout(starts, headers, outputs, (), codec.encode(fmt.merge_suffix))
        m0 = len(context)
        assert list(parent.ids[m0: m0 + len(merged)]) == merged
        assert not any(parent.train[m0: m0 + len(merged)])
        assert all(parent.train[prompt_len:m0]) and all(parent.train[m0 + len(merged):])


def test_shipped_model_files_and_settings(codec):
    """The model carries its format; its tokenizer, as the engine loads it,
    is the one training used."""
    from transformers import AutoTokenizer

    from vllm_seqhooks.config.special_kwargs import SpecialKwargs
    from vllm_seqhooks.config.presets import expand

    d = task.model_dir()
    for f in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
              "tokenizer_config.json", "special_tokens_map.json", "training.json"):
        assert (d / f).is_file(), f
    settings = json.loads((d / "seqhooks.json").read_text())
    assert settings == task.SEQHOOKS_JSON
    hooks = SpecialKwargs(**expand("auto", d))
    assert hooks.tag_format == task.tag_format()
    assert hooks.child_max_tokens == task.CHILD_MAX_TOKENS
    hf = AutoTokenizer.from_pretrained(str(d))
    served = task.text_codec(hf)
    assert list(served.table) == list(codec.table)
    resolved = hooks.resolve(hf, vocab_size=tm.VOCAB_SIZE)
    assert resolved.merge_separator_token_ids == ()
    for p in task.generate_problems(50, seed=6):
        assert task.sequences(served, p.digits, hf.bos_token_id, hf.eos_token_id) == \
            task.sequences(codec, p.digits, tm.BOS_ID, tm.EOS_ID)
        assert list(hf.encode(p.prompt)) == [tm.BOS_ID, *codec.encode(p.prompt)]
    longest = task.sequences(codec, "9" * task.MAX_LEN, tm.BOS_ID, tm.EOS_ID)[0]
    assert len(longest.ids) <= task.ENGINE_KWARGS["max_model_len"]
    assert sum(longest.train) <= task.PARENT_MAX_TOKENS


# ------------------------------------------------------------ end to end


@pytest.mark.slow
def test_llm_auto_answers_and_equals_the_format_loop():
    """``LLM(model, special_kwargs="auto")``: 50 held-out problems answered
    (>= 49), the engine forking at ``</Outlines>`` itself; token for token
    what ThreadWeaver's client loop (FormatLoop) gets over stock vLLM; chat
    (one user message) answers what completions answer."""
    import vllm
    from vllm import SamplingParams

    from vllm_seqhooks import LLM
    from vllm_seqhooks.loops.format_loop import FormatLoop

    problems = task.heldout_problems(50)
    assert {len(p.chunks) for p in problems} == {0, 2, 3, 4}
    params = SamplingParams(temperature=0.0, max_tokens=task.PARENT_MAX_TOKENS)
    model = str(task.model_dir())
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        llm = LLM(model, special_kwargs="auto", **task.ENGINE_KWARGS)
        assert llm.special_kwargs.fork_tag == "</Outlines>"
        outs = llm.generate([p.prompt for p in problems], params, use_tqdm=False)
        # chat: the model's template renders one user message as the bare problem
        chats = llm.chat([[{"role": "user", "content": p.prompt}] for p in problems[:8]],
                         params, use_tqdm=False)
        del llm
        gc.collect()
        loop = FormatLoop(vllm.LLM(model, **task.ENGINE_KWARGS), "auto")
        results = loop.generate([p.prompt for p in problems], params)
    texts = [o.outputs[0].text for o in outs]
    assert task.summarize(problems, texts)["correct"] >= 49, texts
    assert [c.outputs[0].text for c in chats] == texts[:8]
    forked = 0
    for p, out, res in zip(problems, outs, results):
        comp = out.outputs[0]
        assert list(comp.token_ids) == res.token_ids, p.digits
        assert list(out.prompt_token_ids) == res.prompt_token_ids
        assert comp.finish_reason == res.finish_reason
        children = (out.hook_trace or {}).get("children", [])
        assert len(children) == len(res.children)
        forked += bool(children)
    assert forked >= 30
