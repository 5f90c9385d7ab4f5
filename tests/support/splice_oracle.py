"""What a model computes after a KV-splice join, computed the slow and
obvious way: Hugging Face transformers, float32, the whole sequence each
step, with the attention mask and position ids that
:mod:`vllm_seqhooks.core.splice_layout` declares (a 4-D mask: each path
sees the shared context and itself; what follows sees everything).

An engine's splice join must continue a parent exactly as
:func:`greedy_after_join` does from the same merged tokens; a re-prefill
join (one causal sequence, positions counting on) continues as
:func:`greedy_causal` does. Used by the tests, on the tiny models of
:mod:`vllm_seqhooks.scripted.tiny_model`.
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


def _layout_inputs(ids: Sequence[int], layout: Layout, first_position: int):
    """The 4-D additive attention mask and the position ids of ``ids``
    laid out as ``layout``."""
    import torch

    if token_count(layout) != len(ids):
        raise ValueError(f"the layout holds {token_count(layout)} tokens, not {len(ids)}")
    allowed = torch.tensor(attention_mask(layout), dtype=torch.bool)
    mask = torch.zeros(allowed.shape, dtype=torch.float32)
    mask.masked_fill_(~allowed, torch.finfo(torch.float32).min)
    return mask[None, None], positions(layout, first_position)


def next_token(model, ids: Sequence[int], layout: Layout, first_position: int = 0) -> int:
    """The greedy next token after ``ids`` laid out as ``layout`` (its
    first token at ``first_position``)."""
    import torch

    mask, position = _layout_inputs(ids, layout, first_position)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([list(ids)]), attention_mask=mask,
                       position_ids=torch.tensor([position])).logits
    return int(logits[0, -1].argmax())


def greedy_after_join(model, ids: Sequence[int], layout: Layout, max_new: int,
                      stop: Sequence[int] = (), first_position: int = 0) -> list[int]:
    """``max_new`` greedy tokens (fewer when one in ``stop`` comes, kept)
    continuing ``ids`` laid out as ``layout``: each new token sees
    everything before it and takes the next position. The laid-out tokens
    are computed once with the layout's mask; the new ones on their KV."""
    import torch

    if not max_new:
        return []
    mask, position = _layout_inputs(ids, layout, first_position)
    out: list[int] = []
    with torch.no_grad():
        result = model(input_ids=torch.tensor([list(ids)]), attention_mask=mask,
                       position_ids=torch.tensor([position]), use_cache=True)
        next_position = (position[-1] + 1) if position else first_position
        while True:
            out.append(int(result.logits[0, -1].argmax()))
            if len(out) == max_new or out[-1] in stop:
                return out
            result = model(input_ids=torch.tensor([[out[-1]]]),
                           position_ids=torch.tensor([[next_position]]),
                           past_key_values=result.past_key_values, use_cache=True)
            next_position += 1


def logprobs_after_join(model, ids: Sequence[int], layout: Layout, tokens: Sequence[int],
                        first_position: int = 0) -> list[float]:
    """The model's log-probability (log-softmax of the raw logits, as
    vLLM's sample logprobs) of each of ``tokens`` continuing ``ids`` laid
    out as ``layout``: each sees everything before it, at the next
    position."""
    import torch

    if not tokens:
        return []
    mask, position = _layout_inputs(ids, layout, first_position)
    start = (position[-1] + 1) if position else first_position
    with torch.no_grad():
        result = model(input_ids=torch.tensor([list(ids)]), attention_mask=mask,
                       position_ids=torch.tensor([position]), use_cache=True)
        logits = [result.logits[0, -1]]
        if len(tokens) > 1:
            rest = model(input_ids=torch.tensor([list(tokens[:-1])]),
                         position_ids=torch.tensor([list(range(start, start + len(tokens) - 1))]),
                         past_key_values=result.past_key_values, use_cache=True)
            logits += list(rest.logits[0])
    return [float(torch.log_softmax(row, -1)[t]) for row, t in zip(logits, tokens)]


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
