"""What a child takes of its parent's sampling parameters, field by field
(pure: names vLLM's ``SamplingParams`` fields, imports no vLLM).

Every field of the supported releases' ``SamplingParams`` has a row, decided
on purpose (a field a new release adds has none: the engine's start-up check
and ``tests/test_child_params.py`` name it). docs/lifecycle.md's table is
this one. Rules:

* ``INHERIT``: the child samples with the parent's value;
* ``OWN``: the engine sets the child's own value (``n``, budget, seed,
  ``extra_args``);
* ``CLEAR``: the child gets the field's default, given in :data:`CLEARED`;
* ``FRONTEND``: read only by vLLM's frontend for the request's client
  output; a child has none (its tokens are merged as ids), so the value is
  kept and never read.
"""

from __future__ import annotations

INHERIT = "inherit"
OWN = "own"
CLEAR = "clear"
FRONTEND = "frontend"

#: field -> (rule, why)
CHILD_PARAMS: dict[str, tuple[str, str]] = {
    "n": (OWN, "1: each child is one sequence (each of a request's n samples is its own family)"),
    "max_tokens": (OWN, "the child's budget: child_max_tokens, or what the parent has left"),
    "seed": (OWN, "derived from a seeded parent's seed and the child's key; unseeded stays unseeded"),
    "extra_args": (OWN, "a copy of the parent's, with the child's key for the hooks"),
    "min_tokens": (CLEAR, "counts what the parent samples itself; a child ends when it ends"),
    "structured_outputs": (CLEAR, "the parent's grammar constrains the parent's text (merged "
                           "tokens fed to it at each join); a child's sub-task is not that text"),
    "thinking_token_budget": (CLEAR, "the parent's reasoning budget; a child has its own max_tokens"),
    "prompt_logprobs": (CLEAR, "refused with hooks at admission"),
    "prompt_logprob_token_ids": (CLEAR, "goes with prompt_logprobs"),
    "prompt_logprob_start": (CLEAR, "goes with prompt_logprobs"),
    "temperature": (INHERIT, "the family samples alike"),
    "top_p": (INHERIT, "the family samples alike"),
    "top_k": (INHERIT, "the family samples alike"),
    "min_p": (INHERIT, "the family samples alike"),
    "presence_penalty": (INHERIT, "over the child's own output tokens"),
    "frequency_penalty": (INHERIT, "over the child's own output tokens"),
    "repetition_penalty": (INHERIT, "over the child's prompt and output tokens"),
    "repetition_detection": (INHERIT, "over the child's own output tokens"),
    "watermarking": (INHERIT, "every token the family samples is watermarked alike"),
    "_watermarking_skipped": (INHERIT, "goes with watermarking"),
    "logit_bias": (INHERIT, "vocabulary controls hold for every token the family samples"),
    "allowed_token_ids": (INHERIT, "vocabulary controls hold for every token the family samples"),
    "bad_words": (INHERIT, "vocabulary controls hold for every token the family samples"),
    "_bad_words_token_ids": (INHERIT, "goes with bad_words"),
    "stop_token_ids": (INHERIT, "a stop token ends a child as it ends its parent"),
    "_all_stop_token_ids": (INHERIT, "goes with stop_token_ids"),
    "_eos_token_id": (INHERIT, "the model's EOS ends a child"),
    "ignore_eos": (INHERIT, "a child then runs to its budget, as its parent does"),
    "logprobs": (INHERIT, "a child's tokens carry their logprobs into the parent's output"),
    "logprob_token_ids": (INHERIT, "goes with logprobs"),
    "flat_logprobs": (INHERIT, "goes with logprobs"),
    "skip_reading_prefix_cache": (INHERIT, "the family's cache policy"),
    "routed_experts_prompt_start": (INHERIT, "the family's expert-routing capture"),
    "trace_decode_token_ids": (INHERIT, "the family's decode tracing"),
    "stop": (FRONTEND, "stop strings are matched by vLLM's detokenizer on the parent's "
             "text, merged tokens included; a child's text is never detokenized"),
    "include_stop_str_in_output": (FRONTEND, "goes with stop"),
    "output_text_buffer_length": (FRONTEND, "goes with stop"),
    "detokenize": (FRONTEND, "a child's tokens are merged as ids"),
    "skip_special_tokens": (FRONTEND, "a child's tokens are merged as ids"),
    "spaces_between_special_tokens": (FRONTEND, "a child's tokens are merged as ids"),
    "output_kind": (FRONTEND, "a child sends no output to a client"),
    "stream_interval": (FRONTEND, "a child sends no output to a client"),
    "skip_clone": (FRONTEND, "the frontend's copy of the caller's parameters"),
}

#: The value a ``CLEAR`` field takes in a child.
CLEARED: dict[str, object] = {
    "min_tokens": 0,
    "structured_outputs": None,
    "thinking_token_budget": None,
    "prompt_logprobs": None,
    "prompt_logprob_token_ids": None,
    "prompt_logprob_start": None,
}


def unruled(fields) -> list[str]:
    """The ``SamplingParams`` fields with no row (a new vLLM release's)."""
    return [name for name in fields if name not in CHILD_PARAMS]


def cleared_in(fields) -> dict[str, object]:
    """The ``CLEAR`` fields among ``fields`` and the values a child takes."""
    names = set(fields)
    return {name: value for name, value in CLEARED.items() if name in names}
