"""Between two training steps, through verl's own server methods (issue 41,
item 3): verl 0.9.1's ``vLLMHttpServer`` with hooks aborts everything while
fork/join families are in flight (``abort_all_requests``: vLLM's
``pause_generation`` with the caches cleared), updates the weights
(``collective_rpc("reload_weights")``), clears the KV cache
(``clear_kv_cache``) and resumes (``resume_generation``). Afterwards the
server's metrics show nothing held (no parked parent, no open child, no KV
block, no request), what each aborted family returned is verl's aborted
``TokenOutput`` with the parent's tokens so far, and the next step's
families are right.

The families are scripted on the tiny model with a slow model step
(``seqhooks_step_delay_ms``), as in ``test_between_training_steps.py``,
sent through verl's ``LLMServerClient`` with the script in
``extra_args``. What needs a GPU stays untested here: verl's hybrid
``sleep``/``wake_up`` (vLLM's sleep mode; the CPU platform has none) and
its own weight sync (``update_weights_from_ipc``: CUDA IPC or shared
memory from the trainer's workers; here the workers reload the checkpoint
instead, through the same ``collective_rpc``)."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.support.server import (
    SCRIPTED,
    VERL_WORKER_IN_ENGINE_PROCESS,
    WORKER_IN_ENGINE_PROCESS,
    metric,
    scrape,
)
from tests.test_between_training_steps import (CHILDREN, EXPECTED, HELD, SLOW_CHILDREN,
                                               script_args)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local():
    pytest.importorskip("verl", reason="verl is not installed (scripts/setup.sh installs it)")
    from vllm_seqhooks.integrations.verl import local

    return local


def _params(ids, children, delay_ms=0):
    return {"temperature": 0.0, "max_tokens": 100,
            "extra_args": script_args(ids, children, delay_ms)}


async def _held(url: str) -> dict[str, float]:
    samples = await asyncio.to_thread(scrape, url)
    return {name: metric(samples, name) for name in HELD}


async def _nothing_held(url: str, timeout: float = 30) -> dict[str, float]:
    deadline = time.time() + timeout
    while True:
        held = await _held(url)
        if not any(held.values()) or time.time() > deadline:
            return held
        await asyncio.sleep(0.2)


def _ended(tasks, tok) -> list[str]:
    """What each family that ended before the abort returned or raised (a
    failure's first question: did it finish, or fail?)."""
    ended = []
    for t in tasks:
        if not t.done():
            continue
        if t.exception() is not None:
            ended.append(f"raised {t.exception()!r}")
        else:
            out = t.result()
            ended.append(f"{out.stop_reason}: {tok.decode(out.token_ids)!r}")
    return ended


async def _abort_all(server) -> None:
    """verl's ``abort_all_requests``. verl 0.9.1 (built against vLLM 0.24)
    calls ``AsyncLLM.pause_generation(wait_for_inflight_requests=False,
    clear_cache=True)``; vLLM 0.32 and 0.33 name that ``mode="abort"``, and
    verl's call fails with a TypeError before it aborts anything. Then the
    same pause in vLLM's words, as verl would make it."""
    try:
        aborted = await server.abort_all_requests()
    except TypeError as exc:
        assert "wait_for_inflight_requests" in str(exc), exc  # (another failure: not this one)
        await server.engine.pause_generation(mode="abort", clear_cache=True)
    else:
        assert aborted["aborted_count"] >= 4


async def _between_steps(local, cfg, tok, ids):
    from vllm_seqhooks.integrations.verl.rows import agent_loop_fields

    server = await local.start_server(cfg)
    url = f"http://127.0.0.1:{server._server_port}"
    try:
        client = local.server_client(cfg, server)
        prompt = tok.encode("hello", add_special_tokens=False)

        def family(children, delay_ms=0):
            return asyncio.create_task(client.generate(
                "step", prompt_ids=list(prompt), sampling_params=_params(ids, children, delay_ms)))

        # step 1: slow families in flight (every one parked with its
        # children running: on a busy machine they reach the engine a few
        # steps apart, and one still writing its first promise when the
        # abort comes has not reached what is asserted below), then verl's
        # abort-all
        tasks = [family(SLOW_CHILDREN, delay_ms=40) for _ in range(4)]
        deadline = time.time() + 120
        while True:
            held = await _held(url)
            if (held["vllm:seqhooks_parked_requests"] >= len(tasks)
                    and held["vllm:seqhooks_open_children"] >= 2 * len(tasks)):
                break
            assert time.time() < deadline, f"no family in flight: {held}"
            assert not any(t.done() for t in tasks), (held, _ended(tasks, tok))
            await asyncio.sleep(0.1)
        await _abort_all(server)
        outs = await asyncio.gather(*tasks)
        assert {o.stop_reason for o in outs} == {"aborted"}
        texts = [tok.decode(o.token_ids) for o in outs]
        assert all(t.startswith("ab<promise>xy</promise>") and "done" not in t for t in texts), texts
        for o in outs:  # an aborted family's row: the parent's tokens so far, all its own
            fields = agent_loop_fields(prompt, o.token_ids, o.log_probs, o.extra_fields,
                                       response_length=100)
            assert fields["response_ids"] == list(o.token_ids)
            assert fields["response_mask"] == [1] * len(o.token_ids)
        held = await _nothing_held(url)
        assert not any(held.values()), held

        # between the steps: the weights updated (vLLM's worker reloads them
        # through collective_rpc, the path verl's own weight sync takes to its
        # worker extension), the KV cache cleared
        await server.engine.collective_rpc("reload_weights")
        await server.clear_kv_cache()
        await server.resume_generation()
        assert not any((await _nothing_held(url)).values())

        # step 2: the families are right and leave nothing
        outs = await asyncio.gather(*[family(CHILDREN) for _ in range(3)])
        assert [tok.decode(o.token_ids, skip_special_tokens=True) for o in outs] == [EXPECTED] * 3
        assert {o.stop_reason for o in outs} == {"completed"}
        held = await _nothing_held(url)
        assert not any(held.values()), held
    finally:
        await local.stop_server(server)


def test_abort_all_clear_and_resume_through_verls_server(local, tiny_model_dir, monkeypatch):
    from transformers import AutoTokenizer

    from vllm_seqhooks.scripted.processor import encode_script

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    for key, value in WORKER_IN_ENGINE_PROCESS.items():  # (with VERL_WORKER_IN_ENGINE_PROCESS)
        monkeypatch.setenv(key, value)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = local.trainer_config(
        tiny_model_dir, {"sync_token": "<sync>", "promise_token": "<promise>",
                         "promise_end_token": "</promise>"},
        prompt_length=32, response_length=160, calculate_log_probs=False,
        overrides={"actor_rollout_ref.rollout.engine_kwargs.vllm.logits_processors": [SCRIPTED],
                   # (verl turns vLLM's stats off by default: the gauges read here need them)
                   "actor_rollout_ref.rollout.disable_log_stats": False,
                   **VERL_WORKER_IN_ENGINE_PROCESS})
    asyncio.run(_between_steps(local, cfg, tok, lambda text: encode_script(tok, text)))
