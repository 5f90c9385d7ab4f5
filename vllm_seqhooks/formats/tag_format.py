"""Tag formats: fork/join written as text tags (pure, no vLLM import).

The published parallel-reasoning models (ThreadWeaver, Multiverse, NPR,
Parallel-R1) fork at a text tag and join implicitly: the parent stops at the
tag, one child runs per outline item (or a fixed number of children), each
child starts from the parent's context plus a header and ends at its own end
tag, and the parent resumes once they all ended, with every header and child
output appended, then a suffix. :class:`TagFormat` is that description;
:class:`~vllm_seqhooks.formats.tag_format_scanner.TagFormatScanner` reads a
request's sampled tokens for it, and
:mod:`~vllm_seqhooks.formats.boundaries` writes a child's prompt and a
parent's merge. Text the engine adds (headers, the end tag after EOS, the suffix) is
encoded by :class:`~vllm_seqhooks.formats.text_codec.TextCodec`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Replaced by a child's label in ``child_header``.
LABEL_PLACEHOLDER = "{n}"


class TagFormatError(ValueError):
    """A tag-format setting is invalid. The message names the field."""


@dataclass(frozen=True)
class TagFormat:
    """A fork/join format written in text tags (see the module docstring)."""

    #: The tag at which the parent forks and parks (e.g. ``"</Outlines>"``).
    fork_tag: str
    #: One child per ``<outline_tag> N:`` item written since the last fork...
    outline_tag: str | None = None
    #: ... or this many children at each fork.
    fork_count: int | None = None
    #: Appended to the parent's context to start child ``{n}``, after
    #: ``header_lead``; in the merge, the lead comes once, before the first.
    child_header: str = ""
    header_lead: str = ""
    #: A child stops after writing this tag (kept in its output).
    child_end_tag: str | None = None
    #: Appended to a child's output when it ends otherwise (EOS, length).
    child_eos_text: str | None = None
    #: Appended after the children's outputs when the parent resumes.
    merge_suffix: str = ""
    #: A fork with fewer tokens than this left to sample spawns nothing.
    fork_min_tokens: int | None = None
    #: How the text the engine adds meets the text around it: ``"text"``
    #: (tokenized as one string) or ``"ids"`` (each piece encoded alone and
    #: appended); see :mod:`vllm_seqhooks.formats.boundaries`.
    boundary_tokenization: str = "text"
    #: When a child ended without its end tag (EOS, out of tokens): the
    #: parent's merge ends with this text instead of ``merge_suffix`` and the
    #: parent finishes there. None: the parent goes on.
    unclosed_child_stop_text: str | None = None

    def __post_init__(self) -> None:
        for name in ("fork_tag", "outline_tag", "child_end_tag"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise TagFormatError(f"{name} must be a non-empty string, got {value!r}")
        for name in ("child_header", "header_lead", "merge_suffix"):
            if not isinstance(getattr(self, name), str):
                raise TagFormatError(f"{name} must be a string, got {getattr(self, name)!r}")
        for name in ("child_eos_text", "unclosed_child_stop_text"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise TagFormatError(f"{name} must be a string, got {value!r}")
        if (self.outline_tag is None) == (self.fork_count is None):
            raise TagFormatError(
                "a fork_tag format needs exactly one of outline_tag (one child per "
                "outline item) and fork_count (a fixed number of children)")
        for name in ("fork_count", "fork_min_tokens"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise TagFormatError(f"{name} must be an integer >= 1, got {value!r}")
        if self.boundary_tokenization not in ("text", "ids"):
            raise TagFormatError("boundary_tokenization must be 'text' or 'ids', "
                                 f"got {self.boundary_tokenization!r}")
        if self.child_header.count(LABEL_PLACEHOLDER) > 1:
            raise TagFormatError(
                f"child_header may hold {LABEL_PLACEHOLDER} once, got {self.child_header!r}")

    @property
    def texts(self) -> dict[str, str]:
        """The format's text fields that are set, by name."""
        out = {"fork_tag": self.fork_tag}
        for name in ("outline_tag", "child_end_tag", "child_eos_text", "unclosed_child_stop_text"):
            if getattr(self, name):
                out[name] = getattr(self, name)
        for name in ("child_header", "header_lead", "merge_suffix"):
            if getattr(self, name):
                out[name] = getattr(self, name).replace(LABEL_PLACEHOLDER, "1")
        return out

    def header(self, label: str) -> str:
        return self.child_header.replace(LABEL_PLACEHOLDER, label)

    def child_start(self, label: str) -> str:
        """What follows the fork tag in child ``label``'s prompt."""
        return self.header_lead + self.header(label)

    @property
    def eos_text(self) -> str:
        if self.child_eos_text is not None:
            return self.child_eos_text
        return self.child_end_tag or ""

    def outline_pattern(self) -> re.Pattern[bytes]:
        assert self.outline_tag is not None
        return re.compile(re.escape(self.outline_tag.encode()) + rb"\s*(\d+)\s*:")

