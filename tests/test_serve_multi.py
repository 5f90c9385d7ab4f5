"""The multiprocess serving paths: several API server processes in front of
the engines, and data parallelism (two engines); children stay on their
parent's engine, and the trace and metrics reach every frontend.

Longer than a minute (about 60 s on a quiet 2-core machine): each test is a
deployment of its own (docs/deployment.md's table names this file for
them), and what costs is starting its processes, each importing vLLM: two
engines behind two API servers (eight processes), and a frontend with rank
0 beside a headless rank 1 (two ``vllm serve`` commands). No server can
serve both; the requests themselves take about a second.

One engine behind two API servers (``--api-server-count 2`` alone, five
processes) was a deployment of its own until 2026-12-08, with the same
requests and checks. The data-parallel deployment runs two API servers too
(checked by their process titles), each a client of both engines: the same
frontends, metrics across processes and outputs routed back by the
request's ``client_index`` (children take their parent's), with one engine
more; a start-up of five processes fewer."""

from __future__ import annotations

import json
import time

import pytest

from tests.support.server import (
    SCRIPTED,
    TINY_FLAGS,
    TINY_HOOK_FLAGS,
    metric,
    scrape,
    start_server,
)

pytestmark = pytest.mark.slow


def test_multiprocess_serving(tiny_model_dir, tmp_path):
    """Two API servers in front of two data-parallel engines (vLLM's
    default API server count for ``--data-parallel-size 2``, given here
    explicitly): six families, each with its two children on its own engine,
    their merged texts and traces, and the joins of both engines in the
    metrics any frontend serves."""
    from openai import OpenAI
    from transformers import AutoTokenizer

    from vllm_seqhooks.scripted.processor import encode_script

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    S = lambda text: encode_script(tok, text)  # noqa: E731
    srv = start_server(tiny_model_dir, *TINY_FLAGS, *TINY_HOOK_FLAGS,
                       "--data-parallel-size", "2", "--api-server-count", "2",
                       "--logits-processors", SCRIPTED, log_path=tmp_path / "server.log")
    try:
        client = OpenAI(base_url=srv.url + "/v1", api_key="unused")
        texts = []
        for i in range(6):
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
        # each engine reports its own joins: children stayed on their
        # parent's engine (a join needs every child on the same one)
        assert engines == {"0", "1"}
        assert _api_server_titles(srv.proc.pid) == ["APIServer_0", "APIServer_1"]
    finally:
        srv.stop()


def _api_server_titles(pid: int) -> list[str]:
    """The API server processes under ``vllm serve``'s process ``pid``, by
    the titles vLLM gives them (``VLLM::APIServer_<index>``)."""
    import re

    import psutil

    titles = set()
    for proc in psutil.Process(pid).children(recursive=True):
        try:
            found = re.search(r"\bAPIServer_\d+", " ".join(proc.cmdline()))
        except psutil.Error:
            continue
        if found:
            titles.add(found.group())
    return sorted(titles)


def test_headless_data_parallel_rank(tiny_model_dir, tmp_path):
    """Data parallelism across "nodes" in vLLM's headless form: a frontend
    with engine rank 0 (``--data-parallel-size 2 --data-parallel-size-local
    1``) and a ``--headless --data-parallel-start-rank 1`` process (on a
    second node it would be the same command). Concurrent families spread
    over both ranks; each family's trace names the rank that ran it
    (``engine``), and with ``SEQHOOKS_METRICS_DIR`` on storage both processes
    see and one API server (which reads the engines' snapshots there),
    ``/metrics`` has each rank's own joins."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    from openai import OpenAI
    from transformers import AutoTokenizer

    from vllm_seqhooks.scripted.processor import encode_script
    from tests.support.server import free_port, start_server, vllm_command

    import subprocess

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    S = lambda text: encode_script(tok, text)  # noqa: E731
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    env = dict(os.environ, SEQHOOKS_METRICS_DIR=str(metrics_dir))
    dp = ["--data-parallel-size", "2", "--data-parallel-size-local", "1",
          "--data-parallel-address", "127.0.0.1", "--data-parallel-rpc-port", str(free_port())]
    flags = [*TINY_FLAGS, *TINY_HOOK_FLAGS, "--logits-processors", SCRIPTED, *dp]
    with open(tmp_path / "headless.log", "w") as log:
        headless = subprocess.Popen(
            [vllm_command(), "serve", tiny_model_dir, "--headless",
             "--data-parallel-start-rank", "1", *flags],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        srv = start_server(tiny_model_dir, *flags, "--api-server-count", "1",
                           log_path=tmp_path / "server.log", env=env)
        try:
            client = OpenAI(base_url=srv.url + "/v1", api_key="unused")

            def family(i):
                xargs = {"seqhooks_script": S(f"r{i}<promise>a</promise><sync>."),
                         "seqhooks_script_end": "eos", "seqhooks_eos_token_id": 2,
                         "seqhooks_child_scripts": json.dumps({"0": S(f"x{i}" + " y" * 20)}),
                         "seqhooks_child_script_end": "eos"}
                r = client.completions.create(model=tiny_model_dir, prompt=f"p{i}",
                                              max_tokens=60, temperature=0,
                                              extra_body={"vllm_xargs": xargs})
                return r.choices[0].text, r.model_extra["kv_transfer_params"]["seqhooks"]

            with ThreadPoolExecutor(8) as pool:
                done = list(pool.map(family, range(8)))
            assert [text for text, _ in done] == [
                f"r{i}<promise>a</promise><sync>x{i}" + " y" * 20 + "." for i in range(8)]
            ranks = [trace["engine"] for _, trace in done]
            assert set(ranks) == {"0", "1"}, ranks
            deadline = time.time() + 15
            while metric(scrape(srv.url), "vllm:seqhooks_joins_total") < 8:
                assert time.time() < deadline, srv.log_tail()
                time.sleep(0.3)
            m = scrape(srv.url)
            for rank in ("0", "1"):
                assert m[next(k for k in m if k.startswith("vllm:seqhooks_joins_total{")
                              and f'engine="{rank}"' in k)] == ranks.count(rank)
        finally:
            srv.stop()
    finally:
        if headless.poll() is None:
            os.killpg(headless.pid, 2)
            try:
                headless.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(headless.pid, 9)
                headless.wait()
