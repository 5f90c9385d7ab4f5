"""A reasoning parser with fork/join families, with and without structured
outputs (docs/request_features.md, row "reasoning parser"), end to end
through ``vllm_seqhooks.LLM``.

A Qwen3-style reasoning model, offline: the tiny random Llama widened to
Qwen3's tokenizer (``<think>`` and ``</think>`` are its tokens 151667 and
151668), with the promise protocol's hook tokens added to it, and the
scripted-token logits processor writing what a trained model would: the
parent reasons inside ``<think>``, forks two children there
(``<promise>`` ... ``</promise>``), joins them (``<sync>``: their outputs
are merged into the reasoning), ends its reasoning and answers.

vLLM's semantics with a reasoning parser: a request's grammar starts after
the reasoning ends (``StructuredOutputManager._get_constraint_bounds``:
nothing before ``</think>`` is masked or fed to the grammar). A join feeds
its merged tokens through the same gate (``accept_tokens``), so a merge
inside the reasoning never reaches the grammar and one in the answer does.
Both of vLLM's gates are run: ``qwen3`` (an engine-based parser:
``find_reasoning_end`` over the tokens fed) and ``deepseek_r1`` (the
fallback: ``is_reasoning_end_streaming``); with no parser, the grammar
starts at the first token and refuses the reasoning, which shows the
gate is what lets it through.

The scripted processor forces a token over the grammar's bitmask (vLLM
applies the bitmask, then logits processors), so a forced token the grammar
rejects ends the request in error in vLLM's own ``accept_tokens``: a forced
answer that ends with ``"stop"`` is one the grammar accepted; an answer left
``"free"`` is the model's, sampled under the bitmask."""

from __future__ import annotations

import copy
import json
import re

import pytest

from tests.test_request_features import _no_hang

pytestmark = pytest.mark.slow

HOOK_TOKENS = ("<promise>", "</promise>", "<sync>")
PROMPT = "Sort 3 1 2.\n"
CHILDREN = {"0": "1 3", "1": "2"}
#: The parent's reasoning as it writes it (the children's merge follows <sync>).
THINK = "<think>Split.<promise>sort 3 1</promise><promise>sort 2</promise><sync> so</think>"
#: The reasoning the family writes: the children's outputs merged after <sync>
#: (joined by the default merge separator, a newline).
REASONING = "Split.<promise>sort 3 1</promise><promise>sort 2</promise><sync>1 3\n2 so"
ANSWER_RE = r"[0-9]( [0-9]){2}"
ANSWER_SCHEMA = {"type": "object", "properties": {"sorted": {
    "type": "array", "items": {"type": "integer"}}}, "required": ["sorted"]}
PARSERS = ["qwen3", "deepseek_r1", None]


@pytest.fixture(scope="module")
def qwen_model(tmp_path_factory):
    """The tiny random Llama with Qwen3's tokenizer and the hook tokens."""
    from tokenizers import AddedToken

    from tests.support import pinned_wheels as pw
    from tests.support import real_tokenizer_models as rtm
    from tests.support import real_tokenizers as rt

    try:
        tok = copy.deepcopy(rt.qwen3_tokenizer())
    except pw.PackageNotOnIndexError as exc:
        pytest.skip(f"tokenizer data not on the configured index: {exc}")
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in HOOK_TOKENS])
    assert tok.convert_tokens_to_ids(["<think>", "</think>"]) == [151667, 151668]
    model = rtm.build_tiny_model_with_tokenizer(tmp_path_factory.mktemp("qwen3") / "model", tok)
    return tok, str(model)


SERVED = "test_served_reasoning_with_forks"


@pytest.fixture(scope="module", autouse=True)
def served(request, qwen_model, tmp_path_factory):
    """The served test's body, started at the module's first test when that
    test is selected: its ``vllm serve`` starts and answers in processes of
    its own while this process runs the in-process engines' tests (a
    server's start is mostly its processes importing vLLM, on the other
    core); the served test takes its result."""
    import os

    from vllm import envs as vllm_envs

    from tests.support.run_ahead import RunAhead

    ahead = RunAhead(workers=1)
    if any(item.originalname == SERVED for item in request.session.items):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("VLLM_") or k in vllm_envs.environment_variables}
        log_path = tmp_path_factory.mktemp("served") / "serve.log"
        ahead.submit(SERVED, lambda: _served_reasoning_with_forks(qwen_model, log_path, env))
    yield ahead
    ahead.close()


@pytest.fixture(scope="module", params=PARSERS, ids=lambda p: p or "no-parser")
def engine(request, qwen_model):
    """``vllm_seqhooks.LLM`` with the promise protocol's hooks, the scripted
    processor and ``reasoning_parser`` (vLLM's engine argument; ``vllm
    serve --reasoning-parser``)."""
    from tests.support.torch_threads import one_torch_thread
    from vllm_seqhooks import LLM
    from vllm_seqhooks.scripted.llm import scripted_engine_kwargs

    tok, model = qwen_model
    parser = request.param
    kwargs = scripted_engine_kwargs(model, **({"reasoning_parser": parser} if parser else {}))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        llm = LLM(model, special_kwargs="promise", **kwargs)
    with one_torch_thread():  # (beside the served test's processes: see served)
        yield llm, tok, parser
    llm.shutdown()


def _params(tok, script: str, *, children=CHILDREN, end="eos", **kw):
    from vllm_seqhooks.scripted.processor import encode_script, scripted_params

    return scripted_params(
        encode_script(tok, script), end=end, child_end="eos", eos_token_id=tok.eos_token_id,
        child_scripts={k: encode_script(tok, v) for k, v in children.items()}, **kw)


def _generate(llm, params):
    from tests.support.forkjoin import scheduler_of

    with _no_hang():
        (out,) = llm.generate([PROMPT], params, use_tqdm=False)
    sizes = scheduler_of(llm).hook_state_sizes()
    assert sizes == {k: 0 for k in sizes}, sizes  # (nothing of the family left)
    return out


def _children(out) -> int:
    return len(out.hook_trace["children"]) if out.hook_trace else 0


def _split(llm, parser: str, text: str) -> tuple[str | None, str | None]:
    """(reasoning, content) as vLLM's parser splits the text for a client."""
    from vllm.reasoning import ReasoningParserManager

    return ReasoningParserManager.get_reasoning_parser(parser)(
        llm.get_tokenizer()).extract_reasoning(text, None)


def test_reasoning_forks_and_joins_without_structured_outputs(engine):
    """With a reasoning parser and no grammar, a family that forks and joins
    inside its reasoning writes what it writes without a parser (the same
    text on every engine); the parser gives the merge to the reasoning and
    the answer to the content."""
    llm, tok, parser = engine
    out = _generate(llm, _params(tok, THINK + "1 2 3"))
    assert out.outputs[0].text == f"<think>{REASONING}</think>1 2 3"
    assert out.outputs[0].finish_reason == "stop" and _children(out) == 2
    if parser is not None:
        assert _split(llm, parser, out.outputs[0].text) == (REASONING, "1 2 3")


@pytest.mark.parametrize("engine", PARSERS[:2], indirect=True)
def test_structured_outputs_start_after_the_reasoning(engine):
    """The grammar starts after ``</think>``: a family that forks and joins
    inside its reasoning (text no grammar here accepts) answers as the
    grammar says, sampled under its bitmask (regex) or forced and accepted
    by it (JSON schema); an answer the grammar rejects ends the request in
    error (the grammar is on after ``</think>``)."""
    from vllm.sampling_params import StructuredOutputsParams as SO

    llm, tok, parser = engine
    reasoning = f"<think>{REASONING}</think>"
    assert not re.fullmatch(ANSWER_RE, REASONING)

    free = _generate(llm, _params(tok, THINK, end="free", max_tokens=64,
                                  structured_outputs=SO(regex=ANSWER_RE)))
    text = free.outputs[0].text
    assert free.outputs[0].finish_reason == "stop" and _children(free) == 2, text
    assert text.startswith(reasoning) and re.fullmatch(ANSWER_RE, text[len(reasoning):]), text
    assert _split(llm, parser, text) == (REASONING, text[len(reasoning):])

    answer = '{"sorted": [1, 2, 3]}'
    schema = _generate(llm, _params(tok, THINK + answer, structured_outputs=SO(json=ANSWER_SCHEMA)))
    assert schema.outputs[0].text == reasoning + answer
    assert schema.outputs[0].finish_reason == "stop" and _children(schema) == 2
    assert json.loads(_split(llm, parser, schema.outputs[0].text)[1]) == {"sorted": [1, 2, 3]}

    wrong = _generate(llm, _params(tok, THINK + "abc", structured_outputs=SO(regex=ANSWER_RE)))
    assert wrong.outputs[0].finish_reason == "error" and _children(wrong) == 2
    assert wrong.outputs[0].text.startswith(reasoning)


@pytest.mark.parametrize("engine", PARSERS[:2], indirect=True)
def test_a_join_in_the_answer_is_fed_to_the_grammar(engine):
    """A family that forks after ``</think>``: its merge is part of the
    answer, fed to the grammar at the join; one that allows it answers, one
    that rejects it ends the request in error (the text so far, merge
    included), as without a reasoning parser."""
    from vllm.sampling_params import StructuredOutputsParams as SO

    llm, tok, _ = engine
    script = "<think>ok</think><promise>sort 3 1</promise><promise>sort 2</promise><sync> 1 2 3"
    forks = "<think>ok</think><promise>sort 3 1</promise><promise>sort 2</promise><sync>1 3\n2"
    allows = _generate(llm, _params(tok, script, structured_outputs=SO(
        regex=r"(<promise>[a-z0-9 ]*</promise>)+<sync>[0-9 \n]*")))
    assert allows.outputs[0].text == forks + " 1 2 3"
    assert allows.outputs[0].finish_reason == "stop" and _children(allows) == 2
    rejects = _generate(llm, _params(tok, script, structured_outputs=SO(
        regex=r"(<promise>[a-z0-9 ]*</promise>)+<sync>[0-9 ]*")))
    assert rejects.outputs[0].finish_reason == "error" and _children(rejects) == 2
    assert rejects.outputs[0].text == forks


@pytest.mark.parametrize("engine", [None], indirect=True)
def test_without_a_reasoning_parser_the_grammar_refuses_the_reasoning(engine):
    """The control: with no reasoning parser the grammar starts at the first
    token, and the forced ``<think>`` is rejected (the request ends in
    error before it forks): the parsers above are what keeps the reasoning,
    merges included, away from the grammar."""
    from vllm.sampling_params import StructuredOutputsParams as SO

    llm, tok, _ = engine
    for so in (SO(regex=ANSWER_RE), SO(json=ANSWER_SCHEMA)):
        out = _generate(llm, _params(tok, THINK + "1 2 3", structured_outputs=so))
        assert out.outputs[0].finish_reason == "error" and _children(out) == 0
        assert out.outputs[0].text == "<think>"


def test_served_reasoning_with_forks(served):
    """Through ``vllm serve --reasoning-parser qwen3 --seqhooks promise`` and
    the openai client's chat completions: the reasoning (its merge included)
    and the answer are split as for any request, whole and streamed; with a
    structured-output regex the answer is the grammar's (run ahead from the
    module's first test: :func:`served`)."""
    served.result(SERVED)


def _served_reasoning_with_forks(qwen_model, log_path, env) -> None:
    """The served test's body (in a thread of its own)."""
    from openai import OpenAI

    from tests.support.server import SCRIPTED, TINY_FLAGS, start_test_server
    from vllm_seqhooks.scripted.processor import encode_script

    tok, model = qwen_model
    server = start_test_server(model, *TINY_FLAGS, "--seqhooks", "promise", "--reasoning-parser",
                               "qwen3", "--logits-processors", SCRIPTED, log_path=log_path, env=env)

    def xargs(script: str, end: str = "eos") -> dict:
        return {"seqhooks_script": encode_script(tok, script), "seqhooks_script_end": end,
                "seqhooks_eos_token_id": tok.eos_token_id,
                "seqhooks_child_scripts": json.dumps(
                    {k: encode_script(tok, v) for k, v in CHILDREN.items()}),
                "seqhooks_child_script_end": "eos"}

    def reasoning(message) -> str | None:  # (the field's name moved across releases)
        extra = message.model_extra or {}
        return extra.get("reasoning", extra.get("reasoning_content"))

    try:
        client = OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=120)
        ask = dict(model=model, messages=[{"role": "user", "content": PROMPT}], temperature=0,
                   max_tokens=64)
        r = client.chat.completions.create(**ask, extra_body={"vllm_xargs": xargs(THINK + "1 2 3")})
        assert (reasoning(r.choices[0].message), r.choices[0].message.content) == (
            REASONING, "1 2 3")
        assert r.choices[0].finish_reason == "stop"

        chunks = list(client.chat.completions.create(
            **ask, stream=True, extra_body={"vllm_xargs": xargs(THINK + "1 2 3")}))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        assert "".join(reasoning(d) or "" for d in deltas) == REASONING
        assert "".join(d.content or "" for d in deltas) == "1 2 3"

        r = client.chat.completions.create(**ask, extra_body={
            "vllm_xargs": xargs(THINK, "free"), "structured_outputs": {"regex": ANSWER_RE}})
        assert reasoning(r.choices[0].message) == REASONING
        assert re.fullmatch(ANSWER_RE, r.choices[0].message.content), r.choices[0].message
        assert r.choices[0].finish_reason == "stop"
        log = server.log_tail(10 ** 6)
    finally:
        server.stop()
    assert "Traceback" not in log, log[-3000:]
