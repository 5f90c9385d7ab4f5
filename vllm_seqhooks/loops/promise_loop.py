"""Fork/join driven from the client, over a stock ``vllm.LLM``.

This is what one would write without engine support, the baseline the
native scheduler is benchmarked against and the oracle it is tested
against: the same hook settings
(:class:`~vllm_seqhooks.config.special_kwargs.SpecialKwargs`), the same token-level merge,
and the same results for greedy decoding.

Every parent goes through rounds:

1. the parent is continued with ``<sync>`` added to its ``stop_token_ids``
   (vLLM keeps a stop token in ``token_ids``; its text is rebuilt here from
   the ids) and ``max_tokens`` = what it has left to sample;
2. the tokens it wrote are scanned (the engine's own
   :class:`~vllm_seqhooks.formats.promise.PromiseScanner`) for promises, and
   each closed payload makes a child (``payload``: ``child_prompt_template``
   around the payload; ``fork``: the parent's tokens through the payload);
3. once the parent stopped and its children ended, the parent is
   re-submitted with prompt = previous prompt + its new tokens + the merged
   tokens (token ids: the children's outputs, each without its final
   EOS/stop token, in promise order, joined by the separator's ids). vLLM's
   prefix cache (on by default) serves every full KV block of the previous
   context, so mostly the tail is prefilled again.

``mode`` says when requests are sent:

* ``"lockstep"`` (default): one blocking ``LLM.generate`` call per round for
  every unfinished parent, then one for all their children;
* ``"events"``: every request is sent the moment the client knows it,
  between two engine steps (:func:`~vllm_seqhooks.loops.stepping.drive`,
  the loop ``LLM.generate`` runs): a parent's children when it stops at
  ``<sync>``, concurrently with everything in flight, the parent again when
  its last child ends. An asyncio client over ``AsyncLLM`` or HTTP without
  the transport: the most favourable case for a client loop;
* ``"stream"``: ``"events"``, the parent's output streamed and each child
  sent as soon as its payload closes (children start while the parent
  still writes).

Requests carry the keys the engine writes on the requests it makes
(``seqhooks_sampled_before`` on a resumed parent, ``seqhooks_child_key`` on a
child; see :mod:`vllm_seqhooks.config.request_keys`): real models ignore
them, scripted test models read them, so a scripted run forces the same
tokens on both sides.

Semantics follow docs/lifecycle.md: ``max_tokens`` counts the tokens a parent
samples itself (``<sync>`` included, merged tokens not); a child's budget is
``child_max_tokens`` or what its parent had left when it sampled the token
that closed the payload; a ``<sync>`` with no open children is plain text; a
parent that stops (EOS, stop token, length) with open children gets their
merged output before its stop token; a merge is cut at ``max_model_len``
(finish reason ``length``). Children inherit the parent's sampling
parameters (``n=1``, seeds derived like the engine's). Stop *strings* are
not supported (text is rebuilt from token ids; use ``stop_token_ids``). Only
one level of nesting (``max_child_depth=1``): children's hook tokens are
plain text, as in the engine at that depth.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from vllm_seqhooks.config.presets import coerce_special_kwargs
from vllm_seqhooks.config.request_keys import CHILD_KEY_ARG, SAMPLED_BEFORE_ARG
from vllm_seqhooks.config.special_kwargs import SpecialKwargs
from vllm_seqhooks.core.request_tree import derive_seed
from vllm_seqhooks.formats.events import PayloadClosed
from vllm_seqhooks.formats.promise import PromiseScanner
from vllm_seqhooks.loops.stepping import NewRequest, drive
from vllm_seqhooks.loops.results import LoopChild, LoopResult, params_per_prompt, prompt_ids

#: When requests are sent (module docstring).
MODES = ("lockstep", "events", "stream")

_runs = itertools.count()


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
    #: Children spawned and not merged yet; of those, the ones not sent.
    open_children: list[LoopChild] = field(default_factory=list)
    unsent: list[LoopChild] = field(default_factory=list)
    next_key: int = 0
    done: bool = False
    round_params: Any = None
    #: Its context's length when its current round was sent.
    round_start: int = 0
    #: The current round's request ended (its children may still run).
    round_done: bool = False
    #: (finish_reason, stop_reason) of the last round.
    last_finish: tuple[Any, Any] = (None, None)


class ClientLoop:
    """Client-side fork/join over a stock ``vllm.LLM`` (see the module
    docstring). ``llm`` should have prefix caching on (vLLM's default).
    ``timeout_s`` bounds an ``"events"`` or ``"stream"`` run (its requests
    are aborted and ``TimeoutError`` raised)."""

    def __init__(self, llm: Any, special_kwargs: SpecialKwargs | Mapping[str, Any] | str, *,
                 mode: str = "lockstep", timeout_s: float | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        hooks = coerce_special_kwargs(special_kwargs, llm.llm_engine.model_config.model)
        if hooks is None:
            raise ValueError("special_kwargs is required")
        self.llm = llm
        self.mode = mode
        self.timeout_s = timeout_s
        self.tokenizer = llm.get_tokenizer()
        if not hooks.is_resolved:
            hooks = hooks.resolve(self.tokenizer)
        if hooks.max_child_depth != 1:
            raise ValueError("the client loop handles one level of children "
                             "(max_child_depth=1)")
        self.hooks = hooks
        self.max_model_len = int(llm.llm_engine.model_config.max_model_len)
        #: Statistics of the last :meth:`generate` call.
        self.stats: dict[str, Any] = {}

    # ------------------------------------------------------------------ API
    def generate(
        self,
        prompts: Sequence[str | Sequence[int] | Mapping[str, Any]],
        sampling_params: Any,
    ) -> list[LoopResult]:
        """Run ``prompts`` (text, token ids or ``{"prompt_token_ids": ...}``)
        to completion with fork/join; one result per prompt, in order.
        :attr:`stats` then holds the call's ``seconds`` (and, lockstep, its
        rounds, calls and the seconds spent inside ``LLM.generate``)."""
        params_list = params_per_prompt(sampling_params, len(prompts))
        parents = [self._new_parent(i, p, sp)
                   for i, (p, sp) in enumerate(zip(prompts, params_list))]
        self._t0 = time.perf_counter()
        if self.mode == "lockstep":
            stats = self._lockstep(parents)
        else:
            stats = self._events(parents)
        stats["seconds"] = time.perf_counter() - self._t0
        self.stats = stats
        return [p.result for p in parents]

    # -------------------------------------------------------------- drivers
    def _lockstep(self, parents: list[_Parent]) -> dict[str, Any]:
        stats = {"rounds": 0, "parent_calls": 0, "child_calls": 0,
                 "parent_seconds": 0.0, "child_seconds": 0.0}
        active = [p for p in parents if not p.done]
        while active:
            stats["rounds"] += 1
            outs = self._timed_generate([self._round_request(p) for p in active],
                                        stats, "parent")
            for p, out in zip(active, outs):
                self._take_parent_output(p, out)
            todo = [(p, c) for p in active for c in self._to_send(p)]
            if todo:
                outs = self._timed_generate([self._child_request(p, c) for p, c in todo],
                                            stats, "child")
                for (_, c), out in zip(todo, outs):
                    self._take_child_output(c, out)
            for p in active:
                self._after_round(p)
            active = [p for p in parents if not p.done]
        return stats

    def _timed_generate(self, requests: list[NewRequest], stats: dict[str, Any],
                        side: str) -> list[Any]:
        t0 = time.perf_counter()
        outs = self.llm.generate([{"prompt_token_ids": list(ids)} for _, ids, _ in requests],
                                 [sp for _, _, sp in requests], use_tqdm=False)
        stats[f"{side}_seconds"] += time.perf_counter() - t0
        stats[f"{side}_calls"] += 1
        return outs

    def _events(self, parents: list[_Parent]) -> dict[str, Any]:
        run = next(_runs)
        owner: dict[str, tuple[_Parent, LoopChild | None]] = {}

        def send(p: _Parent, child: LoopChild | None = None) -> NewRequest:
            if child is None:
                rid, ids, sp = self._round_request(p)
                rid = f"L{run}-{p.index}-r{p.result.rounds + 1}"
            else:
                rid, ids, sp = self._child_request(p, child)
                rid = f"L{run}-{p.index}-c{child.key}"
            owner[rid] = (p, child)
            return rid, ids, sp

        def on_output(out: Any) -> list[NewRequest]:
            p, child = owner[out.request_id]
            if child is not None:
                if not out.finished:
                    return []
                self._take_child_output(child, out)
            else:
                self._take_parent_output(p, out)
            adds = [send(p, c) for c in self._to_send(p)]
            if p.round_done and all(c.finish_reason is not None for c in p.open_children):
                self._after_round(p)
                if not p.done:
                    adds.append(send(p))
            return adds

        drive(self.llm, [send(p) for p in parents if not p.done], on_output, self.timeout_s)
        return {}

    def _to_send(self, p: _Parent) -> list[LoopChild]:
        """The children to send now: at their payload's end (``"stream"``),
        else once the parent's round ended."""
        if not p.unsent or not (p.round_done or self.mode == "stream"):
            return []
        children, p.unsent = p.unsent, []
        return children

    # ------------------------------------------------------------- requests
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

    def _round_request(self, p: _Parent) -> NewRequest:
        """The parent's next round: what it has left to sample, stopping at
        ``<sync>``; marked as the engine marks a resumed parent. (Request
        ids are the driver's: ``LLM.generate`` or :meth:`_events`.)"""
        from vllm.sampling_params import RequestOutputKind

        sp = p.params.clone()
        sp.n = 1
        sp.max_tokens = p.orig_max_tokens - p.sampled
        sp.min_tokens = max(0, p.orig_min_tokens - p.sampled)
        stops = list(sp.stop_token_ids or [])
        if p.scanner is not None and self.hooks.sync_token_id not in stops:
            stops.append(self.hooks.sync_token_id)
        sp.stop_token_ids = stops
        if p.sampled:
            sp.extra_args = {**(sp.extra_args or {}), SAMPLED_BEFORE_ARG: p.sampled}
        sp.output_kind = (RequestOutputKind.DELTA if self.mode == "stream"
                          else RequestOutputKind.FINAL_ONLY)
        p.round_params = sp
        p.round_start = len(p.context)
        p.round_done = False
        return "", list(p.context), sp

    def _child_request(self, p: _Parent, child: LoopChild) -> NewRequest:
        """The parent's parameters of this round (as the engine clones the
        parent's current ones), without the client's extra ``<sync>`` stop,
        with the child's budget, key and derived seed."""
        from vllm.sampling_params import RequestOutputKind

        sp = p.round_params.clone()
        sp.stop_token_ids = list(p.params.stop_token_ids or [])
        sp.max_tokens = child.max_tokens
        extra = dict(sp.extra_args or {})
        extra.pop(SAMPLED_BEFORE_ARG, None)
        extra[CHILD_KEY_ARG] = child.key
        sp.extra_args = extra
        if sp.seed is not None:
            sp.seed = derive_seed(sp.seed, child.key)
        sp.output_kind = RequestOutputKind.FINAL_ONLY
        return "", list(child.prompt_token_ids), sp

    # -------------------------------------------------------------- outputs
    def _sync_stop(self, p: _Parent) -> bool:
        """The parent's last round ended at ``<sync>`` (its stop token)."""
        finish_reason, stop_reason = p.last_finish
        sync = self.hooks.sync_token_id
        return (p.scanner is not None and finish_reason == "stop" and stop_reason == sync
                and len(p.context) > p.round_start and p.context[-1] == sync)

    def _take_parent_output(self, p: _Parent, out: Any) -> None:
        """A round's tokens (all of them, or a streamed part): into the
        context, scanned; each closed payload makes a child."""
        comp = out.outputs[0]
        new = list(comp.token_ids)
        start = len(p.context)
        p.context.extend(new)
        p.result.token_ids.extend(new)
        p.sampled += len(new)
        if out.finished:
            p.last_finish = (comp.finish_reason, comp.stop_reason)
            p.round_done = True
            p.result.add_round(p.round_start, out.num_cached_tokens)
        if p.scanner is None:
            return
        events = list(p.scanner.feed(new, start))
        if out.finished and not self._sync_stop(p):
            end = len(p.context)
            if comp.finish_reason == "stop" and isinstance(comp.stop_reason, (int, type(None))):
                end -= 1  # the EOS / stop token is not part of a payload
            events += p.scanner.finish(end)
        for ev in events:
            if isinstance(ev, PayloadClosed):
                self._spawn(p, ev)

    def _spawn(self, p: _Parent, ev: PayloadClosed) -> None:
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
            # What the parent had left when it sampled the token at ev.end
            # (the engine's rule).
            sampled_then = p.sampled - max(0, len(p.context) - 1 - ev.end)
            budget = max(1, p.orig_max_tokens - sampled_then)
        key = str(p.next_key)
        p.next_key += 1
        child = LoopChild(key=key, payload_token_ids=list(payload),
                          prompt_token_ids=list(prompt), max_tokens=min(int(budget), room))
        p.open_children.append(child)
        p.unsent.append(child)
        p.result.children.append(child)

    def _take_child_output(self, c: LoopChild, out: Any) -> None:
        comp = out.outputs[0]
        c.output_token_ids = list(comp.token_ids)
        c.finish_reason = comp.finish_reason
        c.cached_prompt_tokens = int(out.num_cached_tokens or 0)
        toks = list(c.output_token_ids)
        if (comp.finish_reason == "stop" and toks
                and isinstance(comp.stop_reason, (int, type(None)))):
            toks.pop()  # its EOS / stop token
        c.contribution = toks

    # ---------------------------------------------------------------- joins
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
        """The parent's round and its children ended: join them, and finish
        the parent or leave it to go on."""
        finish_reason, stop_reason = p.last_finish
        res = p.result
        sync_stop = self._sync_stop(p)
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
        res.finish_time = time.perf_counter() - self._t0
        p.done = True


def client_loop_generate(llm: Any, prompts: Sequence[Any], sampling_params: Any,
                         special_kwargs: SpecialKwargs | Mapping[str, Any]) -> list[LoopResult]:
    """One-call form of :class:`ClientLoop`."""
    return ClientLoop(llm, special_kwargs).generate(prompts, sampling_params)
