"""The baseline: fork/join driven by a client over a stock ``vllm.LLM``.

:class:`EventLoopClient` is what a user of stock vLLM writes today (APR,
ThreadWeaver and similar systems run this way), as an event-driven client
with prefix caching on:

* every parent is a request of its own; it is sent with ``<sync>`` added to
  its ``stop_token_ids``, so it stops there;
* its children are sent as separate requests, all at once and concurrently
  with every other request in flight (continuous batching does the rest) —
  ``spawn_at="sync"``: when the parent stops at ``<sync>`` (the loop the
  issue describes); ``spawn_at="payload"``: as soon as a payload closes, read
  from the parent's streamed output (a streaming client, children start
  while the parent still writes);
* when a parent's last child finishes, the parent is re-submitted at once
  with prompt = its previous context + ``<sync>`` + the merged tokens (token
  ids, merged exactly like the engine: promise order, separator between,
  without each child's EOS); vLLM's prefix cache serves every full KV block
  of the previous context.

It drives the in-process engine with ``LLMEngine.add_request`` / ``step()``
(the same loop ``LLM.generate`` runs): a request is added the moment the
client knows it, before the next engine step. That is an asyncio client
over ``AsyncLLM`` or HTTP without the transport: the most favourable case for
the loop (a real client adds round-trip latency and detokenization on top).

:func:`drive` is shared with the native runs, so both sides go through the
same step loop and the same ``add_request`` path.

:class:`ScriptedClientLoop` wraps the project's lockstep
:class:`vllm_seqhooks.loops.promise_loop.ClientLoop` (one blocking ``generate``
call per round for all parents, then one for all children) so that it can
replay scripted tokens (see its docstring); it is run as a second baseline.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from vllm_seqhooks.loops.promise_loop import ClientLoop
from vllm_seqhooks.config.presets import coerce_special_kwargs
from vllm_seqhooks.core.request_tree import derive_seed
from vllm_seqhooks.scripted.processor import CHILD_KEY, SAMPLED_BEFORE_KEY
from vllm_seqhooks.formats.events import PayloadClosed
from vllm_seqhooks.formats.promise import PromiseScanner

_ids = itertools.count()


def _engine_input(llm: Any, prompt_ids: Sequence[int]) -> Any:
    """The engine input ``LLM.generate`` would build for a token prompt."""
    prompt = {"prompt_token_ids": list(prompt_ids)}
    render = getattr(llm, "_preprocess_cmpl_one", None)
    return render(prompt) if render is not None else prompt


#: Seconds after which :func:`drive` gives up (a stuck engine must not hang
#: a benchmark run); set by ``--timeout``.
DRIVE_TIMEOUT_S = 900.0


def drive(llm: Any, initial: Iterable[tuple[str, Sequence[int], Any]],
          on_output: Callable[[Any], Iterable[tuple[str, Sequence[int], Any]]]) -> float:
    """Add ``initial`` requests ``(request_id, prompt_ids, params)``, then step
    the engine until nothing is left; every ``RequestOutput`` goes to
    ``on_output``, which returns requests to add before the next step.
    Returns the wall seconds. Raises ``TimeoutError`` (after aborting what
    is left) past :data:`DRIVE_TIMEOUT_S`."""
    engine = llm.llm_engine
    t0 = time.perf_counter()
    added: list[str] = []
    for rid, ids, sp in initial:
        engine.add_request(rid, _engine_input(llm, ids), sp)
        added.append(rid)
    while engine.has_unfinished_requests():
        for out in engine.step():
            for rid, ids, sp in on_output(out) or ():
                engine.add_request(rid, _engine_input(llm, ids), sp)
                added.append(rid)
        if time.perf_counter() - t0 > DRIVE_TIMEOUT_S:
            engine.abort_request(added)
            while engine.has_unfinished_requests():
                engine.step()
            raise TimeoutError(f"engine still busy after {DRIVE_TIMEOUT_S:.0f} s")
    return time.perf_counter() - t0


def run_native(llm: Any, prompts: Sequence[Sequence[int]], params: Sequence[Any]
               ) -> tuple[float, list[Any], list[float]]:
    """Parents through the native engine, via :func:`drive`: (seconds,
    final outputs in prompt order, each one's finish time in seconds)."""
    from vllm.sampling_params import RequestOutputKind

    tag = next(_ids)
    finals: dict[str, Any] = {}
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    reqs = []
    for i, (p, sp) in enumerate(zip(prompts, params)):
        sp = sp.clone()
        sp.output_kind = RequestOutputKind.FINAL_ONLY
        reqs.append((f"n{tag}-{i}", p, sp))

    def on_output(out: Any):
        if out.finished:
            finals[out.request_id] = out
            times[out.request_id] = time.perf_counter() - t0
        return ()

    secs = drive(llm, reqs, on_output)
    return secs, [finals[rid] for rid, _, _ in reqs], [times[rid] for rid, _, _ in reqs]


@dataclass
class _Child:
    key: str
    prompt: list[int]
    budget: int
    sent: bool = False
    done: bool = False
    output: list[int] = field(default_factory=list)
    contribution: list[int] = field(default_factory=list)
    cached: int = 0


@dataclass
class LoopOutput:
    """One parent driven by the client: its output as the native engine
    reports it (sampled + merged tokens, EOS included) and what it cost."""

    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    rounds: int = 0
    children: int = 0
    joins: int = 0
    #: Prompt tokens the client sent (parent rounds and children) and the
    #: part vLLM served from its prefix cache (``num_cached_tokens``).
    prompt_tokens_sent: int = 0
    cached_tokens: int = 0
    #: Prompt tokens of the parent's re-submissions not served by the cache:
    #: what a join costs the loop (the native engine's join_prefill_tokens).
    join_prefill_tokens: int = 0
    finish_time: float = 0.0


@dataclass
class _Parent:
    index: int
    params: Any
    context: list[int]
    scanner: PromiseScanner
    max_tokens: int
    result: LoopOutput
    sampled: int = 0
    children: list[_Child] = field(default_factory=list)
    next_key: int = 0
    #: Children before this index have been merged.
    merged_upto: int = 0
    round_id: str = ""
    round_start: int = 0
    round_params: Any = None
    waiting: bool = False
    #: A stop token held back while the parent waits for children (rule 5).
    held: int | None = None
    final_reason: str | None = None
    done: bool = False


class EventLoopClient:
    """Client-side fork/join over a stock ``vllm.LLM`` (module docstring).

    One level of children, ``child_context="fork"``, ``merge_strategy=
    "concatenate"``: the settings the benchmarks use. Scripted runs work:
    re-submitted parents carry ``seqhooks_sampled_before`` and children
    ``seqhooks_child_key`` in ``extra_args``, as the native scheduler writes
    them, so the scripted-token logits processor forces the same tokens on
    both sides.
    """

    def __init__(self, llm: Any, special_kwargs: Mapping[str, Any], *,
                 spawn_at: str = "sync") -> None:
        if spawn_at not in ("sync", "payload"):
            raise ValueError("spawn_at must be 'sync' or 'payload'")
        hooks = coerce_special_kwargs(dict(special_kwargs))
        tokenizer = llm.get_tokenizer()
        if not hooks.is_resolved:
            hooks = hooks.resolve(tokenizer)
        if hooks.child_context != "fork" or hooks.merge_strategy != "concatenate":
            raise ValueError("the benchmark loop implements child_context='fork' "
                             "and merge_strategy='concatenate'")
        self.llm = llm
        self.hooks = hooks
        self.spawn_at = spawn_at
        self.sep = list(hooks.merge_separator_token_ids or ())
        self.max_model_len = int(llm.llm_engine.model_config.max_model_len)

    # ---------------------------------------------------------------- API
    def generate(self, prompts: Sequence[Sequence[int]], params: Sequence[Any]
                 ) -> tuple[float, list[LoopOutput]]:
        """Run every parent to completion: (wall seconds, outputs)."""
        tag = next(_ids)
        self._tag = tag
        self._owner: dict[str, tuple[_Parent, _Child | None]] = {}
        parents = []
        for i, (p, sp) in enumerate(zip(prompts, params)):
            max_tokens = sp.max_tokens
            if max_tokens is None:
                max_tokens = self.max_model_len - len(p)
            parents.append(_Parent(
                index=i, params=sp, context=list(p),
                scanner=PromiseScanner(
                    self.hooks.sync_token_id, self.hooks.promise_token_id,
                    self.hooks.promise_end_token_id,
                    max_promises=self.hooks.max_children_per_request),
                max_tokens=int(max_tokens), result=LoopOutput()))
        self._t0 = time.perf_counter()
        initial = [self._round(p) for p in parents]
        secs = drive(self.llm, initial, self._on_output)
        return secs, [p.result for p in parents]

    # ----------------------------------------------------------- requests
    def _round(self, p: _Parent) -> tuple[str, list[int], Any]:
        from vllm.sampling_params import RequestOutputKind

        sp = p.params.clone()
        sp.n = 1
        sp.max_tokens = p.max_tokens - p.sampled
        stops = list(sp.stop_token_ids or [])
        if self.hooks.sync_token_id not in stops:
            stops.append(self.hooks.sync_token_id)
        sp.stop_token_ids = stops
        extra = dict(sp.extra_args or {})
        extra[SAMPLED_BEFORE_KEY] = p.sampled
        sp.extra_args = extra
        sp.output_kind = (RequestOutputKind.DELTA if self.spawn_at == "payload"
                          else RequestOutputKind.FINAL_ONLY)
        p.round_params = sp
        p.result.rounds += 1
        rid = f"L{self._tag}-{p.index}-r{p.result.rounds}"
        p.round_id = rid
        p.round_start = len(p.context)
        self._owner[rid] = (p, None)
        p.result.prompt_tokens_sent += len(p.context)
        return rid, list(p.context), sp

    def _child_request(self, p: _Parent, c: _Child) -> tuple[str, list[int], Any]:
        from vllm.sampling_params import RequestOutputKind

        # Like the engine: a copy of the parent's parameters (without the
        # client's extra <sync> stop), n=1, its own budget.
        sp = p.params.clone()
        sp.n = 1
        sp.max_tokens = c.budget
        extra = dict(sp.extra_args or {})
        extra.pop(SAMPLED_BEFORE_KEY, None)
        extra[CHILD_KEY] = c.key
        sp.extra_args = extra
        if sp.seed is not None:
            sp.seed = derive_seed(sp.seed, c.key)
        sp.output_kind = RequestOutputKind.FINAL_ONLY
        c.sent = True
        rid = f"L{self._tag}-{p.index}-c{c.key}"
        self._owner[rid] = (p, c)
        p.result.prompt_tokens_sent += len(c.prompt)
        return rid, list(c.prompt), sp

    # ------------------------------------------------------------- events
    def _on_output(self, out: Any) -> list[tuple[str, list[int], Any]]:
        owner = self._owner.get(out.request_id)
        if owner is None:
            return []
        p, child = owner
        if child is not None:
            return self._child_output(p, child, out)
        return self._parent_output(p, out)

    def _parent_output(self, p: _Parent, out: Any) -> list[tuple[str, list[int], Any]]:
        if self.spawn_at == "sync" and not out.finished:
            return []
        comp = out.outputs[0]
        new = list(comp.token_ids)
        adds: list[tuple[str, list[int], Any]] = []
        start = len(p.context)
        p.context.extend(new)
        p.result.token_ids.extend(new)
        p.sampled += len(new)
        sync_stop = (out.finished and comp.finish_reason == "stop"
                     and comp.stop_reason == self.hooks.sync_token_id)
        events = p.scanner.feed(new, start)
        if out.finished and not sync_stop:
            end = len(p.context)
            if comp.finish_reason == "stop" and isinstance(comp.stop_reason, (int, type(None))):
                end -= 1  # the EOS / stop token is not part of a payload
            events += p.scanner.finish(end)
        for ev in events:
            if isinstance(ev, PayloadClosed):
                c = self._new_child(p, ev)
                if c is not None and self.spawn_at == "payload":
                    adds.append(self._child_request(p, c))
        if not out.finished:
            return adds
        cached = int(out.num_cached_tokens or 0)
        p.result.cached_tokens += cached
        if p.result.rounds > 1:
            p.result.join_prefill_tokens += p.round_start - cached
        pending = p.children[p.merged_upto:]
        if sync_stop and not pending:
            # A <sync> with nothing to wait for is plain text: go on.
            adds.append(self._round(p))
            return adds
        if not pending:
            self._finish(p, comp.finish_reason)
            return adds
        if not sync_stop:
            # Stopped with open children (rule 5): hold the stop token back.
            if comp.finish_reason == "stop" and isinstance(comp.stop_reason, (int, type(None))):
                p.held = p.result.token_ids.pop()
                p.context.pop()
            p.final_reason = comp.finish_reason
        p.waiting = True
        for c in pending:
            if not c.sent:
                adds.append(self._child_request(p, c))
        adds += self._maybe_join(p)
        return adds

    def _new_child(self, p: _Parent, ev: PayloadClosed) -> _Child | None:
        prompt = p.context[: ev.context_end]
        room = self.max_model_len - len(prompt)
        if room <= 0:
            return None
        budget = self.hooks.child_max_tokens
        if budget is None:
            closing = {"promise_end": ev.end, "promise": ev.end, "sync": ev.end}.get(
                ev.closed_by, len(p.context) - 1)
            sampled_then = p.sampled - (len(p.context) - 1 - closing)
            budget = max(1, p.max_tokens - sampled_then)
        c = _Child(key=str(p.next_key), prompt=prompt, budget=min(int(budget), room))
        p.next_key += 1
        p.children.append(c)
        p.result.children += 1
        return c

    def _child_output(self, p: _Parent, c: _Child, out: Any) -> list[tuple[str, list[int], Any]]:
        if not out.finished:
            return []
        comp = out.outputs[0]
        c.output = list(comp.token_ids)
        toks = list(c.output)
        if (comp.finish_reason == "stop" and toks
                and isinstance(comp.stop_reason, (int, type(None)))):
            toks.pop()  # its EOS / stop token
        c.contribution = toks
        c.done = True
        c.cached = int(out.num_cached_tokens or 0)
        p.result.cached_tokens += c.cached
        return self._maybe_join(p)

    def _maybe_join(self, p: _Parent) -> list[tuple[str, list[int], Any]]:
        if not p.waiting:
            return []
        pending = p.children[p.merged_upto:]
        if not all(c.done for c in pending):
            return []
        merged: list[int] = []
        for i, c in enumerate(pending):
            if i:
                merged.extend(self.sep)
            merged.extend(c.contribution)
        p.merged_upto = len(p.children)
        p.waiting = False
        p.result.joins += 1
        room = self.max_model_len - len(p.context)
        truncated = len(merged) > room
        merged = merged[: max(room, 0)]
        p.context.extend(merged)
        p.result.token_ids.extend(merged)
        if p.final_reason is not None or truncated or p.sampled >= p.max_tokens:
            if p.held is not None:
                p.result.token_ids.append(p.held)
            self._finish(p, "length" if truncated else (p.final_reason or "length"))
            return []
        return [self._round(p)]

    def _finish(self, p: _Parent, reason: str | None) -> None:
        p.result.finish_reason = reason
        p.result.finish_time = time.perf_counter() - self._t0
        p.done = True


class ScriptedClientLoop(ClientLoop):
    """The project's lockstep :class:`~vllm_seqhooks.loops.promise_loop.ClientLoop`,
    able to replay scripted tokens: its re-submitted parents do not carry
    ``seqhooks_sampled_before`` (the scripted processor would restart the
    parent's script at every round) and its children do not carry
    ``seqhooks_child_key`` (they would not be scripted at all). This adds both,
    exactly as the native scheduler does; nothing else changes."""

    def _parent_params(self, p: Any):
        sp = super()._parent_params(p)
        extra = dict(sp.extra_args or {})
        extra[SAMPLED_BEFORE_KEY] = p.sampled
        sp.extra_args = extra
        return sp

    def _child_params(self, p: Any, child: Any):
        sp = super()._child_params(p, child)
        extra = dict(sp.extra_args or {})
        extra.pop(SAMPLED_BEFORE_KEY, None)
        extra[CHILD_KEY] = child.key
        sp.extra_args = extra
        return sp
