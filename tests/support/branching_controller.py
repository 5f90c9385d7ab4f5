"""The oracle for the verl agent loop: ThreadWeaver's client loop, written
again here.

Followed: ``threadweaver_rl/verl/experimental/agent_loop/single_turn_agent_loop.py``
of facebookresearch/threadweaver at 2662232, ``ParallelBranchingController``
(``run``, ``_sequential_step``, ``_parallel_step``, ``_generate``) and the
cuts of ``SingleTurnAgentLoop.run``: a sequential call stops at
``</Outlines>`` or EOS; the outline numbers (``<Outline> N:``) after the last
``<Outlines>`` give one thread call each, prompted with the context and
``"\\n<Thread>\\nN:"``, stopping at ``</Thread>`` or EOS; a thread's tokens
are cut at EOS and closed with ``"\\n</Thread>"`` unless it stopped at
``</Thread>``; the merge is each thread's header (the first
``"\\n<Thread>\\nN:"``, the others ``"<Thread>\\nN:"``) and tokens, then
``"\\n<Conclusion>\\n"`` (``no_conclusion=False``) and the next sequential
call, or, after an EOS or at the length, the closing
``"\\n<Conclusion>\\n</Conclusion>\\n</Parallel>"`` and the end. Every call
is one expanded row (its prompt, its raw tokens, mask all 1).

The one change: ThreadWeaver's fork of verl answers with SGLang's
``finish_reason`` and ``matched_stop``; verl 0.9.1's ``TokenOutput`` has
neither, so both are read from the tokens (the last one is a stop token or
the call ran out of tokens), which is what they say for these stops.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional

OUTLINE_PATTERN = re.compile(r"<Outline>\s*([0-9]+(?:\.[0-9]+)*)\s*:")
MAX_ITERATIONS = 32

#: (prompt ids, sampling params) -> the answer's token ids.
Generate = Callable[[list[int], dict[str, Any]], Awaitable[list[int]]]


@dataclass
class BranchingResult:
    response_ids: list[int]
    expanded_prompt_ids: list[list[int]] = field(default_factory=list)
    expanded_response_ids: list[list[int]] = field(default_factory=list)
    expanded_response_mask: list[list[int]] = field(default_factory=list)


class BranchingController:
    """seq -> par -> seq over ``generate``, as ThreadWeaver's controller."""

    def __init__(self, tokenizer: Any, generate: Generate, sampling_params: dict[str, Any], *,
                 response_length: int, max_total_tokens: int) -> None:
        self.tok = tokenizer
        self.generate = generate
        self.params = {k: v for k, v in sampling_params.items() if k != "logprobs"}
        self.response_length = response_length
        self.max_total_tokens = max_total_tokens
        self.outlines_start = self._one_id("<Outlines>")
        self.outlines_end = self._one_id("</Outlines>")
        self.thread_end = self._one_id("</Thread>")
        self.eos = tokenizer.eos_token_id

    def _one_id(self, text: str) -> int:
        ids = self.tok.encode(text, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"{text!r} must be one token, got {ids}")
        return ids[0]

    def _encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    async def _call(self, prompt: list[int], stops: list[int]) -> tuple[list[int], Optional[int]]:
        params = dict(self.params)
        params["stop_token_ids"] = list(dict.fromkeys(list(params.get("stop_token_ids") or []) + stops))
        r = self.result
        index = len(r.expanded_prompt_ids)  # (the row is the call's: threads finish in any order)
        r.expanded_prompt_ids.append(list(prompt))
        r.expanded_response_ids.append([])
        r.expanded_response_mask.append([])
        tokens = list(await self.generate(list(prompt), params))
        r.expanded_response_ids[index] = list(tokens)
        r.expanded_response_mask[index] = [1] * len(tokens)
        matched = tokens[-1] if tokens and tokens[-1] in stops else None
        return tokens, matched

    async def run(self, prompt_ids: list[int]) -> BranchingResult:
        self.result = BranchingResult(response_ids=[])
        self.current = list(prompt_ids)
        generated: list[int] = []
        state, outlines = "seq", []
        for _ in range(MAX_ITERATIONS):
            if state == "done" or len(generated) >= self.response_length \
                    or len(self.current) >= self.max_total_tokens:
                break
            if state == "seq":
                tokens, matched = await self._call(self.current, [self.outlines_end, self.eos])
                if not tokens:
                    break
                self.current += tokens
                generated += tokens
                if self.outlines_end in tokens:
                    outlines = self._outline_numbers()
                    if outlines:
                        state = "par"
                if matched is None or matched == self.eos or self.eos in tokens:
                    state = "done"
            else:
                added, eos_seen = await self._parallel(list(dict.fromkeys(outlines)))
                outlines = []
                self.current += added
                generated += added
                closing_now = eos_seen or len(generated) >= self.response_length
                tail = self._encode("\n<Conclusion>\n</Conclusion>\n</Parallel>" if closing_now
                                    else "\n<Conclusion>\n")
                self.current += tail
                generated += tail
                state = "done" if closing_now else "seq"
        self.result.response_ids = generated[: self.response_length]
        self._cut_expanded()
        return self.result

    async def _parallel(self, outlines: list[str]) -> tuple[list[int], bool]:
        headers, calls = [], []
        for i, outline in enumerate(outlines):
            prompt_header = self._encode(f"\n<Thread>\n{outline}:")
            headers.append(prompt_header if i == 0 else self._encode(f"<Thread>\n{outline}:"))
            calls.append(self._call(self.current + prompt_header, [self.thread_end, self.eos]))
        answers = await asyncio.gather(*calls)
        added: list[int] = []
        eos_seen = False
        for header, (tokens, matched) in zip(headers, answers):
            if matched is None or matched == self.eos:
                eos_seen = True
            if self.eos in tokens:
                tokens = tokens[: tokens.index(self.eos)]
                eos_seen = True
            if matched != self.thread_end:
                tokens = tokens + self._encode("\n</Thread>")
            added += header + tokens
        return added, eos_seen

    def _outline_numbers(self) -> list[str]:
        try:
            start = len(self.current) - 1 - self.current[::-1].index(self.outlines_start)
        except ValueError:
            return []
        return OUTLINE_PATTERN.findall(self.tok.decode(self.current[start:]))

    def _cut_expanded(self) -> None:
        r = self.result
        for i, prompt in enumerate(r.expanded_prompt_ids):
            allowed = min(self.response_length, self.max_total_tokens - len(prompt))
            r.expanded_response_ids[i] = r.expanded_response_ids[i][:allowed]
            r.expanded_response_mask[i] = r.expanded_response_mask[i][:allowed]
