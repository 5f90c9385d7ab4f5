"""verl's rows from one engine answer (pure: no verl, no vLLM import).

verl's vLLM server answers a token-in request with a ``TokenOutput``: the
output's ``token_ids``, ``log_probs`` (with logprobs asked) and
``extra_fields["kv_transfer_params"]``, where a hook engine puts the
request's hook trace. :func:`agent_loop_fields` turns that into the fields
of verl's ``AgentLoopOutput``:

- the merged row: ``prompt_ids``, ``response_ids`` (what the parent's
  context holds), ``response_mask`` (1: sampled by the policy, the parent or
  a child; 0: inserted by the engine, :func:`vllm_seqhooks.rollout.training_rows`),
  ``response_logprobs`` (0.0 for an inserted token: it has no loss);
- the expanded rows ThreadWeaver trains on, in the order its client loop
  makes its calls (``expanded_prompt_ids``, ``expanded_response_ids``,
  ``expanded_response_mask``, and ``expanded_response_logprobs`` with
  logprobs asked), each cut as ThreadWeaver's agent loop cuts them
  (``threadweaver_rl/verl/experimental/agent_loop/single_turn_agent_loop.py``,
  ``SingleTurnAgentLoop.run``: to ``response_length`` and to what fits
  ``max_total_tokens`` after its prompt).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from vllm_seqhooks.core.trace import completion_traces
from vllm_seqhooks.rollout import completion_call_rows, completion_training_row

#: The per-call rows' names (ThreadWeaver's ``AgentLoopOutput`` fields).
EXPANDED_FIELDS = ("expanded_prompt_ids", "expanded_response_ids", "expanded_response_mask")
EXPANDED_LOGPROBS = "expanded_response_logprobs"


def hook_trace(extra_fields: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """The hook trace in a ``TokenOutput``'s ``extra_fields`` (None: the
    request never forked, or the server has no hooks)."""
    return completion_traces(extra_fields or {})[0]


def _allowed(response_length: int, max_total_tokens: Optional[int], prompt_len: int) -> int:
    """How many response tokens a row keeps: ``response_length``, and what
    fits ``max_total_tokens`` after its prompt."""
    if max_total_tokens is None:
        return response_length
    return max(0, min(response_length, max_total_tokens - prompt_len))


def _floats(logprobs: Sequence[Optional[float]]) -> list[float]:
    """Logprobs as verl's tensors take them: 0.0 where there is none (an
    inserted token, or one whose logprob was not kept)."""
    return [0.0 if lp is None else float(lp) for lp in logprobs]


def agent_loop_fields(prompt_ids: Sequence[int], token_ids: Sequence[int],
                      log_probs: Optional[Sequence[float]], extra_fields: Optional[dict[str, Any]],
                      *, response_length: int,
                      max_total_tokens: Optional[int] = None) -> dict[str, Any]:
    """``AgentLoopOutput`` fields (see the module doc) for one answer;
    ``extra_fields`` holds the expanded rows."""
    prompt, response = list(prompt_ids), list(token_ids)
    trace = hook_trace(extra_fields)
    lps = list(log_probs) if log_probs else None
    row = completion_training_row(prompt, response, trace, lps)
    allowed = _allowed(response_length, max_total_tokens, len(prompt))
    logprobs = row["rollout_logprobs"]
    fields: dict[str, Any] = {
        "prompt_ids": prompt,
        "response_ids": response[:allowed],
        "response_mask": row["response_mask"][:allowed],
        "response_logprobs": None if logprobs is None else _floats(logprobs[:allowed]),
    }
    fields["extra_fields"] = expanded_rows(prompt, response, trace, lps,
                                           response_length=response_length,
                                           max_total_tokens=max_total_tokens)
    return fields


def expanded_rows(prompt: list[int], response: list[int], trace: Optional[dict[str, Any]],
                  log_probs: Optional[list], *, response_length: int,
                  max_total_tokens: Optional[int]) -> dict[str, Any]:
    """ThreadWeaver's ``expanded_*`` lists: one entry per call its client
    loop would have made, cut as its agent loop cuts them."""
    out: dict[str, Any] = {name: [] for name in EXPANDED_FIELDS}
    if log_probs is not None:
        out[EXPANDED_LOGPROBS] = []
    for call in completion_call_rows(prompt, response, trace, log_probs):
        context = call["context_ids"]
        sampled = call["response_ids"][: _allowed(response_length, max_total_tokens, len(context))]
        out["expanded_prompt_ids"].append(list(context))
        out["expanded_response_ids"].append(list(sampled))
        out["expanded_response_mask"].append([1] * len(sampled))
        if log_probs is not None:
            lps = list(call["rollout_logprobs"] or [])[: len(sampled)]
            out[EXPANDED_LOGPROBS].append(_floats(lps + [None] * (len(sampled) - len(lps))))
    return out
