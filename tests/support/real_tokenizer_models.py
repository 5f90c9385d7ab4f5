"""Models that use a real tokenizer (:mod:`~tests.support.real_tokenizers`):
:func:`save_for_model` writes a tokenizer's files into a model directory, and
:func:`build_tiny_model_with_tokenizer` builds the tiny random Llama of
:mod:`~vllm_seqhooks.scripted.tiny_model` with its vocabulary widened to a real
tokenizer, so ``vllm.LLM`` runs it with that tokenizer."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast


#: Tokenizer files a model directory may hold; :func:`save_for_model` removes
#: them first so none left from another tokenizer (say the tiny model's
#: ``special_tokens_map.json``) mixes with the new one.
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "added_tokens.json", "chat_template.jinja", "chat_template.json",
    "vocab.json", "merges.txt", "tokenizer.model", "tekken.json",
)


def save_for_model(tokenizer: "PreTrainedTokenizerFast",
                   model_dir: str | os.PathLike[str]) -> Path:
    """Write ``tokenizer``'s files into ``model_dir`` (replacing any tokenizer
    files there) so ``vllm.LLM(model=model_dir)`` and ``AutoTokenizer`` load
    it.  When ``model_dir/config.json`` exists, its ``vocab_size`` must cover
    the tokenizer (the tiny model's 128 does not: use
    :func:`build_tiny_model_with_tokenizer`), else ``ValueError``."""
    out = Path(model_dir)
    config = out / "config.json"
    if config.is_file():
        vocab_size = json.loads(config.read_text()).get("vocab_size", 0)
        if vocab_size < len(tokenizer):
            raise ValueError(
                f"{config} has vocab_size {vocab_size} < {len(tokenizer)} "
                "tokens; build the model with build_tiny_model_with_tokenizer"
            )
    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        (out / name).unlink(missing_ok=True)
    tokenizer.save_pretrained(str(out))
    return out


def _widened_weights(tokenizer: "PreTrainedTokenizerFast", seed: int,
                     dtype: str) -> tuple[dict[str, Any], int]:
    """The tiny model's weights with ``embed_tokens`` and ``lm_head`` redrawn
    for ``len(tokenizer)`` tokens (padded to a multiple of 64).  As in
    ``tiny_model``, the added tokens and the padding ids get logits far below
    the others, so the model never picks them on its own."""
    import torch

    from vllm_seqhooks.scripted import tiny_model as tm

    n = len(tokenizer)
    vocab_size = -(-n // 64) * 64
    hidden = tm.SIZES["tiny"]["hidden_size"]
    weights = tm.make_weights("tiny", seed, "float32")
    gen = torch.Generator(device="cpu").manual_seed(int(seed) + 1)
    emb = torch.empty(vocab_size, hidden).normal_(0.0, tm.EMBED_STD, generator=gen)
    emb[:, 0] = tm.BIAS_CHANNEL_VALUE
    head = torch.empty(vocab_size, hidden).normal_(
        0.0, tm.SIZES["tiny"]["init_std"], generator=gen
    )
    head[:, 0] = 0.0
    suppressed = sorted(tokenizer.added_tokens_decoder) + list(range(n, vocab_size))
    head[suppressed, :] = 0.0
    head[suppressed, 0] = -tm.SUPPRESS_WEIGHT
    weights["model.embed_tokens.weight"] = emb
    weights["lm_head.weight"] = head
    tdtype = getattr(torch, dtype)
    return {k: t.to(tdtype).contiguous() for k, t in weights.items()}, vocab_size


def build_tiny_model_with_tokenizer(
    out_dir: str | os.PathLike[str],
    tokenizer: "PreTrainedTokenizerFast",
    *,
    seed: int = 0,
    dtype: str = "float32",
) -> Path:
    """Write the "tiny" random Llama of ``tiny_model`` with ``tokenizer`` and
    a vocabulary of ``len(tokenizer)`` rounded up to 64 into ``out_dir``
    (missing or empty), and return its path.  Run it with
    ``vllm.LLM(model=path, **tiny_model.TINY_ENGINE_KWARGS)``.  With the Qwen
    tokenizer the weights file is about 160 MB (float32)."""
    from safetensors.torch import save_file

    from vllm_seqhooks.scripted import tiny_model as tm

    out = Path(out_dir).resolve()
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty")
    weights, vocab_size = _widened_weights(tokenizer, seed, dtype)
    ids = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    config = {**tm.model_config("tiny", dtype), "vocab_size": vocab_size, **ids}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        gen_config = {k: v for k, v in ids.items() if v is not None}
        (tmp / "generation_config.json").write_text(json.dumps(gen_config) + "\n")
        save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        save_for_model(tokenizer, tmp)
        os.chmod(tmp, 0o755)
        if out.exists():
            out.rmdir()  # empty, checked above
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
