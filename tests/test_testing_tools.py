"""Tests of the offline testing tools: the tiny model and the scripted
logits processor (tests.support)."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_seqhooks.scripted.tiny_model import (
    BOS_ID,
    EOS_ID,
    FIXED_TOKENS,
    HOOK_TOKENS,
    PAD_ID,
    PROMISE_END_ID,
    PROMISE_ID,
    SYNC_ID,
    TOKENIZER_SIZE,
    UNK_ID,
    VOCAB_SIZE,
    build_tiny_model,
)

PROMPTS = ["Hello", "The quick brown fox", "abc", "1234", "Once upon a time"]
ASCII_TEXT = "".join(chr(c) for c in range(32, 127)) + "\n\tline two\n"
REPO_ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------
# Model directory and tokenizer (no engine)
# --------------------------------------------------------------------------


def test_token_id_constants():
    assert (UNK_ID, BOS_ID, EOS_ID, PAD_ID) == (0, 1, 2, 3)
    assert (PROMISE_ID, PROMISE_END_ID, SYNC_ID) == (4, 5, 6)
    assert FIXED_TOKENS[PROMISE_ID] == "<promise>"
    assert FIXED_TOKENS[PROMISE_END_ID] == "</promise>"
    assert FIXED_TOKENS[SYNC_ID] == "<sync>"
    assert VOCAB_SIZE % 64 == 0 and VOCAB_SIZE >= TOKENIZER_SIZE


def test_model_config(tiny_model_dir):
    cfg = json.loads((Path(tiny_model_dir) / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["vocab_size"] == VOCAB_SIZE
    assert cfg["hidden_size"] // cfg["num_attention_heads"] == cfg["head_dim"] == 64
    assert cfg["num_hidden_layers"] == 2
    assert cfg["tie_word_embeddings"] is False
    assert cfg["eos_token_id"] == EOS_ID and cfg["bos_token_id"] == BOS_ID


def test_build_deterministic_and_idempotent(tiny_model_dir, tmp_path):
    other = build_tiny_model(tmp_path / "again")
    files = sorted(p.name for p in Path(tiny_model_dir).iterdir())
    assert files == sorted(p.name for p in other.iterdir())
    for name in files:
        assert (Path(tiny_model_dir) / name).read_bytes() == (
            other / name
        ).read_bytes(), name
    # Second call: returns at once, rewrites nothing.
    mtimes = {p.name: p.stat().st_mtime_ns for p in other.iterdir()}
    assert build_tiny_model(tmp_path / "again") == other
    assert mtimes == {p.name: p.stat().st_mtime_ns for p in other.iterdir()}
    # No temporary directories left behind.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again"]
    # Other settings into the same directory: refused unless overwrite.
    with pytest.raises(FileExistsError):
        build_tiny_model(tmp_path / "again", seed=1)
    build_tiny_model(tmp_path / "again", seed=1, overwrite=True)
    assert (other / "model.safetensors").read_bytes() != (
        Path(tiny_model_dir) / "model.safetensors"
    ).read_bytes()
    # An existing empty directory is filled.
    (tmp_path / "empty").mkdir()
    assert (build_tiny_model(tmp_path / "empty") / "config.json").is_file()


def test_cli(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "vllm_seqhooks.scripted.tiny_model", str(tmp_path / "m")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == str((tmp_path / "m").resolve())
    assert (tmp_path / "m" / "tokenizer.json").is_file()


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_tokenizer_round_trip(hf_tokenizer):
    tok = hf_tokenizer
    assert len(tok) == TOKENIZER_SIZE
    ids = tok.encode(ASCII_TEXT, add_special_tokens=False)
    assert len(ids) == len(ASCII_TEXT)  # one token per character
    assert tok.decode(ids) == ASCII_TEXT
    assert tok.encode("hi") == [BOS_ID] + tok.encode("hi", add_special_tokens=False)
    assert tok.decode(tok.encode("hi"), skip_special_tokens=True) == "hi"
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (
        BOS_ID,
        EOS_ID,
        PAD_ID,
    )
    assert tok.unk_token_id == UNK_ID
    assert tok.encode("\u00e9", add_special_tokens=False) == [UNK_ID]


def test_hook_tokens_atomic_and_visible(hf_tokenizer):
    tok = hf_tokenizer
    assert tok.encode("<sync>", add_special_tokens=False) == [SYNC_ID]
    assert tok.encode("<promise>", add_special_tokens=False) == [PROMISE_ID]
    assert tok.encode("</promise>", add_special_tokens=False) == [PROMISE_END_ID]
    text = "ab<promise>x y</promise><sync>c"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids[2] == PROMISE_ID and ids[6] == PROMISE_END_ID and ids[7] == SYNC_ID
    assert len(ids) == 9
    for skip in (False, True):
        assert tok.decode(ids, skip_special_tokens=skip) == text
    # BOS / EOS are special: hidden by skip_special_tokens=True.
    assert tok.decode([BOS_ID, *ids, EOS_ID], skip_special_tokens=True) == text
    assert tok.decode([BOS_ID, *ids, EOS_ID]) == "<s>" + text + "</s>"
    for t in HOOK_TOKENS:
        assert t not in tok.all_special_tokens


def test_chat_template(hf_tokenizer):
    text = hf_tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<s>user: hi\nassistant: "


def test_encode_script(hf_tokenizer, tiny_model_dir):
    from vllm_seqhooks.scripted.processor import encode_script

    ids = encode_script(hf_tokenizer, "ab<promise>xy</promise><sync>c</s>")
    assert ids == [
        *hf_tokenizer.encode("ab", add_special_tokens=False),
        PROMISE_ID,
        *hf_tokenizer.encode("xy", add_special_tokens=False),
        PROMISE_END_ID,
        SYNC_ID,
        *hf_tokenizer.encode("c", add_special_tokens=False),
        EOS_ID,
    ]
    assert encode_script(tiny_model_dir, "<sync>") == [SYNC_ID]
    assert encode_script(hf_tokenizer, [1, 2]) == [1, 2]


# --------------------------------------------------------------------------
# The logits processor on hand-made batch updates (no engine)
# --------------------------------------------------------------------------


def _proc():
    import torch

    from vllm_seqhooks.scripted.processor import ScriptedTokensLogitsProcessor

    return ScriptedTokensLogitsProcessor(None, torch.device("cpu"), False)


def _update(batch_size, removed=(), added=(), moved=()):
    from vllm.v1.sample.logits_processor import BatchUpdate

    return BatchUpdate(
        batch_size=batch_size,
        removed=list(removed),
        added=list(added),
        moved=list(moved),
    )


def _forced(proc, batch_size, vocab=16):
    """Row -> forced token (None when the row is left alone)."""
    import torch

    logits = torch.zeros(batch_size, vocab)
    out = proc.apply(logits)
    result = []
    for row in out:
        finite = torch.isfinite(row).nonzero().flatten().tolist()
        result.append(None if len(finite) == vocab else finite)
    return [r[0] if r and len(r) == 1 else r for r in result]


def _sp(**extra):
    from vllm import SamplingParams

    return SamplingParams(extra_args=extra or None)


def test_processor_unit_forcing_and_batch_moves():
    from vllm.v1.sample.logits_processor import MoveDirectionality

    proc = _proc()
    assert not proc.is_argmax_invariant()
    out_a: list[int] = []
    out_b: list[int] = []
    out_c: list[int] = []
    a = _sp(seqhooks_script=[5, 6], seqhooks_script_end="eos", seqhooks_eos_token_id=9)
    b = _sp(seqhooks_script=[7])  # end "free"
    c = _sp()  # not scripted
    proc.update_state(
        _update(3, added=[(0, a, [1], out_a), (1, b, [1], out_b), (2, c, [1], out_c)])
    )
    assert _forced(proc, 3) == [5, 7, None]
    # Live output lists: no batch update needed to advance.
    out_a.append(5)
    out_b.append(7)
    proc.update_state(None)
    assert _forced(proc, 3) == [6, None, None]
    out_a.append(6)
    assert _forced(proc, 3) == [9, None, None]  # EOS after the script
    # Swap rows 0 and 2, then move 2 -> 1 after removing 1.
    proc.update_state(_update(3, moved=[(0, 2, MoveDirectionality.SWAP)]))
    assert _forced(proc, 3) == [None, None, 9]
    proc.update_state(
        _update(2, removed=[1], moved=[(2, 1, MoveDirectionality.UNIDIRECTIONAL)])
    )
    assert _forced(proc, 2) == [None, 9]
    # Re-added (same request after a join): new params, fresh output list.
    a2 = _sp(
        seqhooks_script=[5, 6, 3, 4],
        seqhooks_sampled_before=2,
        seqhooks_script_end="eos",
        seqhooks_eos_token_id=9,
    )
    fresh: list[int] = []
    proc.update_state(_update(2, removed=[1], added=[(1, a2, [1], fresh)]))
    assert _forced(proc, 2) == [None, 3]
    fresh.append(3)
    assert _forced(proc, 2) == [None, 4]
    # A row replaced by an unscripted request is released.
    proc.update_state(_update(2, added=[(1, c, [1], [])]))
    assert proc.rows == {}
    assert _forced(proc, 2) == [None, None]


def test_processor_unit_children():
    from vllm_seqhooks.scripted.processor import resolve_script

    base = dict(
        seqhooks_script=[1],
        seqhooks_child_scripts={"0": [2, 3], "0.1": [4]},
        seqhooks_script_end="eos",
    )
    assert resolve_script(base) == ([1], 0, "eos")
    assert resolve_script({**base, "seqhooks_child_key": "0"}) == ([2, 3], 0, "eos")
    assert resolve_script({**base, "seqhooks_child_key": "0.1"}) == ([4], 0, "eos")
    assert resolve_script({**base, "seqhooks_child_key": "1"}) is None
    with_default = {**base, "seqhooks_child_default_script": [8]}
    key1 = {**with_default, "seqhooks_child_key": "1"}
    assert resolve_script(key1) == ([8], 0, "eos")
    child_end = {**base, "seqhooks_child_script_end": "free"}
    key0 = {**child_end, "seqhooks_child_key": "0"}
    assert resolve_script(key0) == ([2, 3], 0, "free")
    assert resolve_script(child_end) == ([1], 0, "eos")
    # The OpenAI server's vllm_xargs cannot nest dicts: JSON string accepted.
    as_json = {**base, "seqhooks_child_scripts": json.dumps({"0": [2, 3]})}
    assert resolve_script({**as_json, "seqhooks_child_key": "0"}) == ([2, 3], 0, "eos")
    assert resolve_script({}) is None and resolve_script(None) is None
    assert resolve_script({"other": 1}) is None

    proc = _proc()
    eos = dict(seqhooks_eos_token_id=9)
    proc.update_state(
        _update(
            3,
            added=[
                (0, _sp(**base, **eos), None, []),
                (1, _sp(**base, **eos, seqhooks_child_key="0"), None, []),
                (2, _sp(**base, **eos, seqhooks_child_key="7"), None, []),
            ],
        )
    )
    assert _forced(proc, 3) == [1, 2, None]


def test_processor_step_delay_sleeps_the_largest_of_the_batch(monkeypatch):
    from vllm_seqhooks.scripted import processor as scripted

    slept: list[float] = []
    monkeypatch.setattr(scripted.time, "sleep", slept.append)
    proc = _proc()
    proc.update_state(_update(3, added=[
        (0, _sp(seqhooks_script=[5], seqhooks_step_delay_ms=20), [], []),
        (1, _sp(seqhooks_script=[6], seqhooks_step_delay_ms=50.0), [], []),
        (2, _sp(seqhooks_script=[7]), [], []),
    ]))
    assert _forced(proc, 3) == [5, 6, 7]  # forcing is unchanged
    assert slept == [0.05]
    proc.update_state(_update(3, removed=[0, 1]))
    _forced(proc, 3)
    assert slept == [0.05]  # no delayed request left: no sleep


def test_processor_validation():
    from vllm_seqhooks.scripted.processor import (
        ScriptedTokensLogitsProcessor,
        scripted_params,
    )

    validate = ScriptedTokensLogitsProcessor.validate_params
    validate(_sp())
    validate(_sp(seqhooks_script=[1, 2], seqhooks_script_end="free"))
    bad = [
        dict(seqhooks_script="abc"),
        dict(seqhooks_script=[1, -1]),
        dict(seqhooks_script=[1.5]),
        dict(seqhooks_script_end="stop"),
        dict(seqhooks_child_script_end="x"),
        dict(seqhooks_child_scripts=[[1]]),
        dict(seqhooks_child_scripts={"0": "x"}),
        dict(seqhooks_sampled_before=-1),
        dict(seqhooks_eos_token_id="2"),
        dict(seqhooks_child_key=0),
        dict(seqhooks_step_delay_ms=-1),
        dict(seqhooks_step_delay_ms="20"),
        dict(seqhooks_step_delay_ms=True),
    ]
    for extra in bad:
        with pytest.raises(ValueError, match=next(iter(extra))):
            validate(_sp(**extra))
    with pytest.raises(ValueError):
        scripted_params([1], end="nope")


def test_scripted_params_helper():
    from vllm_seqhooks.scripted.processor import scripted_params

    p = scripted_params(
        [10, 11],
        child_scripts={0: [12]},
        eos_token_id=PAD_ID,
        sampled_before=3,
        child_end="free",
        child_default_script=[13],
        extra_args={"other": 1},
        max_tokens=7,
    )
    assert p.extra_args == {
        "other": 1,
        "seqhooks_script": [10, 11],
        "seqhooks_script_end": "eos",
        "seqhooks_child_scripts": {"0": [12]},
        "seqhooks_child_script_end": "free",
        "seqhooks_child_default_script": [13],
        "seqhooks_eos_token_id": PAD_ID,
        "seqhooks_sampled_before": 3,
    }
    assert PAD_ID in p.stop_token_ids
    assert p.temperature == 0.0 and p.max_tokens == 7
    q = scripted_params([1])
    assert q.max_tokens is None and "seqhooks_eos_token_id" not in q.extra_args


# --------------------------------------------------------------------------
# In-process engines
# --------------------------------------------------------------------------


def _shutdown(llm) -> None:
    from vllm.distributed import cleanup_dist_env_and_memory

    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:
        pass
    del llm
    gc.collect()
    cleanup_dist_env_and_memory()


def _greedy(max_tokens=32):
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens)


@pytest.fixture(scope="module")
def engines(tiny_llm_kwargs):
    """(LLM with the scripted processor, reference outputs of a plain LLM).

    The plain engine runs first and is shut down before the scripted one
    starts, so only one in-process engine lives at a time. Both run torch
    on one thread (``one_torch_thread``: the tiny model is as fast on one,
    and a busy machine's other processes do not leave two spinning).
    """
    from vllm import LLM

    from vllm_seqhooks.scripted.processor import ScriptedTokensLogitsProcessor

    from tests.support.torch_threads import one_torch_thread

    with pytest.MonkeyPatch.context() as mp, one_torch_thread():
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        plain = LLM(**tiny_llm_kwargs)
        reference = [
            list(o.outputs[0].token_ids)
            for o in plain.generate(PROMPTS, _greedy(), use_tqdm=False)
        ]
        _shutdown(plain)
        llm = LLM(**tiny_llm_kwargs, logits_processors=[ScriptedTokensLogitsProcessor])
        yield llm, reference
        _shutdown(llm)


def _gen(llm, prompts, params):
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [o.outputs[0] for o in outs]


def test_greedy_deterministic_and_varied(engines):
    llm, reference = engines
    first = [list(o.token_ids) for o in _gen(llm, PROMPTS, _greedy())]
    second = [list(o.token_ids) for o in _gen(llm, PROMPTS, _greedy())]
    assert first == second
    assert len({tuple(t) for t in first}) == len(PROMPTS)  # vary across prompts
    for ids in first:
        assert len(ids) == 32
        assert len(set(ids)) >= 4, ids  # not one token forever
        # The random model never emits special / hook / padding ids itself.
        assert all(len(FIXED_TOKENS) <= t < TOKENIZER_SIZE for t in ids), ids


def test_sampling_never_emits_special_tokens(engines):
    from vllm import SamplingParams

    llm, _ = engines
    outs = _gen(llm, PROMPTS, SamplingParams(temperature=1.0, max_tokens=64, seed=1))
    ids = [t for o in outs for t in o.token_ids]
    assert all(len(FIXED_TOKENS) <= t < TOKENIZER_SIZE for t in ids)
    assert len(set(ids)) > 20


def test_unscripted_request_unaffected(engines):
    from vllm_seqhooks.scripted.processor import scripted_params

    llm, reference = engines
    # Alone ...
    assert [list(o.token_ids) for o in _gen(llm, PROMPTS, _greedy())] == reference
    # ... and batched with scripted requests.
    params = [
        _greedy() if i % 2 else scripted_params([40 + i, 50 + i])
        for i in range(len(PROMPTS))
    ]
    outs = _gen(llm, PROMPTS, params)
    for i, o in enumerate(outs):
        if i % 2:
            assert list(o.token_ids) == reference[i]
        else:
            assert list(o.token_ids) == [40 + i, 50 + i, EOS_ID]


def test_script_forcing_then_eos(engines):
    from vllm_seqhooks.scripted.processor import encode_script, scripted_params

    llm, _ = engines
    script = encode_script(llm.get_tokenizer(), "ab<promise>xy</promise>c<sync>d")
    (out,) = _gen(llm, ["hi"], scripted_params(script))
    assert list(out.token_ids) == script + [EOS_ID]
    assert out.finish_reason == "stop"


def test_hook_tokens_visible_in_vllm_text(engines):
    """Hook tokens are not special: vLLM's default skip_special_tokens=True
    keeps them in the text (marked special they would vanish)."""
    from vllm_seqhooks.scripted.processor import encode_script, scripted_params

    llm, _ = engines
    text = "ab<promise>xy</promise>c<sync>d"
    script = encode_script(llm.get_tokenizer(), text)
    for kwargs in ({}, {"skip_special_tokens": False}):
        (out,) = _gen(llm, ["hi"], scripted_params(script, **kwargs))
        assert out.text == text


def test_script_with_sampling_and_custom_stop(engines):
    from vllm_seqhooks.scripted.processor import scripted_params

    llm, _ = engines
    (out,) = _gen(
        llm,
        ["hi"],
        scripted_params([40, 41, 42], eos_token_id=SYNC_ID, temperature=1.0, seed=3),
    )
    assert list(out.token_ids) == [40, 41, 42, SYNC_ID]
    assert out.finish_reason == "stop"


def test_script_end_free(engines):
    from vllm_seqhooks.scripted.processor import scripted_params

    llm, _ = engines
    params = scripted_params([PROMISE_ID, 40], end="free", max_tokens=12)
    (out,) = _gen(llm, ["hi"], params)
    ids = list(out.token_ids)
    assert ids[:2] == [PROMISE_ID, 40] and len(ids) == 12
    assert all(len(FIXED_TOKENS) <= t for t in ids[2:])
    assert out.finish_reason == "length"


def test_sampled_before_offset(engines):
    from vllm_seqhooks.scripted.processor import scripted_params

    llm, _ = engines
    (out,) = _gen(llm, ["hi"], scripted_params([40, 41, 42, 43], sampled_before=2))
    assert list(out.token_ids) == [42, 43, EOS_ID]
    (out,) = _gen(llm, ["hi"], scripted_params([40, 41], sampled_before=5))
    assert list(out.token_ids) == [EOS_ID]


def test_two_scripts_in_one_batch(engines):
    from vllm_seqhooks.scripted.processor import scripted_params

    llm, _ = engines
    outs = _gen(
        llm,
        ["hi", "hello there", "x"],
        [
            scripted_params([40, PROMISE_ID, 41, PROMISE_END_ID, SYNC_ID]),
            scripted_params([50, 51, 52, 53, 54, 55, 56, 57]),
            scripted_params([]),
        ],
    )
    assert list(outs[0].token_ids) == [
        *[40, PROMISE_ID, 41, PROMISE_END_ID, SYNC_ID],
        EOS_ID,
    ]
    assert list(outs[1].token_ids) == [50, 51, 52, 53, 54, 55, 56, 57, EOS_ID]
    assert list(outs[2].token_ids) == [EOS_ID]


def test_child_key_scripts_in_engine(engines):
    """Requests that look like scheduler-made children pick their script."""
    from vllm import SamplingParams

    from vllm_seqhooks.scripted.processor import scripted_params

    llm, reference = engines
    parent = scripted_params(
        [40],
        child_scripts={"0": [60, 61], "0.1": [62]},
        child_default_script=[63],
        max_tokens=32,
    )

    def child(key, **more):
        extra = {**parent.extra_args, "seqhooks_child_key": key, **more}
        return SamplingParams(temperature=0.0, max_tokens=32, extra_args=extra)

    outs = _gen(
        llm,
        PROMPTS[:4],
        [parent, child("0"), child("0.1"), child("5")],
    )
    assert [list(o.token_ids) for o in outs] == [
        [40, EOS_ID],
        [60, 61, EOS_ID],
        [62, EOS_ID],
        [63, EOS_ID],
    ]
    # No entry and no default: the child runs free.
    no_default = {
        k: v
        for k, v in parent.extra_args.items()
        if k != "seqhooks_child_default_script"
    }
    free = SamplingParams(
        temperature=0.0,
        max_tokens=32,
        extra_args={**no_default, "seqhooks_child_key": "3"},
    )
    (out,) = _gen(llm, [PROMPTS[0]], free)
    assert list(out.token_ids) == reference[0]


def test_chat(engines):
    llm, _ = engines
    (out,) = llm.chat(
        [{"role": "user", "content": "hi"}], _greedy(max_tokens=4), use_tqdm=False
    )
    tok = llm.get_tokenizer()
    assert out.prompt_token_ids == tok.encode("user: hi\nassistant: ")
    assert out.prompt_token_ids[0] == BOS_ID
    assert len(out.outputs[0].token_ids) == 4


# --------------------------------------------------------------------------
# Multiprocess engine, processor given by its qualified name
# --------------------------------------------------------------------------


def test_multiprocess_engine_with_fqcn(engines, tiny_llm_kwargs):
    from vllm import LLM, SamplingParams
    from vllm.exceptions import VLLMValidationError

    from vllm_seqhooks.scripted.processor import (
        SCRIPTED_LOGITS_PROCESSOR_FQCN,
        scripted_params,
    )

    _, reference = engines
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
        # The engine process must import vllm_seqhooks.
        path = os.environ.get("PYTHONPATH", "")
        mp.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(REPO_ROOT), path) if p))
        llm = LLM(**tiny_llm_kwargs, logits_processors=[SCRIPTED_LOGITS_PROCESSOR_FQCN])
        try:
            outs = _gen(
                llm,
                PROMPTS[:3],
                [
                    scripted_params([40, SYNC_ID, 41]),
                    _greedy(),
                    scripted_params(
                        None,
                        child_scripts={"1": [70]},
                        extra_args={"seqhooks_child_key": "1"},
                    ),
                ],
            )
            assert list(outs[0].token_ids) == [40, SYNC_ID, 41, EOS_ID]
            assert list(outs[1].token_ids) == reference[1]
            assert list(outs[2].token_ids) == [70, EOS_ID]
            # validate_params runs at admission: a bad script fails the request.
            bad = SamplingParams(extra_args={"seqhooks_script_end": "stop"})
            with pytest.raises(VLLMValidationError, match="seqhooks_script_end"):
                llm.generate(["x"], bad, use_tqdm=False)
        finally:
            _shutdown(llm)


def test_stale_cpu_tp_segments_are_removed_and_mapped_ones_kept(tmp_path):
    from tests.support.cpu_shm import remove_stale_cpu_shm

    shm = tmp_path / "shm"
    shm.mkdir()
    for name in ("4242-tp:0-[0-1]-cpushm_0", "4242-tp:0-[0-1]-cpushm_1",
                 "5151-tp:0-[0-1]-cpushm_0", "other-segment"):
        (shm / name).write_bytes(b"x")
    proc = tmp_path / "proc"
    (proc / "77").mkdir(parents=True)
    (proc / "77" / "maps").write_text(
        "7f00-7f01 rw-s 00000000 00:1a 12 /usr/lib/libc.so.6\n"
        f"7f02-7f03 rw-s 00000000 00:1a 13 {shm / '4242-tp:0-[0-1]-cpushm_1'}\n"
        f"7f04-7f05 rw-s 00000000 00:1a 14 {shm / '5151-tp:0-[0-1]-cpushm_0'} (deleted)\n")
    (proc / "self-not-a-pid").mkdir()
    removed = remove_stale_cpu_shm(shm, proc)
    assert removed == ["4242-tp:0-[0-1]-cpushm_0"]
    assert sorted(p.name for p in shm.iterdir()) == [
        "4242-tp:0-[0-1]-cpushm_1", "5151-tp:0-[0-1]-cpushm_0", "other-segment"]


def test_each_vllm_release_has_its_own_vllm_cache_whatever_xdg_cache_home(tmp_path):
    """vLLM 0.32 and 0.33 cannot read each other's model-info cache entry,
    and the suite runs both at once (tests/support/vllm_cache.py): every
    process a test starts gets this release's own ``VLLM_CACHE_ROOT``, also
    one given a temporary ``XDG_CACHE_HOME``."""
    from importlib.metadata import version

    root = os.environ["VLLM_CACHE_ROOT"]
    assert Path(root).name == version("vllm")
    child = subprocess.run(
        [sys.executable, "-c", "import vllm.envs as e; print(e.VLLM_CACHE_ROOT)"],
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)}, capture_output=True, text=True,
        timeout=120)
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.strip().splitlines()[-1] == root
