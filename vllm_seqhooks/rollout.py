"""Training rows from one generate call with hooks (pure: reads a finished
``RequestOutput`` and its hook trace; no vLLM import).

Both take a ``RequestOutput`` (``LLM.generate``) or an OpenAI completion
response of ``vllm serve`` asked with ``"return_token_ids": true`` (the
``openai`` client's object, or its JSON as a dict).

What an RL trainer needs of a fork/join rollout is which output tokens the
policy sampled (they get loss) and which the engine inserted (headers,
separators, suffixes, failed-child markers: no loss), which branch of the
fork tree sampled each, and the position the model saw it at (after a
splice join a token's position runs behind its index). The hook trace
records, for every join, where the merged tokens start in the parent's
output (``at``) and who gave them (``pieces``: runs of a child's output or
of inserted tokens); this module turns that into rows.

- :func:`training_rows`: one dict per completion (``n`` of them; each of
  ``n`` samples is its own fork/join family with its own trace) with ``prompt_ids``,
  ``response_ids`` (the merged output, as the parent's context holds it),
  ``response_mask`` (1 sampled, 0 inserted), ``position_ids`` (prompt
  included), ``node_ids`` (``""`` the request itself, ``"0"``, ``"0.1"``...
  the child that sampled the token; inserted tokens carry the node whose
  join inserted them) and ``rollout_logprobs`` (when the request asked for
  ``logprobs``: the sampled token's logprob, None for an inserted one).
- :func:`per_call_rows`: ThreadWeaver's agent-loop rows
  (``threadweaver_rl/verl/experimental/agent_loop/single_turn_agent_loop.py``):
  one row per stretch a node sampled without a join in between, with the
  exact tokens it was conditioned on (``context_ids``), what it sampled
  (``response_ids``), ``base_id`` shared by the family, ``is_last`` (the
  root's last row), ``completion_index`` (which of ``n`` samples) and
  ``rollout_logprobs`` (with ``logprobs`` asked: the logprob of each token
  it sampled, children's included, also where a ``"text"`` merge
  re-tokenized them; None without).

A merge that re-tokenizes text at its boundaries (``boundary_tokenization:
"text"``, ThreadWeaver's preset) has no token-by-token owner: its merged
tokens count as inserted in :func:`training_rows` (the children's tokens
get their loss in :func:`per_call_rows`, as in ThreadWeaver's trainer).
"""

from __future__ import annotations

from typing import Any, Optional

from vllm_seqhooks.core.splice_map import SpliceMap, SplicePath
from vllm_seqhooks.core.trace import completion_traces, field_of

#: One output token's origin: (node key, sampled?).
Origin = tuple[str, bool]


def _get(obj: Any, name: str, default: Any = None) -> Any:
    found = field_of(obj, name)
    return default if found is None else found


#: One completion as the rows read it.
Completion = tuple[list[int], list[int], Optional[dict], Any, str]


def _read(output: Any) -> list[Completion]:
    """(prompt ids, response ids, hook trace, each response token's sample
    logprob or None when not asked, base id) of each completion of a
    RequestOutput or an OpenAI (chat) completion response. With ``n`` > 1
    each completion is its own family: its base id is vLLM's id for that
    sample (``"<index>_<request id>"``)."""
    choices = _get(output, "choices")
    completions = list(choices if choices is not None else _get(output, "outputs", ()))
    if choices is not None:
        _check_one_prompt(completions)
    traces = _traces_per_completion(completion_traces(output), len(completions))
    request_id = str(_get(output, "request_id" if choices is None else "id", ""))
    read = []
    for i, comp in enumerate(completions):
        base = request_id if len(completions) == 1 else f"{_get(comp, 'index', i)}_{request_id}"
        trace = traces[i] if i < len(traces) else None
        if choices is None:
            response = list(comp.token_ids)
            read.append((list(output.prompt_token_ids or ()), response, trace,
                         _logprobs_of_rows(response, comp.logprobs), base))
            continue
        response = _get(comp, "token_ids")
        if response is None:
            raise ValueError("the completion has no token ids: ask with \"return_token_ids\": true")
        prompt = _get(comp, "prompt_token_ids", None) or _get(output, "prompt_token_ids", ())
        read.append((list(prompt), list(response), trace, _logprobs_of_choice(comp), base))
    return read


def _check_one_prompt(choices: list[Any]) -> None:
    """An OpenAI response to several prompts carries the hook traces of the
    first prompt's completions only: rows cannot be told apart there."""
    prompts = {tuple(p) for p in (_get(c, "prompt_token_ids") for c in choices) if p is not None}
    if len(prompts) > 1:
        raise ValueError(
            f"the response answers {len(prompts)} different prompts, and vLLM's server "
            "returns the hook traces of the first prompt's completions only: send one "
            "prompt per request to get training rows")


def _traces_per_completion(traces: list[Optional[dict]], count: int) -> list[Optional[dict]]:
    """One trace (or None: that sample never forked) per completion. With
    ``n`` > 1 the engine lists each sample's trace; when no sample forked
    there is no list and no trace at all."""
    if len(traces) == count or count <= 1:
        return traces
    if traces == [None]:
        return [None] * count
    raise ValueError(
        f"{count} completions but {len(traces)} hook trace(s): the per-sample traces of "
        "an n > 1 request were not collected (read the output of vllm_seqhooks.LLM or "
        "of a vllm serve started with hook flags, not of a stock vLLM frontend)")


def _logprobs_of_rows(response: list[int], rows: Any) -> Optional[list[Optional[float]]]:
    """Each token's logprob from vLLM's per-position rows."""
    if rows is None:
        return None
    return [entry[t].logprob if entry and t in entry else None
            for t, entry in zip(response, rows)]


def _logprobs_of_choice(choice: Any) -> Optional[list[Optional[float]]]:
    """Each token's logprob from an OpenAI choice: ``token_logprobs``
    (completions) or ``content[i].logprob`` (chat)."""
    lp = _get(choice, "logprobs")
    if lp is None:
        return None
    values = _get(lp, "token_logprobs")
    if values is None:
        content = _get(lp, "content")
        values = None if content is None else [_get(c, "logprob") for c in content]
    return None if values is None else list(values)


def origins(node: dict[str, Any], output_ids: list[int]) -> list[Origin]:
    """Who gave each of a node's output tokens (``node``: a trace node)."""
    key = node.get("key", "")
    out: list[Origin] = [(key, True)] * len(output_ids)
    appended = node.get("appended_tokens", 0)  # the format's end text
    if appended:
        out[len(out) - appended:] = [(key, False)] * appended
    children = {c["key"]: c for c in node.get("children", ())}
    for join in node.get("joins", ()):
        at, count = join.get("at"), join.get("merged_tokens") or 0
        if at is None or not count:
            continue
        stop = min(at + count, len(output_ids))
        pieces = join.get("pieces")
        if pieces is None:  # re-tokenized text: no token-by-token owner
            out[at:stop] = [(key, False)] * (stop - at)
            continue
        i = at
        for owner, n in pieces:
            if owner is None:
                given = [(key, False)] * n
            else:
                child = children[owner]
                given = origins(child, list(child.get("output_token_ids", ())))[:n]
                given += [(owner, False)] * (n - len(given))
            out[i:i + n] = given[: max(0, stop - i)]
            i += n
    return out[: len(output_ids)]


def splice_map(node: dict[str, Any], inherited: SpliceMap = SpliceMap(),
               prompt_len: Optional[int] = None) -> SpliceMap:
    """A node's positions map (:mod:`vllm_seqhooks.core.splice_map`), from
    its splice joins (children inherit the map their parent had when they
    started)."""
    if prompt_len is None:
        prompt_len = node.get("prompt_tokens", 0)
    current = inherited
    children = {c["key"]: c for c in node.get("children", ())}
    for join in node.get("joins", ()):
        paths = join.get("splice_paths")
        if not paths or join.get("at") is None:
            continue
        context = prompt_len + join["at"]
        laid, at = [], context
        for key, length in zip(join["children"], paths):
            child = children.get(key)
            child_map = splice_map(child, current) if child is not None else SpliceMap()
            laid.append(SplicePath(at, length, child_map))
            at += length
        current = current.after_join(context, laid)
    return current


def training_rows(request_output: Any) -> list[dict[str, Any]]:
    """One row per completion of ``request_output`` (see the module doc)."""
    return [_training_row(*completion) for completion in _read(request_output)]


def _training_row(prompt: list[int], response: list[int], trace: Optional[dict],
                  sample_logprobs: Any, _base: str) -> dict[str, Any]:
    if trace is None:
        given = [("", True)] * len(response)
        positions = list(range(len(prompt) + len(response)))
    else:
        given = origins(trace, response)
        smap = splice_map(trace, prompt_len=len(prompt))
        positions = [i + smap.shift_at(i) for i in range(len(prompt) + len(response))]
    logprobs = None
    if sample_logprobs is not None:  # (an inserted token's row says 0.0: None here)
        logprobs = [lp if sampled else None for lp, (_, sampled) in zip(sample_logprobs, given)]
    return {
        "prompt_ids": prompt,
        "response_ids": response,
        "response_mask": [1 if sampled else 0 for _, sampled in given],
        "position_ids": positions,
        "node_ids": [key for key, _ in given],
        "rollout_logprobs": logprobs,
    }


def per_call_rows(request_output: Any) -> list[dict[str, Any]]:
    """ThreadWeaver-style rows, one per stretch a node sampled (see the
    module doc), in the order a client loop makes its calls: a stretch,
    then the children joined right after it, then the next stretch; with
    ``n`` > 1, the rows of each completion in turn (each its own
    ``base_id``)."""
    return [dict(row, completion_index=i) for i, completion in enumerate(_read(request_output))
            for row in completion_call_rows(*completion)]


def completion_training_row(prompt: list[int], response: list[int], trace: Optional[dict],
                            logprobs: Optional[list] = None) -> dict[str, Any]:
    """:func:`training_rows`' row of one completion given as its parts: the
    prompt's and the output's token ids, its hook trace (None: it never
    forked) and each output token's logprob (None when not asked)."""
    return _training_row(prompt, response, trace, logprobs, "")


def completion_call_rows(prompt: list[int], response: list[int], trace: Optional[dict],
                         logprobs: Optional[list] = None, base: str = "") -> list[dict[str, Any]]:
    """:func:`per_call_rows` of one completion given as its parts (as
    :func:`completion_training_row`)."""
    rows: list[dict[str, Any]] = []

    def walk(node: dict[str, Any], node_prompt: list[int], output: list[int],
             lps: Optional[list]) -> None:
        full = node_prompt + output
        children = {c["key"]: c for c in node.get("children", ())}

        def call(lo: int, hi: int, tail: list[int]) -> None:
            if hi > lo or tail:
                rows.append({"node_id": node.get("key", ""), "base_id": base,
                             "context_ids": node_prompt + output[:lo],
                             "response_ids": output[lo:hi] + tail, "is_last": False,
                             "rollout_logprobs": _stretch(lps, lo, hi, len(tail))})

        def walk_child(child: dict[str, Any]) -> None:
            child_prompt = (full[: child.get("context_tokens", 0)]
                            + list(child.get("prompt_rest_token_ids", ())))
            walk(child, child_prompt, list(child.get("output_token_ids", ())),
                 child.get("output_logprobs") if logprobs is not None else None)

        start = 0
        for join in node.get("joins", ()):
            at = join.get("at")
            if at is None:
                continue
            call(start, at, [])
            for key in join.get("children", ()):
                if key in children:
                    walk_child(children.pop(key))
            start = at + (join.get("merged_tokens") or 0)
        call(start, len(output) - node.get("appended_tokens", 0),
             list(node.get("dropped_token_ids", ())))
        for child in children.values():  # never joined (the output ended first)
            walk_child(child)

    if trace is None:
        rows.append({"node_id": "", "base_id": base, "context_ids": prompt,
                     "response_ids": response, "is_last": False,
                     "rollout_logprobs": logprobs})
    else:
        walk(trace, prompt, response, logprobs)
    root_rows = [r for r in rows if r["node_id"] == ""]
    if root_rows:
        root_rows[-1]["is_last"] = True
    return rows


def _stretch(lps: Optional[list], lo: int, hi: int, tail: int) -> Optional[list]:
    """The logprobs of a node's sampled ``[lo, hi)`` and of the ``tail``
    tokens it wrote after its output's end (they follow in its rows)."""
    if lps is None:
        return None
    got = list(lps[lo:hi]) + list(lps[hi:hi + tail])
    return got + [None] * (hi - lo + tail - len(got))
