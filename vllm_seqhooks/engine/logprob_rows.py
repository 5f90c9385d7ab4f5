"""Sample logprobs of hook requests (``SamplingParams.logprobs``).

vLLM computes the logprob rows of every request that asks for them,
children included (their sampling parameters are their parent's). A
parent's own tokens reach the client with their rows as usual; this module
keeps what the client does not get directly:

- each child's rows, aligned with its output (its own joins' merges
  included), until its parent's join takes them;
- the row of a parked parent's last token, which the join gives back (the
  fork tag's last token) or sends after the merge (a held stop token).

A join's merged tokens then carry rows too: a child's token its child's
row, a token the engine inserted (a header, a separator, a suffix, a
failed child's marker, a format's end text) a row of its own token with
logprob 0.0 (vLLM's ``Logprob`` has no "none"; 0.0 leaves
``cumulative_logprob`` the sum of the sampled tokens'). The trace's
``pieces`` say which is which (``vllm_seqhooks.rollout`` gives inserted
tokens ``None``). A joined child's sampled logprobs stay in its tree node
(the trace's ``output_logprobs``; ``rollout.per_call_rows`` reads them).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
from vllm.v1.outputs import LogprobsLists

#: One token's row: (token ids, logprobs, rank of the sampled token); the
#: sampled token first, then the top ones.
Row = tuple[list[int], list[float], int]


def forced_row(token: int) -> Row:
    return [token], [0.0], 1


def rows_of(lists: LogprobsLists, count: int) -> list[Row]:
    ids, lps, ranks = lists.logprob_token_ids, lists.logprobs, lists.sampled_token_ranks
    return [(ids[i].tolist(), lps[i].tolist(), int(ranks[i])) for i in range(min(count, len(ids)))]


def as_lists(rows: Sequence[Row]) -> LogprobsLists:
    """Rows as vLLM's arrays (narrower rows padded with their own sampled
    token, which the frontend's per-position dict absorbs)."""
    width = max(len(r[0]) for r in rows)
    ids = np.array([r[0] + [r[0][0]] * (width - len(r[0])) for r in rows], dtype=np.int64)
    lps = np.array([r[1] + [r[1][0]] * (width - len(r[1])) for r in rows], dtype=np.float32)
    ranks = np.array([r[2] for r in rows], dtype=np.int64)
    return LogprobsLists(ids, lps, ranks, None)


def concat(first: Optional[LogprobsLists], rows: Sequence[Row]) -> LogprobsLists:
    head = rows_of(first, len(first.logprob_token_ids)) if first is not None else []
    return as_lists([*head, *rows])


class LogprobRows:
    def __init__(self) -> None:
        #: Children's rows (their outputs never reach the client), by id.
        self.children: dict[str, list[Row]] = {}
        #: The row a parked parent's output held back, by id.
        self.withheld: dict[str, Row] = {}
        #: Each child's root (its rows go when its family does).
        self.root_of: dict[str, str] = {}

    def keep_children(self, outputs, fj) -> None:
        """Keep the rows of the children's outputs of a step (``fj``: the
        scheduler's ForkJoinState), before they are taken out of it."""
        for eco in outputs.values():
            for out in eco.outputs:
                if out.new_logprobs is not None and out.request_id in fj.children:
                    rid = out.request_id
                    self.capture(rid, fj.tree.root_of(rid), out.new_token_ids, out.new_logprobs)

    def capture(self, rid: str, root: str, new_token_ids: Sequence[int],
                lists: Optional[LogprobsLists]) -> None:
        self.root_of[rid] = root
        rows = self.children.setdefault(rid, [])
        if lists is None:
            rows.extend(forced_row(t) for t in new_token_ids)
        else:
            got = rows_of(lists, len(new_token_ids))
            rows.extend(got + [forced_row(t) for t in new_token_ids[len(got):]])

    def withhold(self, rid: str, lists: Optional[LogprobsLists], index: int) -> Optional[
            LogprobsLists]:
        """Keep row ``index`` (the output's last) of a parked parent's output;
        the rows it still sends."""
        if lists is None or index < 0 or index >= len(lists.logprob_token_ids):
            return lists
        (self.withheld[rid],) = rows_of(lists.slice_request(index, 1), 1)
        return lists.slice_request(0, index) if index else None

    def merge_rows(self, own: Sequence[Row], merged: Sequence[int],
                   pieces: Optional[Sequence[Sequence]], key_to_id: dict[str, str]) -> list[Row]:
        """Rows of a join's ``merged`` tokens: ``own`` for the ones the
        parent had (the fork tag's last token given back), then each
        piece's: a child's rows (``key_to_id`` maps its trace key to its
        id), forced rows for inserted tokens (and for all of a merge
        without pieces, which re-tokenized text)."""
        rows = list(own)
        at = len(rows)
        for key, count in (pieces or [[None, len(merged) - at]]):
            tokens = merged[at:at + count]
            if key is None:
                rows += [forced_row(t) for t in tokens]
            else:
                theirs = self.children.get(key_to_id.get(key, ""), [])
                n = 0  # its rows, as long as they are the rows of these tokens
                while n < len(tokens) and n < len(theirs) and theirs[n][0][0] == tokens[n]:
                    n += 1
                rows += theirs[:n] + [forced_row(t) for t in tokens[n:]]
            at += count
        return rows

    def join_rows(self, rid: str, start: int, merged: Sequence[int], record,
                  fj) -> list[Row]:
        """The rows of request ``rid``'s join ``record`` (``merged``: what
        it gets from its output's index ``start`` on; ``fj``: the
        scheduler's ForkJoinState). A child's own rows become its rows up
        to ``start`` and these; the joined children's rows go, their
        sampled logprobs into their tree nodes (the trace's
        ``output_logprobs``: ``rollout.per_call_rows``)."""
        kept = record.at - start if record.at is not None else 0
        mine = self.children.get(rid, []) if rid in fj.children else None
        if mine is not None:
            own = mine[start:start + kept]
        else:
            row = self.withheld.get(rid)
            own = [self.withheld.pop(rid)] if kept and row is not None and (
                row[0][0] == merged[0]) else []
        own += [forced_row(t) for t in merged[len(own):kept]]
        tree = fj.tree
        nodes = {c: tree.get(c) for c in record.children}
        key_to_id = {n.key: c for c, n in nodes.items() if n is not None}
        out = self.merge_rows(own, merged, record.pieces, key_to_id)
        for child, node in nodes.items():
            if node is not None:
                node.output_logprobs = [r[1][0] for r in self.children.get(child, ())]
        self.forget(record.children)
        if mine is not None:
            self.children[rid] = mine[:start] + out
        return out

    def forget(self, ids) -> None:
        for rid in ids:
            self.children.pop(rid, None)
            self.withheld.pop(rid, None)
            self.root_of.pop(rid, None)

    def forget_family(self, root: str) -> None:
        """A root request is freed: its rows and its descendants'."""
        self.withheld.pop(root, None)
        if self.root_of:
            self.forget([rid for rid, r in self.root_of.items() if r == root])

    def sizes(self) -> dict[str, int]:
        return {"logprob_rows": len(self.children) + len(self.withheld) + len(self.root_of)}
