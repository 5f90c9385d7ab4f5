"""`vllm_seqhooks.LLM`: stock behaviour without hooks; the hook scheduler in
the default multiprocess engine."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

PROMPTS = ["Hello there", "A B C D", "The fox"]


def test_without_special_kwargs_it_is_stock_vllm(tiny_model_dir, tiny_llm_kwargs):
    import vllm
    from vllm.v1.core.sched.scheduler import Scheduler

    from vllm_seqhooks import LLM
    from tests.support.forkjoin import scheduler_of

    kwargs = {k: v for k, v in tiny_llm_kwargs.items() if k != "model"}
    params = vllm.SamplingParams(temperature=0, max_tokens=24)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        ours = LLM(tiny_model_dir, **kwargs)
        cfg = ours.llm_engine.vllm_config
        assert cfg.scheduler_config.scheduler_cls is None
        assert "seqhooks" not in (cfg.additional_config or {})
        assert type(scheduler_of(ours)) is Scheduler  # vLLM's own, not a subclass
        got = [o.outputs[0].token_ids for o in ours.generate(PROMPTS, params, use_tqdm=False)]
        del ours
        stock = vllm.LLM(tiny_model_dir, **kwargs)
        want = [o.outputs[0].token_ids for o in stock.generate(PROMPTS, params, use_tqdm=False)]
    assert got == want


def test_bad_special_kwargs_fail_before_the_engine_starts(tiny_model_dir):
    from vllm_seqhooks import LLM, SpecialKwargsError

    with pytest.raises(SpecialKwargsError, match="sync_token '<snyc>' is not a single token"):
        LLM(tiny_model_dir, special_kwargs={"sync_token": "<snyc>", "promise_token": "<promise>"})
    with pytest.raises(SpecialKwargsError, match="unknown special_kwargs field"):
        LLM(tiny_model_dir, special_kwargs={"sync_id": 6, "promise_token_id": 4})
    with pytest.raises(ValueError, match="scheduler_cls"):
        LLM(tiny_model_dir, special_kwargs={"sync_token_id": 6, "promise_token_id": 4},
            scheduler_cls="vllm.v1.core.sched.scheduler.Scheduler")


def _worker_exit_grace(worker) -> str | None:
    import os

    from vllm_seqhooks.engine.worker_exit import ENV_VAR

    return os.environ.get(ENV_VAR)


def test_hooks_in_the_default_multiprocess_engine(tiny_model_dir, tiny_llm_kwargs, monkeypatch):
    """Default path: EngineCore in its own process. The merged text and the
    trace can only come from the hook scheduler running in that process."""
    import os

    from vllm_seqhooks import LLM, format_tree
    from tests.support.forkjoin import Scripts
    from vllm_seqhooks.engine.worker_exit import ENV_VAR, WORKER_EXIT_S
    from vllm_seqhooks.scripted.processor import SCRIPTED_LOGITS_PROCESSOR_FQCN

    assert os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0"
    assert ENV_VAR not in os.environ
    # (lets collective_rpc send a test function to the worker, below)
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    kwargs = {k: v for k, v in tiny_llm_kwargs.items() if k != "model"}
    llm = LLM(tiny_model_dir,
              special_kwargs={"sync_token": "<sync>", "promise_token": "<promise>",
                              "promise_end_token": "</promise>", "merge_separator": " | "},
              logits_processors=[SCRIPTED_LOGITS_PROCESSOR_FQCN], **kwargs)
    try:
        assert llm.llm_engine.engine_core.__class__.__name__ != "InprocClient"
        # Its processes give the worker time to exit on a busy machine
        # (engine/worker_exit.py; the worker inherits the engine process's
        # environment, and setproctitle hides both from /proc); the caller's
        # environment is unchanged.
        assert llm.collective_rpc(_worker_exit_grace) == [str(WORKER_EXIT_S)]
        assert ENV_VAR not in os.environ
        S = Scripts(llm.get_tokenizer())
        params = S.params("go<promise>a</promise><promise>b</promise><sync>!",
                          {"0": "X", "1": "YY"})
        out = llm.generate(["multi"], params, use_tqdm=False)[0]
        assert out.outputs[0].text == "go<promise>a</promise><promise>b</promise><sync>X | YY!"
        assert [c["output"] for c in out.hook_trace["children"]] == ["X", "YY"]
        assert "join of ['0', '1']" in format_tree(out.hook_trace)
        chat = llm.chat([{"role": "user", "content": "hi"}],
                        S.params("<promise>q</promise><sync>", {"0": "Z"}), use_tqdm=False)[0]
        assert chat.outputs[0].text == "<promise>q</promise><sync>Z"
    finally:
        llm.shutdown()  # its EngineCore process: not left running for the rest of the run


def test_hooks_with_two_tensor_parallel_worker_processes(tiny_model_dir, tiny_llm_kwargs,
                                                         monkeypatch):
    """Tensor parallelism: the model runs in two worker processes beside
    EngineCore. Fork/join still merges correctly, and both workers keep
    families together in their batches (they load the hook worker extension)."""
    from vllm_seqhooks import LLM
    from tests.support.forkjoin import Scripts
    from vllm_seqhooks.scripted.processor import SCRIPTED_LOGITS_PROCESSOR_FQCN

    import os

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("two worker processes need two CPUs")
    # the CPU backend binds each worker to its own cores (one each here)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", f"{cpus[0]}|{cpus[1]}")
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc(callable)
    kwargs = {k: v for k, v in tiny_llm_kwargs.items() if k != "model"}
    llm = LLM(tiny_model_dir, special_kwargs={"sync_token": "<sync>", "promise_token": "<promise>",
                                              "promise_end_token": "</promise>"},
              logits_processors=[SCRIPTED_LOGITS_PROCESSOR_FQCN], tensor_parallel_size=2,
              distributed_executor_backend="mp", **kwargs)
    try:
        S = Scripts(llm.get_tokenizer())
        params = S.params("a<promise>x</promise>b<promise>y</promise><sync>e",
                          {"0": "AAAA", "1": "BBBBB"})
        outs = llm.generate([f"tp {i}" for i in range(3)], params, use_tqdm=False)
        assert [o.outputs[0].text for o in outs] == [
            "a<promise>x</promise>b<promise>y</promise><sync>AAAA\nBBBBBe"] * 3
        flags = llm.collective_rpc(
            lambda self: type(self.model_runner.__dict__.get("_seqhooks_family_grouping")).__name__)
        assert flags == ["FamilyGrouping"] * 2
    finally:
        llm.llm_engine.engine_core.shutdown()
