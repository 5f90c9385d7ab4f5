"""A seeded request whose prefill spans several steps (vLLM 0.32's V1 CPU
runner rewinds its generator by an offset CPU generators lack, and fails
the step: engine/vllm_private/cpu_seeds.py). With hooks, children of a
seeded request are seeded and their prompts hold the parent's context,
and a join's merge is prefilled too: a seeded family whose prompts are
split gives the same tokens as one whose prompts fit in a step."""

from __future__ import annotations

import gc

import pytest

pytestmark = pytest.mark.slow


def _families(model: str, budget: int, seeds) -> list[tuple[list[int], list[list[int]]]]:
    """For each seed, one family on an engine with step budget ``budget``:
    the parent's output and its children's."""
    from vllm_seqhooks import get_hook_trace
    from tests.support.forkjoin import Scripts, hook_llm

    llm = hook_llm(model, max_num_batched_tokens=budget, max_model_len=1024,
                   enable_prefix_caching=False)
    S = Scripts(llm.get_tokenizer())
    prompt = S("a long question " * 12)  # 192 tokens: 3+ steps at 64
    got = []
    for seed in seeds:
        params = S.params("<promise>ab</promise><promise>cd</promise><sync>",
                          {"0": "", "1": ""}, end="free", child_end="free",
                          temperature=1.0, seed=seed, max_tokens=60)
        (out,) = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
        trace = get_hook_trace(out)
        got.append((list(out.outputs[0].token_ids),
                    [list(c["output_token_ids"]) for c in trace["children"]]))
    del llm
    gc.collect()
    return got


def test_seeded_family_with_split_prefills(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    (split,) = _families(tiny_model_dir, 64, [11])
    whole, other = _families(tiny_model_dir, 2048, [11, 12])
    assert split == whole
    output, children = split
    assert len(children) == 2 and all(children)
    assert children[0] != children[1]  # each child its own seed
    assert other[0] != output
