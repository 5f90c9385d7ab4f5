"""The fork/join task of the embedded model: sorting digits, by one level of
merge sort.  Pure Python (no vLLM, no torch import).

A problem is a list of 1 to ``MAX_LEN`` digits.  The prompt is
``"sort 3917425="``; the answer is the digits in ascending order,
``"1234579"``.

- A list of at most ``CHUNK`` (4) digits is sorted directly::

      sort 391=139</s>

- A longer list is cut into consecutive chunks of ``CHUNK`` digits (the last
  one may be shorter).  The parent writes one promise per chunk, then
  ``<sync>``; each child sorts its chunk; the engine appends the children's
  outputs after ``<sync>`` (promise order, joined by ``,``); the parent then
  writes ``=`` and the merge of the sorted chunks::

      sort 3917425=<promise>3917</promise><promise>425</promise><sync>1379,245=1234579</s>
                                                                       ^^^^^^^^ merged by the engine

- Children run in ``payload`` context: a child's prompt is the payload inside
  the template ``"sort {payload}="`` (no BOS; the parent's prompt has vLLM's
  BOS), so a child is the same task on a short list, and one model does both.
  ``payload`` context keeps children independent of the parent's context
  (short prompts, no shared prefix needed); ``fork`` would work too but gives
  children a longer, different-looking prompt.

The number of promises (0, 2, 3 or 4) depends on the length of the list, so
the model decides whether and how often to fork.  The checker is exact: the
text after the last ``=`` of the model's output must equal the sorted digits
(:func:`check`); :func:`check_full_text` also demands the exact fork/join
text above (right chunks, right merged text).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

#: Longest list; lists longer than ``CHUNK`` are split into chunks of ``CHUNK``.
MAX_LEN = 16
CHUNK = 4
PROMPT_PREFIX = "sort "
PROMPT_SUFFIX = "="
#: The child's prompt (``payload`` context).
CHILD_PROMPT_TEMPLATE = PROMPT_PREFIX + "{payload}" + PROMPT_SUFFIX
MERGE_SEPARATOR = ","
#: What the parent writes between the merged text and its answer.
ANSWER_MARK = "="

PROMISE = "<promise>"
PROMISE_END = "</promise>"
SYNC = "<sync>"

#: Token budgets that fit every problem of the task (parent: at most
#: 4 promises x 6 tokens + <sync> + "=" + 16 digits + EOS = 43 sampled tokens).
PARENT_MAX_TOKENS = 64
CHILD_MAX_TOKENS = 8

#: Seeds of the data: training streams use the training seed (see
#: scripts/train_tiny_forkjoin.py); evaluation uses these.
HELDOUT_SEED = 20_240_601
DEMO_SEED = 7

MODEL_DIR = Path(__file__).resolve().parents[1] / "data" / "forkjoin_model"

#: Engine arguments for the model on CPU (float32, no torch.compile; the
#: longest sequence of the task is 85 tokens).  ``vllm.LLM`` and
#: ``vllm_seqhooks.LLM`` take them as they are.
#: The engine arguments that size an engine to the model, which it carries
#: in seqhooks.json (``"engine"``: :mod:`vllm_seqhooks.config.engine_defaults`):
#: used whenever hooks are on and the user gives no value of their own.
ENGINE_DEFAULTS: dict[str, Any] = dict(
    kv_cache_memory_bytes=128 << 20,
    max_model_len=256,
    block_size=32,
)
ENGINE_KWARGS: dict[str, Any] = dict(
    ENGINE_DEFAULTS,
    enforce_eager=True,
    dtype="float32",
    seed=0,
    enable_prefix_caching=True,
)


def model_dir() -> Path:
    """The embedded trained model (``$SEQHOOKS_FORKJOIN_MODEL`` overrides)."""
    env = os.environ.get("SEQHOOKS_FORKJOIN_MODEL")
    return Path(env) if env else MODEL_DIR


#: What the model directory carries in seqhooks.json (``special_kwargs="auto"``,
#: ``vllm serve MODEL --seqhooks auto``): the same settings as
#: :func:`hook_settings`, with the hook tokens as strings.
MODEL_SETTINGS: dict[str, Any] = {
    "format": "promise",
    "child_context": "payload",
    "child_prompt_template": CHILD_PROMPT_TEMPLATE,
    "merge_separator": MERGE_SEPARATOR,
    "child_max_tokens": CHILD_MAX_TOKENS,
}

#: The trained models' chat template: the model reads a bare problem after
#: BOS, so a chat is one user message whose content is the problem, rendered
#: as the completion prompt of the same text (the same tokens, the same
#: answer); anything else is refused, saying so.
CHAT_TEMPLATE = (
    "{%- if messages | length != 1 or messages[0]['role'] != 'user' -%}"
    "{{ raise_exception('this model was trained on bare problems, not chat turns: send one "
    "user message holding the problem, e.g. sort 9081726354=') }}"
    "{%- endif -%}"
    "{{ bos_token }}{{ messages[0]['content'] }}"
)

#: The model directory's seqhooks.json: the hook settings and the engine
#: defaults.
SEQHOOKS_JSON: dict[str, Any] = {**MODEL_SETTINGS, "engine": ENGINE_DEFAULTS}


def hook_settings(**overrides: Any) -> dict[str, Any]:
    """``special_kwargs`` for the model (token ids of
    :mod:`vllm_seqhooks.scripted.tiny_model`'s tokenizer)."""
    from vllm_seqhooks.scripted.tiny_model import PROMISE_END_ID, PROMISE_ID, SYNC_ID

    settings = dict(
        sync_token_id=SYNC_ID,
        promise_token_id=PROMISE_ID,
        promise_end_token_id=PROMISE_END_ID,
        child_context="payload",
        child_prompt_template=CHILD_PROMPT_TEMPLATE,
        merge_separator=MERGE_SEPARATOR,
        child_max_tokens=CHILD_MAX_TOKENS,
    )
    settings.update(overrides)
    return settings


# --------------------------------------------------------------------------
# Problems
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    digits: str  # e.g. "3917425"

    def __post_init__(self) -> None:
        if not self.digits or not self.digits.isdigit() or not self.digits.isascii():
            raise ValueError(f"a problem is a non-empty string of digits, got {self.digits!r}")

    @property
    def prompt(self) -> str:
        return prompt_text(self.digits)

    @property
    def answer(self) -> str:
        return solve(self.digits)

    @property
    def chunks(self) -> list[str]:
        return split(self.digits)


def prompt_text(digits: str) -> str:
    return f"{PROMPT_PREFIX}{digits}{PROMPT_SUFFIX}"


def solve(digits: str) -> str:
    return "".join(sorted(digits))


def split(digits: str) -> list[str]:
    """The chunks a parent delegates (empty when it sorts directly)."""
    if len(digits) <= CHUNK:
        return []
    return [digits[i : i + CHUNK] for i in range(0, len(digits), CHUNK)]


def random_problem(rng: random.Random, min_len: int = 1, max_len: int = MAX_LEN) -> Problem:
    n = rng.randint(min_len, max_len)
    return Problem("".join(rng.choice("0123456789") for _ in range(n)))


def generate_problems(
    n: int, seed: int, min_len: int = 1, max_len: int = MAX_LEN
) -> list[Problem]:
    """``n`` problems, lengths uniform in ``[min_len, max_len]``, digits
    uniform; deterministic in ``seed``."""
    rng = random.Random(seed)
    return [random_problem(rng, min_len, max_len) for _ in range(n)]


def heldout_problems(n: int = 1000, seed: int = HELDOUT_SEED) -> list[Problem]:
    return generate_problems(n, seed)


# --------------------------------------------------------------------------
# Expected texts (what training teaches) and the checker
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    """A piece of a parent's output text; ``merged`` pieces are written by
    the engine (from the children), not sampled by the parent."""

    text: str
    merged: bool = False


def parent_segments(digits: str) -> list[Segment]:
    """The parent's expected output, without EOS."""
    chunks = split(digits)
    if not chunks:
        return [Segment(solve(digits))]
    promises = "".join(f"{PROMISE}{c}{PROMISE_END}" for c in chunks)
    return [
        Segment(promises + SYNC),
        Segment(MERGE_SEPARATOR.join(solve(c) for c in chunks), merged=True),
        Segment(ANSWER_MARK + solve(digits)),
    ]


def expected_text(digits: str) -> str:
    """The parent's whole expected output text (merged text included)."""
    return "".join(s.text for s in parent_segments(digits))


def child_prompt(payload: str) -> str:
    return CHILD_PROMPT_TEMPLATE.format(payload=payload)


def extract_answer(text: str) -> str:
    """The answer in a model output: what follows the last ``=`` (the whole
    text when there is none), stripped."""
    return text.rsplit(ANSWER_MARK, 1)[-1].strip()


def check(problem: Problem | str, text: str) -> bool:
    """Exact-match checker: the output's answer is the sorted list."""
    digits = problem.digits if isinstance(problem, Problem) else problem
    return extract_answer(text) == solve(digits)


def check_full_text(problem: Problem | str, text: str) -> bool:
    """Stricter: the output is exactly the expected fork/join text."""
    digits = problem.digits if isinstance(problem, Problem) else problem
    return text == expected_text(digits)


def promise_payloads(text: str) -> list[str]:
    """The payloads of the promises in ``text``."""
    out = []
    rest = text
    while PROMISE in rest:
        rest = rest.split(PROMISE, 1)[1]
        payload, _, rest = rest.partition(PROMISE_END)
        out.append(payload)
    return out


def iter_problems(seed: int) -> Iterator[Problem]:
    rng = random.Random(seed)
    while True:
        yield random_problem(rng)


def summarize(problems: Sequence[Problem], texts: Sequence[str]) -> dict[str, Any]:
    """Accuracy figures for outputs ``texts`` of ``problems``."""
    n = len(problems)
    correct = sum(check(p, t) for p, t in zip(problems, texts))
    exact = sum(check_full_text(p, t) for p, t in zip(problems, texts))
    forks_ok = sum(promise_payloads(t) == p.chunks for p, t in zip(problems, texts))
    return {
        "n": n,
        "correct": correct,
        "accuracy": correct / n if n else 0.0,
        "full_text_exact": exact,
        "decomposition_correct": forks_ok,
    }
