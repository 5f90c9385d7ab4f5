"""A request's hook settings, decided as it is added: per-request overrides
from ``extra_args`` within the server's limits (:mod:`vllm_seqhooks.core.admission`
decides), its scanner, its family's ledger; and the model's text codec."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any
from vllm.v1.request import Request

from vllm_seqhooks.config.request_keys import parse_request_overrides
from vllm_seqhooks.config.special_kwargs import SpecialKwargs, SpecialKwargsError
from vllm_seqhooks.core.admission import RequestHooks, request_hooks
from vllm_seqhooks.formats.events import HookScanner
from vllm_seqhooks.formats.request_scanner import request_scanner
from vllm_seqhooks.formats.text_codec import TextCodec
from vllm_seqhooks.engine.state import ForkJoinState, HookState

if TYPE_CHECKING:
    from vllm_seqhooks.engine.family_limits import FamilyLimits

# Under vLLM's "vllm" logger: same handlers, format and VLLM_LOGGING_LEVEL.
logger = logging.getLogger("vllm.seqhooks.scheduler")

#: How many distinct (depth, per-request settings) the cache of
#: request_hooks (and their scanners) keeps before it starts again.
_HOOKS_KEPT = 256


class Admission:
    """Decides a request's hook settings as it is added: its state in
    ``fork_join``, from the engine's ``hooks`` and the request's own keys; a
    new family's limits from ``family_limits``; the tokenizer from
    ``model_config`` when text is read."""

    def __init__(self, fork_join: ForkJoinState, hooks: SpecialKwargs,
                 family_limits: "FamilyLimits", model_config: Any) -> None:
        self.fork_join = fork_join
        self.hooks = hooks
        self.family_limits = family_limits
        self.model_config = model_config
        self._codec: TextCodec | None = None
        #: request_hooks by (depth, per-request settings), with a new
        #: scanner for them (each request gets a copy: building one reads the
        #: format and the codec, 3-4x a copy's time): a family's children
        #: (and most requests) ask with the same settings.
        self._hooks: dict[tuple, tuple[RequestHooks, HookScanner | None]] = {}

    def admit(self, request: Request) -> None:
        """Give ``request`` its :class:`HookState` (none: hooks off for it)."""
        fj = self.fork_join
        if request.request_id in fj.states or request.pooling_params or request.resumable:
            # (vLLM's own streaming-input sessions park and resume through
            # the same path; hooks are not combined with them.)
            return
        sp = request.sampling_params
        if sp is None:
            return
        try:
            per_request = parse_request_overrides(sp.extra_args)
        except SpecialKwargsError as exc:
            # The frontend validates these; a request that reached the engine
            # without it runs without hooks rather than failing the engine.
            logger.warning("%s: %s; sequence hooks off for this request",
                           request.request_id, exc)
            return
        if per_request.get("enabled", True) is False:
            return
        node = fj.tree.get(request.request_id)
        rh, scanner = self._request_hooks(per_request, node.depth if node is not None else 0)
        family = None
        if rh.may_spawn and rh.depth == 0:
            family = self.family_limits.new_family(request, per_request)
        st = fj.states[request.request_id] = HookState(
            request=request,
            scanner=None if scanner is None else scanner.copy(),
            orig_prompt_len=request.num_prompt_tokens,
            orig_max_tokens=request.max_tokens,
            orig_min_tokens=sp.min_tokens,
            child_max_tokens=rh.child_max_tokens,
            separator=self._separator(per_request.get("merge_separator")),
            family=family,
        )
        if st.scanner is not None and st.scanner.needs_history:
            st.scanner.fed_to = request.num_tokens  # (it reads from its first sampled token)
        fj.refresh_quiet(st)

    def _request_hooks(self, per_request: dict, depth: int
                       ) -> tuple[RequestHooks, HookScanner | None]:
        """The settings and a new scanner (to copy) of a request at ``depth``
        with ``per_request``'s keys."""
        key = (depth, *per_request.items())
        found = self._hooks.get(key)
        if found is None:
            if len(self._hooks) >= _HOOKS_KEPT:
                self._hooks.clear()
            rh = request_hooks(self.hooks, per_request, depth)
            found = self._hooks[key] = (rh, request_scanner(self.hooks, rh, self.text_codec))
        return found

    def _separator(self, text: str | None) -> tuple[int, ...]:
        """Token ids of a per-request merge separator (cached), or the
        server's when there is none or no tokenizer to encode it with."""
        hooks = self.hooks
        default = tuple(hooks.merge_separator_token_ids or ())
        if text is None or text == hooks.merge_separator:
            return default
        codec = self.text_codec(required=False)
        if codec is None:
            logger.warning("seqhooks_merge_separator needs a tokenizer "
                           "(skip_tokenizer_init is set); using the server's")
            return default
        return codec.encode(text)

    def use_text_codec(self, codec: TextCodec) -> None:
        """Read text through ``codec`` instead of the model's tokenizer
        (test harnesses that schedule without a model)."""
        self._codec = codec
        self._hooks.clear()  # (their scanners read the codec they were built with)

    def text_codec(self, required: bool = True) -> TextCodec | None:
        """Text and token bytes through the model's tokenizer, loaded in
        EngineCore on first use (none with ``skip_tokenizer_init``)."""
        model_config = self.model_config
        if self._codec is None and not model_config.skip_tokenizer_init:
            from vllm.tokenizers import cached_tokenizer_from_config

            tokenizer = cached_tokenizer_from_config(model_config)
            self._codec = TextCodec.from_tokenizer(
                tokenizer, max(len(tokenizer), model_config.get_vocab_size()))
        if self._codec is None and required:
            raise ValueError("a tag format (fork_tag) needs the model's tokenizer; "
                             "skip_tokenizer_init cannot be set")
        return self._codec
