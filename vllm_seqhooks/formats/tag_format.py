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
#: The fields that are tags: the text the scanner looks for.
TAG_FIELDS = ("fork_tag", "outline_tag", "child_end_tag")

#: ``{...}`` with no brace inside, and what inside one looks like a
#: placeholder's name (``{m}``, ``{N}``, ``{ n }``, ``{0}``, ``{}``).
_BRACED = re.compile(r"\{([^{}]*)\}")
_NAME_LIKE = re.compile(r"\s*\w{0,32}\s*")


def placeholder_problem(name: str, text: str, placeholder: str, meaning: str = "") -> str | None:
    """What is wrong with the placeholders of template ``text`` (field
    ``name``), whose only placeholder is ``placeholder`` (e.g. ``"{n}"``),
    or None. Refused: another name in braces (``{m}``, ``{N}``, ``{ n }``),
    and the placeholder's name with one brace only (``{n:``, ``n}``); other
    braces (``{"key": ``) are text. The message names the fix (``meaning``:
    what the placeholder stands for, said after it)."""
    word = placeholder[1:-1]
    the_one = f"{placeholder} ({meaning})" if meaning else placeholder
    for match in _BRACED.finditer(text):
        if match.group(0) != placeholder and _NAME_LIKE.fullmatch(match.group(1)):
            fixed = text[:match.start()] + placeholder + text[match.end():]
            return (f"{name} {text!r} holds {match.group(0)!r}, which is not a placeholder: "
                    f"the only one is {the_one}; did you mean {fixed!r}?")
    for pattern, fix in ((r"\{" + re.escape(word) + r"(?![\w}])", lambda m: placeholder),
                         (r"(?<![{\w])" + re.escape(word) + r"\}", lambda m: placeholder)):
        match = re.search(pattern, text)
        if match:
            fixed = text[:match.start()] + fix(match) + text[match.end():]
            return (f"{name} {text!r} holds {match.group(0)!r}, a placeholder with one brace "
                    f"only (the placeholder is {the_one}); did you mean {fixed!r}?")
    return None


#: A ``<`` that opens a tag (before a name, ``/``, ``|``, ``!`` or ``?``) and a
#: ``>`` that closes one (after a name, ``/``, ``|``, ``?`` or a quote); an
#: arrow's ``->`` / ``=>`` / ``<-`` is neither.
_OPENS = re.compile(r"<(?=[\w/|!?])")
_CLOSES = re.compile(r"(?<=[\w/|?'\"])>")


def angle_bracket_problem(name: str, tag: str) -> str | None:
    """What is wrong with the angle brackets of ``tag`` (field ``name``), or
    None: a ``<`` that opens a tag must be closed by a ``>`` before the next
    one opens, and a ``>`` after a name must close one (``</Outlines``,
    ``Outline>``, ``<Out<line>`` are refused; ``<<SYS>>``, ``<|fork|>``,
    ``->`` are not)."""
    opened: int | None = None
    for i, char in enumerate(tag):
        if char == "<" and _OPENS.match(tag, i):
            if opened is not None:
                return (f"{name} {tag!r} opens a second '<' at character {i + 1} before "
                        "closing the first with '>'; a tag's '<' and '>' go in pairs")
            opened = i
        elif char == ">":
            if opened is not None:
                opened = None
            elif _CLOSES.match(tag, i):
                fix = f"; did you mean {'<' + tag!r}?" if "<" not in tag else ""
                return (f"{name} {tag!r} closes a '>' at character {i + 1} that no '<' "
                        f"opened{fix}")
    if opened is not None:
        fix = f"; did you mean {tag + '>'!r}?" if ">" not in tag[opened:] else ""
        return f"{name} {tag!r} opens '<' without closing it with '>'{fix}"
    return None


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
        for name in TAG_FIELDS:
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
        self._check_texts()

    def _check_texts(self) -> None:
        """Mistakes the engine would otherwise write or wait for literally:
        a placeholder other than ``{n}`` (the label) in ``child_header``,
        ``{n}`` where nothing fills it in, tags whose angle brackets do not
        pair, and one tag given to two roles."""
        problem = placeholder_problem("child_header", self.child_header, LABEL_PLACEHOLDER,
                                      "the child's label: its outline number")
        if problem:
            raise TagFormatError(problem)
        for name in ("header_lead", "merge_suffix"):
            if LABEL_PLACEHOLDER in getattr(self, name):
                raise TagFormatError(
                    f"{name} {getattr(self, name)!r} holds {LABEL_PLACEHOLDER}, which only "
                    f"child_header fills in (with the child's label); {name} is written as it is")
        tags = {name: getattr(self, name) for name in TAG_FIELDS if getattr(self, name)}
        for name, tag in tags.items():
            problem = angle_bracket_problem(name, tag)
            if problem:
                raise TagFormatError(problem)
        seen: dict[str, str] = {}
        for name, tag in tags.items():
            if tag in seen:
                raise TagFormatError(
                    f"{seen[tag]} and {name} are both {tag!r}; they must differ (the fork, "
                    "an outline item and a child's end are told apart by their tag)")
            seen[tag] = name

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

