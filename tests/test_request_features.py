"""vLLM's request features with fork/join families, end to end on the
embedded fork/join model (docs/request_features.md is the matrix these
tests back): nothing hangs, children sample with the parameters their rows
in ``core/child_params.py`` give them, refusals say why.

The oracle for a child: a fresh request of the child's own prompt (from its
trace) with the parameters its row gives it (``min_tokens`` 0, its budget,
its derived seed), hooks off, on the same engine: the same tokens."""

from __future__ import annotations

import json
import os
import signal
from contextlib import contextmanager

import pytest

from vllm_seqhooks.tasks import forkjoin as task

pytestmark = pytest.mark.slow

PROBLEM = "sort 9081726354="
HOOKS_OFF = {"seqhooks_enabled": False}


@contextmanager
def _no_hang(seconds: int = 120):
    """A request that would hang fails the test instead of the run."""
    def stop(*_):
        raise TimeoutError(f"no answer within {seconds} s: a hang")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


SERVED = "test_served_features"


@pytest.fixture(scope="module", autouse=True)
def served(request, tmp_path_factory):
    """The served test's body, started at the module's first test when that
    test is selected: its ``vllm serve`` starts and answers in processes of
    its own while this process runs the in-process engine's tests (a
    server's start is mostly its processes importing vLLM, on the other
    core); the served test takes its result."""
    from tests.support.run_ahead import RunAhead

    ahead = RunAhead(workers=1)
    if any(item.originalname == SERVED for item in request.session.items):
        log_path = tmp_path_factory.mktemp("served") / "serve.log"
        env = dict(os.environ)  # (now: the engine tests switch VLLM_ variables while it starts)
        ahead.submit(SERVED, lambda: _served_features(log_path, env))
    yield ahead
    ahead.close()


@pytest.fixture(scope="module")
def llm():
    from tests.support.torch_threads import one_torch_thread
    from vllm_seqhooks import LLM

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        engine = LLM(str(task.model_dir()), special_kwargs="auto", **task.ENGINE_KWARGS)
    with one_torch_thread():  # (beside the served test's processes: see served)
        yield engine
    engine.shutdown()


def _generate(llm, params, prompt=PROBLEM):
    with _no_hang():
        (out,) = llm.generate([prompt], params, use_tqdm=False)
    return out


def _params(**kw):
    from vllm import SamplingParams

    kw.setdefault("temperature", 0.0)
    kw.setdefault("max_tokens", task.PARENT_MAX_TOKENS)
    return SamplingParams(**kw)


def _child_oracle(llm, child: dict, params):
    """A fresh request of ``child``'s prompt with its row's parameters."""
    import copy

    from vllm.inputs import TokensPrompt

    from vllm_seqhooks.core.request_tree import derive_seed

    sp = copy.deepcopy(params)
    sp.n, sp.min_tokens, sp.max_tokens = 1, 0, task.CHILD_MAX_TOKENS
    sp.structured_outputs = None
    if sp.seed is not None:
        sp.seed = derive_seed(sp.seed, child["key"])
    sp.extra_args = dict(HOOKS_OFF)
    prompt = TokensPrompt(prompt_token_ids=child["prompt_rest_token_ids"])
    with _no_hang():
        (out,) = llm.generate([prompt], sp, use_tqdm=False)
    return list(out.outputs[0].token_ids)


FEATURES = {
    "min_tokens": dict(min_tokens=12),
    "penalties": dict(presence_penalty=0.4, frequency_penalty=0.3, repetition_penalty=1.3),
    "logit_bias": dict(logit_bias={25: 2.0, 33: -1.5}),  # '0' up, '8' down
    "allowed_token_ids": "the answer's own tokens",
    "bad_words": dict(bad_words=["99"]),
    "stop_token_ids": dict(stop_token_ids=[38]),  # '=': the parent stops after the merge
    "seed": dict(temperature=0.8, top_p=0.95, seed=1234),
}


@pytest.mark.parametrize("feature", list(FEATURES))
def test_sampling_features_reach_children_as_their_rows_say(llm, feature):
    """Each child's tokens are those of a fresh request of its prompt with
    the parameters its rows give it; ``min_tokens`` (the parent's own count)
    leaves the greedy answer as it is without it."""
    plain = _generate(llm, _params())
    kw = FEATURES[feature]
    if feature == "allowed_token_ids":
        tok = llm.get_tokenizer()
        used = set(tok.encode(PROBLEM)) | set(plain.outputs[0].token_ids)
        used |= {tok.eos_token_id}
        for child in plain.hook_trace["children"]:
            used |= set(child["prompt_rest_token_ids"]) | set(child["output_token_ids"])
        kw = dict(allowed_token_ids=sorted(used))
    params = _params(**kw)
    out = _generate(llm, params)
    children = out.hook_trace["children"] if out.hook_trace else []
    if feature != "seed":
        assert children, out.outputs[0].text  # (the feature kept the fork)
    for child in children:
        oracle = _child_oracle(llm, child, params)
        own = list(child["output_token_ids"])
        assert oracle[: len(own)] == own, (child["key"], oracle, own)
        assert len(oracle) == child["sampled_tokens"], (child["key"], oracle, child)
    if feature in ("min_tokens", "allowed_token_ids"):
        assert out.outputs[0].text == plain.outputs[0].text
        assert task.check_full_text(task.Problem("9081726354"), out.outputs[0].text)
    if feature == "stop_token_ids":
        assert out.outputs[0].text == plain.outputs[0].text.split("=")[0]
        assert out.outputs[0].stop_reason == 38
    if feature == "seed":
        again = _generate(llm, params)
        assert list(again.outputs[0].token_ids) == list(out.outputs[0].token_ids)


def test_a_banned_hook_token_means_no_fork(llm):
    from vllm_seqhooks.scripted.tiny_model import PROMISE_ID

    out = _generate(llm, _params(logit_bias={PROMISE_ID: -100.0}))
    assert out.hook_trace is None and "<promise>" not in out.outputs[0].text


def test_structured_outputs_never_hang(llm):
    """The parent's grammar constrains what it samples and sees the merged
    tokens at each join: a grammar that allows the family's text answers as
    without one; one that rejects the merge ends the request with
    ``finish_reason`` "error" (not a hang); one that cannot write a hook
    token never forks; children get no grammar."""
    from vllm.sampling_params import StructuredOutputsParams as SO

    plain = _generate(llm, _params())
    allows = _generate(llm, _params(structured_outputs=SO(regex=r"[<>/a-z0-9,=]*")))
    assert allows.outputs[0].text == plain.outputs[0].text
    assert allows.outputs[0].finish_reason == "stop"
    assert len(allows.hook_trace["children"]) == 3
    rejects = _generate(llm, _params(structured_outputs=SO(regex=r"[<>/a-z0-9=]*")))
    assert rejects.outputs[0].finish_reason == "error"
    assert rejects.outputs[0].text.endswith("<sync>0189,2367,45")
    for so in (SO(choice=["yes", "no"]), SO(json={"type": "object"}),
               SO(grammar='root ::= [0-9]+ "="'), SO(regex=r"[0-9]{4}")):
        out = _generate(llm, _params(structured_outputs=so))
        text = out.outputs[0].text
        assert out.hook_trace is None and "<" not in text, (so, text)
        if so.json is not None:
            assert isinstance(json.loads(text), dict)
        if so.choice is not None:
            assert text in so.choice


def test_a_stop_string_in_merged_text_stops_the_family(llm):
    """A stop string is matched on the parent's text, merged tokens
    included: the request stops there and nothing of its family is left
    running."""
    out = _generate(llm, _params(stop=["2367"]))
    assert out.outputs[0].finish_reason == "stop"
    assert out.outputs[0].text.endswith("<sync>0189,")
    assert not llm.llm_engine.has_unfinished_requests()


def test_beam_search_is_refused(llm):
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import BeamSearchParams

    with pytest.raises(VLLMValidationError, match="beam search cannot be combined with sequence"):
        llm.beam_search([{"prompt": PROBLEM}], BeamSearchParams(beam_width=2, max_tokens=8))


def test_served_features(served):
    """Through ``vllm serve --seqhooks auto`` and the openai client:
    ``min_tokens`` leaves the answer as it is, a structured-output regex
    answers (no hang) and one that rejects the merge ends in error (vLLM's
    server answers a request that ended in error with a 500; the server's
    log names the reason), beam search is a 400 naming the reason (run
    ahead from the module's first test: :func:`served`)."""
    served.result(SERVED)


def _served_features(log_path, env) -> None:
    """The served test's body (in a thread of its own)."""
    import openai
    from openai import OpenAI

    from vllm_seqhooks.check import trained_engine_flags
    from tests.support.server import start_test_server

    model = str(task.model_dir())
    server = start_test_server(model, "--seqhooks", "auto", *trained_engine_flags(),
                               log_path=log_path, env=env)
    try:
        client = OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=120)

        def ask(**extra):
            return client.completions.create(model=model, prompt=PROBLEM, temperature=0,
                                             max_tokens=task.PARENT_MAX_TOKENS,
                                             extra_body=extra).choices[0]

        plain = ask()
        assert ask(min_tokens=12).text == plain.text
        assert ask(structured_outputs={"regex": r"[<>/a-z0-9,=]*"}).text == plain.text
        # (a request that ended in error: vLLM's server answers 500; its log says why)
        with pytest.raises(openai.InternalServerError):
            ask(structured_outputs={"regex": r"[<>/a-z0-9=]*"})
        with pytest.raises(openai.BadRequestError, match="beam search cannot be combined"):
            ask(use_beam_search=True, n=2)
        assert ask().text == plain.text  # (the server goes on)
        log = server.log_tail(10 ** 6)
    finally:
        server.stop()
    assert "Traceback" not in log, log[-3000:]
    assert "rejects the 12 tokens merged from its children" in log


def _lora_adapter(path):
    """A rank-8 LoRA adapter (q and v projections, random) for the embedded
    model, written as PEFT writes one."""
    import torch
    from safetensors.torch import save_file

    path.mkdir()
    gen = torch.Generator().manual_seed(0)
    weights = {}
    for layer in range(4):
        for proj, (rows, cols) in {"q_proj": (256, 256), "v_proj": (128, 256)}.items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            weights[f"{prefix}.lora_A.weight"] = torch.randn(8, cols, generator=gen) * 0.5
            weights[f"{prefix}.lora_B.weight"] = torch.randn(rows, 8, generator=gen) * 0.5
    save_file(weights, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 8, "lora_alpha": 16,
        "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
        "target_modules": ["q_proj", "v_proj"], "base_model_name_or_path": "forkjoin_model"}))
    return path


def test_children_run_under_the_parents_lora_adapter(tmp_path):
    """A request with a LoRA adapter: each child's tokens are a fresh
    request of its prompt under the same adapter (and not those of the base
    model)."""
    from vllm.lora.request import LoRARequest

    from vllm_seqhooks import LLM

    adapter = LoRARequest("random", 1, str(_lora_adapter(tmp_path / "adapter")))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        engine = LLM(str(task.model_dir()), special_kwargs="auto", enable_lora=True,
                     max_lora_rank=8, max_loras=1, **task.ENGINE_KWARGS)
    try:
        params = _params()
        with _no_hang():
            (out,) = engine.generate([PROBLEM], params, lora_request=adapter, use_tqdm=False)
        children = out.hook_trace["children"]
        assert children, out.outputs[0].text
        base = []
        for child in children:
            sp = params.clone()
            sp.max_tokens, sp.extra_args = task.CHILD_MAX_TOKENS, dict(HOOKS_OFF)
            prompt = {"prompt_token_ids": child["prompt_rest_token_ids"]}
            with _no_hang():
                (under,) = engine.generate([prompt], sp, lora_request=adapter, use_tqdm=False)
                (plain,) = engine.generate([prompt], sp, use_tqdm=False)
            own = list(child["output_token_ids"])
            assert list(under.outputs[0].token_ids)[: len(own)] == own, child["key"]
            base.append(list(plain.outputs[0].token_ids)[: len(own)] == own)
        assert not all(base)  # (the adapter changes what a child writes)
    finally:
        engine.shutdown()
