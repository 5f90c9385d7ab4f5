"""The fenced blocks of README.md and docs/ that hold commands, and the
embedded models the pages use."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SHELL_LANGS = {"bash", "sh", "shell", "console"}
LANGS = SHELL_LANGS | {"python"}
#: A bare ``` block holding one of these at the start of a line is a command.
BARE_COMMAND = re.compile(
    r"^\s*(\$ )?(vllm |python|\.venv/|\./scripts/|bash |curl |pip |torchrun |ray |[A-Z_]+=\S+ )",
    re.M)
FORKJOIN = "vllm_seqhooks/data/forkjoin_model"
THREADWEAVER = "vllm_seqhooks/data/threadweaver_model"
TAG_FORMATS = ("threadweaver", "multiverse", "npr", "parallel-r1")
#: A problem each embedded model answers by forking (the pages' own).
FORKING_PROMPT = {FORKJOIN: "sort 9081726354=", THREADWEAVER: "sort 0125073179975761="}


# ----------------------------------------------------------------- the blocks


@dataclass(frozen=True)
class Block:
    path: str  # relative to the checkout
    line: int  # of the opening fence
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    def commands(self) -> list[str]:
        """Shell: the logical lines (continuations joined), comment-only and
        empty lines left out. Python: the block."""
        if self.lang == "python":
            return [self.text]
        joined = self.text.replace("\\\n", " ")
        return [line.strip() for line in joined.splitlines()
                if line.strip() and not line.strip().startswith("#")]

    def comments(self) -> list[str]:
        return [line.strip() for line in self.text.splitlines() if line.strip().startswith("#")]


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def read_blocks() -> list[Block]:
    out = []
    for path in doc_files():
        text = path.read_text()
        for m in re.finditer(r"^```([\w-]*)[^\n]*\n(.*?)^```", text, re.S | re.M):
            lang, body = m.group(1).lower(), m.group(2)
            if lang in LANGS or (lang == "" and BARE_COMMAND.search(body)):
                out.append(Block(str(path.relative_to(ROOT)), text[:m.start()].count("\n") + 1,
                                 lang or "bash", body))
    return out
