"""The verl agent loop (``vllm_seqhooks.integrations.verl``) against verl's
own classes (issue 41): verl 0.9.1's ``vLLMHttpServer`` builds and starts
the engine from verl's trainer config (the hook settings in its
``engine_kwargs.vllm``), verl's ``LLMServerClient`` sends the requests, and
verl's ``AgentLoopWorker`` runs the agent loop it finds in its registry
through ``agent_loop_config_path`` and returns its ``DataProto``
(:mod:`vllm_seqhooks.integrations.verl.local` runs them in this process).

The oracle is ThreadWeaver's client loop written again
(:mod:`tests.support.branching_controller`) over the same verl server
classes without hooks: for the same prompts (greedy), the agent loop's
merged response and its expanded rows equal what that loop produces.

The pure parts (rows from a trace, the engine arguments, importing without
verl) run without verl; the rest is skipped when verl is not installed
(``scripts/setup.sh`` installs it beside vLLM, ``docs/rl.md``).

Time (issue 51: over 60 s, and why): six engines, none of which another
test's can be: the oracle's stock server, the hook servers of the "ids" and
the "text" boundaries (an engine setting), the GRPO example's in its own
process and the rollout benchmark's two in its own, each a multiprocess
engine (verl's server) of about 12 s to start and 5 s to stop; the three
in this process and the benchmark's run their workers in their EngineCore
processes (``VERL_WORKER_IN_ENGINE_PROCESS``; the benchmark through its
``--override``), the example's as pasted. The two
scripts run ahead (``scripts_ahead``), beside the in-process tests, every
engine process on one OpenMP thread (``verl_env``)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from vllm_seqhooks.core.trace import TRACE_KEY
from vllm_seqhooks.integrations import verl as seqhooks_verl
from vllm_seqhooks.integrations.verl.rows import agent_loop_fields
from vllm_seqhooks.tasks import threadweaver as task

from tests.support.run_ahead import RunAhead
from tests.support.server import VERL_WORKER_IN_ENGINE_PROCESS, WORKER_IN_ENGINE_PROCESS
from tests.test_rollout import RESPONSE, TRACE

PROBLEMS = ["3917425", "12", "987654321", "5", "80604020", "1111222233334444", "73", "90817"]


def test_importing_the_integration_needs_neither_verl_nor_vllm():
    code = ("import sys; import vllm_seqhooks.integrations.verl as v, vllm_seqhooks.integrations.verl.rows;"
            "v.engine_kwargs('threadweaver');"
            "print(sorted(m for m in ('verl', 'vllm', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_agent_loop_without_verl_says_how_to_get_it():
    code = ("import sys; sys.modules['verl'] = None\n"
            "try:\n    import vllm_seqhooks.integrations.verl.agent_loop\n"
            "except ImportError as exc:\n    print(exc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "subclasses verl's AgentLoopBase" in out.stdout
    assert "docs/rl.md" in out.stdout


def test_engine_kwargs_name_the_scheduler_the_settings_and_both_worker_extensions():
    got = seqhooks_verl.engine_kwargs({"format": "threadweaver", "boundary_tokenization": "ids"},
                                      additional_config={"mine": 1})
    assert got["scheduler_cls"] == "vllm_seqhooks.engine.scheduler.SeqHooksScheduler"
    assert got["worker_extension_cls"] == seqhooks_verl.WORKER_EXTENSION_CLASS_PATH
    assert got["additional_config"]["mine"] == 1
    assert got["additional_config"]["seqhooks"]["boundary_tokenization"] == "ids"
    assert got["additional_config"]["seqhooks"]["fork_tag"] == "</Outlines>"
    with pytest.raises(ValueError, match="needs hook settings"):
        seqhooks_verl.engine_kwargs(None)


def test_agent_loop_fields_mask_inserted_tokens_and_list_calls_in_order():
    lps = [-(t / 100) for t in RESPONSE]
    import copy

    trace = copy.deepcopy(TRACE)
    zero, one = trace["children"]
    zero["output_logprobs"], one["output_logprobs"] = [-0.2, -0.21, -0.22], [-0.3, 0.0]
    fields = agent_loop_fields([1, 2], RESPONSE, lps, {"kv_transfer_params": {TRACE_KEY: trace}},
                               response_length=100)
    assert fields["response_ids"] == RESPONSE
    assert fields["response_mask"] == [1, 1, 0, 1, 1, 0, 1, 1, 0, 1]
    assert fields["response_logprobs"][2] == 0.0 and fields["response_logprobs"][0] == -0.1
    extra = fields["extra_fields"]
    assert extra["expanded_response_ids"] == [[10, 11], [20, 21, 2], [30], [40, 2], [12]]
    assert extra["expanded_prompt_ids"][1] == [1, 2, 10, 11, 50]
    assert extra["expanded_response_mask"] == [[1] * len(r) for r in extra["expanded_response_ids"]]
    # a node whose logprobs were not kept (here 1.0) gets 0.0s, aligned with its tokens
    assert extra["expanded_response_logprobs"] == [
        [-0.1, -0.11], [-0.2, -0.21, -0.22], [-0.3], [0.0, 0.0], [-0.12]]


def test_agent_loop_fields_cut_as_threadweavers_agent_loop():
    fields = agent_loop_fields([1, 2], RESPONSE, None, {"kv_transfer_params": {TRACE_KEY: TRACE}},
                               response_length=4, max_total_tokens=8)
    assert fields["response_ids"] == RESPONSE[:4] and len(fields["response_mask"]) == 4
    assert fields["response_logprobs"] is None
    extra = fields["extra_fields"]
    assert "expanded_response_logprobs" not in extra
    # each call: at most 4 tokens, and at most 8 - len(its prompt)
    assert extra["expanded_response_ids"] == [[10, 11], [20, 21, 2], [30], [40, 2], []]


def test_a_sample_that_never_forked_is_one_plain_row():
    fields = agent_loop_fields([1], [5, 6, 2], [-1.0, -2.0, -3.0], {"global_steps": 3},
                               response_length=10)
    assert fields["response_mask"] == [1, 1, 1]
    assert fields["extra_fields"]["expanded_prompt_ids"] == [[1]]
    assert fields["extra_fields"]["expanded_response_ids"] == [[5, 6, 2]]


# -- verl's own classes ------------------------------------------------------


def _verl_local():
    pytest.importorskip("verl", reason="verl is not installed (scripts/setup.sh installs it)")
    from vllm_seqhooks.integrations.verl import local

    return local


@pytest.fixture(scope="module")
def verl_env():
    mp = pytest.MonkeyPatch()
    mp.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    # one OpenMP thread per engine process: the servers here and the scripts'
    # (run ahead, beside them) would otherwise spin against each other on
    # two cores; the oracle's server and the hook servers alike
    mp.setenv("OMP_NUM_THREADS", "1")
    # the servers' workers in their EngineCore processes (two processes a
    # server, not three: VERL_WORKER_IN_ENGINE_PROCESS); the scripts run as
    # pasted, without it (_script_env)
    for key, value in WORKER_IN_ENGINE_PROCESS.items():
        mp.setenv(key, value)
    yield
    mp.undo()


def _script_env() -> dict[str, str]:
    """This process's environment as a user's shell has it: without
    :data:`WORKER_IN_ENGINE_PROCESS` (``verl_env``)."""
    import os

    return {k: v for k, v in os.environ.items() if k not in WORKER_IN_ENGINE_PROCESS}


async def _oracle_rows(local, cfg, prompts):
    """ThreadWeaver's client loop over verl's server without hooks."""
    from tests.support.branching_controller import BranchingController

    server = await local.start_server(cfg)
    try:
        client = local.server_client(cfg, server)
        tok = server.model_config.tokenizer
        rollout = cfg.actor_rollout_ref.rollout

        async def generate(prompt_ids, params):
            out = await client.generate("oracle", prompt_ids=prompt_ids, sampling_params=dict(params))
            return out.token_ids

        params = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0}
        assert cfg.actor_rollout_ref.model.custom_chat_template is None  # the model's own
        results = []
        for text in prompts:
            # (as ThreadWeaver's SingleTurnAgentLoop.run builds its prompt)
            ids = tok.apply_chat_template([{"role": "user", "content": text}],
                                          add_generation_prompt=True, tokenize=True)
            ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)  # (transformers 5: a dict)
            ctl = BranchingController(tok, generate, params, response_length=rollout.response_length,
                                      max_total_tokens=rollout.max_model_len)
            results.append((ids, await ctl.run(ids)))
        return results
    finally:
        await local.stop_server(server)


async def _agent_loop_batch(local, cfg, prompts):
    server = await local.start_server(cfg)
    try:
        worker = local.agent_loop_worker(cfg, local.server_client(cfg, server))
        return await worker.generate_sequences(local.prompts_batch(prompts))
    finally:
        await local.stop_server(server)


@pytest.fixture(scope="module")
def scripts_ahead(request, verl_env):
    """The selected tests that run a script (``SCRIPTS``: each its own
    process and engines), started at once, beside the in-process tests
    that follow: a script's process and the tests' engine processes are
    each mostly one busy process at a time, so together they use both
    cores. Each test takes its own result."""
    names = {item.originalname for item in request.session.items
             if getattr(item, "module", None) is request.module}
    runs = RunAhead(workers=len(SCRIPTS))
    for name, body in SCRIPTS.items():
        if name in names:
            runs.submit(name, body)
    yield runs
    runs.close()


@pytest.fixture(scope="module")
def threadweaver_oracle(verl_env, scripts_ahead):
    local = _verl_local()
    stock = local.trainer_config(str(task.model_dir()), None, temperature=0.0,
                                 overrides=VERL_WORKER_IN_ENGINE_PROCESS)
    return asyncio.run(_oracle_rows(local, stock, [task.prompt_text(d) for d in PROBLEMS]))


@pytest.mark.slow
@pytest.mark.parametrize("boundaries", ["ids", "text"])
def test_agent_loop_rows_equal_threadweavers_client_loop_over_stock_vllm(
        verl_env, threadweaver_oracle, boundaries):
    """With "text" boundaries the loop is switched in by the one line of
    docs/rl.md: ``agent_loop_config_path`` = ``AGENT_LOOPS_AS_SINGLE_TURN``
    with verl's default agent, ``single_turn_agent``, left as it is."""
    local = _verl_local()
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    expected = threadweaver_oracle
    one_line = {"actor_rollout_ref.rollout.agent.default_agent_loop": "single_turn_agent",
                "actor_rollout_ref.rollout.agent.agent_loop_config_path":
                    str(seqhooks_verl.AGENT_LOOPS_AS_SINGLE_TURN)}
    hooks = local.trainer_config(str(task.model_dir()),
                                 {"format": "auto", "boundary_tokenization": boundaries},
                                 temperature=0.0,
                                 overrides={**VERL_WORKER_IN_ENGINE_PROCESS,
                                            **(one_line if boundaries == "text" else {})})
    saved = dict(_agent_loop_registry)
    try:
        batch = asyncio.run(_agent_loop_batch(local, hooks,
                                              [task.prompt_text(d) for d in PROBLEMS]))
    finally:  # (verl's registry is global: give single_turn_agent back)
        _agent_loop_registry.clear()
        _agent_loop_registry.update(saved)

    nt = batch.non_tensor_batch
    got_responses = local.responses(batch)
    forked = 0
    for i, (prompt_ids, want) in enumerate(expected):
        mask = batch.batch["attention_mask"][i]
        plen = batch.batch["prompts"].shape[1]
        got_prompt = batch.batch["prompts"][i][mask[:plen].bool()].tolist()
        got_response = got_responses[i]
        n = len(got_response)
        assert got_prompt == prompt_ids
        assert got_response == want.response_ids, PROBLEMS[i]
        assert [list(x) for x in nt["expanded_prompt_ids"][i]] == want.expanded_prompt_ids
        assert [list(x) for x in nt["expanded_response_ids"][i]] == want.expanded_response_ids, (PROBLEMS[i], got_response, want.expanded_prompt_ids)
        assert [list(x) for x in nt["expanded_response_mask"][i]] == want.expanded_response_mask
        forked += len(want.expanded_prompt_ids) > 1
        # 1: sampled by the policy; 0: inserted by the engine. A "text" merge
        # re-tokenizes its boundaries: the children's tokens get their loss
        # in their own (expanded) rows only.
        sampled = int(batch.batch["response_mask"][i][:n].sum())
        calls = want.expanded_response_ids
        owned = calls if boundaries == "ids" else [calls[0], calls[-1]] if len(calls) > 1 else calls
        assert sampled == sum(len(c) for c in owned)
    assert forked >= len(PROBLEMS) // 2  # the comparison covers families, not only plain samples
    assert set(nt["agent_name"]) == {seqhooks_verl.AGENT_NAME if boundaries == "ids"
                                     else "single_turn_agent"}
    assert set(nt["stop_reason"]) == {"completed"}



@pytest.mark.slow
def test_the_grpo_example_runs_through_verls_agent_loop_worker(scripts_ahead):
    """``examples/verl_grpo_rollouts.py``: verl's DataProto with the agent
    loop's fields, a reward and an advantage per sample, a clean exit (no
    process killed at shutdown, also on a busy machine). (Run ahead:
    ``scripts_ahead``.)"""
    scripts_ahead.result("test_the_grpo_example_runs_through_verls_agent_loop_worker")


def _grpo_example() -> None:
    from pathlib import Path

    from tests.support.crash_like import crash_like

    _verl_local()
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "examples" / "verl_grpo_rollouts.py"),
                           "--problems", "3", "--group", "2"],
                          cwd=root, capture_output=True, text=True, timeout=600, env=_script_env())
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert not crash_like(output), crash_like(output)
    # (stopped within local.stop_server's wait, busy machine or not: vLLM's
    # 5 s grace ran out under load, issue 51 item 6)
    assert "still running after grace period" not in output, output[-3000:]
    assert "verl DataProto: 6 rows" in proc.stdout
    for field in ("'responses'", "'response_mask'", "'rollout_log_probs'", "'position_ids'"):
        assert f"batch[{field}]" in proc.stdout
    assert "expanded_prompt_ids" in proc.stdout
    samples = [line for line in proc.stdout.splitlines() if line.startswith("  sample")]
    assert len(samples) == 6 and all("reward" in s and "advantage" in s for s in samples)
    assert any("inserted)" in s and "(0 inserted)" not in s for s in samples)  # some forked


@pytest.mark.slow
def test_the_verl_rollout_benchmark_smoke(scripts_ahead):
    """``python -m benchmarks.verl_rollout --smoke``: the three
    configurations ran through verl's agent-loop worker and counted the
    same things (the sampled tokens are each call's tokens on both sides).
    (Run ahead: ``scripts_ahead``.)"""
    scripts_ahead.result("test_the_verl_rollout_benchmark_smoke")


def _benchmark_smoke() -> None:
    import json
    import tempfile
    from pathlib import Path

    _verl_local()
    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory(prefix="verl-rollout-smoke-") as out:
        tmp_path = Path(out)
        # (its two servers' workers in their EngineCore processes, as the
        # in-process tests' servers: what is checked is what the benchmark
        # counts; the example above runs vLLM's CPU default, as pasted)
        overrides = [f"--override={key}={value}"
                     for key, value in VERL_WORKER_IN_ENGINE_PROCESS.items()]
        proc = subprocess.run([sys.executable, "-m", "benchmarks.verl_rollout", "--smoke",
                               *overrides, "--out", str(tmp_path)], cwd=root,
                              capture_output=True, text=True, timeout=600,
                              env={**_script_env(), **WORKER_IN_ENGINE_PROCESS})
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        results = json.loads((tmp_path / "verl_rollout.json").read_text())
        report = (tmp_path / "verl_rollout.md").read_text()
    assert results["overrides"] == VERL_WORKER_IN_ENGINE_PROCESS
    rounds = results["rounds"]
    assert set(rounds) == {"loop", "loop_b", "native"}
    for config, rs in rounds.items():
        assert all(r["samples"] == 8 and r["sampled_tokens"] > 0 for r in rs), config
    # one request per sample natively; the client loop one per call row
    assert all(r["requests"] == r["samples"] < r["calls"] for r in rounds["native"])
    assert all(r["requests"] == r["calls"] for r in rounds["loop"])
    assert set(results["ratios"]) == {"A/A control: loop_b / loop", "native / loop"}
    assert "native / loop" in report


#: The tests' bodies that run a script, run ahead by ``scripts_ahead``.
SCRIPTS = {
    "test_the_grpo_example_runs_through_verls_agent_loop_worker": _grpo_example,
    "test_the_verl_rollout_benchmark_smoke": _benchmark_smoke,
}
