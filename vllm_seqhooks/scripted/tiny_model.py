"""A tiny, random-weight, fully offline Llama model for tests.

:func:`build_tiny_model` writes a Hugging Face model directory (``config.json``,
``generation_config.json``, ``model.safetensors``, ``tokenizer.json``,
``tokenizer_config.json``, ``special_tokens_map.json``) that ``vllm.LLM`` loads
on CPU and ``transformers.AutoTokenizer`` loads, without any download.

Tokenizer
---------
Character level (a ``tokenizers`` BPE model with an empty merge list, so every
character is one token; no normalizer, no pre-tokenizer, a ``Fuse`` decoder),
over the 95 printable ASCII characters plus ``"\\t"`` and ``"\\n"``.  Encoding
then decoding any ASCII text gives it back unchanged; any other character
becomes ``<unk>``.  Seven tokens have fixed ids (module constants below)::

    0 <unk>  1 <s> (BOS)  2 </s> (EOS)  3 <pad>
    4 <promise>  5 </promise>  6 <sync>

followed by ``"\\t"`` = 7, ``"\\n"`` = 8 and the printable characters
``" "`` ... ``"~"`` = 9 ... 103 (``TOKENIZER_SIZE`` = 104).  The model's vocab is
padded to a multiple of 64 (128); ids 104..127 have no string and are never
produced (see "Weights").

``<s>``, ``</s>``, ``<pad>`` and ``<unk>`` are *special* added tokens. The hook
tokens ``<promise>``, ``</promise>`` and ``<sync>`` are added tokens with
``special=False, normalized=False``: they are atomic (``encode("<sync>",
add_special_tokens=False) == [SYNC_ID]``, also inside text such as
``"ab<sync>c"``) but are *not* special, so they stay in decoded text even with
``skip_special_tokens=True``, which is vLLM's default for
``SamplingParams``.  Had they been marked special, vLLM's detokenizer would drop
them from ``CompletionOutput.text`` by default (they would only show with
``skip_special_tokens=False``); they would still be in ``token_ids``.  Both
behaviours were checked by running vLLM 0.32 on CPU (see
``tests/test_testing_tools.py::test_hook_tokens_visible_in_vllm_text``).
BOS, EOS and pad are hidden with the default, as usual.

The post-processor prepends ``<s>`` when ``add_special_tokens=True`` (the
default of ``tokenizer.encode`` and of vLLM for plain text prompts).  The chat
template renders ``<s>user: hi\\nassistant: `` (one ``role: content\\n`` line per
message, then ``assistant: `` when a generation prompt is asked for).

Weights
-------
Seeded normal init: embeddings std ``EMBED_STD`` (0.5), the other matrices
std ``SIZES[size]["init_std"]`` (about ``1.1 / sqrt(hidden_size)``), RMSNorm
weights 1.  With these, greedy generation from the random model is varied:
for ten short prompts, 32 greedy tokens hold at least 11 distinct tokens (about
20 on average, no run of one token longer than 13), and different prompts
give different outputs.  (With std 0.02 everywhere the outputs fall into short
loops, e.g. ``"3333..."``.)

The model never picks on its own any of the special tokens (ids 0..6) nor the
padding ids (104..127), neither greedily nor by sampling: hidden dimension 0
is a constant "bias channel" (every embedding row holds
``BIAS_CHANNEL_VALUE`` there, and every ``o_proj`` / ``down_proj`` writes
nothing to it, so after the final RMSNorm it is always positive), and the
``lm_head`` rows of those ids are ``-SUPPRESS_WEIGHT`` on that channel and 0
elsewhere, so their logits lie far below the others (by more than 190 for
"tiny" and more than 75 for "base" in the check above; at temperature 1 their
probability is below ``e**-75``).  Tests force hook tokens and EOS with
:class:`vllm_seqhooks.scripted.processor.ScriptedTokensLogitsProcessor`; without
it a request only stops at ``max_tokens`` (or a stop string).

The directory is written to a temporary sibling directory and renamed into
place, and ends with a marker file naming the settings, so a second call with
the same settings returns at once and concurrent builders never expose a half
written directory.  The bytes depend only on ``(size, seed, dtype)`` (and the
torch / tokenizers versions that produce them).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

# --------------------------------------------------------------------------
# Token ids and strings
# --------------------------------------------------------------------------

UNK_TOKEN = "<unk>"
BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
PAD_TOKEN = "<pad>"
PROMISE_TOKEN = "<promise>"
PROMISE_END_TOKEN = "</promise>"
SYNC_TOKEN = "<sync>"

UNK_ID = 0
BOS_ID = 1
EOS_ID = 2
PAD_ID = 3
PROMISE_ID = 4
PROMISE_END_ID = 5
SYNC_ID = 6

#: Tokens with fixed ids, in id order.
FIXED_TOKENS: tuple[str, ...] = (
    UNK_TOKEN,
    BOS_TOKEN,
    EOS_TOKEN,
    PAD_TOKEN,
    PROMISE_TOKEN,
    PROMISE_END_TOKEN,
    SYNC_TOKEN,
)
#: Special tokens (hidden by ``skip_special_tokens=True``).
SPECIAL_TOKENS: tuple[str, ...] = (UNK_TOKEN, BOS_TOKEN, EOS_TOKEN, PAD_TOKEN)
#: Hook tokens: atomic added tokens, not special (visible in decoded text).
HOOK_TOKENS: tuple[str, ...] = (PROMISE_TOKEN, PROMISE_END_TOKEN, SYNC_TOKEN)
HOOK_TOKEN_IDS: tuple[int, ...] = (PROMISE_ID, PROMISE_END_ID, SYNC_ID)

#: The characters of the tokenizer, in id order, from ``len(FIXED_TOKENS)``.
CHARS: tuple[str, ...] = ("\t", "\n") + tuple(chr(c) for c in range(32, 127))
#: Number of token strings the tokenizer knows (ids ``0 .. TOKENIZER_SIZE-1``).
TOKENIZER_SIZE = len(FIXED_TOKENS) + len(CHARS)

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)

# --------------------------------------------------------------------------
# Model settings
# --------------------------------------------------------------------------

#: ``vllm.LLM`` keyword arguments for the tiny model on CPU: a small KV
#: cache (the CPU backend needs its size), no torch.compile (saves ~30 s a
#: start), float32, KV blocks of 32 tokens (CPU block sizes are multiples of
#: 32).
TINY_ENGINE_KWARGS: dict[str, Any] = dict(
    enforce_eager=True,
    kv_cache_memory_bytes=64 << 20,
    max_model_len=1024,
    block_size=32,
    dtype="float32",
    seed=0,
)
#: ``vllm serve`` hook flags matching the tiny model's tokens.
TINY_HOOK_FLAGS = ["--sync-token", "<sync>", "--promise-token", "<promise>",
                   "--promise-end-token", "</promise>"]

#: Model shapes; ``init_std`` (~ 1.1 / sqrt(hidden_size)) is the std of the
#: attention, MLP and lm_head weights.
SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=256,
        init_std=0.1,
    ),
    # ~99M parameters.
    "base": dict(
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=12,
        intermediate_size=2560,
        init_std=0.04,
    ),
}
DTYPES = ("float32", "bfloat16", "float16")
MAX_POSITION_EMBEDDINGS = 4096
#: Embedding rows are drawn with a larger std than the other weights so the
#: current token weighs more and greedy output is less repetitive.
EMBED_STD = 0.5
BIAS_CHANNEL_VALUE = EMBED_STD
SUPPRESS_WEIGHT = 1000.0
#: Bump when the files written change, so old cached directories are rebuilt.
FORMAT_VERSION = 1
MARKER_FILE = ".seqhooks_tiny_model.json"
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)


def padded_vocab_size(multiple: int = 64) -> int:
    """The model's vocab size: ``TOKENIZER_SIZE`` rounded up to ``multiple``."""
    return -(-TOKENIZER_SIZE // multiple) * multiple


VOCAB_SIZE = padded_vocab_size()

# --------------------------------------------------------------------------
# Builders
# --------------------------------------------------------------------------


def _dump_json(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def build_tokenizer(extra_tokens: Sequence[str] = ()):
    """Return the ``tokenizers.Tokenizer`` described in the module docstring.

    ``extra_tokens``: more atomic added tokens (not special, like the hook
    tokens), with ids ``TOKENIZER_SIZE, TOKENIZER_SIZE + 1, ...`` in order
    (at most ``VOCAB_SIZE - TOKENIZER_SIZE``); e.g. the tags of a trained
    tag-format model."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    _check_extra_tokens(extra_tokens)

    vocab = {tok: i for i, tok in enumerate(FIXED_TOKENS + CHARS)}
    assert len(vocab) == TOKENIZER_SIZE
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK_TOKEN))
    tok.decoder = decoders.Fuse()
    # Existing vocab entries keep their ids when added as added tokens.
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    )
    tok.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t in HOOK_TOKENS]
    )
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
        special_tokens=[(BOS_TOKEN, BOS_ID)],
    )
    if extra_tokens:
        tok.add_tokens(
            [AddedToken(t, special=False, normalized=False) for t in extra_tokens]
        )
    for i, t in enumerate(extra_tokens, start=TOKENIZER_SIZE):
        vocab[t] = i
    for t, i in vocab.items():
        assert tok.token_to_id(t) == i, (t, i, tok.token_to_id(t))
    return tok


def _check_extra_tokens(extra_tokens: Sequence[str]) -> None:
    known = set(FIXED_TOKENS + CHARS)
    if len(extra_tokens) > VOCAB_SIZE - TOKENIZER_SIZE:
        raise ValueError(f"at most {VOCAB_SIZE - TOKENIZER_SIZE} extra tokens, "
                         f"got {len(extra_tokens)}")
    if len(set(extra_tokens)) != len(extra_tokens) or known & set(extra_tokens):
        raise ValueError(f"extra tokens must be new and distinct, got {list(extra_tokens)}")


def _tokenizer_config(extra_tokens: Sequence[str] = (),
                      chat_template: str = CHAT_TEMPLATE) -> dict[str, Any]:
    added = {}
    ids = [*range(len(FIXED_TOKENS)),
           *range(TOKENIZER_SIZE, TOKENIZER_SIZE + len(extra_tokens))]
    for i, t in zip(ids, FIXED_TOKENS + tuple(extra_tokens)):
        added[str(i)] = {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": t in SPECIAL_TOKENS,
        }
    return {
        "added_tokens_decoder": added,
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": BOS_TOKEN,
        "chat_template": chat_template,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS_TOKEN,
        "model_max_length": MAX_POSITION_EMBEDDINGS,
        "pad_token": PAD_TOKEN,
        "padding_side": "left",
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": UNK_TOKEN,
    }


def model_config(size: str = "tiny", dtype: str = "float32") -> dict[str, Any]:
    """The ``config.json`` contents for ``size``."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    s = SIZES[size]
    return {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "head_dim": s["hidden_size"] // s["num_attention_heads"],
        "hidden_act": "silu",
        "hidden_size": s["hidden_size"],
        "initializer_range": s["init_std"],
        "intermediate_size": s["intermediate_size"],
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": s["num_attention_heads"],
        "num_hidden_layers": s["num_hidden_layers"],
        "num_key_value_heads": s["num_key_value_heads"],
        "pad_token_id": PAD_ID,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
        "dtype": dtype,
        "use_cache": True,
        "vocab_size": VOCAB_SIZE,
    }


def _suppressed_ids() -> list[int]:
    return list(range(len(FIXED_TOKENS))) + list(range(TOKENIZER_SIZE, VOCAB_SIZE))


def make_weights(size: str = "tiny", seed: int = 0, dtype: str = "float32"):
    """Return the ``{name: tensor}`` state dict (HF Llama names)."""
    import torch

    cfg = model_config(size, dtype)
    h = cfg["hidden_size"]
    inter = cfg["intermediate_size"]
    hd = cfg["head_dim"]
    nq = cfg["num_attention_heads"] * hd
    nkv = cfg["num_key_value_heads"] * hd
    v = cfg["vocab_size"]
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    init_std = SIZES[size]["init_std"]

    def normal(*shape: int, std: float = init_std) -> torch.Tensor:
        return torch.empty(shape, dtype=torch.float32).normal_(
            0.0, std, generator=gen
        )

    sd: dict[str, torch.Tensor] = {}
    emb = normal(v, h, std=EMBED_STD)
    emb[:, 0] = BIAS_CHANNEL_VALUE
    sd["model.embed_tokens.weight"] = emb
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = torch.ones(h)
        sd[p + "self_attn.q_proj.weight"] = normal(nq, h)
        sd[p + "self_attn.k_proj.weight"] = normal(nkv, h)
        sd[p + "self_attn.v_proj.weight"] = normal(nkv, h)
        o = normal(h, nq)
        o[0, :] = 0.0  # keep the bias channel constant
        sd[p + "self_attn.o_proj.weight"] = o
        sd[p + "post_attention_layernorm.weight"] = torch.ones(h)
        sd[p + "mlp.gate_proj.weight"] = normal(inter, h)
        sd[p + "mlp.up_proj.weight"] = normal(inter, h)
        d = normal(h, inter)
        d[0, :] = 0.0
        sd[p + "mlp.down_proj.weight"] = d
    sd["model.norm.weight"] = torch.ones(h)
    head = normal(v, h)
    head[:, 0] = 0.0
    sup = _suppressed_ids()
    head[sup, :] = 0.0
    head[sup, 0] = -SUPPRESS_WEIGHT
    sd["lm_head.weight"] = head
    tdtype = getattr(torch, dtype)
    return {k: t.to(tdtype).contiguous() for k, t in sd.items()}


def _settings(size: str, seed: int, dtype: str) -> dict[str, Any]:
    return {
        "dtype": dtype,
        "format_version": FORMAT_VERSION,
        "seed": int(seed),
        "size": size,
    }


def _is_complete(path: Path, settings: dict[str, Any]) -> bool:
    try:
        marker = json.loads((path / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return False
    return marker == settings and all((path / f).is_file() for f in MODEL_FILES)


def _write_model(tmp: Path, size: str, seed: int, dtype: str) -> None:
    from safetensors.torch import save_file

    (tmp / "config.json").write_text(_dump_json(model_config(size, dtype)))
    gen_cfg = {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID}
    (tmp / "generation_config.json").write_text(_dump_json(gen_cfg))
    save_file(
        make_weights(size, seed, dtype),
        str(tmp / "model.safetensors"),
        metadata={"format": "pt"},
    )
    tok = build_tokenizer()
    (tmp / "tokenizer.json").write_text(
        _dump_json(json.loads(tok.to_str())), encoding="utf-8"
    )
    (tmp / "tokenizer_config.json").write_text(_dump_json(_tokenizer_config()))
    special_map = {
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "unk_token": UNK_TOKEN,
    }
    (tmp / "special_tokens_map.json").write_text(_dump_json(special_map))
    for f in tmp.iterdir():
        os.chmod(f, 0o644)
    # The marker is written last: its presence means the directory is complete.
    (tmp / MARKER_FILE).write_text(_dump_json(_settings(size, seed, dtype)))


def build_tiny_model(
    out_dir: str | os.PathLike[str],
    *,
    size: str = "tiny",
    seed: int = 0,
    dtype: str = "float32",
    overwrite: bool = False,
) -> Path:
    """Write the model directory ``out_dir`` and return its path.

    Returns at once when ``out_dir`` already holds a complete model built with
    the same ``size``, ``seed`` and ``dtype``.  ``out_dir`` may be missing or an
    empty directory.  A directory holding anything else (for instance a model
    with other settings) raises ``FileExistsError`` unless ``overwrite=True``.
    """
    model_config(size, dtype)  # validates size and dtype
    out = Path(out_dir).resolve()
    settings = _settings(size, seed, dtype)
    if _is_complete(out, settings):
        return out
    if out.exists():
        if not out.is_dir():
            raise FileExistsError(f"{out} exists and is not a directory")
        if any(out.iterdir()):
            if not overwrite:
                raise FileExistsError(
                    f"{out} is not empty and does not hold a tiny model with "
                    f"settings {settings}; pass overwrite=True to replace it"
                )
            shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        _write_model(tmp, size, seed, dtype)
        os.chmod(tmp, 0o755)
        try:
            # Atomic; replaces ``out`` only when it is missing or empty.
            os.rename(tmp, out)
        except OSError:
            # Another process finished first.
            if _is_complete(out, settings):
                return out
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vllm_seqhooks.scripted.tiny_model",
        description="Write a tiny random Llama model directory for offline tests.",
    )
    parser.add_argument("out_dir")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    path = build_tiny_model(
        args.out_dir,
        size=args.size,
        seed=args.seed,
        dtype=args.dtype,
        overwrite=args.overwrite,
    )
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
