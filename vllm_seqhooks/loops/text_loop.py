"""A tag format's text-level loop over a stock ``vllm.LLM``: every prompt is
a string, as a text-level orchestrator sends it to a completions API.

Written after ThreadWeaver's SFT evaluation orchestrator
(facebookresearch/threadweaver ``threadweaver_sft/src/simple_eval.py``,
``branching_generate``), generalized to any :class:`TagFormat`:

1. the parent's text is sent with the fork tag as a stop string; vLLM cuts
   the output text before the tag, and the loop appends the tag (the bytes
   the tag's last token carried past it are gone, as in the orchestrator);
2. outline items are read from the text the parent wrote since its last
   fork (``<outline_tag> N:``), or ``fork_count`` children;
3. child ``n``'s prompt is the parent's text, the lead and header ``n``; it
   stops at the end tag (a stop string: the loop appends the tag), and a
   child that ends otherwise (EOS, out of tokens) gets ``child_eos_text``;
4. the parent's next prompt is its text, the lead, then for each child its
   header and text (a separator between children), then the merge suffix;
   when a child ended without its end tag and the format has an
   ``unclosed_child_stop_text``, that text replaces the suffix and the
   generation ends there.

Nothing here uses the engine's token-level code: this is the reference the
native engine's ``"text"`` boundaries are checked against
(``tests/test_boundaries_real_tokenizers.py``). One level of children.

The loop talks to a :class:`Completions`: :class:`VllmCompletions` sends
each call to a stock ``vllm.LLM`` (setting the keys the scripted test models
read, ``seqhooks_sampled_before`` and ``seqhooks_child_key``, as the engine
sets them); ``ScriptedCompletions`` of the repository's ``tests/support/text_completions.py``
replays scripted tokens without a model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence

from vllm_seqhooks.config.presets import coerce_special_kwargs
from vllm_seqhooks.config.request_keys import CHILD_KEY_ARG, SAMPLED_BEFORE_ARG
from vllm_seqhooks.config.special_kwargs import SpecialKwargs
from vllm_seqhooks.core.request_tree import derive_seed
from vllm_seqhooks.loops.results import params_per_prompt


@dataclass(frozen=True)
class Completion:
    """One call's result, as vLLM reports it: the prompt's ids, the sampled
    ids, the text (cut before a stop string), why it ended."""

    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    stop_reason: int | str | None = None


class Completions(Protocol):
    def complete(self, prompt: str, max_tokens: int, stop: str | None, *,
                 sampled_before: int = 0, child_key: str | None = None) -> Completion:
        """Continue ``prompt`` (a string, tokenized as a fresh request's)
        for at most ``max_tokens``, stopping at the stop string ``stop``;
        ``sampled_before``: tokens the parent sampled in earlier calls;
        ``child_key``: the child's key, for a child."""


class VllmCompletions:
    """:class:`Completions` over a stock ``vllm.LLM`` with the sampling
    parameters of the request the loop runs."""

    def __init__(self, llm: Any, params: Any) -> None:
        self.llm = llm
        self.params = params
        self.max_model_len = int(llm.llm_engine.model_config.max_model_len)

    def complete(self, prompt: str, max_tokens: int, stop: str | None, *,
                 sampled_before: int = 0, child_key: str | None = None) -> Completion:
        sp = self.params.clone()
        sp.n = 1
        room = self.max_model_len - len(self.llm.get_tokenizer().encode(prompt))
        sp.max_tokens = max(1, min(max_tokens, room))
        sp.stop = [*(sp.stop or []), *([stop] if stop else [])]
        extra = dict(sp.extra_args or {})
        if sampled_before:
            extra[SAMPLED_BEFORE_ARG] = sampled_before
        if child_key is not None:
            extra[CHILD_KEY_ARG] = child_key
            if sp.seed is not None:
                sp.seed = derive_seed(sp.seed, child_key)
        sp.extra_args = extra or None
        (out,) = self.llm.generate([prompt], sp, use_tqdm=False)
        comp = out.outputs[0]
        return Completion(list(out.prompt_token_ids), list(comp.token_ids), comp.text,
                          comp.finish_reason, comp.stop_reason)


@dataclass
class TextChild:
    key: str
    label: str
    prompt: str
    prompt_token_ids: list[int]
    #: What it gives the merge: its text through its end tag, or with the
    #: format's end text.
    text: str = ""
    finish_reason: str | None = None
    closed: bool = False


@dataclass
class TextLoopResult:
    """One parent: its whole text (prompt included), the prompt and output
    ids of its last call, and its children."""

    text: str
    prompt_token_ids: list[int] = field(default_factory=list)
    output_token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    children: list[TextChild] = field(default_factory=list)
    calls: int = 0

    @property
    def token_ids(self) -> list[int]:
        """Prompt and output ids of the last call."""
        return [*self.prompt_token_ids, *self.output_token_ids]


class TextLoop:
    """Client-side fork/join for a tag format, in text (see the module
    docstring)."""

    def __init__(self, hooks: SpecialKwargs | Mapping[str, Any] | str, model: Any = None) -> None:
        hooks = coerce_special_kwargs(hooks, model)
        if hooks is None or hooks.tag_format is None:
            raise ValueError("TextLoop runs a tag format")
        self.hooks = hooks
        self.fmt = hooks.tag_format

    def generate(self, llm: Any, prompts: Sequence[str], sampling_params: Any
                 ) -> list[TextLoopResult]:
        """Run each prompt over a stock ``vllm.LLM``."""
        return [self.run(VllmCompletions(llm, params), prompt, params.max_tokens)
                for prompt, params in
                zip(prompts, params_per_prompt(sampling_params, len(prompts)))]

    # ------------------------------------------------------------------
    def run(self, calls: Completions, prompt: str, max_tokens: int) -> TextLoopResult:
        """One parent, started from ``prompt``, sampling ``max_tokens`` in all."""
        fmt = self.fmt
        res = TextLoopResult(text=prompt)
        sampled = 0
        since_fork = ""
        children_left = self.hooks.max_children_per_request
        while True:
            comp = calls.complete(res.text, max_tokens - sampled, fmt.fork_tag,
                                  sampled_before=sampled)
            res.calls += 1
            res.prompt_token_ids = list(comp.prompt_token_ids)
            res.output_token_ids = list(comp.token_ids)
            sampled += len(comp.token_ids)
            at_fork = comp.finish_reason == "stop" and comp.stop_reason == fmt.fork_tag
            res.text += comp.text
            if not at_fork:
                res.finish_reason = comp.finish_reason
                return res
            res.text += fmt.fork_tag
            since_fork += comp.text + fmt.fork_tag
            labels = self._labels(since_fork)
            since_fork = ""
            if children_left is not None:
                labels = labels[:children_left]
                children_left -= len(labels)
            if fmt.fork_min_tokens and max_tokens - sampled < fmt.fork_min_tokens:
                labels = []
            if not labels:
                if sampled >= max_tokens:
                    res.finish_reason = "length"
                    return res
                continue  # the tag is plain text
            children = self._run_children(calls, res, labels, max_tokens - sampled)
            stops = fmt.unclosed_child_stop_text is not None and not all(
                c.closed for c in children)
            res.text += self._merge(children, stops)
            if stops or sampled >= max_tokens:
                # The generation ends with the merge: the ids are those of
                # the text, as the next call would send them.
                res.finish_reason = "length"
                res.prompt_token_ids = calls.complete(res.text, 0, None).prompt_token_ids
                res.output_token_ids = []
                return res

    def _labels(self, text: str) -> list[str]:
        fmt = self.fmt
        if fmt.outline_tag is None:
            return [str(i + 1) for i in range(fmt.fork_count or 0)]
        pattern = re.escape(fmt.outline_tag) + r"\s*(\d+)\s*:"
        labels: list[str] = []
        for match in re.finditer(pattern, text):
            if match.group(1) not in labels:
                labels.append(match.group(1))
        return labels

    def _run_children(self, calls: Completions, res: TextLoopResult, labels: list[str],
                      parent_left: int) -> list[TextChild]:
        fmt = self.fmt
        children: list[TextChild] = []
        for label in labels:
            key = str(len(res.children))
            prompt = res.text + fmt.header_lead + fmt.header(label)
            budget = self.hooks.child_max_tokens or max(1, parent_left)
            comp = calls.complete(prompt, budget, fmt.child_end_tag, child_key=key)
            child = TextChild(key, label, prompt, list(comp.prompt_token_ids),
                              finish_reason=comp.finish_reason)
            child.closed = (fmt.child_end_tag is not None and comp.finish_reason == "stop"
                            and comp.stop_reason == fmt.child_end_tag)
            if child.closed:
                child.text = comp.text + fmt.child_end_tag
            else:
                child.text = comp.text + (fmt.eos_text if fmt.child_end_tag else "")
            res.children.append(child)
            children.append(child)
        return children

    def _merge(self, children: list[TextChild], stops: bool) -> str:
        fmt = self.fmt
        parts = []
        for i, child in enumerate(children):
            parts.append(self.hooks.merge_separator if i else fmt.header_lead)
            parts.append(fmt.header(child.label) + child.text)
        parts.append(fmt.unclosed_child_stop_text if stops else fmt.merge_suffix)
        return "".join(parts)
