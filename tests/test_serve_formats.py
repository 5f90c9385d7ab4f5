"""`vllm serve MODEL --seqhooks parallel-r1` (a tag format by name) on
127.0.0.1 through the openai client, with scripted tokens: completions,
streaming and chat get the merged text and the fork/join tree."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow

from tests.support.server import SCRIPTED, TINY_FLAGS, start_test_server

BEFORE = "Let me think.<Parallel>"
CHILDREN = {"0": "A is right</Path>ignored", "1": "B too"}
AFTER = "both</Summary> done"
MERGED = "<Path>A is right</Path><Path>B too</Path></Parallel>\n<Summary>"
EXPECTED = BEFORE + MERGED + AFTER


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    import os

    from vllm import envs as vllm_envs

    env = {k: v for k, v in os.environ.items()
           if not k.startswith("VLLM_") or k in vllm_envs.environment_variables}
    srv = start_test_server(tiny_model_dir, *TINY_FLAGS, "--seqhooks", "parallel-r1",
                            "--logits-processors", SCRIPTED,
                            log_path=tmp_path_factory.mktemp("serve") / "server.log", env=env)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="unused")


@pytest.fixture(scope="module")
def xargs(tiny_model_dir):
    from transformers import AutoTokenizer

    from vllm_seqhooks.scripted.processor import encode_script

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    S = lambda text: encode_script(tok, text)  # noqa: E731
    return {
        "seqhooks_script": S(BEFORE + AFTER),
        "seqhooks_script_end": "eos",
        "seqhooks_eos_token_id": 2,
        "seqhooks_child_scripts": json.dumps({k: S(v) for k, v in CHILDREN.items()}),
        "seqhooks_child_script_end": "eos",
    }


def test_completion_has_the_merged_paths_and_the_tree(client, tiny_model_dir, xargs):
    r = client.completions.create(model=tiny_model_dir, prompt="Q:", max_tokens=120,
                                  temperature=0, extra_body={"vllm_xargs": xargs})
    choice = r.choices[0]
    assert choice.text == EXPECTED
    assert choice.finish_reason == "stop"
    tree = r.model_extra["kv_transfer_params"]["seqhooks"]
    assert [c["finish_reason"] for c in tree["children"]] == ["stop", "stop"]
    assert tree["usage"]["num_children"] == 2
    assert r.usage.completion_tokens == len(EXPECTED) + 1  # a token per character, and EOS


def test_streamed_chunks_add_up(client, tiny_model_dir, xargs):
    stream = client.completions.create(model=tiny_model_dir, prompt="Q:", max_tokens=120,
                                       temperature=0, stream=True,
                                       extra_body={"vllm_xargs": xargs})
    chunks = [c.choices[0].text for c in stream if c.choices]
    assert "".join(chunks) == EXPECTED
    # The merge arrives whole, in one chunk (vLLM may join it with its
    # neighbours when the client reads slower than the engine).
    assert any(MERGED in c for c in chunks), chunks


def test_chat_completion(client, tiny_model_dir, xargs):
    r = client.chat.completions.create(
        model=tiny_model_dir, messages=[{"role": "user", "content": "hi"}], max_tokens=120,
        temperature=0, extra_body={"vllm_xargs": xargs})
    assert r.choices[0].message.content == EXPECTED


def test_the_fork_tag_in_the_prompt_is_not_a_fork(client, tiny_model_dir):
    r = client.completions.create(model=tiny_model_dir, prompt="x<Parallel>", max_tokens=4,
                                  temperature=0)
    assert r.choices[0].finish_reason == "length"
    assert r.model_extra["kv_transfer_params"] is None or not r.model_extra[
        "kv_transfer_params"].get("seqhooks", {}).get("children")
