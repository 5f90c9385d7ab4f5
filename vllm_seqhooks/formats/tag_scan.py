"""`TagScanner`: text tags found in a stream of token ids (pure, no vLLM).

A tag is found at the token that holds its last byte, whatever the tokens
its bytes are split into or merged with (see :mod:`vllm_seqhooks.formats.token_bytes`).
The scanner keeps the last ``len(longest tag) - 1`` bytes of the stream and
which token each came from, so a step costs one ``bytes.find`` per tag and
token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


#: (id of a table, last bytes) -> (the table, ids holding one of them).
_ENDING_IDS: dict[tuple[int, bytes], tuple[Sequence[bytes], frozenset[int]]] = {}


@dataclass(frozen=True)
class TagHit:
    #: Index of the tag in the scanner's ``tags``.
    tag: int
    #: Position of the token holding the tag's first byte, and its last byte.
    first_pos: int
    pos: int


class TagScanner:
    """Finds ``tags`` (bytes) in token ids, with ``table[id]`` the bytes of
    each id (ids past the table stand for no bytes)."""

    __slots__ = ("table", "tags", "keep", "tail", "owners", "lasts")

    def __init__(self, table: Sequence[bytes], tags: Sequence[bytes]) -> None:
        if not tags or any(not t for t in tags):
            raise ValueError("tags must be non-empty byte strings")
        self.table = table
        self.tags = tuple(tags)
        self.keep = max(len(t) for t in self.tags) - 1
        self.tail = b""
        #: The token position of each byte of ``tail``.
        self.owners: list[int] = []
        #: The bytes a tag can end with.
        self.lasts = bytes(sorted({t[-1] for t in self.tags}))

    def copy(self) -> "TagScanner":
        twin = TagScanner.__new__(TagScanner)
        twin.table, twin.tags, twin.keep = self.table, self.tags, self.keep
        twin.tail, twin.owners, twin.lasts = self.tail, list(self.owners), self.lasts
        return twin

    def ending_ids(self) -> frozenset[int]:
        """The ids whose bytes hold a byte a tag ends with: a tag is found
        only at such a token (the one holding its last byte), so tokens
        without one may be fed later, in order, before the next such token,
        with the same hits (cached per table and tags' last bytes)."""
        key = (id(self.table), self.lasts)
        found = _ENDING_IDS.get(key)
        if found is None or found[0] is not self.table:
            ids = frozenset(i for i, data in enumerate(self.table)
                            if any(b in self.lasts for b in data))
            found = _ENDING_IDS[key] = (self.table, ids)
        return found[1]

    def bytes_of(self, token: int) -> bytes:
        return self.table[token] if 0 <= token < len(self.table) else b""

    def feed(self, tokens: Sequence[int], start_pos: int) -> list[TagHit]:
        """Tags completed by ``tokens`` (the first at ``start_pos``), in the
        order their last bytes arrive."""
        hits: list[TagHit] = []
        for offset, tok in enumerate(tokens):
            data = self.bytes_of(tok)
            if not data:
                continue
            pos = start_pos + offset
            buf = self.tail + data
            owners = self.owners + [pos] * len(data)
            base = len(self.tail)
            found: list[tuple[int, TagHit]] = []
            for index, tag in enumerate(self.tags):
                at = buf.find(tag, max(0, base - len(tag) + 1))
                while at != -1:
                    found.append((at + len(tag), TagHit(index, owners[at], pos)))
                    at = buf.find(tag, at + 1)
            if found:
                found.sort(key=lambda item: item[0])
                hits.extend(hit for _, hit in found)
            if self.keep:
                self.tail = buf[-self.keep:]
                self.owners = owners[-self.keep:]
        return hits
