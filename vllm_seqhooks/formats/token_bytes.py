"""The bytes each token id stands for, read from a tokenizer (pure, no vLLM).

Tags such as ``</Outlines>`` are several tokens in a real tokenizer, and
byte-level BPE merges them with neighbouring text differently from place to
place (``"x</"``, ``"Out"``, ``"lines"``, ``">\\n"``). Scanning the bytes the
tokens stand for finds a tag whatever the merges. Decoding one id at a time
does not give those bytes (a token may hold half a UTF-8 character, and
decoders drop or add spaces), so the table is built from the vocabulary:

* byte-level BPE (GPT-2, Llama 3, Qwen): each character of a token string is
  one byte through the GPT-2 byte alphabet;
* SentencePiece-style vocabularies: ``"▁"`` is a space, ``<0xNN>`` one byte;
* anything else, and added tokens: the token's decoded text.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

_SPM_SPACE = "\u2581"


@lru_cache(maxsize=1)
def byte_alphabet() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte, inverted."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def _decoder_kind(tokenizer: Any) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    if backend is None and hasattr(tokenizer, "decoder") and hasattr(tokenizer, "get_vocab"):
        backend = tokenizer  # a tokenizers.Tokenizer
    decoder = getattr(backend, "decoder", None)
    text = repr(decoder) if decoder is not None else ""
    if "ByteLevel" in text:
        return "byte_level"
    if "Metaspace" in text or "ByteFallback" in text or "Replace" in text:
        return "metaspace"
    return "text"


def _added_ids(tokenizer: Any) -> set[int]:
    decoder = getattr(tokenizer, "added_tokens_decoder", None)
    if isinstance(decoder, dict):
        return {int(i) for i in decoder}
    get = getattr(tokenizer, "get_added_tokens_decoder", None)
    return {int(i) for i in get()} if callable(get) else set()


def token_bytes_table(tokenizer: Any, size: int | None = None) -> list[bytes]:
    """``table[id]``: the bytes of token ``id``, for ids ``0 .. size-1``
    (default: the tokenizer's length). Ids the tokenizer has no string for
    stand for no bytes."""
    if size is None:
        size = len(tokenizer)
    vocab = tokenizer.get_vocab()
    strings: list[str | None] = [None] * size
    for tok, i in vocab.items():
        if 0 <= i < size:
            strings[i] = tok
    kind = _decoder_kind(tokenizer)
    added = _added_ids(tokenizer)
    alphabet = byte_alphabet()
    table: list[bytes] = []
    for i, tok in enumerate(strings):
        if tok is None:
            table.append(b"")
        elif i in added:
            table.append(tok.encode("utf-8"))
        elif kind == "byte_level" and all(c in alphabet for c in tok):
            table.append(bytes(alphabet[c] for c in tok))
        elif kind == "metaspace" and len(tok) == 6 and tok.startswith("<0x") and tok.endswith(">"):
            table.append(bytes([int(tok[3:5], 16)]))
        elif kind == "metaspace":
            table.append(tok.replace(_SPM_SPACE, " ").encode("utf-8"))
        else:
            table.append(tokenizer.decode([i], skip_special_tokens=False).encode("utf-8"))
    return table
