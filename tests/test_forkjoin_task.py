"""The fork/join task of the embedded model (generator, checker) and the
shipped trained model end to end: native hooks and the client loop."""

from __future__ import annotations

import random

import pytest

from vllm_seqhooks.tasks import forkjoin as task

# ---------------------------------------------------------------- generator


def test_generator_is_deterministic_and_covers_lengths():
    a = task.generate_problems(500, seed=3)
    assert a == task.generate_problems(500, seed=3)
    assert a != task.generate_problems(500, seed=4)
    lengths = {len(p.digits) for p in a}
    assert lengths == set(range(1, task.MAX_LEN + 1))
    assert all(p.digits.isdigit() for p in a)
    assert task.heldout_problems(20) == task.generate_problems(20, task.HELDOUT_SEED)


def test_problem_rejects_non_digits():
    for bad in ("", "12a", "1 2", "٣"):
        with pytest.raises(ValueError):
            task.Problem(bad)


def test_split_and_expected_text():
    assert task.split("391") == []
    assert task.split("3917") == []
    assert task.split("39174") == ["3917", "4"]
    assert task.split("1234567890123456") == ["1234", "5678", "9012", "3456"]
    assert task.expected_text("391") == "139"
    assert task.expected_text("3917425") == (
        "<promise>3917</promise><promise>425</promise><sync>1379,245=1234579")
    segs = task.parent_segments("3917425")
    assert [s.merged for s in segs] == [False, True, False]
    assert segs[1].text == "1379,245"
    assert task.prompt_text("3917425") == "sort 3917425="
    assert task.child_prompt("3917") == "sort 3917="
    assert task.CHILD_PROMPT_TEMPLATE.format(payload="3917") == "sort 3917="


def test_checker_is_exact():
    p = task.Problem("3917425")
    good = task.expected_text(p.digits)
    assert task.check(p, good) and task.check_full_text(p, good)
    assert task.check(p, "1234579")  # a direct answer is still right
    assert not task.check_full_text(p, "1234579")
    assert task.check(p, " =1234579 ")
    for wrong in ("123457", "12345799", "1234597", "", "<sync>1379,245=1234578",
                  "1234579=12"):
        assert not task.check(p, wrong), wrong
    assert task.extract_answer("a=b=c") == "c"
    assert task.promise_payloads(good) == ["3917", "425"]


def test_checker_against_random_outputs():
    rng = random.Random(0)
    for p in task.generate_problems(300, seed=11):
        assert task.check(p, task.expected_text(p.digits))
        assert task.promise_payloads(task.expected_text(p.digits)) == p.chunks
        # A random permutation is right only when it happens to be sorted.
        perm = list(p.digits)
        rng.shuffle(perm)
        s = "".join(perm)
        assert task.check(p, s) == (s == "".join(sorted(p.digits)))


def test_summarize():
    ps = [task.Problem("21"), task.Problem("987654")]
    s = task.summarize(ps, ["12", "=456789"])
    assert s["correct"] == 2 and s["full_text_exact"] == 1
    assert s["decomposition_correct"] == 1


def test_hook_settings_match_tokenizer():
    from vllm_seqhooks.config.special_kwargs import SpecialKwargs
    from vllm_seqhooks.scripted.tiny_model import build_tokenizer

    hooks = SpecialKwargs(**task.hook_settings())
    tok = build_tokenizer()
    assert tok.token_to_id("<promise>") == hooks.promise_token_id
    assert tok.token_to_id("</promise>") == hooks.promise_end_token_id
    assert tok.token_to_id("<sync>") == hooks.sync_token_id
    longest = "9" * task.MAX_LEN
    n = len(tok.encode(task.prompt_text(longest) + task.expected_text(longest)).ids) + 1
    assert n <= task.ENGINE_KWARGS["max_model_len"]


def test_shipped_model_files():
    d = task.model_dir()
    for f in ("config.json", "generation_config.json", "model.safetensors",
              "tokenizer.json", "tokenizer_config.json", "training.json"):
        assert (d / f).is_file(), f


# --------------------------------------------------------------- end to end


@pytest.mark.slow
def test_trained_model_end_to_end_native_and_client_loop():
    """The model writes the hook tokens itself; answers are right; the client
    loop over stock vLLM gives the same tokens."""
    import vllm
    from vllm import SamplingParams

    from vllm_seqhooks import LLM
    from vllm_seqhooks.loops.promise_loop import ClientLoop

    # Two problems per fan-out (0, 2, 3, 4 promises), from the held-out stream.
    pool = task.heldout_problems(200, seed=12345)
    problems = []
    for k in (0, 2, 3, 4):
        problems += [p for p in pool if len(p.chunks) == k][:2]
    assert len(problems) == 8
    params = SamplingParams(temperature=0.0, max_tokens=task.PARENT_MAX_TOKENS)
    model = str(task.model_dir())
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        llm = LLM(model, special_kwargs=task.hook_settings(), **task.ENGINE_KWARGS)
        outs = llm.generate([p.prompt for p in problems], params, use_tqdm=False)
        for p, out in zip(problems, outs):
            text = out.outputs[0].text
            assert task.check(p, text), (p.digits, text)
            assert task.check_full_text(p, text), (p.digits, text)
            trace = out.hook_trace
            if p.chunks:
                assert trace is not None, p.digits
                assert [c["payload"] for c in trace["children"]] == p.chunks
                assert [c["output"] for c in trace["children"]] == [
                    task.solve(c) for c in p.chunks]
                assert all(c["state"] == "merged" for c in trace["children"])
                assert len(trace["joins"]) == 1
            else:
                assert trace is None or not trace.get("children")
        del llm
        stock = vllm.LLM(model, **task.ENGINE_KWARGS)
        results = ClientLoop(stock, task.hook_settings()).generate(
            [p.prompt for p in problems], params)
    for p, out, res in zip(problems, outs, results):
        assert res.token_ids == list(out.outputs[0].token_ids), p.digits
        assert res.text == out.outputs[0].text
        assert res.finish_reason == out.outputs[0].finish_reason
        assert len(res.children) == len(p.chunks)
        assert res.rounds == (2 if p.chunks else 1)


def ngram_against_plain(n: int) -> dict:
    """Runs in a fresh process (see the test): the same problems with and
    without ngram speculative decoding, in-process engines."""
    from vllm import SamplingParams

    from vllm_seqhooks import LLM
    from tests.support.observed_calls import observe_calls

    problems = task.heldout_problems(n)
    params = SamplingParams(temperature=0.0, max_tokens=task.PARENT_MAX_TOKENS, logprobs=2)
    spec = {"method": "ngram", "num_speculative_tokens": 3,
            "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    out: dict = {}
    for name, extra in (("plain", {}), ("ngram", {"speculative_config": spec})):
        llm = LLM(str(task.model_dir()), special_kwargs=task.hook_settings(),
                  **task.ENGINE_KWARGS, **extra)
        drafts = []

        def counting_update(update, so, mro, drafts=drafts):
            drafts.append(sum(map(len, so.scheduled_spec_decode_tokens.values())))
            return update(so, mro)

        sched = observe_calls(llm, update_from_output=counting_update)
        outs = llm.generate([p.prompt for p in problems], params, use_tqdm=False)
        out[name] = {
            "texts": [o.outputs[0].text for o in outs],
            "tokens": [list(o.outputs[0].token_ids) for o in outs],
            "logprobs": [[sorted((t, e.logprob) for t, e in row.items())
                          for row in o.outputs[0].logprobs] for o in outs],
            "drafts": sum(drafts),
            "joins": sched.hook_stats["joins"],
            "idle": sched.hook_state_sizes() == {k: 0 for k in sched.hook_state_sizes()},
        }
        del llm
    return out


@pytest.mark.slow
def test_trained_model_with_ngram_speculative_decoding():
    """Hooks with vLLM's ngram speculative decoding (no logits processor is
    installed, so vLLM accepts it): the model writes its hook tokens inside
    accepted draft runs, and every answer, token and logprob equals the run
    without speculation. (In a fresh process: vLLM's ngram proposer imports numba,
    and vLLM 0.32's CPU kernel rebinding then fails for every later engine
    of the process, see docs/install.md.)"""
    from tests.support.engine_modes import IN_PROCESS, EngineMode, run_in_mode

    n = 60
    res = run_in_mode(EngineMode("v1", False), ngram_against_plain, kwargs={"n": n},
                      env=IN_PROCESS, fresh=True)
    plain, ngram = res["plain"], res["ngram"]
    assert ngram["drafts"] > 0, "no draft token was ever scheduled"
    assert ngram["joins"] > 0 and ngram["idle"]
    assert ngram["tokens"] == plain["tokens"]
    # logprobs with hooks and speculation: the same rows as without
    # (inserted tokens 0.0 in both; the verifier scores drafts in a batch)
    rows = [(a, b) for x, y in zip(ngram["logprobs"], plain["logprobs"]) for a, b in zip(x, y)]
    assert len(rows) == sum(map(len, plain["tokens"]))
    assert all([t for t, _ in a] == [t for t, _ in b] for a, b in rows)
    assert max(abs(la - lb) for a, b in rows for (_, la), (_, lb) in zip(a, b)) < 2e-4
    assert sum(lp < -1 for _, b in rows for _, lp in b) > n  # (the runner-up tokens)
    problems = task.heldout_problems(n)
    assert task.summarize(problems, ngram["texts"])["correct"] >= n - 1


@pytest.mark.slow
def test_embedded_model_with_auto_settings_llm():
    """The model carries its protocol and its engine's size:
    ``special_kwargs="auto"`` is enough (no memory, block size or length
    given: the model's ``"engine"`` defaults, not vLLM's machine-sized ones).
    Chat answers what completions answer (the model's chat template renders
    the one user message as the bare problem); a chat it was not trained for
    is refused, saying so."""
    from vllm import SamplingParams

    from vllm_seqhooks import LLM

    problems = task.heldout_problems(12, seed=4321)
    params = SamplingParams(temperature=0.0, max_tokens=task.PARENT_MAX_TOKENS)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        llm = LLM(str(task.model_dir()), special_kwargs="auto", dtype="float32",
                  enforce_eager=True, seed=0)
        outs = llm.generate([p.prompt for p in problems], params, use_tqdm=False)
        chats = llm.chat([[{"role": "user", "content": p.prompt}] for p in problems], params,
                         use_tqdm=False)
        with pytest.raises(Exception, match="not chat turns: send one user message"):
            llm.chat([{"role": "system", "content": "You sort digits."},
                      {"role": "user", "content": problems[0].prompt}], params, use_tqdm=False)
    config = llm.llm_engine.vllm_config
    assert config.cache_config.block_size == task.ENGINE_DEFAULTS["block_size"]
    assert config.cache_config.kv_cache_memory_bytes == task.ENGINE_DEFAULTS["kv_cache_memory_bytes"]
    assert config.model_config.max_model_len == task.ENGINE_DEFAULTS["max_model_len"]
    assert llm.special_kwargs.child_prompt_template == task.CHILD_PROMPT_TEMPLATE
    assert all(task.check_full_text(p, o.outputs[0].text) for p, o in zip(problems, outs))
    assert any(o.hook_trace and o.hook_trace["children"] for o in outs)
    assert [c.outputs[0].text for c in chats] == [o.outputs[0].text for o in outs]
    assert [c.prompt_token_ids for c in chats] == [o.prompt_token_ids for o in outs]
