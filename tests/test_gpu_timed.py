"""The GPU-timed engine's parts that decide (benchmarks.gpu_timed): the step
model's roofline and what the worker's tracker samples and prices, step by
step, from scheduler outputs. Pure: no vLLM engine starts here (the engine
itself runs in ``python -m benchmarks.gpu_timed --smoke``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks.gpu_timed.profiles import parse_profile, step_model_for
from benchmarks.gpu_timed.step_model import Calibration, Gpu, Model, StepModel
from benchmarks.gpu_timed.tracker import RequestTracker

GPU = Gpu("test", hbm_bytes_per_s=1e12, dense_bf16_flops=100e12)
MODEL = Model("test", params=1.1e9, layers=10, hidden=1000, heads=8, kv_heads=2,
              head_dim=125, vocab=100_000, tied_embeddings=False)
EXACT = Calibration(bandwidth_efficiency=1.0, flops_efficiency=1.0, overhead_s=0.0)


def test_a_decode_step_streams_the_weights_once_and_each_context():
    sm = StepModel(GPU, MODEL, EXACT)
    kv = 2 * 10 * 2 * 125 * 2  # K and V, layers, KV heads, head dim, bf16
    assert MODEL.kv_bytes_per_token == kv
    weights = (1.1e9 - 1e8) * 2  # the input embedding table is not streamed
    one = sm.cost([(1, 100)])
    assert one.bytes == pytest.approx(weights + 101 * kv)
    assert one.seconds == pytest.approx(one.bytes / 1e12)
    many = sm.cost([(1, 100)] * 64)
    assert many.bytes == pytest.approx(weights + 64 * 101 * kv)
    assert one.seconds < many.seconds < 64 * one.seconds


def test_a_long_prefill_is_compute_bound_and_overhead_adds_per_step():
    sm = StepModel(GPU, MODEL, Calibration(0.5, 0.5, 0.002))
    chunk = sm.cost([(4096, 4096)])
    assert chunk.compute_s > chunk.memory_s
    assert chunk.seconds == pytest.approx(chunk.compute_s + 0.002)
    assert sm.cost([]).seconds == 0.0
    # Attention pairs: a chunk of 2 after 3 computed tokens sees 3+1 and 3+2.
    pairs = sm.cost([(2, 5)], sampled_rows=0).flops - 2 * MODEL.matmul_params * 2
    assert pairs == pytest.approx(4 * 10 * 8 * 125 * (4 + 5))


def test_the_h100_profiles_meet_their_calibration_point():
    # Qwen3-8B at batch 1, ~350 tokens of context: 7.28 ms measured (the page).
    assert step_model_for("h100-sxm", "qwen3-8b").seconds([(1, 350)]) == pytest.approx(
        7.28e-3, rel=0.03)
    with pytest.raises(ValueError, match="known: h100-sxm/"):
        parse_profile("h100/qwen3-8b")


class _Plan:
    def __init__(self, script, sampled_before=0):
        self.script, self.sampled_before = script, sampled_before

    def token_at(self, k):
        return self.script[k] if k < len(self.script) else None


def _out(new=(), cached=(), scheduled=None, finished=()):
    cached = list(cached)
    return SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id=r, prompt_token_ids=p, sampling_params=sp,
                                            num_computed_tokens=c) for r, p, sp, c in new],
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=[c[0] for c in cached], num_computed_tokens=[c[1] for c in cached],
            resumed_req_ids={c[0] for c in cached if len(c) > 2},
            all_token_ids={c[0]: c[2] for c in cached if len(c) > 2 and c[2] is not None},
            num_output_tokens=[c[3] if len(c) > 3 else 0 for c in cached]),
        num_scheduled_tokens=dict(scheduled or {}), finished_req_ids=set(finished))


def test_a_request_samples_its_script_once_its_prompt_is_computed():
    tr = RequestTracker(lambda new: new.sampling_params, filler_token=9)
    plan = _Plan([70, 71, 72])
    step = tr.step(_out(new=[("a", [1] * 10, plan, 0)], scheduled={"a": 6}))
    assert step.batch == [(6, 6)] and step.sampled == {}           # a chunk: nothing yet
    step = tr.step(_out(cached=[("a", 6)], scheduled={"a": 4}))
    assert step.batch == [(4, 10)] and step.sampled == {"a": 70}
    step = tr.step(_out(cached=[("a", 10)], scheduled={"a": 1}))
    assert step.sampled == {"a": 71}
    # Unscripted: the filler token, for as long as the engine schedules it.
    step = tr.step(_out(new=[("b", [1, 2], None, 0)], cached=[("a", 11)],
                        scheduled={"a": 1, "b": 2}))
    assert step.req_ids == ["a", "b"] and step.sampled == {"a": 72, "b": 9}
    step = tr.step(_out(cached=[("b", 2)], scheduled={"b": 1}, finished=["a"]))
    assert step.sampled == {"b": 9} and len(tr) == 1


def test_a_rejoined_parent_continues_its_script_after_the_merged_tokens():
    tr = RequestTracker(lambda new: new.sampling_params, filler_token=9)
    tr.step(_out(new=[("p", [1, 2], _Plan([5, 6, 7, 8]), 0)], scheduled={"p": 2}))
    # Re-added after a join: the merged context is its prompt, the tokens it
    # sampled before are counted, only the uncomputed tail is scheduled.
    step = tr.step(_out(new=[("p", [1, 2, 5, 30, 31, 32], _Plan([5, 6, 7, 8], 1), 3)],
                        scheduled={"p": 3}, finished=["p"]))
    assert step.batch == [(3, 6)] and step.sampled == {"p": 6}


def test_a_request_resumed_after_preemption_counts_its_outputs():
    tr = RequestTracker(lambda new: new.sampling_params, filler_token=9)
    tr.step(_out(new=[("a", [1, 2], _Plan([5, 6, 7]), 0)], scheduled={"a": 2}))
    step = tr.step(_out(cached=[("a", 0, [1, 2, 5, 6], 2)], scheduled={"a": 4}))
    assert step.batch == [(4, 4)] and step.sampled == {"a": 7}


def test_traces_have_threadweavers_published_lengths():
    import random
    import statistics

    from benchmarks.gpu_timed.traces import TABLE8, draw_trace

    rng = random.Random(0)
    traces = [draw_trace(rng) for _ in range(3000)]
    threads = [n for t in traces for b in t.blocks for n in b]
    blocks = [b for t in traces for b in t.blocks]
    assert statistics.mean(len(b) for b in blocks) == pytest.approx(2.46, rel=0.02)
    assert statistics.mean(threads) == pytest.approx(TABLE8["tokens_per_thread"], rel=0.06)
    assert statistics.mean(max(b) for b in blocks) == pytest.approx(1878, rel=0.06)
    assert statistics.mean(t.total_tokens for t in traces) == pytest.approx(
        TABLE8["total"], rel=0.06)
    assert statistics.mean(t.critical_path_tokens for t in traces) == pytest.approx(
        TABLE8["critical_path"], rel=0.06)


def test_a_trace_is_written_in_threadweavers_tags_with_its_lengths():
    import random

    from benchmarks.gpu_timed.traces import draw_trace, trace_text

    trace = draw_trace(random.Random(1), scale=0.05, blocks=2)
    text = trace_text(trace, random.Random(2))
    threads = [n for b in trace.blocks for n in b]
    assert len(text.children) == len(threads)
    assert [len(c) - len("</Thread>") for c in text.children.values()] == threads
    assert text.parent.count("</Outlines>") == 2 and text.parent.count("</Parallel>") == 2
    assert text.sequential.count("<Thread>") == len(threads)
    # The sequential trace writes every thread in full, with its header.
    assert all(body in text.sequential for body in text.children.values())


def test_the_scheduler_clock_times_each_call_and_counts_steps_that_compute():
    from benchmarks.gpu_timed.timed_scheduler import SchedulerClock

    clock = SchedulerClock()

    def busy(out):
        t = 0
        for i in range(20000):
            t += i
        return out

    for tokens, plain in (({"a": 1, "b": 1}, True), ({}, True), ({"a": 1}, False)):
        out = clock.call("schedule", busy, SimpleNamespace(total_num_scheduled_tokens=len(tokens),
                                                           num_scheduled_tokens=tokens))
        clock.count(out, plain)
    counters = clock.counters()
    assert counters["steps"] == 2 and counters["request_steps"] == 3
    assert counters["plain_steps"] == 1
    assert counters["schedule_cpu_s"] > 0 and counters["update_from_output_cpu_s"] == 0
    assert counters["scheduler_cpu_s"] == counters["schedule_cpu_s"]


def test_a_prompt_picks_its_family_and_the_engine_keys_pick_the_part():
    from benchmarks.gpu_timed.trace_book import PLAIN_KEY, TraceBook, prompt_text

    encode = lambda text: [ord(c) for c in text]  # noqa: E731
    book = TraceBook("native", 0.05, prompt_tokens=16, eos_token_id=2, encode=encode)
    prompt = encode(prompt_text(0, 16))
    trace, text = book.family(prompt)
    args = book.extra_args(prompt, None)
    assert args["seqhooks_script"] == encode(text.parent)
    assert args["seqhooks_child_scripts"] == {k: encode(v) for k, v in text.children.items()}
    assert len(text.children) == sum(len(b) for b in trace.blocks)
    # A child's prompt starts with its family's; the engine's keys stay.
    child = book.extra_args(prompt + [7, 8, 9], {"seqhooks_child_key": "1"})
    assert child["seqhooks_child_key"] == "1"
    assert child["seqhooks_script"] == args["seqhooks_script"]
    other = book.extra_args(encode(prompt_text(1, 16)), None)
    assert other["seqhooks_script"] != args["seqhooks_script"]
    seq = TraceBook("sequential", 0.05, 16, 2, encode).extra_args(prompt, None)
    assert seq["seqhooks_script"] == encode(text.sequential)
    assert "seqhooks_child_scripts" not in seq
    # plain traffic: a request that says so samples no family
    assert book.extra_args(prompt, {PLAIN_KEY: 1, "k": "v"}) == {PLAIN_KEY: 1, "k": "v"}
    with pytest.raises(ValueError, match="first 16"):
        book.extra_args(prompt[:10], None)
    with pytest.raises(ValueError, match="one of"):
        TraceBook("loop", 0.05, 16, 2, encode)


def test_the_grid_report_gives_the_ratios_per_profile_and_size():
    from benchmarks.gpu_timed.grid import percentile
    from benchmarks.gpu_timed.report import largest_fitting, markdown, ratios

    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([1.0, 2.0], 99) == pytest.approx(1.99)

    def r(config, p50, critical=1.0, kept=True, families=4, cpu_ms=1.0, per_rs=1.0, **extra):
        return dict(profile="h100-sxm/qwen3-8b", config=config, families=families,
                    time_scale=4.0 if families == 16 else 1.0, family_latency_p50_s=p50,
                    family_latency_p99_s=p50, tokens_per_s=1,
                    engine_steps=1, modelled_gpu_s=1, wall_s=1, engine_cpu_per_step_ms=cpu_ms,
                    modelled_step_ms=2.0, engine_cpu_per_request_step_us=per_rs,
                    critical_path_s=critical, host_kept_up=kept, **extra)

    def size(n, native_cpu_ms):
        return [r("sequential", 10.0, families=n), r("sequential-aa", 10.2, families=n),
                r("loop", 8.0, families=n, loop_cpu_per_request_step_us=4.0),
                r("native", 6.0, critical=5.0, kept=n != 4, families=n, cpu_ms=native_cpu_ms,
                  per_rs=3.0),
                r("native-in-process", 5.6, families=n),
                r("plain-stock", 1.0, families=n, cpu_ms=1.0),
                r("plain-hooks", 1.0, families=n, cpu_ms=1.04)]

    rows = size(4, 1.5) + size(16, 2.5)
    got = ratios(rows)
    assert got[0] == dict(profile="h100-sxm/qwen3-8b", families=4, time_scale=1.0, aa=1.02,
                          native_vs_sequential=0.6, native_vs_loop=0.75,
                          native_vs_critical_path=1.2, in_process_vs_loop=0.7,
                          plain_hooks_vs_stock_cpu_per_step=1.04,
                          plain_hooks_vs_stock_cpu_per_request_step=1.0,
                          native_vs_loop_per_request_step=0.75,
                          native_fits_step=True, stock_fits_step=True, host_kept_up=False)
    assert not got[1]["native_fits_step"] and got[1]["host_kept_up"]
    assert largest_fitting(rows) == {"h100-sxm/qwen3-8b": 4}
    page = markdown(rows, "python -m benchmarks.gpu_timed --smoke")
    assert "| h100-sxm/qwen3-8b | 4 | 1.0 | 1.02 | 0.6 | 0.75 | 1.2 | 0.7 | False |" in page
    assert "| h100-sxm/qwen3-8b | 16 | 4.0 | 1.02 |" in page
    assert "| h100-sxm/qwen3-8b | 16 | 1.04 | 1.0 | 0.75 | False | True |" in page
    assert "fits the modelled step, h100-sxm/qwen3-8b: 4" in page


def test_the_median_row_of_repeats_keeps_the_range():
    from benchmarks.gpu_timed.grid import median_row

    rows = [{"cpu": 3.0, "n": 1}, {"cpu": 1.0, "n": 2}, {"cpu": 2.0, "n": 3}]
    assert median_row(rows, "cpu") == {"cpu": 2.0, "n": 3, "cpu_range": [1.0, 3.0], "repeats": 3}
    assert median_row(rows[:2], "cpu")["cpu"] == 1.0  # (even: the lower middle)


def test_the_engine_size_is_one_dict_given_as_flags_to_the_servers():
    from benchmarks.gpu_timed.engine_args import ENGINE_SIZE, serve_flags
    from benchmarks.gpu_timed.grid import MAX_MODEL_LEN

    assert serve_flags({"enforce_eager": True, "max_num_seqs": 1024, "block_size": 32}) == [
        "--enforce-eager", "--max-num-seqs", "1024", "--block-size", "32"]
    flags = serve_flags(ENGINE_SIZE)
    assert flags[flags.index("--kv-cache-memory-bytes") + 1] == str(1 << 30)
    assert MAX_MODEL_LEN == ENGINE_SIZE["max_model_len"] == 4096


def test_plain_pairs_summary_compares_within_each_pair_and_stock_across_pairs():
    from benchmarks.gpu_timed.plain_pairs import summary

    pairs = [{"stock": [50.0, 60.0, 55.0], "hooks": [66.0, 58.0, 60.0]},
             {"stock": [100.0, 110.0, 90.0], "hooks": [101.0, 99.0, 100.0]},
             {"stock": [50.0, 50.0, 50.0], "hooks": [55.0, 55.0, 55.0]}]
    s = summary(pairs)
    # each pair's medians: (55, 60), (100, 100), (50, 55)
    assert s["hooks_vs_stock"] == [round(60 / 55, 3), 1.0, 1.1]
    assert s["hooks_vs_stock_median"] == round(60 / 55, 3)
    assert s["hooks_vs_stock_range"] == [1.0, 1.1]
    assert s["aa_stock_vs_next_stock"] == [0.55, 2.0]
    assert s["aa_range"] == [0.55, 2.0]
    assert "hooks_vs_stock_per_call_median" not in s
    calls = {"schedule": 30.0, "update_from_output": 20.0, "add_request": 1.0}
    for p, hooks_update in zip(pairs, (22.0, 20.0, 24.0)):
        p["calls"] = {"stock": [calls] * 3,
                      "hooks": [{**calls, "update_from_output": hooks_update}] * 3}
    assert summary(pairs)["hooks_vs_stock_per_call_median"] == {
        "schedule": 1.0, "update_from_output": 1.1, "add_request": 1.0}


def test_a_runs_counters_wait_for_its_steps_and_fail_without_them(tmp_path):
    import json as _json
    from pathlib import Path

    from benchmarks.gpu_timed.grid import counters, counters_after_run

    stats = tmp_path / "stock.stats.json"
    stats.write_text(_json.dumps({"modelled_gpu_s": 1.0}))
    Path(f"{stats}.sched").write_text(_json.dumps({"steps": 5, "scheduler_cpu_s": 0.1}))
    before = counters(stats, 0)
    with pytest.raises(RuntimeError, match="no step counted"):
        counters_after_run(stats, before, 0, timeout_s=0.3)
    Path(f"{stats}.sched").write_text(_json.dumps({"steps": 9, "scheduler_cpu_s": 0.2}))
    assert counters_after_run(stats, before, 0)["sched_steps"] == 9


def test_a_time_scaled_gpu_waits_longer_and_counts_modelled_seconds():
    from benchmarks.gpu_timed.worker import ModelledGpu

    now = [10.0]
    gpu = ModelledGpu(clock=lambda: now[0])
    assert gpu.queue(0.002, 8) == pytest.approx(10.002)
    gpu.time_scale = 4.0
    # queued behind the first step, then four times its 3 ms
    assert gpu.queue(0.003, 8) == pytest.approx(10.014)
    assert gpu.last_start == pytest.approx(10.002)  # (the spans' start)
    now[0] = 11.0
    assert gpu.queue(0.001, 1) == pytest.approx(11.004)
    assert gpu.counters() == {"steps": 3, "request_steps": 17,
                              "modelled_gpu_s": pytest.approx(0.006)}


def test_one_worker_prices_its_steps_for_each_profile_it_is_set_to():
    from benchmarks.gpu_timed.worker import GpuTimedWorker

    worker = object.__new__(GpuTimedWorker)  # (no engine: set_profile sets the step model)
    batch = [(1, 350)] * 4
    priced = []
    for profile in ("h100-sxm/qwen3-8b", "h100-sxm/qwen3-32b", "h100-sxm/qwen3-8b"):
        assert worker.set_profile(profile) == profile
        priced.append(worker._model.seconds(batch))
        assert priced[-1] == step_model_for(*parse_profile(profile)).seconds(batch)
    assert priced[0] == priced[2] < priced[1]
    with pytest.raises(ValueError, match="known: h100-sxm/"):
        worker.set_profile("h100/qwen3-8b")


def test_the_time_scale_doubles_until_the_host_keeps_up_and_rows_divide_it_back():
    from benchmarks.gpu_timed.grid import Family, row
    from benchmarks.gpu_timed.time_scale import MAX_SCALE, busy_fraction, client_lag, next_scale

    # 7 modelled GPU seconds in 17.7 s of wall at 1: idle most of the time
    assert busy_fraction(7.0, 17.7, 1) == pytest.approx(0.395, abs=1e-3)
    assert next_scale(1, 0.395, 1.0) == 2
    assert next_scale(4, busy_fraction(7.0, 28.2, 4), 1.01) is None  # 99 % busy: kept up
    # busy, but the client saw its families finish 1.6 times later than the
    # engine finished them (the grid of 2026-11-29 at 1.5B, 256 families)
    lag = client_lag(7.08, [4.4, 4.5, 4.3], 1)
    assert lag == pytest.approx(7.08 / 4.4)
    assert next_scale(1, 0.99, lag) == 2
    assert client_lag(4.5, [8.0, 9.0, 10.0], 2) == 1.0  # spans are wall: over the scale
    assert next_scale(MAX_SCALE, 0.5, 2.0) is None  # the largest: the rows then say so
    fams = [Family("p", [1] * 4, critical_path_tokens=100, sequential_tokens=200)] * 2
    counts = dict(steps=0, request_steps=0, modelled_gpu_s=0.0, sched_steps=0,
                  sched_request_steps=0, sched_scheduler_cpu_s=0.0)
    after = dict(steps=1000, request_steps=2000, modelled_gpu_s=4.0, sched_steps=1000,
                 sched_request_steps=2000, sched_scheduler_cpu_s=0.5)
    run = {"latencies": [8.0, 16.0], "total_output_tokens": 400, "duration": 16.4}
    r = row("sequential", "h100-sxm/qwen3-8b", fams, run, counts, after, time_scale=4.0)
    # modelled seconds: the wall's over the scale; this host's wall and CPU as measured
    assert (r["family_latency_p50_s"], r["family_latency_p99_s"]) == (3.0, 3.98)
    assert r["tokens_per_s"] == round(400 / 4.1, 1) and r["wall_s"] == 16.4
    assert r["host_kept_up"] and r["time_scale"] == 4.0
    assert r["engine_cpu_per_step_ms"] == 0.5 and r["modelled_step_ms"] == 4.0
    assert not row("sequential", "h100-sxm/qwen3-8b", fams, run, counts, after)["host_kept_up"]


def test_a_requests_span_runs_from_its_first_steps_start_to_its_last_steps_end():
    from benchmarks.gpu_timed.request_spans import RequestSpans

    spans = RequestSpans()
    spans.step(["a"], 1.0, 1.5)
    spans.step(["a", "b"], 1.5, 2.25)
    spans.step(["b"], 3.0, 3.5)
    assert sorted(spans.take()) == [1.25, 2.0]
    assert spans.take() == []  # each call: the requests since the last one
