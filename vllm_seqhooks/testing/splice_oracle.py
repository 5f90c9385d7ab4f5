"""What a model computes after a KV-splice join, computed the slow and
obvious way: Hugging Face transformers, float32, the whole sequence each
step, with the attention mask and position ids that
:mod:`vllm_seqhooks.core.splice_layout` declares (a 4-D mask: each path
sees the shared context and itself; what follows sees everything).

An engine's splice join must continue a parent exactly as
:func:`greedy_after_join` does from the same merged tokens; a re-prefill
join (one causal sequence, positions counting on) continues as
:func:`greedy_causal` does. Used by the tests, on the tiny models of
:mod:`vllm_seqhooks.testing.tiny_model`.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from vllm_seqhooks.core.splice_layout import (
    Layout,
    attention_mask,
    positions,
    token_count,
)


@lru_cache(maxsize=4)
def load(model_dir: str):
    """The model at ``model_dir`` in float32 on CPU, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return model.eval()


def next_token(model, ids: Sequence[int], layout: Layout, first_position: int = 0) -> int:
    """The greedy next token after ``ids`` laid out as ``layout`` (its
    first token at ``first_position``)."""
    import torch

    if token_count(layout) != len(ids):
        raise ValueError(f"the layout holds {token_count(layout)} tokens, not {len(ids)}")
    allowed = torch.tensor(attention_mask(layout), dtype=torch.bool)
    mask = torch.zeros(allowed.shape, dtype=torch.float32)
    mask.masked_fill_(~allowed, torch.finfo(torch.float32).min)
    with torch.no_grad():
        logits = model(
            input_ids=torch.tensor([list(ids)]),
            attention_mask=mask[None, None],
            position_ids=torch.tensor([positions(layout, first_position)]),
        ).logits
    return int(logits[0, -1].argmax())


def greedy_after_join(model, ids: Sequence[int], layout: Layout, max_new: int,
                      stop: Sequence[int] = (), first_position: int = 0) -> list[int]:
    """``max_new`` greedy tokens (fewer when one in ``stop`` comes, kept)
    continuing ``ids`` laid out as ``layout``: each extends its last run."""
    ids, out = list(ids), []
    layout = tuple(layout) if layout and isinstance(layout[-1], int) else (*layout, 0)
    while len(out) < max_new:
        token = next_token(model, ids, layout, first_position)
        out.append(token)
        if token in stop:
            break
        ids.append(token)
        layout = (*layout[:-1], layout[-1] + 1)
    return out


def greedy_causal(model, ids: Sequence[int], max_new: int, stop: Sequence[int] = (),
                  first_position: int = 0) -> list[int]:
    """The same with plain causal attention and consecutive positions
    from ``first_position`` (what a re-prefill join computes)."""
    return greedy_after_join(model, ids, (len(ids),), max_new, stop, first_position)


def greedy_shifted(model, prompt: Sequence[int], max_new: int, shift: int) -> list[int]:
    """Greedy generation with causal attention, the prompt at positions
    0, 1, 2, ... and each token after it at its index plus ``shift`` (as
    a parent's tokens after a splice join: its positions run behind its
    indices)."""
    import torch

    ids, out = list(prompt), []
    while len(out) < max_new:
        pos = [*range(len(prompt)), *(i + shift for i in range(len(prompt), len(ids)))]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids]),
                           position_ids=torch.tensor([pos])).logits
        out.append(int(logits[0, -1].argmax()))
        ids.append(out[-1])
    return out
