"""vLLM's Model Runner V2 (the GPU default) on CPU, and the scripted-token
logits processor for its interface (tests.support.v2_runner,
vllm_seqhooks.scripted.processor_v2).

Unit tests drive the V2 processor with hand-built batch layouts (no engine,
no Triton).  Engine tests run V2 in a subprocess through Triton's interpreter
(``run_in_v2``, or the session's V2 process, ``run_in_mode``); the functions ending in ``_case`` are what those processes
run (module level, JSON in and out)."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from tests.support import v2_runner
from tests.support.engine_modes import IN_PROCESS, EngineMode, run_in_mode
from vllm_seqhooks.scripted.tiny_model import (
    EOS_ID,
    FIXED_TOKENS,
    PROMISE_END_ID,
    PROMISE_ID,
    SYNC_ID,
    TOKENIZER_SIZE,
)

V1_RUNNER = "vllm.v1.worker.cpu_model_runner.CPUModelRunner"
V2_RUNNER = "vllm.v1.worker.cpu.model_runner.CPUModelRunner"
V2_BASE_MODULE = "vllm.v1.worker.gpu.model_runner"  # GPUModelRunner of V2
PROMPTS = ["Hello", "The quick brown fox", "1234"]

needs_triton = pytest.mark.skipif(
    not v2_runner.available(), reason=v2_runner.unavailable_reason() or ""
)


# --------------------------------------------------------------------------
# The V2 processor on hand-built batch layouts (no engine)
# --------------------------------------------------------------------------

VOCAB = 16
MAX_REQS = 4


def _proc(prompt_lens):
    """A V2 processor over fake request state (prompt length per slot)."""
    import torch
    from vllm.v1.worker.gpu.sample.logits_processor.interface import (
        LogitsProcRequestState,
    )

    from vllm_seqhooks.scripted.processor_v2 import ScriptedTokensLogitsProcessorV2

    prompt_len = SimpleNamespace(np=np.zeros(MAX_REQS, dtype=np.int32))
    prompt_len.np[: len(prompt_lens)] = prompt_lens
    state = LogitsProcRequestState(
        device=torch.device("cpu"),
        max_num_reqs=MAX_REQS,
        vocab_size=VOCAB,
        all_token_ids=None,
        prompt_len=prompt_len,
        prefill_len=None,
        total_len=None,
    )
    return ScriptedTokensLogitsProcessorV2(None, state), prompt_len.np


def _forced(proc, rows):
    """Apply to a batch given as ``[(slot, pos), ...]`` (one logits row each,
    requests in first-seen order); row -> forced token or None."""
    import torch
    from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsContext

    slots = [s for s, _ in rows]
    req_slots = list(dict.fromkeys(slots))
    local = [slots[:i].count(s) for i, s in enumerate(slots)]
    ctx = LogitsContext(
        expanded_idx_mapping=torch.tensor(slots, dtype=torch.int32),
        idx_mapping=torch.tensor(req_slots, dtype=torch.int32),
        idx_mapping_np=np.array(req_slots, dtype=np.intp),
        expanded_local_pos=torch.tensor(local, dtype=torch.int32),
        input_ids=torch.zeros(len(rows), dtype=torch.int32),
        pos=torch.tensor([p for _, p in rows], dtype=torch.int64),
        seq_lens_upper_bound_np=np.zeros(len(req_slots), dtype=np.int32),
    )
    logits = torch.randn(len(rows), VOCAB)
    out = proc.apply(logits, ctx)
    result = []
    for row in out:
        finite = torch.isfinite(row).nonzero().flatten().tolist()
        result.append(None if len(finite) == VOCAB else finite)
    return [r[0] if r and len(r) == 1 else r for r in result]


def _sp(**extra):
    from vllm import SamplingParams

    return SamplingParams(extra_args=extra or None)


def test_v2_processor_index_per_row_reordered_batch():
    proc, _ = _proc([5, 3, 7])
    a = _sp(seqhooks_script=[10, 11, 12], seqhooks_script_end="eos",
            seqhooks_eos_token_id=9)
    b = _sp(seqhooks_script=[13])  # end "free"
    c = _sp()  # not scripted
    assert [proc.add_request(i, p) for i, p in enumerate((a, b, c))] == [
        True, True, False
    ]
    proc.apply_staged_writes()
    # First samples: the row's input is the last prompt token (pos = len - 1).
    assert _forced(proc, [(0, 4), (1, 2), (2, 6)]) == [10, 13, None]
    # Rows reordered; k follows each row's position, not its place.
    assert _forced(proc, [(2, 7), (1, 3), (0, 5)]) == [None, None, 11]
    assert _forced(proc, [(0, 6)]) == [12]
    assert _forced(proc, [(0, 7)]) == [9]  # EOS after the script
    assert _forced(proc, [(0, 30)]) == [9]
    # A chunked prefill's row (before the prompt's end) is left alone.
    assert _forced(proc, [(0, 2), (1, 0)]) == [None, None]


def test_v2_processor_speculative_rows():
    """Under speculative decoding a request owns a row per draft token."""
    proc, _ = _proc([4, 2])
    proc.add_request(0, _sp(seqhooks_script=[10, 11, 12, 13]))
    proc.add_request(1, _sp(seqhooks_script=[14, 15]))
    proc.apply_staged_writes()
    rows = [(1, 2), (1, 3), (0, 4), (0, 5), (0, 6)]
    assert _forced(proc, rows) == [15, None, 11, 12, 13]


def test_v2_processor_readd_after_join_uses_new_prompt_length():
    """The scheduler re-adds a parent after a join: merged tokens become
    prompt tokens and extra_args carry seqhooks_sampled_before."""
    proc, prompt_len = _proc([3])
    script = [10, 11, 12, 13, 14]
    proc.add_request(0, _sp(seqhooks_script=script))
    proc.apply_staged_writes()
    assert _forced(proc, [(0, 2)]) == [10]
    assert _forced(proc, [(0, 3)]) == [11]
    # Re-added with prompt = 3 + 2 sampled + 4 merged tokens.
    prompt_len[0] = 9
    proc.add_request(0, _sp(seqhooks_script=script, seqhooks_sampled_before=2))
    proc.apply_staged_writes()
    assert _forced(proc, [(0, 8)]) == [12]
    assert _forced(proc, [(0, 9)]) == [13]
    # A slot reused by an unscripted request is released.
    proc.add_request(0, _sp())
    assert _forced(proc, [(0, 9)]) == [None]


def test_v2_processor_children_end_and_vocab():
    proc, _ = _proc([2, 2, 2, 2])
    base = dict(
        seqhooks_script=[10],
        seqhooks_child_scripts={"0": [11, 12]},
        seqhooks_child_default_script=[13],
        seqhooks_script_end="eos",
        seqhooks_eos_token_id=9,
    )
    proc.add_request(0, _sp(**base))
    proc.add_request(1, _sp(**base, seqhooks_child_key="0"))
    proc.add_request(2, _sp(**base, seqhooks_child_key="5"))
    # Out of the vocabulary: not forced (vLLM's sampler would index past it).
    proc.add_request(3, _sp(seqhooks_script=[VOCAB + 1, 12]))
    rows = [(0, 1), (1, 1), (2, 1), (3, 1)]
    assert _forced(proc, rows) == [10, 11, 13, None]
    rows = [(0, 2), (1, 2), (2, 2), (3, 2)]
    assert _forced(proc, rows) == [9, 12, 9, 12]


def test_v2_processor_skips_and_delays(monkeypatch):
    from vllm_seqhooks.scripted import processor_v2 as scripted_v2

    slept: list[float] = []
    monkeypatch.setattr(scripted_v2.time, "sleep", slept.append)
    proc, _ = _proc([1, 1, 1])
    proc.add_request(0, _sp(seqhooks_script=[10], seqhooks_step_delay_ms=20))
    proc.add_request(1, _sp(seqhooks_script=[11], seqhooks_step_delay_ms=50.0))
    proc.add_request(2, _sp())
    assert _forced(proc, [(0, 0), (1, 0), (2, 0)]) == [10, 11, None]
    assert slept == [0.05]
    # A batch without a scripted request: logits untouched, no sleep.
    assert _forced(proc, [(2, 1)]) == [None]
    assert slept == [0.05]


def test_v2_processor_validation_is_shared():
    from vllm_seqhooks.scripted.processor_v2 import ScriptedTokensLogitsProcessorV2

    validate = ScriptedTokensLogitsProcessorV2.validate_params
    validate(_sp(seqhooks_script=[1], seqhooks_child_scripts='{"0": [2]}'))
    for extra in (
        dict(seqhooks_script=[1, -1]),
        dict(seqhooks_script_end="stop"),
        dict(seqhooks_sampled_before=-1),
    ):
        with pytest.raises(ValueError, match=next(iter(extra))):
            validate(_sp(**extra))


def test_scripted_processor_for():
    from vllm.v1.sample.logits_processor import LogitsProcessor as V1Interface
    from vllm.v1.worker.gpu.sample.logits_processor.interface import (
        LogitsProcessor as V2Interface,
    )

    from tests.support.forkjoin import scripted_processor_for
    from vllm_seqhooks.scripted.processor import (
        SCRIPTED_LOGITS_PROCESSOR_FQCN,
        SCRIPTED_LOGITS_PROCESSOR_V2_FQCN,
    )

    v1, v2 = scripted_processor_for(False), scripted_processor_for(True)
    assert issubclass(v1, V1Interface) and not issubclass(v1, V2Interface)
    assert issubclass(v2, V2Interface) and not issubclass(v2, V1Interface)
    assert scripted_processor_for(SimpleNamespace(use_v2_model_runner=True)) is v2
    for cls, fqcn in ((v1, SCRIPTED_LOGITS_PROCESSOR_FQCN),
                      (v2, SCRIPTED_LOGITS_PROCESSOR_V2_FQCN)):
        assert fqcn == f"{cls.__module__}:{cls.__qualname__}"


# --------------------------------------------------------------------------
# v2_runner (no engine)
# --------------------------------------------------------------------------


def test_v2_env_and_availability(tmp_path):
    reason = v2_runner.unavailable_reason(tmp_path)
    assert reason and "setup.sh" in reason and str(tmp_path) in reason
    with pytest.raises(RuntimeError, match="setup.sh"):
        v2_runner.v2_env(directory=tmp_path)
    (tmp_path / "triton").mkdir()
    (tmp_path / "triton" / "__init__.py").write_text("")
    assert v2_runner.available(tmp_path)
    env = v2_runner.v2_env({"PYTHONPATH": "/elsewhere", "X": "1"}, directory=tmp_path)
    assert env["PYTHONPATH"].split(os.pathsep) == [
        str(v2_runner.STUB_DIR),
        str(tmp_path.resolve()),
        str(v2_runner.REPO_ROOT),
        "/elsewhere",
    ]
    assert env["TRITON_INTERPRET"] == "1" and env["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    assert env["X"] == "1"
    with pytest.raises(ValueError, match="module-level"):
        v2_runner.run_in_v2(lambda: 0)


def test_setup_installs_the_pinned_triton():
    setup = (v2_runner.REPO_ROOT / "scripts" / "setup.sh").read_text()
    assert f"TRITON_VERSION={v2_runner.TRITON_VERSION}\n" in setup
    assert '--target "$TRITON_DIR.partial" "triton==$TRITON_VERSION"' in setup


@needs_triton
def test_startup_hook_registers_stub_backend_only_when_interpreting():
    code = "from triton.backends import backends; print('cpu' in backends)"
    env = v2_runner.v2_env()
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True,
        check=True,
    )
    assert out.stdout.strip() == "True"
    env["TRITON_INTERPRET"] = "0"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True,
        check=True,
    )
    assert out.stdout.strip() == "False"


def echo_case(value, fail: bool = False) -> dict:
    from triton.backends import backends

    if fail:
        raise ValueError(f"failed with {value!r}")
    return {
        "value": value,
        "env": [os.environ.get(k) for k in ("TRITON_INTERPRET", "EXTRA")],
        "stub": "cpu" in backends,
    }


@needs_triton
def test_run_in_v2_round_trip_and_errors():
    value = {"a": [1, 2], "b": None}
    got = v2_runner.run_in_v2(echo_case, kwargs={"value": value}, env={"EXTRA": "x"})
    assert got == {"value": value, "env": ["1", "x"], "stub": True}
    with pytest.raises(v2_runner.V2RunError, match="ValueError: failed with 7"):
        v2_runner.run_in_v2(echo_case, kwargs={"value": 7, "fail": True})


@needs_triton
def test_activate_in_this_process_before_vllm_only():
    code = (
        "from tests.support.v2_runner import activate_in_this_process\n"
        "activate_in_this_process()\n"
        "from vllm.triton_utils import HAS_TRITON\n"
        "import vllm.envs as envs\n"
        "print(HAS_TRITON, envs.VLLM_USE_V2_MODEL_RUNNER)\n"
        "try:\n"
        "    activate_in_this_process()\n"
        "except RuntimeError as e:\n"
        "    print('refused:', e)\n"
    )
    env = {k: v for k, v in os.environ.items()
           if k not in ("TRITON_INTERPRET", "VLLM_USE_V2_MODEL_RUNNER")}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True,
        check=True,
    )
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "True True"
    assert lines[1].startswith("refused:") and "before vLLM is imported" in lines[1]


# --------------------------------------------------------------------------
# Engines: stock vLLM on V2 vs V1, and the scripted processor on V2
# --------------------------------------------------------------------------


def _runner_name(llm) -> tuple[str, list[str]]:
    from tests.support.forkjoin import model_runner_of

    cls = type(model_runner_of(llm))
    return f"{cls.__module__}.{cls.__qualname__}", [c.__module__ for c in cls.__mro__]


def greedy_case(model: str, prompts: list[str], max_tokens: int) -> dict:
    """Stock ``vllm.LLM``: which runner, which greedy tokens, and what
    ``uses_v2_model_runner`` predicted from the arguments beforehand."""
    from vllm import LLM, SamplingParams

    from vllm_seqhooks.scripted.tiny_model import TINY_ENGINE_KWARGS
    from tests.support.v2_runner import uses_v2_model_runner

    args = {"model": model, **TINY_ENGINE_KWARGS}
    predicted = uses_v2_model_runner(args)
    llm = LLM(**args)
    try:
        # Different lengths: each step mixes requests of different sizes.
        params = [SamplingParams(temperature=0.0, max_tokens=max_tokens - i)
                  for i in range(len(prompts))]
        outs = llm.generate(prompts, params, use_tqdm=False)
        runner, mro = _runner_name(llm)
        return {
            "predicted_v2": predicted,
            "config_v2": llm.llm_engine.vllm_config.use_v2_model_runner,
            "runner": runner,
            "mro": mro,
            "tokens": [list(o.outputs[0].token_ids) for o in outs],
        }
    finally:
        llm.llm_engine.engine_core.shutdown()


def v2_engines_case(model: str, prompts: list[str], max_tokens: int) -> dict:
    """:func:`greedy_case` and :func:`scripted_case` one after another in
    one V2 process (one import of vLLM for both engines)."""
    return {"greedy": greedy_case(model, prompts, max_tokens),
            "scripted": scripted_case(model)}


@pytest.fixture(scope="module")
def v2_engines(tiny_model_dir) -> dict:
    """The V2 engines, in the session's V2 (sync) process, which the other
    engine-mode files share (:mod:`tests.support.mode_workers`)."""
    return run_in_mode(EngineMode("v2", False), v2_engines_case, env=IN_PROCESS, kwargs=dict(
        model=tiny_model_dir, prompts=PROMPTS, max_tokens=12))


@pytest.mark.slow
@needs_triton
def test_v2_greedy_equals_v1(tiny_model_dir, v2_engines, monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    v1 = greedy_case(model=tiny_model_dir, prompts=PROMPTS, max_tokens=12)
    v2 = v2_engines["greedy"]

    assert v1["runner"] == V1_RUNNER and V2_BASE_MODULE not in v1["mro"]
    assert v2["runner"] == V2_RUNNER and V2_BASE_MODULE in v2["mro"]
    assert (v1["config_v2"], v2["config_v2"]) == (False, True)
    assert (v1["predicted_v2"], v2["predicted_v2"]) == (False, True)
    assert [len(t) for t in v1["tokens"]] == [12, 11, 10]
    assert len({tuple(t) for t in v1["tokens"]}) == len(PROMPTS)
    assert v2["tokens"] == v1["tokens"]


def prediction_case(model: str) -> dict:
    """``uses_v2_model_runner`` without ``VLLM_USE_V2_MODEL_RUNNER``: with
    Triton usable, it asks vLLM's config (which picks V2 here)."""
    os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
    from tests.support.forkjoin import scripted_engine_kwargs
    from vllm_seqhooks.scripted.processor import SCRIPTED_LOGITS_PROCESSOR_V2_FQCN
    from vllm_seqhooks.scripted.tiny_model import TINY_ENGINE_KWARGS
    from tests.support.v2_runner import uses_v2_model_runner

    (proc,) = scripted_engine_kwargs(model)["logits_processors"]
    return {
        "from_args": uses_v2_model_runner({"model": model, **TINY_ENGINE_KWARGS}),
        "hook_llm_processor": f"{proc.__module__}:{proc.__qualname__}",
        "v2_fqcn": SCRIPTED_LOGITS_PROCESSOR_V2_FQCN,
    }


def scripted_case(model: str) -> dict:
    """The V2 scripted processor (given by name) in a V2 engine."""
    from vllm import LLM, SamplingParams
    from vllm.exceptions import VLLMValidationError

    from vllm_seqhooks.scripted.processor import (
        SCRIPTED_LOGITS_PROCESSOR_V2_FQCN,
        scripted_params,
    )
    from vllm_seqhooks.scripted.tiny_model import TINY_ENGINE_KWARGS

    llm = LLM(model, logits_processors=[SCRIPTED_LOGITS_PROCESSOR_V2_FQCN],
              **TINY_ENGINE_KWARGS)

    def gen(prompts, params):
        outs = llm.generate(prompts, params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    try:
        parent = scripted_params([40], child_scripts={"0": [60, 61]},
                                 child_default_script=[63], max_tokens=16)

        def child(key):
            extra = {**parent.extra_args, "seqhooks_child_key": key}
            return SamplingParams(temperature=0.0, max_tokens=16, extra_args=extra)

        result = {
            "runner": _runner_name(llm)[0],
            "free_alone": gen(["Hello"], SamplingParams(temperature=0.0, max_tokens=8)),
            # One batch: scripted rows among free rows, prompts of various lengths.
            "batch": gen(
                ["hi", "Hello", "The quick brown fox", "x", "abc", "1234"],
                [
                    scripted_params([40, PROMISE_ID, 41, PROMISE_END_ID, SYNC_ID]),
                    SamplingParams(temperature=0.0, max_tokens=8),
                    scripted_params([40, 41, 42, 43], sampled_before=2),
                    parent,
                    child("0"),
                    child("7"),
                ],
            ),
            "end_free": gen(["hi"], scripted_params([PROMISE_ID, 40], end="free",
                                                    max_tokens=6)),
        }
        try:
            gen(["x"], SamplingParams(extra_args={"seqhooks_script_end": "stop"}))
        except VLLMValidationError as e:
            result["validation_error"] = str(e)
        return result
    finally:
        llm.llm_engine.engine_core.shutdown()


@pytest.mark.slow
@needs_triton
def test_v2_scripted_processor(v2_engines):
    got = v2_engines["scripted"]
    assert got["runner"] == V2_RUNNER
    (free,) = got["free_alone"]
    assert len(free) == 8 and all(len(FIXED_TOKENS) <= t < TOKENIZER_SIZE
                                  for t in free)
    assert got["batch"] == [
        [40, PROMISE_ID, 41, PROMISE_END_ID, SYNC_ID, EOS_ID],
        free,  # an unscripted request is untouched in a scripted batch
        [42, 43, EOS_ID],  # seqhooks_sampled_before=2
        [40, EOS_ID],
        [60, 61, EOS_ID],  # seqhooks_child_key "0"
        [63, EOS_ID],  # no entry: the default child script
    ]
    (end_free,) = got["end_free"]
    assert end_free[:2] == [PROMISE_ID, 40] and len(end_free) == 6
    assert all(len(FIXED_TOKENS) <= t for t in end_free[2:])
    assert "seqhooks_script_end" in got.get("validation_error", "")


@pytest.mark.slow
@needs_triton
def test_v2_prediction_without_env_var(tiny_model_dir):
    got = v2_runner.run_in_v2(prediction_case, kwargs=dict(model=tiny_model_dir))
    assert got["from_args"] is True
    assert got["hook_llm_processor"] == got["v2_fqcn"]
