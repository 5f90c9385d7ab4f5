"""A tag format's own inference loop, driven from the client over a stock
``vllm.LLM``: what ThreadWeaver, Multiverse, NPR and Parallel-R1 run without
engine support, and the oracle the native engine is compared with.

Each round, for all unfinished parents at once (lockstep):

1. one ``LLM.generate`` call continues every parent, stopping at the fork tag
   (a stop string; vLLM keeps the token that completed it in ``token_ids``);
2. the tokens are read with the engine's own
   :class:`~vllm_seqhooks.formats.tag_format_scanner.TagFormatScanner` (outline items, limits);
3. one ``LLM.generate`` call runs every child: the parent's context through
   the fork tag, then the child's lead and header; it stops at the end tag;
   a child that ends otherwise gets ``child_eos_text`` instead of its EOS;
4. each parent is re-submitted with the headers, the children's outputs and
   the suffix appended, in place of the fork tag's last token (token ids,
   laid out by :mod:`~vllm_seqhooks.formats.boundaries` for the format's
   ``boundary_tokenization``, as the engine does); the prefix cache serves
   the context computed before. When a child ended without its end tag and
   the format has an ``unclosed_child_stop_text``, that text ends the merge
   and the parent finishes.

:mod:`vllm_seqhooks.loops.text_loop` is the text-level loop, which builds
every prompt as a string.

One level of children (``max_child_depth=1``); budgets as the engine's: a
child may sample ``child_max_tokens``, or what its parent had left at the
fork.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from vllm_seqhooks.loops.results import LoopChild, LoopResult, params_per_prompt, prompt_ids
from vllm_seqhooks.config.presets import coerce_special_kwargs
from vllm_seqhooks.config.special_kwargs import SpecialKwargs
from vllm_seqhooks.config.request_keys import CHILD_KEY_ARG, SAMPLED_BEFORE_ARG
from vllm_seqhooks.core.request_tree import derive_seed
from vllm_seqhooks.formats.boundaries import ChildText, child_output, child_prompt, join_tokens
from vllm_seqhooks.formats.events import ForkReached
from vllm_seqhooks.formats.tag_format_scanner import TagFormatScanner
from vllm_seqhooks.formats.text_codec import TextCodec
from vllm_seqhooks.core.join_plan import fit_merge


@dataclass
class _Parent:
    params: Any
    context: list[int]
    result: LoopResult
    scanner: TagFormatScanner
    max_tokens: int
    sampled: int = 0
    fork: ForkReached | None = None
    #: Children of the fork being run, each with its label.
    children: list[tuple[LoopChild, str]] = field(default_factory=list)
    done: bool = False


def child_contribution(fmt, codec: TextCodec, token_ids: Sequence[int], finish_reason: Any,
                       stop_reason: Any) -> tuple[list[int], bytes | None, bool]:
    """What a child run by a client gives its parent: its tokens, ending at
    its end tag (a stop string), or else without its EOS / stop token and
    with ``fmt.eos_text`` instead; the same as text for a ``"text"`` merge
    (formats.boundaries.child_output); and whether it ended at its end tag."""
    toks = list(token_ids)
    at_tag = finish_reason == "stop" and stop_reason == fmt.child_end_tag
    if not at_tag and finish_reason == "stop" and isinstance(stop_reason, (int, type(None))):
        toks.pop()  # its EOS / stop token
    tokens, text = child_output(codec, fmt, toks, ended_by_tag=at_tag)
    return tokens, text, at_tag


class FormatLoop:
    """Client-side fork/join for a tag format (see the module docstring)."""

    def __init__(self, llm: Any, special_kwargs: SpecialKwargs | Mapping[str, Any] | str) -> None:
        hooks = coerce_special_kwargs(special_kwargs, llm.llm_engine.model_config.model)
        if hooks is None or hooks.tag_format is None:
            raise ValueError("FormatLoop runs a tag format (a preset such as "
                             "'threadweaver', or settings with a fork_tag)")
        if hooks.max_child_depth != 1:
            raise ValueError("the format loop runs one level of children (max_child_depth=1)")
        self.llm = llm
        self.tokenizer = llm.get_tokenizer()
        self.hooks = hooks.resolve(self.tokenizer) if not hooks.is_resolved else hooks
        self.fmt = hooks.tag_format
        size = max(len(self.tokenizer), llm.llm_engine.model_config.get_vocab_size())
        self.codec = TextCodec.from_tokenizer(self.tokenizer, size)
        self.max_model_len = int(llm.llm_engine.model_config.max_model_len)
        self.stats: dict[str, Any] = {}

    def generate(self, prompts: Sequence[Any], sampling_params: Any) -> list[LoopResult]:
        parents = [self._new_parent(p, sp) for p, sp in
                   zip(prompts, params_per_prompt(sampling_params, len(prompts)))]
        stats = {"rounds": 0, "parent_calls": 0, "child_calls": 0}
        t0 = time.perf_counter()
        active = parents
        while active:
            stats["rounds"] += 1
            self._advance(active, stats)
            forked = [p for p in active if p.fork is not None]
            if forked:
                self._run_children(forked, stats)
                for p in forked:
                    self._join(p)
            active = [p for p in parents if not p.done]
        stats["seconds"] = time.perf_counter() - t0
        self.stats = stats
        return [p.result for p in parents]

    def _new_parent(self, prompt: Any, params: Any) -> _Parent:
        ids = prompt_ids(self.tokenizer, prompt)
        max_tokens = params.max_tokens
        if max_tokens is None:
            max_tokens = self.max_model_len - len(ids)
        scanner = TagFormatScanner(self.fmt, self.codec, may_fork=True, ends_at_tag=False,
                                   max_children=self.hooks.max_children_per_request)
        return _Parent(params=params, context=list(ids), scanner=scanner,
                       result=LoopResult(prompt_token_ids=list(ids)), max_tokens=int(max_tokens))

    def _advance(self, active: list[_Parent], stats: dict[str, Any]) -> None:
        sps = []
        for p in active:
            sp = p.params.clone()
            sp.n = 1
            sp.max_tokens = p.max_tokens - p.sampled
            sp.stop = [*(sp.stop or []), self.fmt.fork_tag]
            if p.sampled:
                # As the engine marks a resumed parent (scripted test models
                # read it; real models ignore it).
                sp.extra_args = {**(sp.extra_args or {}), SAMPLED_BEFORE_ARG: p.sampled}
            sps.append(sp)
        outs = self.llm.generate([{"prompt_token_ids": list(p.context)} for p in active], sps,
                                 use_tqdm=False)
        stats["parent_calls"] += 1
        for p, out in zip(active, outs):
            comp = out.outputs[0]
            new = list(comp.token_ids)
            res = p.result
            res.add_round(len(p.context), out.num_cached_tokens)
            start = len(p.context)
            p.fork = next((ev for ev in p.scanner.feed(new, start)
                           if isinstance(ev, ForkReached)), None)
            if p.fork is not None:
                new = new[: p.fork.pos + 1 - start]
            p.context.extend(new)
            res.token_ids.extend(new)
            p.sampled += len(new)
            min_tokens = self.fmt.fork_min_tokens
            if p.fork is not None and min_tokens and p.max_tokens - p.sampled < min_tokens:
                p.fork = None  # too little budget left: the tag is plain text
            if p.fork is not None:
                continue
            at_tag = comp.finish_reason == "stop" and comp.stop_reason == self.fmt.fork_tag
            if not at_tag:
                self._finish(p, comp.finish_reason, comp.stop_reason)
            elif p.sampled >= p.max_tokens:
                self._finish(p, "length", None)

    def _run_children(self, forked: list[_Parent], stats: dict[str, Any]) -> None:
        todo: list[tuple[_Parent, LoopChild]] = []
        for p in forked:
            for label in p.fork.labels:
                prompt, kept = child_prompt(self.codec, self.fmt, p.context, p.fork.tag_start,
                                            label)
                start = prompt[kept:]
                if len(prompt) >= self.max_model_len:
                    continue
                key = str(len(p.result.children))
                budget = self.hooks.child_max_tokens or max(1, p.max_tokens - p.sampled)
                child = LoopChild(key=key, payload_token_ids=start, prompt_token_ids=prompt,
                                  max_tokens=min(budget, self.max_model_len - len(prompt)))
                p.children.append((child, label))
                p.result.children.append(child)
                todo.append((p, child))
        if not todo:
            return
        sps = []
        for p, c in todo:
            sp = p.params.clone()
            sp.n = 1
            sp.max_tokens = c.max_tokens
            if self.fmt.child_end_tag:
                sp.stop = [*(sp.stop or []), self.fmt.child_end_tag]
            if sp.seed is not None:
                sp.seed = derive_seed(sp.seed, c.key)
            # The engine's mark of a child (read by scripted test models).
            sp.extra_args = {**(sp.extra_args or {}), CHILD_KEY_ARG: c.key}
            sps.append(sp)
        outs = self.llm.generate([{"prompt_token_ids": c.prompt_token_ids} for _, c in todo],
                                 sps, use_tqdm=False)
        stats["child_calls"] += 1
        for (p, c), out in zip(todo, outs):
            comp = out.outputs[0]
            toks = list(comp.token_ids)
            c.output_token_ids = list(toks)
            c.finish_reason = comp.finish_reason
            c.cached_prompt_tokens = int(out.num_cached_tokens or 0)
            c.contribution, c.text, c.closed = child_contribution(
                self.fmt, self.codec, toks, comp.finish_reason, comp.stop_reason)

    def _join(self, p: _Parent) -> None:
        children, p.children, fork, p.fork = p.children, [], p.fork, None
        res = p.result
        if not children:  # every child refused: the tag was plain text
            return
        fmt = self.fmt
        stops = fmt.unclosed_child_stop_text is not None and not all(
            c.closed for c, _ in children)
        suffix_text = fmt.unclosed_child_stop_text if stops else fmt.merge_suffix
        merged = join_tokens(self.codec, fmt, p.context, fork.tag_start,
                             [ChildText(label, c.contribution, c.text) for c, label in children],
                             self.hooks.merge_separator_token_ids or (), suffix_text)
        # The fork tag's last token is replaced by the merge.
        del p.context[-1]
        del res.token_ids[-1]
        room = self.max_model_len - len(p.context)
        merged, truncated = fit_merge(merged, room)
        res.joins.append({"children": [c.key for c, _ in children],
                          "merged_tokens": len(merged), "truncated": truncated})
        res.merged_tokens += len(merged)
        p.context.extend(merged)
        res.token_ids.extend(merged)
        if stops or truncated or len(merged) >= room or p.sampled >= p.max_tokens:
            self._finish(p, "length", None)

    def _finish(self, p: _Parent, reason: Any, stop_reason: Any) -> None:
        res = p.result
        res.finish_reason = reason
        res.stop_reason = stop_reason
        res.sampled_tokens = p.sampled
        res.text = self.tokenizer.decode(res.token_ids, skip_special_tokens=True)
        p.done = True
