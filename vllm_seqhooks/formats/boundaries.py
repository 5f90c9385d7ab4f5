"""The tokens a tag format's engine writes at its boundaries (pure, no vLLM
import): a child's prompt after the fork tag, and what a parent resumes
with after the join.

A tag ends where its last byte ends, as a stop string does: bytes that the
token holding the tag's last byte carries past it (``>\\n`` closing
``</Outlines>`` with Qwen's or Llama 3's tokenizer, ``><`` closing
``</Thread>`` before the next ``<Thread>``) belong neither to the parent's
text, nor to a child's prompt, nor to the merge. Then the text the engine
adds is tokenized in one of two ways (:data:`TOKENIZATIONS`,
``boundary_tokenization``):

``"text"``
    Every boundary is tokenized with the text around it as one string: the
    parent's text from the fork tag's first token on, the lead and header
    (a child's prompt), or the lead, headers, children's texts, separators
    and suffix (the merge). That is what a text-level orchestrator sends
    (ThreadWeaver's SFT ``branching_generate``) and what models trained on
    whole texts have seen.
``"ids"``
    The parent's tokens stay as sampled through the tag (a last token that
    carries more is replaced by the encoding of its bytes through the tag)
    and each piece the engine adds is encoded alone and appended, as
    id-level loops do (Multiverse's engine, ThreadWeaver's RL controller);
    a child's tokens are cut at its end tag the same way.

A parent parked at a fork holds its tag's last token back from its client;
:func:`join_tokens` gives the tokens that follow the tokens it keeps
(everything before that token), so the client and the KV cache see one
sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from vllm_seqhooks.core.join_plan import merged_layout
from vllm_seqhooks.formats.tag_format import TagFormat
from vllm_seqhooks.formats.text_codec import TextCodec

TOKENIZATIONS = ("text", "ids")


@dataclass(frozen=True)
class ChildText:
    """What one child gives a join: its label and its output, as ids
    (``"ids"``) and as bytes cut at its end tag (``"text"``); ``None``
    output: it failed (the failed-child marker stands in)."""

    label: str
    tokens: Sequence[int] | None
    text: bytes | None


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def cut_after(data: bytes, tag: bytes, *, last: bool = False) -> bytes:
    """``data`` through the end of its first (``last``: last) ``tag``;
    ``data`` itself when the tag is not in it."""
    at = data.rfind(tag) if last else data.find(tag)
    return data if at < 0 else data[: at + len(tag)]


def through_tag(codec: TextCodec, tokens: Sequence[int], tag: str) -> list[int]:
    """``tokens``, whose last token holds the last byte of ``tag``, ending at
    that byte: the last token itself when the tag ends with it, else the
    encoding of its bytes through the tag."""
    if not tokens:
        return []
    recent = list(tokens[-len(tag.encode()):])
    data = codec.text(recent)
    extra = len(data) - len(cut_after(data, tag.encode(), last=True))
    if extra <= 0:
        return list(tokens)
    last = codec.text(tokens[-1:])
    return [*tokens[:-1], *codec.encode(_decode(last[: len(last) - extra]))]


def fork_text(codec: TextCodec, context: Sequence[int], tag_start: int,
              tag: str) -> tuple[int, bytes]:
    """Where the re-tokenized text begins (``tag_start``, or an earlier token
    when that one starts inside a UTF-8 character) and its bytes, through the
    fork tag's last byte."""
    start = max(0, min(tag_start, len(context)))
    data = codec.text(context[start:])
    while start > 0 and data and 0x80 <= data[0] < 0xC0:
        start -= 1
        data = codec.text(context[start:])
    return start, cut_after(data, tag.encode())


def child_prompt(codec: TextCodec, fmt: TagFormat, context: Sequence[int], tag_start: int,
                 label: str) -> tuple[list[int], int]:
    """Child ``label``'s prompt after a fork whose tag's last byte is in the
    last token of ``context`` (its first in token ``tag_start``), and how
    many tokens of ``context`` it starts with."""
    start_text = fmt.child_start(label)
    if fmt.boundary_tokenization == "ids":
        through = through_tag(codec, context, fmt.fork_tag)
        kept = len(context) if through == list(context) else len(context) - 1
        return [*through, *codec.encode(start_text)], kept
    start, tail = fork_text(codec, context, tag_start, fmt.fork_tag)
    return [*context[:start], *codec.encode(_decode(tail) + start_text)], start


def child_tokens(codec: TextCodec, fmt: TagFormat, output: Sequence[int], *,
                 ended_by_tag: bool) -> list[int]:
    """A finished child's tokens for an ``"ids"`` merge: its ``output`` (its
    EOS already dropped), cut at its end tag when it stopped there."""
    if ended_by_tag and fmt.child_end_tag:
        return through_tag(codec, output, fmt.child_end_tag)
    return list(output)


def child_output(codec: TextCodec, fmt: TagFormat, output: Sequence[int], *,
                 ended_by_tag: bool) -> tuple[list[int], bytes | None]:
    """What a finished child gives a join, from its ``output`` (its EOS
    already dropped): cut at its end tag when it stopped there, else followed
    by the format's end text; as ids (:func:`child_tokens` for ``"ids"``) and,
    for a ``"text"`` merge, as text (:func:`child_text`; None for ``"ids"``)."""
    closing = "" if ended_by_tag or not fmt.child_end_tag else fmt.eos_text
    tail = list(codec.encode(closing))
    if fmt.boundary_tokenization == "text":
        text = child_text(codec, fmt, output, ended_by_tag=ended_by_tag, closing=closing)
        return [*output, *tail], text
    return [*child_tokens(codec, fmt, output, ended_by_tag=ended_by_tag), *tail], None


def child_text(codec: TextCodec, fmt: TagFormat, output: Sequence[int], *,
               ended_by_tag: bool, closing: str = "") -> bytes:
    """A finished child's text for a ``"text"`` merge: its ``output`` (its
    EOS already dropped) cut at its end tag when it stopped there, else
    followed by ``closing`` (the format's end text)."""
    data = codec.text(output)
    if ended_by_tag and fmt.child_end_tag:
        return cut_after(data, fmt.child_end_tag.encode(), last=True)
    return data + closing.encode()


def merge_text(fmt: TagFormat, children: Sequence[ChildText], separator: bytes,
               failed: bytes, suffix: str) -> bytes:
    """The text a join adds after the fork tag: the lead and the first
    child's header and text, ``separator``, header and text of each other
    child, then ``suffix`` (a failed child's text is ``failed``)."""
    parts: list[bytes] = []
    for i, child in enumerate(children):
        parts.append(separator if i else fmt.header_lead.encode())
        parts.append(fmt.header(child.label).encode())
        parts.append(child.text if child.text is not None else failed)
    parts.append(suffix.encode())
    return b"".join(parts)


def merge_tokens(codec: TextCodec, fmt: TagFormat, context: Sequence[int], tag_start: int,
                 added: bytes) -> list[int]:
    """``"text"``: the tokens that follow ``context[:-1]`` (everything before
    the fork tag's last token) once the join ``added`` its text after the
    tag: the text from ``tag_start`` on, cut at the tag, and ``added``,
    tokenized as one string. The tokens before the tag's last token were
    sent to the client already: when that tokenization does not start with
    them, it is taken from after their bytes instead (same text)."""
    pos = len(context) - 1
    start, tail = fork_text(codec, context, tag_start, fmt.fork_tag)
    fresh = codec.encode(_decode(tail + added))
    kept = tuple(context[start:pos])
    if tuple(fresh[: len(kept)]) == kept:
        return list(fresh[len(kept):])
    return list(codec.encode(_decode(tail[len(codec.text(kept)):] + added)))



def join_tokens(codec: TextCodec, fmt: TagFormat, context: Sequence[int], tag_start: int,
                children: Sequence[ChildText], separator: Sequence[int], suffix: str,
                failed: Sequence[int] = ()) -> list[int]:
    """The tokens that follow ``context[:-1]`` (``context`` ends with the
    fork tag's last token) after a join of ``children``: ``"ids"``: that
    token, then each piece encoded alone
    (:func:`~vllm_seqhooks.core.join_plan.merged_layout`); ``"text"``:
    :func:`merge_tokens` of :func:`merge_text`. ``failed``: the failed-child
    marker's ids."""
    if fmt.boundary_tokenization == "ids":
        outputs = [list(c.tokens) if c.tokens is not None else list(failed) for c in children]
        tail = list(context[-len(fmt.fork_tag.encode()):])
        through = through_tag(codec, tail, fmt.fork_tag)
        return [*through[len(tail) - 1:], *merged_layout(
            [codec.encode(fmt.child_start(c.label)) for c in children],
            [codec.encode(fmt.header(c.label)) for c in children],
            outputs, separator, codec.encode(suffix))]
    added = merge_text(fmt, children, codec.text(separator), codec.text(failed), suffix)
    return merge_tokens(codec, fmt, context, tag_start, added)
