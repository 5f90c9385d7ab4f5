"""`vllm serve` with the hook flags, on 127.0.0.1, through the openai client."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

pytestmark = pytest.mark.slow

from tests.support.server import (
    SCRIPTED,
    TINY_FLAGS,
    metric,
    scrape,
    start_test_server,
    vllm_command,
)

VLLM = vllm_command()
COMMON = TINY_FLAGS


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    import os

    from vllm import envs as vllm_envs

    log_path = tmp_path_factory.mktemp("serve") / "server.log"
    # vLLM's CPU worker sets VLLM_DIST_IDENT in its process's environment,
    # which is this one for the in-process engines of earlier tests, and its
    # own check calls that variable unknown: leave such leftovers out
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("VLLM_") or k in vllm_envs.environment_variables}
    srv = start_test_server(tiny_model_dir, *COMMON, "--sync-token", "<sync>",
                            "--promise-token-id", "4", "--promise-end-token", "</promise>",
                            "--logits-processors", SCRIPTED,
                            # vLLM refuses unknown VLLM_* environment variables
                            # with this flag: the plugin must not introduce any
                            "--fail-on-environ-validation", log_path=log_path, env=env)
    try:
        yield srv.url, log_path
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server[0] + "/v1", api_key="unused")


@pytest.fixture(scope="module")
def S(tiny_model_dir):
    from transformers import AutoTokenizer

    from vllm_seqhooks.scripted.processor import encode_script

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    return lambda text: encode_script(tok, text)


def xargs(S, script, children):
    return {
        "seqhooks_script": S(script),
        "seqhooks_script_end": "eos",
        "seqhooks_eos_token_id": 2,
        "seqhooks_child_scripts": json.dumps({k: S(v) for k, v in children.items()}),
        "seqhooks_child_script_end": "eos",
    }


SCRIPT = "ab<promise>xy</promise><promise>zw</promise>c<sync>done"
CHILDREN = {"0": "AAA", "1": "BBBB"}
EXPECTED = "ab<promise>xy</promise><promise>zw</promise>c<sync>AAA\nBBBBdone"


def complete(client, model, vllm_xargs):
    """The scripted completion of "hello" (60 tokens, greedy): its choice
    and its fork/join trace."""
    r = client.completions.create(model=model, prompt="hello", max_tokens=60,
                                  temperature=0, extra_body={"vllm_xargs": vllm_xargs})
    return r.choices[0], r.model_extra["kv_transfer_params"]["seqhooks"]


def test_completion_has_merged_text_and_trace(client, tiny_model_dir, S):
    r = client.completions.create(model=tiny_model_dir, prompt="hello", max_tokens=60,
                                  temperature=0,
                                  extra_body={"vllm_xargs": xargs(S, SCRIPT, CHILDREN)})
    choice = r.choices[0]
    assert choice.text == EXPECTED
    assert choice.finish_reason == "stop"
    trace = r.model_extra["kv_transfer_params"]["seqhooks"]
    assert [c["output_token_ids"] for c in trace["children"]] == [S("AAA"), S("BBBB")]


def test_streamed_chunks_add_up_to_the_final_text(client, tiny_model_dir, S):
    stream = client.completions.create(model=tiny_model_dir, prompt="hello", max_tokens=60,
                                       temperature=0, stream=True,
                                       extra_body={"vllm_xargs": xargs(S, SCRIPT, CHILDREN)})
    chunks = [c.choices[0].text for c in stream if c.choices]
    assert "".join(chunks) == EXPECTED
    # the merged children arrive together, in one chunk (vLLM may join it
    # with its neighbours when the client reads slower than the engine)
    assert any("AAA\nBBBB" in c for c in chunks), chunks


def test_a_streamed_completion_carries_its_trace_where_vllm_streams_it(client, tiny_model_dir,
                                                                       S):
    """vLLM 0.33 streams a completion's ``kv_transfer_params`` on its final
    chunk: the hook trace reaches streaming clients there. vLLM 0.32 streams
    no ``kv_transfer_params`` (the trace needs a non-streamed request)."""
    from vllm_seqhooks.engine.vllm_private.releases import installed

    stream = client.completions.create(model=tiny_model_dir, prompt="hello", max_tokens=60,
                                       temperature=0, stream=True,
                                       extra_body={"vllm_xargs": xargs(S, SCRIPT, CHILDREN)})
    chunks = list(stream)
    params = [c.model_extra.get("kv_transfer_params") for c in chunks]
    traces = [p["seqhooks"] for p in params if p and "seqhooks" in p]
    if not installed().streams_kv_transfer_params:
        assert traces == []
        return
    (trace,) = traces
    assert params[-1] is not None and "seqhooks" in params[-1]  # (the final chunk)
    assert [c["output_token_ids"] for c in trace["children"]] == [S("AAA"), S("BBBB")]


def test_chat_completion(client, tiny_model_dir, S):
    r = client.chat.completions.create(
        model=tiny_model_dir, messages=[{"role": "user", "content": "hi"}],
        max_tokens=40, temperature=0,
        extra_body={"vllm_xargs": xargs(S, "<promise>q</promise><sync>!", {"0": "Z"})})
    assert r.choices[0].message.content == "<promise>q</promise><sync>Z!"
    # chat logprobs: a row per token of the merged text, the separator 0.0
    r = client.chat.completions.create(
        model=tiny_model_dir, messages=[{"role": "user", "content": "hi"}],
        max_tokens=40, temperature=0, logprobs=True, top_logprobs=1,
        extra_body={"vllm_xargs": xargs(S, "<promise>q</promise><promise>r</promise><sync>!",
                                        {"0": "Z", "1": "Y"})})
    rows = r.choices[0].logprobs.content
    assert "".join(t.token for t in rows) == "<promise>q</promise><promise>r</promise><sync>Z\nY!</s>"
    assert [t.logprob for t in rows if t.token == "\n"] == [0.0]  # inserted
    assert all(t.logprob < 0.0 and len(t.top_logprobs) == 1 for t in rows if t.token != "\n")


def test_plain_request_is_untouched(client, tiny_model_dir):
    r = client.completions.create(model=tiny_model_dir, prompt="hello", max_tokens=8,
                                  temperature=0)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 8


def test_metrics_count_forks_and_joins(server, client, tiny_model_dir, S):
    url = server[0]
    before = scrape(url)
    client.completions.create(model=tiny_model_dir, prompt="m", max_tokens=60, temperature=0,
                              extra_body={"vllm_xargs": xargs(S, SCRIPT, CHILDREN)})
    deadline = time.time() + 10
    while True:
        after = scrape(url)
        if metric(after, "vllm:seqhooks_joins_total") > metric(before, "vllm:seqhooks_joins_total"):
            break
        assert time.time() < deadline, "metrics did not move"
        time.sleep(0.3)
    delta = lambda n: metric(after, n) - metric(before, n)  # noqa: E731
    assert delta("vllm:seqhooks_children_spawned_total") == 2
    assert delta("vllm:seqhooks_joins_total") == 1
    assert delta("vllm:seqhooks_merged_tokens_total") == len(S("AAA\nBBBB"))
    assert delta("vllm:seqhooks_join_prefill_tokens_total") == len(S("AAA\nBBBB")) + 1
    assert metric(after, "vllm:seqhooks_park_time_seconds_count") >= 1
    assert metric(after, "vllm:seqhooks_open_children") == 0
    assert metric(after, "vllm:seqhooks_parked_requests") == 0
    ended = {k: v for k, v in after.items() if k.startswith("vllm:seqhooks_children_ended_total")}
    assert any('outcome="finished"' in k for k in ended)


def test_client_disconnect_aborts_the_family(server, tiny_model_dir, S):
    """A streaming client that goes away mid-stream: the parent and its
    children are aborted, nothing stays parked or allocated."""
    import requests

    url = server[0]
    body = {
        "model": tiny_model_dir, "prompt": "bye", "max_tokens": 400, "temperature": 0,
        "stream": True,
        "vllm_xargs": {
            "seqhooks_script": S("<promise>a</promise><promise>b</promise><sync>"),
            "seqhooks_script_end": "free",
            # children are forced to write long outputs (never EOS) on a
            # slowed model (50 ms a step): the family stays parked for ~45 s
            # on any machine, longer than the clean-up deadline below, so
            # only the abort can end it in time
            "seqhooks_child_default_script": S("x") * 900,
            "seqhooks_child_max_tokens": 900,
            "seqhooks_step_delay_ms": 50,
        },
    }
    with requests.post(url + "/v1/completions", json=body, stream=True, timeout=60) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        got = 0
        for line in lines:
            if line.startswith(b"data: ") and b"<sync>" in line:
                break
            got += 1
            assert got < 100
        # wait until the parent is parked with its two children running
        deadline = time.time() + 30
        while metric(scrape(url), "vllm:seqhooks_parked_requests") < 1:
            assert time.time() < deadline, "parent never parked"
            time.sleep(0.2)
    # connection closed: vLLM aborts the request; the subtree must go too
    deadline = time.time() + 30
    while True:
        m = scrape(url)
        if (metric(m, "vllm:seqhooks_parked_requests") == 0
                and metric(m, "vllm:seqhooks_open_children") == 0
                and metric(m, "vllm:num_requests_running") == 0
                and metric(m, "vllm:num_requests_waiting") == 0
                and metric(m, "vllm:kv_cache_usage_perc") == 0):
            break
        assert time.time() < deadline, {k: v for k, v in m.items() if "seqhooks" in k or "num_requests" in k or "kv_cache_usage" in k}
        time.sleep(0.3)
    assert metric(m, 'vllm:seqhooks_children_ended_total') >= 2


def test_per_request_control_and_bad_values(client, tiny_model_dir, S):
    import openai

    base = xargs(S, SCRIPT, CHILDREN)
    off = client.completions.create(model=tiny_model_dir, prompt="hello", max_tokens=60,
                                    temperature=0,
                                    extra_body={"vllm_xargs": {**base, "seqhooks_enabled": False}})
    assert off.choices[0].text == "ab<promise>xy</promise><promise>zw</promise>c<sync>done"
    sep = client.completions.create(
        model=tiny_model_dir, prompt="hello", max_tokens=60, temperature=0,
        extra_body={"vllm_xargs": {**base, "seqhooks_merge_separator": " | "}})
    assert sep.choices[0].text == EXPECTED.replace("AAA\nBBBB", "AAA | BBBB")
    for bad, field in [({"seqhooks_child_max_tokens": 0}, "seqhooks_child_max_tokens"),
                       ({"seqhooks_max_child_depth": -1}, "seqhooks_max_child_depth"),
                       ({"seqhooks_enabled": "sometimes"}, "seqhooks_enabled"),
                       ({"seqhooks_child_max_token": 4},  # a typo: refused, not ignored
                        "unknown sequence-hook request key.*'seqhooks_child_max_token' "
                        r"\(did you mean 'seqhooks_child_max_tokens'\?\)")]:
        with pytest.raises(openai.BadRequestError, match=field):
            client.completions.create(model=tiny_model_dir, prompt="x", max_tokens=5,
                                      extra_body={"vllm_xargs": {**base, **bad}})
    with pytest.raises(openai.BadRequestError, match="prompt_logprobs"):
        client.completions.create(model=tiny_model_dir, prompt="x", max_tokens=5,
                                  extra_body={"prompt_logprobs": 1})
    # the server keeps serving
    ok = client.completions.create(model=tiny_model_dir, prompt="hello", max_tokens=60,
                                   temperature=0, extra_body={"vllm_xargs": base})
    assert ok.choices[0].text == EXPECTED


def test_usage_counts_merged_tokens_as_completion_tokens(client, tiny_model_dir, S):
    r = client.completions.create(model=tiny_model_dir, prompt="hello", max_tokens=60,
                                  temperature=0,
                                  extra_body={"vllm_xargs": xargs(S, SCRIPT, CHILDREN)})
    usage = r.model_extra["kv_transfer_params"]["seqhooks"]["usage"]
    sampled = len(S(SCRIPT)) + 1  # the parent's own tokens, EOS included
    assert r.usage.completion_tokens == sampled + usage["merged_tokens"]
    assert usage["children_sampled_tokens"] == len(S("AAA")) + 1 + len(S("BBBB")) + 1


BAD_FLAGS = [
    (["--sync-token-id", "6", "--promise-token-id", "6"],
     "--promise-token-id and --sync-token-id must differ"),
    (["--sync-token-id", "-1", "--promise-token-id", "4"],
     "argument --sync-token-id: expected an integer >= 0"),
    (["--sync-token", "<snyc>", "--promise-token-id", "4"],
     "--sync-token '<snyc>' is not a single token"),
    (["--sync-token-id", "6", "--promise-token-id", "4000"],
     "--promise-token-id 4000 is outside the model's vocabulary"),
    (["--sync-token-id", "6", "--promise-token-id", "4", "--merge-strategy", "zip"],
     "argument --merge-strategy: invalid choice"),
]
HELP = ["serve", "--help=Sequence hooks (vllm-seqhooks)"]


@pytest.fixture(scope="module")
def cli_results(tiny_model_dir):
    """What ``vllm serve`` with each of BAD_FLAGS, and ``vllm serve
    --help=...``, did: the console script's ``main()`` in forks of one
    process that imported vLLM once (:mod:`tests.support.cli_forks`; six
    fresh ``vllm`` processes cost six vLLM imports, about 30 s here)."""
    from tests.support.cli_forks import run_vllm_commands

    commands = [["serve", tiny_model_dir, *COMMON, *flags] for flags, _ in BAD_FLAGS] + [HELP]
    return {r.args: r for r in run_vllm_commands(VLLM, commands)}


@pytest.mark.parametrize("flags, message", BAD_FLAGS)
def test_bad_flag_values_exit_with_a_clear_message(cli_results, tiny_model_dir, flags, message):
    r = cli_results[("serve", tiny_model_dir, *COMMON, *flags)]
    assert r.returncode == 2, r.stderr[-2000:]
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_help_lists_the_hook_flags(cli_results):
    r = cli_results[tuple(HELP)]
    assert r.returncode == 0, r.stderr[-2000:]
    for flag in ("--sync-token-id", "--promise-token-id", "--promise-end-token-id",
                 "--sync-token", "--child-context", "--merge-strategy",
                 "--max-child-depth", "--max-children-per-request", "--child-max-tokens",
                 "--family-token-factor", "--max-descendants",
                 "--max-live-children-per-family", "--max-live-children", "--child-timeout",
                 "--family-timeout", "--fair-share"):
        assert flag in r.stdout


def test_small_load_all_correct_and_drained(server, tiny_model_dir, S):
    """A small version of benchmarks/serve_load.py: concurrent streaming
    requests with hooks, every text exact, nothing left afterwards."""
    import asyncio

    from benchmarks.serve_load import run_load, wait_drained

    result = asyncio.run(run_load(server[0], tiny_model_dir, S, requests=40, concurrency=40,
                                  timeout_s=300))
    assert result["errors"] == 0, result["first_errors"]
    assert result["ok"] == 40
    assert not any(wait_drained(server[0]).values())


def test_example_client_runs(server):
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parents[1] / "examples" / "openai_client.py"
    r = subprocess.run([sys.executable, str(example), "--url", server[0], "--scripted-tiny"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    merged = "Plan:<promise>flights</promise><promise>hotel</promise><sync>Flight AB12\nHotel Rose Done."
    assert merged in r.stdout
    assert "join of ['0', '1']" in r.stdout
    # payloads and outputs as text, as in-process (the trace itself carries ids)
    assert "payload='flights' -> 'Flight AB12'" in r.stdout, r.stdout


def test_training_rows_from_an_http_completion(client, tiny_model_dir, S):
    """``vllm_seqhooks.rollout`` reads the openai client's completion (asked
    with ``return_token_ids``): each child's tokens under its node, the
    merge separator inserted, the parent's own tokens sampled."""
    from transformers import AutoTokenizer

    from vllm_seqhooks import rollout

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    r = client.completions.create(
        model=tiny_model_dir, prompt="hello", max_tokens=60, temperature=0,
        extra_body={"return_token_ids": True, "vllm_xargs": xargs(S, SCRIPT, CHILDREN)})
    assert r.choices[0].text == EXPECTED
    (row,) = rollout.training_rows(r)
    by = lambda key, m: tok.decode([t for t, n, k in zip(  # noqa: E731
        row["response_ids"], row["node_ids"], row["response_mask"]) if n == key and k == m])
    assert (by("0", 1), by("1", 1), by("", 0)) == ("AAA", "BBBB", "\n")
    calls = rollout.per_call_rows(r)
    assert [c["node_id"] for c in calls] == ["", "0", "1", ""]  # (a client loop's call order)
    assert calls[0]["context_ids"] == row["prompt_ids"]
    assert {c["base_id"] for c in calls} == {r.id}
    with pytest.raises(ValueError, match="return_token_ids"):
        rollout.training_rows(client.completions.create(
            model=tiny_model_dir, prompt="hello", max_tokens=60, temperature=0,
            extra_body={"vllm_xargs": xargs(S, SCRIPT, CHILDREN)}))


def test_logprobs_with_hooks_over_http(client, tiny_model_dir, S):
    """Completions with ``logprobs``, whole and streamed: a row per token of
    the merged text; the separator the engine inserted says 0.0."""
    body = {"vllm_xargs": xargs(S, SCRIPT, CHILDREN)}
    r = client.completions.create(model=tiny_model_dir, prompt="hello", max_tokens=60,
                                  temperature=0, logprobs=1, extra_body=body)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == EXPECTED + "</s>"  # (the EOS has its row too)
    assert len(lp.token_logprobs) == len(lp.tokens)
    assert lp.token_logprobs[lp.tokens.index("\n")] == 0.0  # inserted
    from vllm_seqhooks import rollout

    r = client.completions.create(model=tiny_model_dir, prompt="hello", max_tokens=60,
                                  temperature=0, logprobs=0,
                                  extra_body={**body, "return_token_ids": True})
    (row,) = rollout.training_rows(r)
    lps = r.choices[0].logprobs.token_logprobs
    assert row["rollout_logprobs"] == [lp if m else None
                                       for lp, m in zip(lps, row["response_mask"])]
    assert row["response_mask"].count(0) == 1  # the separator
    calls = rollout.per_call_rows(r)
    assert [len(c["rollout_logprobs"]) for c in calls] == [len(c["response_ids"]) for c in calls]
    streamed = []
    for chunk in client.completions.create(model=tiny_model_dir, prompt="hello",
                                           max_tokens=60, temperature=0, logprobs=1,
                                           stream=True, extra_body=body):
        if chunk.choices and chunk.choices[0].logprobs:
            streamed += chunk.choices[0].logprobs.token_logprobs
    assert streamed == lp.token_logprobs


def test_n_and_stop_strings(client, tiny_model_dir, S):
    # (stock vLLM wants n=1 with greedy sampling; the script forces the tokens)
    from vllm_seqhooks import rollout
    from vllm_seqhooks.core.trace import TRACES_KEY

    r = client.completions.create(model=tiny_model_dir, prompt="hello", max_tokens=60,
                                  temperature=1.0, seed=7, n=2,
                                  extra_body={"vllm_xargs": xargs(S, SCRIPT, CHILDREN),
                                              "return_token_ids": True})
    assert [c.text for c in r.choices] == [EXPECTED, EXPECTED]
    # each sample is its own family: one trace per choice, one training row each
    traces = r.model_extra["kv_transfer_params"][TRACES_KEY]
    assert [t["request_id"].split("_")[0] for t in traces] == ["0", "1"]
    rows = rollout.training_rows(r)
    assert [row["response_ids"] for row in rows] == [c.token_ids for c in r.choices]
    assert all(0 in row["response_mask"] for row in rows)  # the inserted separator
    # a group in which no sample forks has rows too (and no trace at all)
    r = client.completions.create(model=tiny_model_dir, prompt="hello", max_tokens=60,
                                  temperature=1.0, seed=7, n=8,
                                  extra_body={"vllm_xargs": xargs(S, "no hooks here", {}),
                                              "return_token_ids": True})
    rows = rollout.training_rows(r)
    assert [row["response_ids"] for row in rows] == [c.token_ids for c in r.choices]
    assert all(set(row["response_mask"]) == {1} for row in rows) and len(rows) == 8
    assert len(rollout.per_call_rows(r)) == 8
    # a stop string is matched by vLLM's frontend on the parent's merged text
    r = client.completions.create(model=tiny_model_dir, prompt="hello", max_tokens=60,
                                  temperature=0, stop=["BBBB"],
                                  extra_body={"vllm_xargs": xargs(S, SCRIPT, CHILDREN)})
    assert r.choices[0].text == EXPECTED.split("BBBB")[0]
    assert r.choices[0].finish_reason == "stop"


# ------------------------------------------------------------ adversarial
def _bad_values(kind):
    """Values a per-request key of this kind must refuse (raw JSON text)."""
    common = ['[1, 2]', '{"a": 1}', 'NaN', 'null']
    if kind == "bool":
        return ['"maybe"', '2', *common]
    if kind == "text":
        return ['5', '1.5', *common]
    if kind == "seconds":
        return ['"soon"', '0', '-1', 'Infinity', '-Infinity', *common]
    # (JSON true reaches an integer key as 1: vLLM's request model coerces it)
    return ['"12"', '1.5', '-1', '-1e308', *common]


def _post_raw(url, body_text):
    import requests

    return requests.post(url + "/v1/completions", data=body_text,
                         headers={"Content-Type": "application/json"}, timeout=120)


def test_adversarial_request_values_answer_400_and_serving_goes_on(server, client,
                                                                    tiny_model_dir, S):
    """Every per-request key with wrong types, below its minimum, NaN,
    infinities, null, lists and nested objects: HTTP 400 (naming the key
    when the value reaches our validation), the server keeps serving and
    nothing leaks."""
    from benchmarks.serve_load import wait_drained
    from vllm_seqhooks.config.request_keys import REQUEST_OVERRIDE_KEYS

    url = server[0]
    tried = 0
    for key, check in REQUEST_OVERRIDE_KEYS.items():
        kind, minimum = check.kind, getattr(check, "minimum", None)
        for raw in _bad_values(kind):
            if kind == "int" and raw == "-1" and minimum == 0:
                raw = "-2"
            body = (f'{{"model": {json.dumps(tiny_model_dir)}, "prompt": "x", '
                    f'"max_tokens": 4, "vllm_xargs": {{"{key}": {raw}}}}}')
            r = _post_raw(url, body)
            tried += 1
            assert r.status_code == 400, (key, raw, r.status_code, r.text[:300])
            if raw not in ('{"a": 1}', 'null'):
                # pydantic refuses nested objects and null before us
                assert key in r.text, (key, raw, r.text[:300])
    assert tried >= 55
    # Past 64 bits vLLM itself refuses the value (a clear 400).
    import openai

    with pytest.raises(openai.BadRequestError, match="integers must be between"):
        client.completions.create(model=tiny_model_dir, prompt="x", max_tokens=4,
                                  extra_body={"vllm_xargs": {"seqhooks_max_descendants": 10**30}})
    # Huge integers are accepted: they are lowered to the server's limits.
    huge = {k: 2**62 for k, m in REQUEST_OVERRIDE_KEYS.items() if m.kind == "int"}
    ok = client.completions.create(model=tiny_model_dir, prompt="hello", max_tokens=60,
                                   temperature=0,
                                   extra_body={"vllm_xargs": {**xargs(S, SCRIPT, CHILDREN),
                                                              **huge}})
    assert ok.choices[0].text == EXPECTED
    assert not any(wait_drained(url).values())


def test_best_of_and_hook_tokens_in_the_prompt(server, client, tiny_model_dir, S):
    # Hook tokens in the prompt are text: only sampled tokens drive hooks.
    r = client.completions.create(
        model=tiny_model_dir, prompt="<promise>evil</promise><promise>x</promise><sync>",
        max_tokens=60, temperature=0, extra_body={"vllm_xargs": xargs(S, SCRIPT, CHILDREN)})
    assert r.choices[0].text == EXPECTED
    trace = r.model_extra["kv_transfer_params"]["seqhooks"]
    assert [c["key"] for c in trace["children"]] == ["0", "1"]
    # best_of: vLLM 0.32's completions API has no such field; it is answered
    # (ignored or refused) and hooks are unaffected.
    resp = _post_raw(server[0], json.dumps({
        "model": tiny_model_dir, "prompt": "hello", "max_tokens": 60, "temperature": 0,
        "best_of": 2, "n": 1, "vllm_xargs": xargs(S, SCRIPT, CHILDREN)}))
    assert resp.status_code in (200, 400), resp.text[:300]
    if resp.status_code == 200:
        assert resp.json()["choices"][0]["text"] == EXPECTED


def test_family_limits_over_http(client, tiny_model_dir, S):
    base = xargs(S, SCRIPT, CHILDREN)
    one, trace = complete(client, tiny_model_dir, {**base, "seqhooks_max_descendants": 1})
    assert len(trace["children"]) == 1
    assert [p["reason"] for p in trace["ignored_promises"]] == ["max_descendants"]
    assert one.text == "ab<promise>xy</promise><promise>zw</promise>c<sync>AAAdone"
    # A family budget of 60 (own) + 3 tokens: the children are cut at 3
    # tokens together, with finish reason length, and their text is merged.
    cut, trace = complete(client, tiny_model_dir, {**base, "seqhooks_max_family_tokens": 63})
    assert trace["limits"]["exhausted_by"] == "family_token_budget"
    assert trace["usage"]["children_sampled_tokens"] == 3
    assert {c["finish_reason"] for c in trace["children"]} == {"length"}
    assert cut.text.endswith("done")


def test_concurrent_aborts_of_families(server, client, tiny_model_dir, S):
    """Eight streaming families on a slowed model; four clients go away once
    their parent has parked: their subtrees go, the others finish exactly,
    and nothing is left allocated."""
    import threading

    import requests

    from benchmarks.serve_load import wait_drained

    url = server[0]

    def body(i):
        return {
            "model": tiny_model_dir, "prompt": f"family {i}", "max_tokens": 200,
            "temperature": 0, "stream": True,
            "vllm_xargs": {**xargs(S, SCRIPT, {"0": "A" * 40, "1": "B" * 40}),
                           "seqhooks_step_delay_ms": 20},
        }

    results = {}

    def run(i, abort):
        with requests.post(url + "/v1/completions", json=body(i), stream=True,
                           timeout=300) as r:
            text = []
            for line in r.iter_lines():
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                text.append("".join(c.get("text") or "" for c in chunk["choices"]))
                if abort and "<sync>" in "".join(text):
                    results[i] = "aborted"
                    return  # closing the connection aborts the request
            results[i] = "".join(text)

    threads = [threading.Thread(target=run, args=(i, i % 2 == 0)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    full = EXPECTED.replace("AAA\nBBBB", "A" * 40 + "\n" + "B" * 40)
    assert all(results[i] == "aborted" for i in range(0, 8, 2))
    assert all(results[i] == full for i in range(1, 8, 2)), results
    assert not any(wait_drained(url).values())
    # and the server still answers
    ok = client.completions.create(model=tiny_model_dir, prompt="hello", max_tokens=60,
                                   temperature=0, extra_body={"vllm_xargs": xargs(S, SCRIPT, CHILDREN)})
    assert ok.choices[0].text == EXPECTED


def test_deadlines_over_http(client, tiny_model_dir, S):
    """Children that would run for ~45 s on the slowed model: a 1 s child
    timeout fails them and the parent resumes; a 1 s family timeout cuts
    them and the request finishes with what it has (length)."""
    slow = {**xargs(S, SCRIPT, {}), "seqhooks_child_default_script": S("x") * 900,
            "seqhooks_child_max_tokens": 900, "seqhooks_step_delay_ms": 50}
    timed, trace = complete(client, tiny_model_dir, {**slow, "seqhooks_child_timeout_s": 1})
    assert [(c["state"], c["finish_reason"]) for c in trace["children"]] == [
        ("failed", "timeout"), ("failed", "timeout")]
    assert trace["limits"]["timed_out_children"] == 2
    # (no --failed-child-marker on this server: nothing is merged for them)
    assert timed.text == "ab<promise>xy</promise><promise>zw</promise>c<sync>\ndone"
    cut, trace = complete(client, tiny_model_dir, {**slow, "seqhooks_family_timeout_s": 1})
    assert trace["limits"]["exhausted_by"] == "family_deadline"
    assert {c["finish_reason"] for c in trace["children"]} == {"length"}
    assert cut.finish_reason == "length"
    assert not cut.text.endswith("done")
