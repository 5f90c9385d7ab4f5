"""A request's hook settings, decided as it is added (per-request
overrides from ``extra_args`` within the server's limits)."""

from __future__ import annotations

import logging

from vllm.v1.request import Request

from vllm_seqhooks.config import SpecialKwargsError
from vllm_seqhooks.formats import TagFormatScanner, TextCodec
from vllm_seqhooks.request_keys import parse_request_overrides
from vllm_seqhooks.sched.state import HookState
from vllm_seqhooks.token_bytes import token_bytes_table
from vllm_seqhooks.tokens import SpecialTokenProcessor

# Under vLLM's "vllm" logger: same handlers, format and VLLM_LOGGING_LEVEL.
logger = logging.getLogger("vllm.seqhooks.scheduler")


class AdmissionMixin:
    """Decides a request's hook settings as it is added."""

    def _init_hook_state(self, request: Request) -> None:
        if request.request_id in self._hook_states or request.pooling_params:
            return
        if request.resumable:
            # vLLM's own streaming-input sessions park and resume through the
            # same path; hooks are not combined with them.
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
        node = self.deps.get(request.request_id)
        depth = node.depth if node is not None else 0
        max_depth = min(self.hooks.max_child_depth,
                        per_request.get("max_child_depth", self.hooks.max_child_depth))
        max_children = min(
            self.hooks.max_children_per_request,
            per_request.get("max_children_per_request", self.hooks.max_children_per_request),
        )
        may_spawn = depth < max_depth and max_children > 0
        scanner = None
        fmt = self.hooks.tag_format
        if fmt is not None:
            if may_spawn or (depth > 0 and fmt.child_end_tag):
                scanner = TagFormatScanner(fmt, self._text_codec(), may_fork=may_spawn,
                                           ends_at_tag=depth > 0, max_children=max_children)
        elif may_spawn:
            scanner = SpecialTokenProcessor(
                self.hooks.sync_token_id,
                self.hooks.promise_token_id,
                self.hooks.promise_end_token_id,
                max_promises=max_children,
            )
        family = None
        if may_spawn and depth == 0:
            family = self._new_family(request, per_request)
            if family.deadline is not None:
                self._timed_families.add(family)
        self._hook_states[request.request_id] = HookState(
            request=request,
            scanner=scanner,
            orig_prompt_len=request.num_prompt_tokens,
            orig_max_tokens=request.max_tokens,
            orig_min_tokens=sp.min_tokens,
            child_max_tokens=per_request.get("child_max_tokens", self.hooks.child_max_tokens),
            separator=self._separator(per_request.get("merge_separator")),
            family=family,
        )

    def _separator(self, text: str | None) -> tuple[int, ...]:
        """Token ids of a per-request merge separator (cached), or the
        server's when there is none or no tokenizer to encode it with."""
        default = tuple(self.hooks.merge_separator_token_ids or ())
        if text is None or text == self.hooks.merge_separator:
            return default
        ids = self._token_cache.get(text)
        if ids is None:
            tokenizer = self._engine_tokenizer()
            if tokenizer is None:
                logger.warning("seqhooks_merge_separator needs a tokenizer "
                               "(skip_tokenizer_init is set); using the server's")
                return default
            ids = tuple(tokenizer.encode(text, add_special_tokens=False))
            if len(self._token_cache) < 1024:
                self._token_cache[text] = ids
        return ids

    def _engine_tokenizer(self):
        """The model's tokenizer, loaded in EngineCore on first use (None
        with ``skip_tokenizer_init``)."""
        if self._tokenizer is None and not self.vllm_config.model_config.skip_tokenizer_init:
            from vllm.tokenizers import cached_tokenizer_from_config

            self._tokenizer = cached_tokenizer_from_config(self.vllm_config.model_config)
        return self._tokenizer

    def _text_codec(self) -> TextCodec:
        """Token bytes and text encoding for a tag format (built once)."""
        if self._codec is None:
            tokenizer = self._engine_tokenizer()
            if tokenizer is None:
                raise ValueError("a tag format (fork_tag) needs the model's tokenizer; "
                                 "skip_tokenizer_init cannot be set")
            size = max(len(tokenizer), self.vllm_config.model_config.get_vocab_size())
            self._codec = TextCodec(
                token_bytes_table(tokenizer, size),
                lambda text: tokenizer.encode(text, add_special_tokens=False))
        return self._codec
