"""A stand-in for a model trained on whole texts: it continues any context
that is the start of one of its texts' tokens, and writes EOS otherwise.

:class:`CorpusLogitsProcessor` (vLLM's V1 model runner, the CPU backend's)
reads a corpus file named by ``SEQHOOKS_CORPUS``: JSON ``{"sequences":
[[ids...], ...], "eos_token_id": N}``, each sequence a training text as the
tokenizer splits it whole (:func:`write_corpus`). For every request, each
step, when ``prompt + output`` ids are the first tokens of a sequence, the
next token of that sequence is forced; otherwise EOS. No request keys are
needed, so any client drives it (an orchestrator over HTTP, the text loop,
the native engine): a client that sends a context the texts never contain
(a boundary tokenized differently) gets EOS at once, as the children of a
badly joined family "wrote nothing" in issue 19.

Use::

    write_corpus(path, tokenizer, texts)
    os.environ["SEQHOOKS_CORPUS"] = str(path)
    LLM(model, logits_processors=[CORPUS_LOGITS_PROCESSOR_FQCN], ...)
    # or: vllm serve MODEL --logits-processors tests.support.corpus_model:CorpusLogitsProcessor
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

CORPUS_ENV = "SEQHOOKS_CORPUS"
CORPUS_LOGITS_PROCESSOR_FQCN = "tests.support.corpus_model:CorpusLogitsProcessor"


def write_corpus(path: str | os.PathLike[str], tokenizer: Any, texts: Iterable[str]) -> Path:
    """Tokenize each text whole (special tokens added, as vLLM adds them to a
    text prompt) and write the corpus file."""
    sequences = [list(tokenizer.encode(text)) for text in texts]
    out = Path(path)
    out.write_text(json.dumps({"sequences": sequences,
                               "eos_token_id": tokenizer.eos_token_id}))
    return out


def next_token_table(sequences: Sequence[Sequence[int]]) -> dict[tuple[int, ...], int]:
    """Each proper prefix of a sequence -> the token after it (the first
    sequence listed wins where two diverge)."""
    table: dict[tuple[int, ...], int] = {}
    for seq in sequences:
        for i in range(len(seq)):
            table.setdefault(tuple(seq[:i]), int(seq[i]))
    return table


class CorpusLogitsProcessor(LogitsProcessor):
    """See the module docstring."""

    def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool) -> None:
        path = os.environ.get(CORPUS_ENV)
        if not path:
            raise ValueError(f"{CORPUS_ENV} must name a corpus file (write_corpus)")
        data = json.loads(Path(path).read_text())
        self.table = next_token_table(data["sequences"])
        self.eos = int(data["eos_token_id"])
        # persistent-batch row -> (prompt ids, live output ids)
        self.rows: dict[int, tuple[Sequence[int], Sequence[int]]] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, _params, prompt_ids, output_ids in batch_update.added:
            self.rows[index] = (prompt_ids or (), output_ids)
        for a, b, direction in batch_update.moved:
            a_row, b_row = self.rows.pop(a, None), self.rows.pop(b, None)
            if a_row is not None:
                self.rows[b] = a_row
            if b_row is not None and direction == MoveDirectionality.SWAP:
                self.rows[a] = b_row

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, (prompt, output) in self.rows.items():
            token = self.table.get((*prompt, *output), self.eos)
            logits[index] = float("-inf")
            logits[index, token] = 0.0
        return logits
