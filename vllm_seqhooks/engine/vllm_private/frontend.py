"""The frontend's side: the per-request params validator of vLLM's
InputProcessor, which the hooks' own request check joins."""

from __future__ import annotations

import inspect

from vllm_seqhooks.engine.vllm_private.common import (
    VllmPrivateAPIError,
    method_problems,
    wrap_method,
)


#: The frontend's admission path: the per-request params validator that
#: :func:`install_request_validator` extends with the hooks' own checks.
INPUT_PROCESSOR_METHODS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("_build_logits_processors_params_validator", ("self",)),
    ("_validate_params", ("self", "params", "supported_tasks")),
)
#: The processed request :func:`install_request_validator` checks (its
#: multimodal features): ``InputProcessor.process_inputs(self, request_id,
#: prompt, params, ...)`` returns an ``EngineCoreRequest``.
PROCESS_INPUTS_PARAMS = ("self", "request_id", "prompt", "params")


def input_processor_problems() -> list[str]:
    """Like :func:`problems`, for the frontend's admission path."""
    from vllm.v1.engine.input_processor import InputProcessor

    found = method_problems(InputProcessor, INPUT_PROCESSOR_METHODS)
    init_src = inspect.getsource(InputProcessor.__init__)
    if "self._build_logits_processors_params_validator()" not in init_src:
        found.append("InputProcessor.__init__ no longer builds its params validator")
    got = tuple(inspect.signature(InputProcessor.process_inputs).parameters)[:4]
    if got != PROCESS_INPUTS_PARAMS:
        found.append(f"InputProcessor.process_inputs{got} != expected {PROCESS_INPUTS_PARAMS}...")
    from vllm.v1.engine import EngineCoreRequest

    if "mm_features" not in EngineCoreRequest.__struct_fields__:
        found.append("EngineCoreRequest lost field 'mm_features'")
    src = inspect.getsource(InputProcessor._validate_params)
    if "self.validate_logits_processors_params(params)" not in src:
        found.append("InputProcessor._validate_params no longer runs the params validator")
    return found


_REQUEST_VALIDATOR_MARK = "_seqhooks_request_validator"


def install_request_validator() -> None:
    """Make the frontend of every engine with hooks run
    :func:`vllm_seqhooks.engine.validation.check_request` on each request it admits,
    and :func:`~vllm_seqhooks.engine.validation.check_engine_request` on what it
    made of the prompt (once per process; engines without hooks are untouched).

    vLLM's ``InputProcessor`` builds one params validator at start-up and
    calls it for every request in ``_validate_params``; the wrapper chains
    the hooks' check after vLLM's own. It works the same for both model
    runners and costs nothing per step. Raises :class:`VllmPrivateAPIError`
    when the installed vLLM lacks what it needs: requests would otherwise
    reach the engine unchecked."""
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.engine.input_processor import InputProcessor

    from vllm_seqhooks.engine.metrics_export import enable_engine_metrics
    from vllm_seqhooks.engine.validation import (
        chain_validators, check_engine_request, hooks_enabled)

    original = InputProcessor._build_logits_processors_params_validator
    if getattr(original, _REQUEST_VALIDATOR_MARK, False):
        return
    found = input_processor_problems()
    if found:
        raise VllmPrivateAPIError(
            "vllm_seqhooks cannot validate requests on this vLLM:\n  - "
            + "\n  - ".join(found)
        )

    def _build_logits_processors_params_validator(self):
        validator = original(self)
        if hooks_enabled(getattr(self.vllm_config, "additional_config", None)):
            validator = chain_validators(validator, VLLMValidationError)
            enable_engine_metrics()  # (before the engine starts: it inherits the directory)
        return validator

    wrap_method(InputProcessor, "_build_logits_processors_params_validator",
                _build_logits_processors_params_validator, _REQUEST_VALIDATOR_MARK)

    process_inputs = InputProcessor.process_inputs

    def process_inputs_checked(self, request_id, prompt, params, *args, **kwargs):
        request = process_inputs(self, request_id, prompt, params, *args, **kwargs)
        if hooks_enabled(getattr(self.vllm_config, "additional_config", None)):
            try:
                check_engine_request(request, params)
            except ValueError as exc:
                raise VLLMValidationError(str(exc), parameter="prompt") from exc
        return request

    wrap_method(InputProcessor, "process_inputs", process_inputs_checked, _REQUEST_VALIDATOR_MARK)


#: Where vLLM's frontend turns an engine output into a ``RequestOutput``;
#: with ``n`` > 1 it aggregates the ``n`` completions there
#: (``ParentRequest.get_outputs``) and keeps the last one's
#: ``kv_transfer_params`` for all of them.
OUTPUT_STATE_METHODS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("make_request_output", ("self", "new_token_ids", "pooling_output", "finish_reason",
                             "stop_reason", "kv_transfer_params", "ec_transfer_params",
                             "error")),
)


def output_processor_problems() -> list[str]:
    """Like :func:`input_processor_problems`, for the per-completion traces."""
    from vllm.v1.engine.output_processor import RequestState

    found = method_problems(RequestState, OUTPUT_STATE_METHODS)
    init = inspect.getsource(RequestState.__init__)
    for attr in ("self.parent_req = parent_req", "self.request_index = request_index"):
        if attr not in init:
            found.append(f"RequestState.__init__ no longer sets {attr.split(' = ')[0]}")
    src = inspect.getsource(RequestState.make_request_output)
    if "self.parent_req.get_outputs(" not in src:
        found.append("RequestState.make_request_output no longer aggregates n completions")
    return found


_TRACES_MARK = "_seqhooks_completion_traces"


def install_per_completion_traces() -> None:
    """Keep each of a request's ``n`` completions' hook trace.

    vLLM's frontend runs each of ``n`` samples as its own engine request
    (each its own fork/join family, with its own trace in its finished
    output's ``kv_transfer_params``) and, when not streaming, answers once
    with all ``n`` completions and the last finished one's
    ``kv_transfer_params``. The wrapper remembers each completion's trace
    on vLLM's ``ParentRequest`` and puts the list, in output order, in the
    aggregated output (:func:`vllm_seqhooks.core.trace.with_completion_traces`).
    Requests with ``n`` = 1 and outputs without a trace pass through.
    Raises :class:`VllmPrivateAPIError` when the installed vLLM lacks what
    it needs."""
    from vllm.v1.engine.output_processor import RequestState

    from vllm_seqhooks.core.trace import TRACE_KEY, with_completion_traces

    original = RequestState.make_request_output
    if getattr(original, _TRACES_MARK, False):
        return
    found = output_processor_problems()
    if found:
        raise VllmPrivateAPIError(
            "vllm_seqhooks cannot keep per-completion traces on this vLLM:\n  - "
            + "\n  - ".join(found))

    def make_request_output(self, new_token_ids, pooling_output, finish_reason, stop_reason,
                            kv_transfer_params=None, *args, **kwargs):
        out = original(self, new_token_ids, pooling_output, finish_reason, stop_reason,
                       kv_transfer_params, *args, **kwargs)
        parent = self.parent_req
        if parent is None or finish_reason is None:
            return out
        traces = getattr(parent, _TRACES_MARK, None)
        trace = (kv_transfer_params or {}).get(TRACE_KEY)
        if trace is not None:
            if traces is None:
                traces = {}
                setattr(parent, _TRACES_MARK, traces)
            traces[self.request_index] = trace
        outputs = getattr(out, "outputs", None)
        if traces and outputs and len(outputs) == parent.n:  # the aggregated answer
            out.kv_transfer_params = with_completion_traces(
                out.kv_transfer_params, [traces.get(o.index) for o in outputs])
        return out

    wrap_method(RequestState, "make_request_output", make_request_output, _TRACES_MARK)


#: vLLM's beam search: offline (``LLM.beam_search``) and online (the OpenAI
#: server's ``use_beam_search``). Each runs one-token requests step after
#: step and scores them; with hooks, a step that samples a hook token spawns
#: children nobody joins, and the beams read ``<sync><sync>...``: refused.
BEAM_SEARCH = (
    ("vllm.entrypoints.generate.beam_search.offline", "BeamSearchOfflineMixin"),
    ("vllm.entrypoints.generate.beam_search.online", "BeamSearchOnlineMixin"),
)
_BEAM_SEARCH_MARK = "_seqhooks_beam_search_refusal"


def beam_search_problems(module: str | None = None) -> list[str]:
    """Like :func:`input_processor_problems`, for the beam-search refusal
    (of ``module``'s mixin, or both)."""
    import importlib

    found = []
    for name_of_module, name in BEAM_SEARCH:
        if module not in (None, name_of_module):
            continue
        cls = getattr(importlib.import_module(name_of_module), name, None)
        method = getattr(cls, "beam_search", None)
        asynchronous = name.endswith("OnlineMixin")
        if not callable(method) or inspect.isasyncgenfunction(
                getattr(method, "__wrapped__", method)) != asynchronous:
            found.append(f"{name_of_module}.{name}.beam_search is no longer "
                         f"{'an async generator' if asynchronous else 'a method'}")
    return found


def install_beam_search_refusal(module: str | None = None) -> None:
    """Make vLLM's beam search (of ``module``'s mixin, or both; offline and
    online) refuse an engine with hooks
    (:data:`vllm_seqhooks.engine.validation.BEAM_SEARCH_REFUSAL`, a
    ``VLLMValidationError``: HTTP 400); engines without hooks are untouched.
    Raises :class:`VllmPrivateAPIError` when the mixin is not as expected."""
    import importlib

    from vllm.exceptions import VLLMValidationError

    from vllm_seqhooks.engine.validation import BEAM_SEARCH_REFUSAL, hooks_enabled

    found = beam_search_problems(module)
    if found:
        raise VllmPrivateAPIError(
            "vllm_seqhooks cannot refuse beam search on this vLLM:\n  - " + "\n  - ".join(found))

    def refuse(vllm_config) -> None:
        if hooks_enabled(getattr(vllm_config, "additional_config", None)):
            raise VLLMValidationError(BEAM_SEARCH_REFUSAL, parameter="use_beam_search")

    for name_of_module, name in BEAM_SEARCH:
        if module not in (None, name_of_module):
            continue
        cls = getattr(importlib.import_module(name_of_module), name)
        original = cls.beam_search
        if getattr(original, _BEAM_SEARCH_MARK, False):
            continue
        if inspect.isasyncgenfunction(original):
            async def beam_search(self, *args, _original=original, **kwargs):
                refuse(self.engine_client.vllm_config)
                async for output in _original(self, *args, **kwargs):
                    yield output
        else:
            def beam_search(self, *args, _original=original, **kwargs):
                refuse(self.llm_engine.vllm_config)
                return _original(self, *args, **kwargs)
        wrap_method(cls, "beam_search", beam_search, _BEAM_SEARCH_MARK)
