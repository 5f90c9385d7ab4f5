"""Scripted fork/join text in each preset's format (for benchmarks and tests
on the tiny model): what a parent writes before its fork, what each child
writes, and what the parent writes after the join. Pure, no vLLM import."""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

_LETTERS = string.ascii_letters + "     "


@dataclass(frozen=True)
class FormatScript:
    before: str
    children: dict[str, str]
    after: str


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(_LETTERS) for _ in range(n))


def format_script(name: str, rng: random.Random, *, k: int = 4, item: int = 8,
                  child_tokens: int = 32, continuation: int = 16) -> FormatScript:
    """A family in preset ``name``'s format: ``k`` outline items of ``item``
    characters (Parallel-R1: its fixed 2 children), children writing
    ``child_tokens`` characters then their end tag, and ``continuation``
    characters after the join (with the tiny model's character tokenizer,
    characters are tokens)."""
    items = [_text(rng, item) for _ in range(k)]
    body = [_text(rng, child_tokens) for _ in range(k)]
    after = _text(rng, continuation)
    if name == "threadweaver":
        outline = "".join(f"<Outline>{i + 1}: {t}</Outline>\n" for i, t in enumerate(items))
        return FormatScript("<Parallel>\n<Outlines>\n" + outline + "</Outlines>",
                            {str(i): b + "</Thread>" for i, b in enumerate(body)},
                            "</Parallel>\n" + after)
    if name == "multiverse":
        outline = "".join(f"<Outline>\n{i + 1}: {t}\n</Outline>\n" for i, t in enumerate(items))
        return FormatScript("<Parallel>\n<Goal>\n" + outline + "</Goal>",
                            {str(i): b + "\n</Path>" for i, b in enumerate(body)},
                            "</Conclusion>\n</Parallel>\n" + after)
    if name == "npr":
        outline = "".join(f"<plan>{i + 1}: {t}</plan>\n" for i, t in enumerate(items))
        return FormatScript("<guideline>\n" + outline + "</guideline>",
                            {str(i): b + "\n</step>" for i, b in enumerate(body)},
                            "</takeaway>\n" + after)
    if name == "parallel-r1":
        return FormatScript(_text(rng, item) + "<Parallel>",
                            {str(i): b + "</Path>" for i, b in enumerate(body[:2])},
                            after + "</Summary>")
    raise ValueError(f"no script for format {name!r}")
