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


def input_processor_problems() -> list[str]:
    """Like :func:`problems`, for the frontend's admission path."""
    from vllm.v1.engine.input_processor import InputProcessor

    found = method_problems(InputProcessor, INPUT_PROCESSOR_METHODS)
    init_src = inspect.getsource(InputProcessor.__init__)
    if "self._build_logits_processors_params_validator()" not in init_src:
        found.append("InputProcessor.__init__ no longer builds its params validator")
    src = inspect.getsource(InputProcessor._validate_params)
    if "self.validate_logits_processors_params(params)" not in src:
        found.append("InputProcessor._validate_params no longer runs the params validator")
    return found


_REQUEST_VALIDATOR_MARK = "_seqhooks_request_validator"


def install_request_validator() -> None:
    """Make the frontend of every engine with hooks run
    :func:`vllm_seqhooks.engine.validation.check_request` on each request it admits
    (once per process; engines without hooks are untouched).

    vLLM's ``InputProcessor`` builds one params validator at start-up and
    calls it for every request in ``_validate_params``; the wrapper chains
    the hooks' check after vLLM's own. It works the same for both model
    runners and costs nothing per step. Raises :class:`VllmPrivateAPIError`
    when the installed vLLM lacks what it needs: requests would otherwise
    reach the engine unchecked."""
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.engine.input_processor import InputProcessor

    from vllm_seqhooks.engine.validation import chain_validators, hooks_enabled

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
        return validator

    wrap_method(InputProcessor, "_build_logits_processors_params_validator",
                _build_logits_processors_params_validator, _REQUEST_VALIDATOR_MARK)
