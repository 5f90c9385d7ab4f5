"""What a client loop over stock vLLM returns for each parent request
(:class:`LoopResult`, with a :class:`LoopChild` per child), and how the
loops read their arguments (the promise protocol's
:mod:`~vllm_seqhooks.loops.promise_loop` and the tag formats'
:mod:`~vllm_seqhooks.loops.format_loop`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass
class LoopChild:
    key: str
    payload_token_ids: list[int]
    prompt_token_ids: list[int]
    output_token_ids: list[int] = field(default_factory=list)
    #: What was merged into the parent (output without its final EOS/stop).
    contribution: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    cached_prompt_tokens: int = 0
    #: Its token budget.
    max_tokens: int = 0
    #: Tag formats: its contribution as text (cut at its end tag; None for
    #: "ids" boundaries), and whether it ended at its end tag.
    text: bytes | None = None
    closed: bool = True

    @property
    def prefilled_tokens(self) -> int:
        return len(self.prompt_token_ids) - self.cached_prompt_tokens


@dataclass
class LoopResult:
    """One parent request driven by the client loop."""

    prompt_token_ids: list[int]
    #: Output tokens as the native engine reports them: sampled + merged.
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    #: Requests sent for this parent (``generate`` calls it took part in).
    rounds: int = 0
    children: list[LoopChild] = field(default_factory=list)
    #: One entry per join: ``{"children": [keys], "merged_tokens": n}``.
    joins: list[dict[str, Any]] = field(default_factory=list)
    sampled_tokens: int = 0
    merged_tokens: int = 0
    #: Sum over rounds of the parent's prompt length / cached part.
    parent_prompt_tokens: int = 0
    parent_cached_tokens: int = 0
    #: Prompt tokens of the rounds after the first not served by the prefix
    #: cache: what its joins cost the loop (the engine's
    #: ``join_prefill_tokens``).
    join_prefill_tokens: int = 0
    #: Seconds from the start of the ``generate`` call to this parent's end.
    finish_time: float = 0.0

    def add_round(self, prompt_tokens: int, cached_tokens: int | None) -> None:
        """One more ``generate`` call for the parent, with this prompt."""
        self.rounds += 1
        cached = int(cached_tokens or 0)
        self.parent_prompt_tokens += prompt_tokens
        self.parent_cached_tokens += cached
        if self.rounds > 1:
            self.join_prefill_tokens += prompt_tokens - cached

    @property
    def parent_prefilled_tokens(self) -> int:
        return self.parent_prompt_tokens - self.parent_cached_tokens

    @property
    def child_prefilled_tokens(self) -> int:
        return sum(c.prefilled_tokens for c in self.children)

    @property
    def prefilled_tokens(self) -> int:
        """Prompt tokens computed (not served by the prefix cache), parent
        rounds and children together."""
        return self.parent_prefilled_tokens + self.child_prefilled_tokens

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens the prefix cache served, parent rounds and children."""
        return self.parent_cached_tokens + sum(c.cached_prompt_tokens for c in self.children)



def params_per_prompt(sampling_params: Any, n: int) -> list[Any]:
    """One ``SamplingParams`` per prompt (the same one for all, or a list)."""
    from vllm import SamplingParams

    if isinstance(sampling_params, SamplingParams) or sampling_params is None:
        return [sampling_params or SamplingParams()] * n
    params = list(sampling_params)
    if len(params) != n:
        raise ValueError("one SamplingParams per prompt, or one for all")
    return params


def prompt_ids(tokenizer: Any, prompt: Any) -> list[int]:
    """Text, token ids or ``{"prompt_token_ids": ...}`` as token ids."""
    if isinstance(prompt, str):
        return list(tokenizer.encode(prompt))
    if isinstance(prompt, Mapping):
        return list(prompt["prompt_token_ids"])
    return [int(t) for t in prompt]
