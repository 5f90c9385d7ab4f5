"""Decisions around a fork and a join (pure, no vLLM import): a promise
child's prompt, a child's budget, what a finished child gives its parent,
the merged layout, how much of a merge fits, whether the parent resumes, and
whether it resumes through the prefix cache."""

from __future__ import annotations

from typing import Any, Optional, Sequence


def promise_prompt_len(hooks: Any, start: int, end: int, context_end: int) -> int:
    """The prompt length of a promise's child (payload ``[start, end)``)."""
    if hooks.child_context == "fork":
        return context_end
    return (len(hooks.child_prompt_prefix_token_ids or ()) + (end - start)
            + len(hooks.child_prompt_suffix_token_ids or ()))


def promise_prompt(hooks: Any, tokens: Sequence[int], start: int, end: int,
                   context_end: int) -> list[int]:
    """A promise's child prompt: the parent's ``tokens`` through
    ``context_end`` (fork context), or the payload ``tokens[start:end]``
    inside the template (payload context)."""
    if hooks.child_context == "fork":
        return list(tokens[:context_end])
    return [*(hooks.child_prompt_prefix_token_ids or ()), *tokens[start:end],
            *(hooks.child_prompt_suffix_token_ids or ())]


def child_budget(child_max_tokens: int | None, parent_max_tokens: int, parent_sampled: int,
                 room: int) -> int:
    """A child's ``max_tokens``: ``child_max_tokens``, or what its parent had
    left to sample (``parent_sampled``: tokens it had sampled when the child
    was spawned), within ``room`` (what ``max_model_len`` leaves)."""
    budget = child_max_tokens
    if budget is None:
        budget = max(1, parent_max_tokens - parent_sampled)
    return min(int(budget), room)


def contribution(tokens: Sequence[int], prompt_len: int, stop_pos: int | None,
                 merged: Sequence[int] = (), closing: Sequence[int] = ()) -> list[int]:
    """What a finished request gives its parent: ``tokens`` after its
    original prompt without the stop token at ``stop_pos`` (EOS / stop
    token), then ``merged`` (its own children's, when it finished at a join),
    then ``closing`` (a tag format's end text for a child that did not end at
    its end tag)."""
    out = list(tokens[prompt_len:])
    if stop_pos is not None and 0 <= stop_pos - prompt_len < len(out):
        del out[stop_pos - prompt_len]
    out.extend(merged)
    out.extend(closing)
    return out


def fit_merge(merged: list[int], room: int) -> tuple[list[int], bool]:
    """The merge cut to ``room`` tokens (what ``max_model_len`` leaves), and
    whether it was cut."""
    if len(merged) > room:
        return merged[: max(room, 0)], True
    return merged, False


def resumes(*, truncated: bool, merged: int, room: int, remaining: int,
            family_stops: bool) -> bool:
    """Whether a joined parent samples again (else it finishes, ``length``):
    the merge fitted with room to spare, it has tokens left to sample, and
    its family's budget or deadline does not stop it."""
    return not (truncated or merged >= room or remaining <= 0 or family_stops)


def first_child_covers(shared_tokens: int, child_tokens: int, parent_computed: int,
                       block_size: int) -> bool:
    """A tag format's merge starts like the first child's own sequence (the
    parent's context, the child's start, its output): whether the KV blocks
    that child filled with the ``shared_tokens`` its sequence
    (``child_tokens``: its prompt and what it sampled, the last never
    computed) shares with the parent's resumed one go past what the parent
    computed, so that resuming through the prefix cache reuses them."""
    shared = min(shared_tokens, child_tokens - 1)
    return shared // block_size * block_size > parent_computed


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share (compared a chunk at a
    time: a child's prompt shares thousands of tokens with its parent)."""
    n = min(len(a), len(b))
    start = 0
    while start < n:
        stop = min(start + _CHUNK, n)
        if list(a[start:stop]) != list(b[start:stop]):
            break
        start = stop
    for i in range(start, n):
        if a[i] != b[i]:
            return i
    return n


_CHUNK = 256


#: Who gave a run of merged tokens: a child (its key in the request tree, its
#: output's tokens in order) or the engine (None: lead, header, separator,
#: suffix, a failed child's marker), and how many.
Piece = tuple[Optional[str], int]


def layout_pieces(start: int, headers: Sequence[int], outputs: Sequence[int],
                  owners: Sequence[Optional[str]], separator: int = 0,
                  suffix: int = 0) -> list[Piece]:
    """The runs of :func:`merged_layout` by who gave them, from the lengths
    of its parts: ``start`` (the first child's start), ``headers`` (of the
    other children; index 0 unused), ``outputs`` and their ``owners``
    (None: a failed child's marker)."""
    pieces: list[Piece] = []
    for i, (n, owner) in enumerate(zip(outputs, owners)):
        pieces.append((None, (separator + headers[i]) if i else start))
        pieces.append((owner, n))
    pieces.append((None, suffix))
    return cut_pieces(pieces, 0, sum(n for _, n in pieces))


def cut_pieces(pieces: Sequence[Piece], start: int, stop: int) -> list[Piece]:
    """The runs of tokens ``start`` .. ``stop - 1`` of ``pieces``' tokens,
    empty runs dropped and neighbours of one owner made one."""
    out: list[Piece] = []
    at = 0
    for owner, n in pieces:
        lo, hi = max(at, start), min(at + n, stop)
        at += n
        if hi <= lo:
            continue
        if out and out[-1][0] == owner and owner is None:
            out[-1] = (None, out[-1][1] + hi - lo)
        else:
            out.append((owner, hi - lo))
    return out


def merged_layout(starts: Sequence[Sequence[int]], headers: Sequence[Sequence[int]],
                  outputs: Sequence[Sequence[int]], separator: Sequence[int] = (),
                  suffix: Sequence[int] = ()) -> list[int]:
    """What a parent resumes with: the first child's start (lead and header:
    the tokens its prompt ends with) and output, then for each other child
    ``separator``, its header and output, then ``suffix``. ``starts`` and
    ``headers`` hold one entry per child (empty for the promise protocol)."""
    out: list[int] = []
    for i, output in enumerate(outputs):
        if i:
            out.extend(separator)
            out.extend(headers[i])
        else:
            out.extend(starts[0])
        out.extend(output)
    out.extend(suffix)
    return out
