"""The second embedded model's task: the digit sorting of
:mod:`vllm_seqhooks.tasks.forkjoin`, written in ThreadWeaver's fork/join
format (the ``threadweaver`` preset).  Pure Python (no vLLM, no torch
import).

A problem is 1 to ``MAX_LEN`` (16) digits; the prompt is ``"sort 3917425="``.

- At most ``CHUNK`` (4) digits are sorted directly: ``sort 391=`` -> ``139</s>``.
- A longer list is cut into consecutive chunks of 4 (the last may be
  shorter).  The parent writes one outline item per chunk and the fork tag::

      <Parallel>\\n<Outlines>\\n<Outline>1: 3917</Outline>\\n<Outline>2: 425</Outline>\\n</Outlines>

  The engine forks one child per outline item: child ``N``'s prompt is the
  parent's context and ``"\\n<Thread>\\nN:"``; the child writes its sorted
  chunk and the end tag (``1379</Thread>``), where the engine stops it.  The
  engine then appends to the parent the merge::

      \\n<Thread>\\n1:1379</Thread><Thread>\\n2:245</Thread>\\n<Conclusion>\\n

  and the parent writes ``1234579</Conclusion>\\n</Parallel></s>``.

Every tag is one token of the model's tokenizer (:data:`TAGS`, added to the
character tokenizer of :mod:`vllm_seqhooks.scripted.tiny_model`).  The token
ids of the training sequences are laid out by the engine's own format code
(:func:`sequences`): the fork found by
:class:`~vllm_seqhooks.formats.tag_format_scanner.TagFormatScanner`, child prompts by
:func:`~vllm_seqhooks.formats.boundaries.child_prompt`, the merge by
:func:`~vllm_seqhooks.formats.boundaries.join_tokens`, with the
:class:`~vllm_seqhooks.formats.tag_format.TagFormat` the model's own ``seqhooks.json``
settings give.

Checker (:func:`check`): when the output holds ``</Conclusion>``, the answer
is the text between the last ``<Conclusion>\\n`` and the last
``</Conclusion>``; otherwise the text after the last ``=`` (the whole text
when there is none).  It must equal the sorted digits.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from vllm_seqhooks.tasks import forkjoin as _sorting
from vllm_seqhooks.formats.boundaries import ChildText, child_prompt, child_text, join_tokens
from vllm_seqhooks.formats.events import ForkReached
from vllm_seqhooks.formats.tag_format import TagFormat
from vllm_seqhooks.formats.tag_format_scanner import TagFormatScanner
from vllm_seqhooks.formats.text_codec import TextCodec

# The problems, prompts and chunks of the first model's task.
MAX_LEN = _sorting.MAX_LEN
CHUNK = _sorting.CHUNK
Problem = _sorting.Problem
prompt_text = _sorting.prompt_text
solve = _sorting.solve
split = _sorting.split
random_problem = _sorting.random_problem
generate_problems = _sorting.generate_problems
#: Engine arguments on CPU (the longest sequence of this task is 128 tokens).
ENGINE_KWARGS = _sorting.ENGINE_KWARGS

FORMAT = "threadweaver"
PARALLEL, PARALLEL_END = "<Parallel>", "</Parallel>"
OUTLINES, OUTLINES_END = "<Outlines>", "</Outlines>"
OUTLINE, OUTLINE_END = "<Outline>", "</Outline>"
THREAD, THREAD_END = "<Thread>", "</Thread>"
CONCLUSION, CONCLUSION_END = "<Conclusion>", "</Conclusion>"
#: The added tokens of the model's tokenizer, in id order (104 .. 113).
TAGS: tuple[str, ...] = (PARALLEL, PARALLEL_END, OUTLINES, OUTLINES_END, OUTLINE,
                         OUTLINE_END, THREAD, THREAD_END, CONCLUSION, CONCLUSION_END)

#: Token budgets that fit every problem: the parent samples at most
#: 4 + 4 x 10 + 1 (outline) + 16 + 3 (conclusion) + EOS = 65 tokens; a child
#: at most 4 digits + ``</Thread>``.
PARENT_MAX_TOKENS = 96
CHILD_MAX_TOKENS = 8

#: Held-out problems (scripts/eval_threadweaver.py, the tests); training and
#: validation streams use seeds derived from the training seed.
HELDOUT_SEED = 20_241_101

MODEL_DIR = Path(__file__).resolve().parents[1] / "data" / "threadweaver_model"

#: What the model directory carries in seqhooks.json (``special_kwargs="auto"``,
#: ``vllm serve MODEL --seqhooks auto``).
MODEL_SETTINGS: dict[str, Any] = {"format": FORMAT, "child_max_tokens": CHILD_MAX_TOKENS}
#: The chat template (the promise model's: one user message, the bare problem).
CHAT_TEMPLATE = _sorting.CHAT_TEMPLATE
#: The model directory's seqhooks.json: the hook settings and the engine
#: defaults (the same as the promise model's).
SEQHOOKS_JSON: dict[str, Any] = {**MODEL_SETTINGS, "engine": _sorting.ENGINE_DEFAULTS}


def model_dir() -> Path:
    """The embedded model (``$SEQHOOKS_THREADWEAVER_MODEL`` overrides)."""
    env = os.environ.get("SEQHOOKS_THREADWEAVER_MODEL")
    return Path(env) if env else MODEL_DIR


def heldout_problems(n: int = 1000, seed: int = HELDOUT_SEED) -> list[Problem]:
    return generate_problems(n, seed)


def tag_format(settings: dict[str, Any] | None = None) -> TagFormat:
    """The :class:`TagFormat` of the engine for the model's settings."""
    from vllm_seqhooks.config.special_kwargs import SpecialKwargs
    from vllm_seqhooks.config.presets import expand

    return SpecialKwargs(**expand(settings or MODEL_SETTINGS)).tag_format


def text_codec(tokenizer: Any) -> TextCodec:
    """A :class:`TextCodec` over a ``tokenizers.Tokenizer`` or a Hugging Face
    tokenizer, built as the engine builds its own."""
    from vllm_seqhooks.formats.token_bytes import token_bytes_table

    if hasattr(tokenizer, "get_vocab_size"):
        size = tokenizer.get_vocab_size(with_added_tokens=True)
    else:
        size = len(tokenizer)

    def encode(text: str) -> Sequence[int]:
        enc = tokenizer.encode(text, add_special_tokens=False)
        return getattr(enc, "ids", enc)

    return TextCodec(token_bytes_table(tokenizer, size), encode)


# --------------------------------------------------------------------------
# Texts the model writes
# --------------------------------------------------------------------------


def outline_text(chunks: Sequence[str]) -> str:
    """The parent's output up to and including the fork tag."""
    items = "".join(f"{OUTLINE}{i}: {c}{OUTLINE_END}\n" for i, c in enumerate(chunks, 1))
    return f"{PARALLEL}\n{OUTLINES}\n{items}{OUTLINES_END}"


def child_output_text(chunk: str) -> str:
    """What child ``N`` writes after its header (the engine stops it at the
    end tag, which stays in its output)."""
    return solve(chunk) + THREAD_END


def conclusion_text(digits: str) -> str:
    """What the parent writes after the merge (before EOS)."""
    return f"{solve(digits)}{CONCLUSION_END}\n{PARALLEL_END}"


def expected_text(digits: str, fmt: TagFormat | None = None) -> str:
    """The parent's whole expected output text (merged text included),
    without EOS."""
    chunks = split(digits)
    if not chunks:
        return solve(digits)
    fmt = fmt or tag_format()
    parts = [outline_text(chunks), fmt.header_lead]
    for i, c in enumerate(chunks, 1):
        parts += [fmt.header(str(i)), child_output_text(c)]
    return "".join(parts) + fmt.merge_suffix + conclusion_text(digits)


# --------------------------------------------------------------------------
# Token sequences, laid out by the engine's format code
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Example:
    """One request's token ids and, per token, whether the request samples
    it itself (the loss covers those)."""

    role: str  # "parent" or "child"
    ids: tuple[int, ...]
    train: tuple[int, ...]
    #: A child's outline number ("" for the parent).
    label: str = ""


def sequences(codec: TextCodec, digits: str, bos_id: int, eos_id: int,
              fmt: TagFormat | None = None,
              separator: Sequence[int] = ()) -> list[Example]:
    """The parent's sequence, then one per child, as the engine runs them:
    the parent's prompt is BOS and the prompt text (vLLM's encoding of a text
    prompt); the fork, the children's prompts and the merge come from
    :mod:`vllm_seqhooks.formats.tag_format`; ``separator`` is the merge separator's ids
    (the preset's is empty)."""
    fmt = fmt or tag_format()
    prompt = [bos_id, *codec.encode(prompt_text(digits))]
    chunks = split(digits)
    if not chunks:
        out = [*codec.encode(solve(digits)), eos_id]
        return [Example("parent", (*prompt, *out), (0,) * len(prompt) + (1,) * len(out))]
    outline = list(codec.encode(outline_text(chunks)))
    scanner = TagFormatScanner(fmt, codec, may_fork=True, ends_at_tag=False)
    forks = [ev for ev in scanner.feed(outline, len(prompt)) if isinstance(ev, ForkReached)]
    if len(forks) != 1 or forks[0].pos != len(prompt) + len(outline) - 1:
        raise ValueError(f"the outline of {digits!r} does not fork once at its end: {forks}")
    fork = forks[0]
    if list(fork.labels) != [str(i) for i in range(1, len(chunks) + 1)]:
        raise ValueError(f"outline labels {fork.labels} for {len(chunks)} chunks")
    context = prompt + outline
    children: list[Example] = []
    pieces: list[ChildText] = []
    for label, chunk in zip(fork.labels, chunks):
        child, _ = child_prompt(codec, fmt, context, fork.tag_start, label)
        output = codec.encode(child_output_text(chunk))
        children.append(Example("child", (*child, *output),
                                (0,) * len(child) + (1,) * len(output), label))
        pieces.append(ChildText(label, output,
                                child_text(codec, fmt, output, ended_by_tag=True)))
    # The merge replaces the fork tag's last token (the same token, when
    # the tag ends at a token boundary: then it stays a sampled one).
    merged = join_tokens(codec, fmt, context, fork.tag_start, pieces, separator,
                         fmt.merge_suffix)
    sampled = int(bool(merged) and merged[0] == context[-1])
    tail = [*codec.encode(conclusion_text(digits)), eos_id]
    ids = (*context[:-1], *merged, *tail)
    train = ((0,) * len(prompt) + (1,) * (len(outline) - 1 + sampled)
             + (0,) * (len(merged) - sampled) + (1,) * len(tail))
    return [Example("parent", ids, train), *children]


# --------------------------------------------------------------------------
# Checker
# --------------------------------------------------------------------------

_OUTLINE_ITEM = re.compile(re.escape(OUTLINE) + r"(\d+): (\d*)" + re.escape(OUTLINE_END))


def extract_answer(text: str) -> str:
    """The answer in a model output (see the module docstring), stripped."""
    if CONCLUSION_END in text:
        head = text[: text.rindex(CONCLUSION_END)]
        return head.rsplit(CONCLUSION + "\n", 1)[-1].strip()
    return text.rsplit("=", 1)[-1].strip()


def check(problem: Problem | str, text: str) -> bool:
    """Exact-match checker: the output's answer is the sorted list."""
    digits = problem.digits if isinstance(problem, Problem) else problem
    return extract_answer(text) == solve(digits)


def check_full_text(problem: Problem | str, text: str) -> bool:
    """Stricter: the output is exactly the expected fork/join text."""
    digits = problem.digits if isinstance(problem, Problem) else problem
    return text == expected_text(digits)


def outline_chunks(text: str) -> list[str]:
    """The chunks of the outline items in ``text``, in order."""
    return [m.group(2) for m in _OUTLINE_ITEM.finditer(text)]


def summarize(problems: Sequence[Problem], texts: Sequence[str]) -> dict[str, Any]:
    """Accuracy figures for outputs ``texts`` of ``problems``."""
    n = len(problems)
    correct = sum(check(p, t) for p, t in zip(problems, texts))
    fmt = tag_format()
    exact = sum(t == expected_text(p.digits, fmt) for p, t in zip(problems, texts))
    forks_ok = sum(outline_chunks(t) == p.chunks for p, t in zip(problems, texts))
    by_k: dict[int, list[int]] = {}
    for p, t in zip(problems, texts):
        row = by_k.setdefault(len(p.chunks), [0, 0])
        row[0] += check(p, t)
        row[1] += 1
    return {
        "n": n,
        "correct": correct,
        "accuracy": correct / n if n else 0.0,
        "full_text_exact": exact,
        "decomposition_correct": forks_ok,
        "by_children": {k: v for k, v in sorted(by_k.items())},
    }
