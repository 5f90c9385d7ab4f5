"""The multiprocess serving paths: several API server processes in front of
one engine, and data parallelism (two engines); children stay on their
parent's engine, and the trace and metrics reach every frontend."""

from __future__ import annotations

import json
import time

import pytest

from vllm_seqhooks.testing.server import (
    SCRIPTED,
    TINY_FLAGS,
    TINY_HOOK_FLAGS,
    metric,
    scrape,
    start_server,
)

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("topology", [["--api-server-count", "2"],
                                      ["--data-parallel-size", "2"]],
                         ids=["2-api-servers", "data-parallel-2"])
def test_multiprocess_serving(tiny_model_dir, tmp_path, topology):
    from openai import OpenAI
    from transformers import AutoTokenizer

    from vllm_seqhooks.testing.scripted import encode_script

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    S = lambda text: encode_script(tok, text)  # noqa: E731
    srv = start_server(tiny_model_dir, *TINY_FLAGS, *TINY_HOOK_FLAGS, *topology,
                       "--logits-processors", SCRIPTED, log_path=tmp_path / "server.log")
    try:
        client = OpenAI(base_url=srv.url + "/v1", api_key="unused")
        texts = []
        for i in range(6):  # requests are spread over both frontends
            xargs = {"seqhooks_script": S(f"r{i}<promise>a</promise><promise>b</promise><sync>."),
                     "seqhooks_script_end": "eos", "seqhooks_eos_token_id": 2,
                     "seqhooks_child_scripts": json.dumps({"0": S(f"x{i}"), "1": S(f"y{i}")}),
                     "seqhooks_child_script_end": "eos"}
            r = client.completions.create(model=tiny_model_dir, prompt=f"p{i}", max_tokens=50,
                                          temperature=0, extra_body={"vllm_xargs": xargs})
            texts.append(r.choices[0].text)
            assert len(r.model_extra["kv_transfer_params"]["seqhooks"]["children"]) == 2
        assert texts == [f"r{i}<promise>a</promise><promise>b</promise><sync>x{i}\ny{i}."
                         for i in range(6)]
        deadline = time.time() + 10
        while metric(scrape(srv.url), "vllm:seqhooks_joins_total") < 6:
            assert time.time() < deadline, srv.log_tail()
            time.sleep(0.3)
        m = scrape(srv.url)
        assert metric(m, "vllm:seqhooks_children_spawned_total") == 12
        assert metric(m, "vllm:seqhooks_parked_requests") == 0
        engines = {k.split('engine="')[1].split('"')[0] for k in m
                   if k.startswith("vllm:seqhooks_joins_total{")}
        if "--data-parallel-size" in topology:
            # each engine reports its own joins: children stayed on their
            # parent's engine (a join needs every child on the same one)
            assert engines == {"0", "1"}
        else:
            assert engines == {"0"}
    finally:
        srv.stop()
