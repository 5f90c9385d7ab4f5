"""`TextCodec`: a tokenizer as the format code needs it (pure, no vLLM
import): the bytes of each token id and ``encode(text) -> ids``."""

from __future__ import annotations

from typing import Callable, Sequence


class TextCodec:
    """A tokenizer as the format code needs it: the bytes of each token id
    and ``encode(text) -> ids`` (cached; no special tokens added)."""

    def __init__(self, table: Sequence[bytes] | Callable[[], Sequence[bytes]],
                 encode: Callable[[str], Sequence[int]]) -> None:
        #: The table, or what builds it on first use.
        self._table = table
        self._encode = encode
        self._cache: dict[str, tuple[int, ...]] = {}

    @classmethod
    def from_tokenizer(cls, tokenizer, size: int | None = None) -> "TextCodec":
        """From a Hugging Face tokenizer (``size``: ids to cover, e.g. the
        model's padded vocabulary); the byte table is read on first use."""
        from vllm_seqhooks.formats.token_bytes import token_bytes_table

        return cls(lambda: token_bytes_table(tokenizer, size),
                   lambda text: tokenizer.encode(text, add_special_tokens=False))

    @property
    def table(self) -> Sequence[bytes]:
        if callable(self._table):
            self._table = self._table()
        return self._table

    def encode(self, text: str) -> tuple[int, ...]:
        ids = self._cache.get(text)
        if ids is None:
            ids = tuple(int(t) for t in self._encode(text)) if text else ()
            if len(self._cache) < 4096:
                self._cache[text] = ids
        return ids

    def text(self, ids: Sequence[int]) -> bytes:
        table = self.table
        return b"".join(table[t] for t in ids if 0 <= t < len(table))
