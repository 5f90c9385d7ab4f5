"""`ScriptedCompletions`: a :class:`~vllm_seqhooks.loops.text_loop.Completions`
without a model, for :class:`~vllm_seqhooks.loops.text_loop.TextLoop` (pure,
no vLLM import).

Each call's prompt is tokenized as vLLM tokenizes a text prompt
(``tokenizer.encode(prompt)``, special tokens added); the "model" samples
the request's script (the root's, or a child's by key) from the index it has
reached (``sampled_before``), then EOS; the output ends as vLLM ends it: at
EOS (dropped from the text), at the first stop string in the decoded text
(the text cut before it) or after ``max_tokens``. The same scripts drive the
scheduler harness (:mod:`~tests.support.sched_harness`), so a test
compares the native engine with the text-level loop on the same sampled
tokens.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from vllm_seqhooks.loops.text_loop import Completion

#: The key of the root request's script.
ROOT = ""


class ScriptedCompletions:
    def __init__(self, tokenizer: Any, scripts: Mapping[str, Sequence[int]], eos_id: int) -> None:
        self.tokenizer = tokenizer
        self.scripts = {k: list(v) for k, v in scripts.items()}
        self.eos_id = eos_id

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def complete(self, prompt: str, max_tokens: int, stop: str | None, *,
                 sampled_before: int = 0, child_key: str | None = None) -> Completion:
        prompt_ids = list(self.tokenizer.encode(prompt))
        script = self.scripts.get(ROOT if child_key is None else child_key, [])
        out: list[int] = []
        for index in range(sampled_before, sampled_before + max_tokens):
            token = script[index] if index < len(script) else self.eos_id
            out.append(token)
            if token == self.eos_id:
                return Completion(prompt_ids, out, self._decode(out[:-1]), "stop", None)
            if stop:
                text = self._decode(out)
                at = text.find(stop)
                if at >= 0:
                    return Completion(prompt_ids, out, text[:at], "stop", stop)
        return Completion(prompt_ids, out, self._decode(out), "length", None)
