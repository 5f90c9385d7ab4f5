"""Admission-time validation without a logits processor: the same check on
both model runners, installed only for engines with hooks, and nothing that
vLLM's V1 or V2 logits-processor loaders (or speculative decoding) refuse."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.support.sched_harness import make_scheduler, make_vllm_config


def _v2_config_without_triton(monkeypatch, v2: bool = True) -> None:
    """Configurations that pick the V2 runner: vLLM checks that Triton is
    importable (its runner needs it); the frontend and the scheduler built
    here do not run a model, so the check is waived in this process."""
    import vllm.config.vllm as vllm_config_module

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1" if v2 else "0")
    monkeypatch.setattr(vllm_config_module, "HAS_TRITON", True)


def _params(**kwargs):
    from vllm import SamplingParams

    return SamplingParams(max_tokens=4, **kwargs)


def test_check_request_names_the_field():
    from vllm_seqhooks.engine.validation import check_request

    check_request(_params())
    check_request(_params(logprobs=1))  # sample logprobs: a row per merged token
    with pytest.raises(ValueError, match="prompt_logprobs"):
        check_request(_params(prompt_logprobs=1))
    with pytest.raises(ValueError, match="seqhooks_child_max_tokens"):
        check_request(_params(extra_args={"seqhooks_child_max_tokens": -3}))
    # Hooks off for the request: its prompt logprobs are fine.
    check_request(_params(prompt_logprobs=1, extra_args={"seqhooks_enabled": False}))


def test_unknown_request_keys_are_refused_naming_the_known_ones():
    from vllm_seqhooks.config.request_keys import REQUEST_OVERRIDE_KEYS
    from vllm_seqhooks.engine.validation import check_request

    with pytest.raises(ValueError) as exc:
        check_request(_params(extra_args={"seqhooks_child_max_token": 4, "other_plugin": 1}))
    message = str(exc.value)
    assert message.startswith(
        "unknown sequence-hook request key(s) in vllm_xargs / extra_args: "
        "'seqhooks_child_max_token' (did you mean 'seqhooks_child_max_tokens'?); known keys: ")
    assert "other_plugin" not in message
    assert all(k in message for k in REQUEST_OVERRIDE_KEYS)
    # a name cut short means the one it starts; nothing close: no guess
    with pytest.raises(ValueError) as exc:
        check_request(_params(extra_args={"seqhooks_max_children": 2, "seqhooks_zzz": 1}))
    assert ("'seqhooks_max_children' (did you mean 'seqhooks_max_children_per_request'?), "
            "'seqhooks_zzz'; known keys") in str(exc.value)
    # keys the engine writes itself, and those a loaded test tool reads
    import vllm_seqhooks.scripted.processor  # noqa: F401 (registers its keys)

    check_request(_params(extra_args={"seqhooks_child_key": "0", "seqhooks_sampled_before": 3,
                                      "seqhooks_script": [1], "seqhooks_step_delay_ms": 1}))


@pytest.mark.parametrize("v2", [False, True], ids=["v1-runner", "v2-runner"])
@pytest.mark.parametrize("hooks", [True, False], ids=["hooks", "stock"])
def test_input_processor_validates_only_engines_with_hooks(monkeypatch, v2, hooks):
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.engine.input_processor import InputProcessor

    from vllm_seqhooks.engine import vllm_private

    _v2_config_without_triton(monkeypatch, v2)
    vllm_private.install_request_validator()
    config = make_vllm_config(False, hooks={} if hooks else None)
    assert config.use_v2_model_runner is v2
    processor = InputProcessor(config)
    validate = processor.validate_logits_processors_params
    validate(_params())
    if hooks:
        with pytest.raises(VLLMValidationError, match="prompt_logprobs cannot be combined"):
            validate(_params(prompt_logprobs=2))
        with pytest.raises(VLLMValidationError, match="seqhooks_enabled"):
            validate(_params(extra_args={"seqhooks_enabled": "maybe"}))
    else:
        validate(_params(logprobs=2))


def test_hook_engine_arguments_pass_vllms_logits_processor_loaders(tiny_model_dir):
    """The engine arguments hooks install hold no logits processor, so
    vLLM's V1 and V2 loaders accept them and speculative decoding is not
    refused for it."""
    from vllm.v1.sample.logits_processor import validate_logits_processors_parameters
    from vllm.v1.worker.gpu.sample.logits_processor import (
        build_custom_logits_processors_params_validator,
    )

    from vllm_seqhooks.config.special_kwargs import SpecialKwargs
    from vllm_seqhooks.engine.engine_args import hook_engine_args

    hooks = SpecialKwargs(sync_token_id=6, promise_token_id=4, merge_separator_token_ids=(8,))
    for user in (None, [], ["my.module:Proc"]):
        given = {} if user is None else {"logits_processors": user}
        kwargs = {**given, **hook_engine_args(hooks, given)}
        assert kwargs.get("logits_processors") == user
    kwargs = hook_engine_args(hooks, {})
    build_custom_logits_processors_params_validator(kwargs.get("logits_processors"))(_params())
    validate_logits_processors_parameters(kwargs.get("logits_processors"), _params())


def test_v2_config_builds_the_hook_scheduler(monkeypatch):
    from vllm_seqhooks.engine.scheduler import SeqHooksAsyncScheduler, SeqHooksSyncScheduler

    _v2_config_without_triton(monkeypatch)
    for async_sched, cls in ((False, SeqHooksSyncScheduler), (True, SeqHooksAsyncScheduler)):
        sched = make_scheduler(async_sched)
        assert type(sched) is cls
        assert sched.use_v2_model_runner is True


def test_plugin_installs_the_check_when_the_frontend_is_imported():
    """In a fresh process, the entry point patches nothing until vLLM's
    frontend module is imported, and patches it as soon as it is."""
    code = textwrap.dedent(
        """
        import sys
        from vllm_seqhooks.plugin import register
        register()
        assert "vllm.v1.engine.input_processor" not in sys.modules
        from vllm.v1.engine.input_processor import InputProcessor
        fn = InputProcessor._build_logits_processors_params_validator
        print(getattr(fn, "_seqhooks_request_validator", False))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "True"


def test_when_imported_runs_after_the_import(tmp_path, monkeypatch):
    from vllm_seqhooks.engine.post_import import when_imported

    (tmp_path / "seqhooks_probe_mod.py").write_text("VALUE = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []

    def callback():
        seen.append(sys.modules["seqhooks_probe_mod"].VALUE)

    when_imported("seqhooks_probe_mod", callback)
    assert seen == []
    import seqhooks_probe_mod  # noqa: F401

    assert seen == [41]
    when_imported("seqhooks_probe_mod", lambda: seen.append("now"))
    assert seen == [41, "now"]
    monkeypatch.delitem(sys.modules, "seqhooks_probe_mod")


# ---------------------------------------------------------------------------
# Engines hooks refuse at start-up
# ---------------------------------------------------------------------------
def test_hooks_refuse_kv_connectors():
    from vllm.config import KVTransferConfig

    from vllm_seqhooks.config.special_kwargs import SpecialKwargs
    from vllm_seqhooks.engine.engine_args import hook_engine_args
    from vllm_seqhooks.engine.engine_support import unsupported_engine

    config = make_vllm_config(False, hooks={})
    assert unsupported_engine(config) is None
    config.kv_transfer_config = KVTransferConfig(kv_connector="ExampleConnector",
                                                 kv_role="kv_both")
    assert "kv_transfer_config" in unsupported_engine(config)
    hooks = SpecialKwargs(sync_token_id=6, promise_token_id=4, merge_separator_token_ids=(8,))
    with pytest.raises(ValueError, match="kv_transfer_config"):
        hook_engine_args(hooks, {"kv_transfer_config": {"kv_connector": "X"}})


def test_hooks_refuse_models_with_recurrent_state():
    """A KV cache group that is not attention (Mamba / linear attention):
    the scheduler refuses to start, saying why."""
    import torch
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, MambaSpec

    from vllm_seqhooks.engine.scheduler import SeqHooksScheduler
    from tests.support.sched_harness import make_kv_cache_config

    config = make_vllm_config(False, hooks={})
    attention = make_kv_cache_config(64, 16)
    mamba = KVCacheGroupSpec(["mamba"], MambaSpec(block_size=16, shapes=((4, 4),),
                                                  dtypes=(torch.float32,)))
    hybrid = KVCacheConfig(num_blocks=64, kv_cache_tensors=[],
                           kv_cache_groups=[*attention.kv_cache_groups, mamba])
    with pytest.raises(ValueError, match="only per-token state is attention KV.*MambaSpec"):
        SeqHooksScheduler(vllm_config=config, kv_cache_config=hybrid,
                          structured_output_manager=None, block_size=16)


def test_a_multimodal_prompt_with_hooks_is_refused():
    """Children are built from their parent's token ids: a multimodal
    prompt's images would not reach them, so such a request is refused
    (unless hooks are off for it); text prompts pass."""
    from types import SimpleNamespace

    from vllm_seqhooks.engine.validation import MULTIMODAL_REFUSAL, check_engine_request

    params = _params()
    with pytest.raises(ValueError) as err:
        check_engine_request(SimpleNamespace(mm_features=[object()]), params)
    assert str(err.value) == MULTIMODAL_REFUSAL and "seqhooks_enabled=false" in MULTIMODAL_REFUSAL
    check_engine_request(SimpleNamespace(mm_features=None), params)
    check_engine_request(SimpleNamespace(mm_features=[]), params)
    check_engine_request(SimpleNamespace(mm_features=[object()]),
                         _params(extra_args={"seqhooks_enabled": False}))


def test_the_frontend_checks_what_it_made_of_each_prompt():
    from vllm.v1.engine.input_processor import InputProcessor

    from vllm_seqhooks.engine import vllm_private

    assert vllm_private.input_processor_problems() == []
    vllm_private.install_request_validator()
    assert getattr(InputProcessor.process_inputs, "_seqhooks_request_validator", False)
