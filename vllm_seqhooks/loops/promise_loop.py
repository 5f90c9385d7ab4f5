"""Fork/join driven from the client, over a stock ``vllm.LLM``.

This is what one would write without engine support, and the baseline the
native scheduler is compared with: the same hook settings
(:class:`~vllm_seqhooks.config.special_kwargs.SpecialKwargs`), the same token-level merge,
and the same results for greedy decoding.

Each round, for all unfinished parents at once (lockstep):

1. one ``LLM.generate`` call continues every parent, with ``<sync>`` added to
   its ``stop_token_ids`` (vLLM keeps a stop token in ``token_ids``; its text
   is rebuilt here from the ids) and ``max_tokens`` = what the parent has left
   to sample;
2. the tokens it wrote are scanned (the engine's own
   :class:`~vllm_seqhooks.formats.promise.PromiseScanner`) for promises;
3. one ``LLM.generate`` call runs the children of all parents as a single
   batch (``payload``: ``child_prompt_template`` around the payload;
   ``fork``: the parent's tokens through the payload);
4. each parent that stopped at ``<sync>`` with open children is re-submitted
   with prompt = previous prompt + its new tokens + the merged tokens (token
   ids: the children's outputs, each without its final EOS/stop token, in
   promise order, joined by the separator's ids). vLLM's prefix cache (on by
   default) serves every full KV block of the previous context, so mostly the
   tail is prefilled again.

Semantics follow docs/lifecycle.md: ``max_tokens`` counts the tokens a parent
samples itself (``<sync>`` included, merged tokens not); a child's budget is
``child_max_tokens`` or what its parent had left when the payload closed; a
``<sync>`` with no open children is plain text; a parent that stops (EOS,
stop token, length) with open children gets their merged output before its
stop token; a merge is cut at ``max_model_len`` (finish reason ``length``).
Children inherit the parent's sampling parameters (``n=1``, seeds derived
like the engine's). Stop *strings* are not supported (text is rebuilt from
token ids; use ``stop_token_ids``). Only one level of nesting (``max_child_depth=1``):
children's hook tokens are plain text, as in the engine at that depth.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from vllm_seqhooks.config.presets import coerce_special_kwargs
from vllm_seqhooks.config.special_kwargs import SpecialKwargs
from vllm_seqhooks.core.request_tree import derive_seed
from vllm_seqhooks.formats.events import PayloadClosed, PromiseIgnored
from vllm_seqhooks.formats.promise import PromiseScanner


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
    #: ``generate`` calls this parent took part in.
    rounds: int = 0
    children: list[LoopChild] = field(default_factory=list)
    #: One entry per join: ``{"children": [keys], "merged_tokens": n}``.
    joins: list[dict[str, Any]] = field(default_factory=list)
    sampled_tokens: int = 0
    merged_tokens: int = 0
    #: Sum over rounds of the parent's prompt length / cached part.
    parent_prompt_tokens: int = 0
    parent_cached_tokens: int = 0

    def add_round(self, prompt_tokens: int, cached_tokens: int | None) -> None:
        """One more ``generate`` call for the parent, with this prompt."""
        self.rounds += 1
        self.parent_prompt_tokens += prompt_tokens
        self.parent_cached_tokens += int(cached_tokens or 0)

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


@dataclass
class _Parent:
    index: int
    params: Any  # the caller's SamplingParams
    prompt: list[int]  # original prompt
    context: list[int]  # prompt + output so far
    result: LoopResult
    scanner: PromiseScanner | None
    orig_max_tokens: int
    orig_min_tokens: int
    sampled: int = 0
    #: Children spawned and not merged yet.
    open_children: list[LoopChild] = field(default_factory=list)
    next_key: int = 0
    done: bool = False
    round_params: Any = None
    #: (finish_reason, stop_reason) of the last round.
    last_finish: tuple[Any, Any] = (None, None)


class ClientLoop:
    """Client-side fork/join over a stock ``vllm.LLM`` (see the module
    docstring). ``llm`` should have prefix caching on (vLLM's default)."""

    def __init__(self, llm: Any, special_kwargs: SpecialKwargs | Mapping[str, Any] | str) -> None:
        hooks = coerce_special_kwargs(special_kwargs, llm.llm_engine.model_config.model)
        if hooks is None:
            raise ValueError("special_kwargs is required")
        self.llm = llm
        self.tokenizer = llm.get_tokenizer()
        if not hooks.is_resolved:
            hooks = hooks.resolve(self.tokenizer)
        if hooks.max_child_depth != 1:
            raise ValueError("the client loop handles one level of children "
                             "(max_child_depth=1)")
        self.hooks = hooks
        self.max_model_len = int(llm.llm_engine.model_config.max_model_len)
        self.eos_token_id = getattr(self.tokenizer, "eos_token_id", None)
        #: Statistics of the last :meth:`generate` call.
        self.stats: dict[str, Any] = {}

    # ------------------------------------------------------------------ API
    def generate(
        self,
        prompts: Sequence[str | Sequence[int] | Mapping[str, Any]],
        sampling_params: Any,
    ) -> list[LoopResult]:
        """Run ``prompts`` (text, token ids or ``{"prompt_token_ids": ...}``)
        to completion with fork/join; one result per prompt, in order."""
        params_list = params_per_prompt(sampling_params, len(prompts))
        parents = [self._new_parent(i, p, sp)
                   for i, (p, sp) in enumerate(zip(prompts, params_list))]
        stats = {"rounds": 0, "parent_calls": 0, "child_calls": 0,
                 "parent_seconds": 0.0, "child_seconds": 0.0}
        t_start = time.perf_counter()
        active = [p for p in parents if not p.done]
        while active:
            stats["rounds"] += 1
            self._advance_parents(active, stats)
            spawned = [c for p in active for c in p.open_children if not c.finish_reason]
            if spawned:
                self._run_children(active, stats)
            for p in active:
                self._after_round(p)
            active = [p for p in parents if not p.done]
        stats["seconds"] = time.perf_counter() - t_start
        self.stats = stats
        return [p.result for p in parents]

    # ------------------------------------------------------------ internals
    def _new_parent(self, index: int, prompt: Any, params: Any) -> _Parent:
        if getattr(params, "n", 1) != 1:
            raise ValueError("the client loop supports n=1")
        if params.stop:
            raise ValueError("the client loop rebuilds text from token ids: use "
                             "stop_token_ids, not stop strings")
        ids = prompt_ids(self.tokenizer, prompt)
        max_tokens = params.max_tokens
        if max_tokens is None:
            max_tokens = self.max_model_len - len(ids)
        scanner = None
        if self.hooks.max_children_per_request > 0:
            scanner = PromiseScanner(
                self.hooks.sync_token_id, self.hooks.promise_token_id,
                self.hooks.promise_end_token_id,
                max_promises=self.hooks.max_children_per_request)
        return _Parent(index=index, params=params, prompt=ids, context=list(ids),
                       result=LoopResult(prompt_token_ids=list(ids)), scanner=scanner,
                       orig_max_tokens=int(max_tokens),
                       orig_min_tokens=int(params.min_tokens or 0))

    def _parent_params(self, p: _Parent):
        sp = p.params.clone()
        sp.n = 1
        sp.max_tokens = p.orig_max_tokens - p.sampled
        sp.min_tokens = max(0, p.orig_min_tokens - p.sampled)
        stops = list(sp.stop_token_ids or [])
        if p.scanner is not None and self.hooks.sync_token_id not in stops:
            stops.append(self.hooks.sync_token_id)
        sp.stop_token_ids = stops
        return sp

    def _advance_parents(self, active: list[_Parent], stats: dict[str, Any]) -> None:
        prompts = [{"prompt_token_ids": list(p.context)} for p in active]
        params = [self._parent_params(p) for p in active]
        for p, sp in zip(active, params):
            p.round_params = sp
        t0 = time.perf_counter()
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        stats["parent_seconds"] += time.perf_counter() - t0
        stats["parent_calls"] += 1
        for p, out in zip(active, outs):
            comp = out.outputs[0]
            new = list(comp.token_ids)
            res = p.result
            res.add_round(len(p.context), out.num_cached_tokens)
            start = len(p.context)
            sampled_before = p.sampled
            p.context.extend(new)
            res.token_ids.extend(new)
            p.sampled += len(new)
            p.last_finish = (comp.finish_reason, comp.stop_reason)
            if p.scanner is None:
                continue
            sync_stop = (comp.finish_reason == "stop" and new
                         and new[-1] == self.hooks.sync_token_id
                         and comp.stop_reason == self.hooks.sync_token_id)
            events = list(p.scanner.feed(new, start))
            if not sync_stop:
                end = len(p.context)
                if comp.finish_reason == "stop" and isinstance(comp.stop_reason, (int, type(None))):
                    end -= 1  # the EOS / stop token is not part of a payload
                events += p.scanner.finish(end)
            for ev in events:
                if isinstance(ev, PayloadClosed):
                    closing = {"promise_end": ev.end - 1, "promise": ev.end,
                               "sync": ev.end}.get(ev.closed_by, len(p.context) - 1)
                    sampled_then = sampled_before + (closing - start + 1)
                    self._spawn(p, ev, sampled_then)
                elif isinstance(ev, PromiseIgnored):
                    pass

    def _spawn(self, p: _Parent, ev: PayloadClosed, sampled_then: int) -> None:
        hooks = self.hooks
        payload = p.context[ev.start : ev.end]
        if hooks.child_context == "fork":
            prompt = p.context[: ev.context_end]
        else:
            prompt = [*(hooks.child_prompt_prefix_token_ids or ()), *payload,
                      *(hooks.child_prompt_suffix_token_ids or ())]
            if not prompt:
                return
        room = self.max_model_len - len(prompt)
        if room <= 0:
            return
        budget = hooks.child_max_tokens
        if budget is None:
            budget = max(1, p.orig_max_tokens - sampled_then)
        key = str(p.next_key)
        p.next_key += 1
        child = LoopChild(key=key, payload_token_ids=list(payload),
                          prompt_token_ids=list(prompt), max_tokens=min(int(budget), room))
        p.open_children.append(child)
        p.result.children.append(child)

    def _child_params(self, p: _Parent, child: LoopChild):
        # The parent's parameters of this round (as the engine clones the
        # parent's current ones), without the client's extra <sync> stop.
        sp = p.round_params.clone()
        sp.stop_token_ids = list(p.params.stop_token_ids or [])
        sp.max_tokens = child.max_tokens
        if sp.seed is not None:
            sp.seed = derive_seed(sp.seed, child.key)
        return sp

    def _run_children(self, active: list[_Parent], stats: dict[str, Any]) -> None:
        todo = [(p, c) for p in active for c in p.open_children if c.finish_reason is None]
        prompts = [{"prompt_token_ids": list(c.prompt_token_ids)} for _, c in todo]
        params = [self._child_params(p, c) for p, c in todo]
        t0 = time.perf_counter()
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        stats["child_seconds"] += time.perf_counter() - t0
        stats["child_calls"] += 1
        for (p, c), out in zip(todo, outs):
            comp = out.outputs[0]
            c.output_token_ids = list(comp.token_ids)
            c.finish_reason = comp.finish_reason
            c.cached_prompt_tokens = int(out.num_cached_tokens or 0)
            toks = list(c.output_token_ids)
            if (comp.finish_reason == "stop" and toks
                    and isinstance(comp.stop_reason, (int, type(None)))):
                toks.pop()  # its EOS / stop token
            c.contribution = toks

    def _merged(self, children: list[LoopChild]) -> list[int]:
        sep = list(self.hooks.merge_separator_token_ids or ())
        merged: list[int] = []
        if self.hooks.merge_strategy == "none":
            return merged
        for i, c in enumerate(children):
            if i:
                merged.extend(sep)
            merged.extend(c.contribution)
        return merged

    def _after_round(self, p: _Parent) -> None:
        finish_reason, stop_reason = p.last_finish
        res = p.result
        sync_stop = (p.scanner is not None and finish_reason == "stop"
                     and res.token_ids and res.token_ids[-1] == self.hooks.sync_token_id
                     and stop_reason == self.hooks.sync_token_id)
        remaining = p.orig_max_tokens - p.sampled
        if sync_stop and not p.open_children:
            # A <sync> with nothing to wait for is plain text: go on.
            if remaining <= 0 or len(p.context) >= self.max_model_len:
                self._finish(p, [], "length", None, held=None)
            return
        if not p.open_children:
            self._finish(p, [], finish_reason, stop_reason, held=None)
            return
        children, p.open_children = p.open_children, []
        merged = self._merged(children)
        room = self.max_model_len - len(p.context)
        truncated = len(merged) > room
        if truncated:
            merged = merged[: max(room, 0)]
        res.joins.append({"children": [c.key for c in children],
                          "merged_tokens": len(merged), "truncated": truncated})
        res.merged_tokens += len(merged)
        if not sync_stop:
            # Stopped with open children: merged output goes before its
            # stop token (if it ended on one).
            held = None
            if finish_reason == "stop" and isinstance(stop_reason, (int, type(None))):
                held = res.token_ids.pop()
                p.context.pop()
            reason = "length" if truncated else finish_reason
            self._finish(p, merged, reason, stop_reason, held=held)
            return
        p.context.extend(merged)
        res.token_ids.extend(merged)
        if truncated or len(merged) >= room or remaining <= 0:
            self._finish(p, [], "length", None, held=None)

    def _finish(self, p: _Parent, merged: list[int], reason: Any, stop_reason: Any,
                held: int | None) -> None:
        res = p.result
        res.token_ids.extend(merged)
        p.context.extend(merged)
        shown = list(res.token_ids)
        if held is not None:
            res.token_ids.append(held)
            p.context.append(held)
        elif (reason == "stop" and shown and isinstance(stop_reason, (int, type(None)))
              and not p.params.include_stop_str_in_output):
            shown = shown[:-1]  # vLLM leaves a stop token out of the text
        res.text = self.tokenizer.decode(
            shown, skip_special_tokens=p.params.skip_special_tokens)
        res.finish_reason = reason
        res.stop_reason = stop_reason
        res.sampled_tokens = p.sampled
        p.done = True


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


def client_loop_generate(llm: Any, prompts: Sequence[Any], sampling_params: Any,
                         special_kwargs: SpecialKwargs | Mapping[str, Any]) -> list[LoopResult]:
    """One-call form of :class:`ClientLoop`."""
    return ClientLoop(llm, special_kwargs).generate(prompts, sampling_params)
