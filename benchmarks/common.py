"""Shared pieces of the benchmarks: models, engines, engine-side counters,
scripted fork/join families, repeats and statistics.

Everything runs in one process with in-process engines
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set by :func:`setup_env`), so the
counters below read each engine's scheduler directly. They are measured the
same way for every engine (stock vLLM, the client loop, native hooks): by
wrapping the scheduler *instance*'s ``schedule`` and ``update_from_output``
methods (nothing in vLLM or in ``vllm_seqhooks`` is changed).
"""

from __future__ import annotations

import gc
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, NoReturn, Sequence


def setup_env(threads: int | None = 1) -> None:
    """In-process engines (their schedulers are readable), quiet logs, and
    ``threads`` torch/OpenMP threads (``OMP_NUM_THREADS``, unless already
    set; None leaves the default).

    Why 1 by default: an in-process vLLM CPU engine keeps torch's default
    thread count (every core: vLLM 0.32's "reduce torch threads to 1 for
    serving" is skipped because its CPU worker has already replaced
    ``torch.set_num_threads`` with a no-op). On a shared 2-core machine the
    OpenMP threads then wait on each other whenever another process holds a
    core: a batch-1 decode step measured 80-600 ms with 2 threads and a
    steady 26 ms with 1. Every configuration runs with the same setting.
    """
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if threads is not None:
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        if "torch" in sys.modules:  # too late for OpenMP's own default
            import torch

            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


# --------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------

#: Positions the benchmark models accept. The builder writes 4,096
#: (``tiny_model.MAX_POSITION_EMBEDDINGS``); a 4,096-token prompt plus promises,
#: merged outputs and a continuation needs more. Llama's RoPE has no learned
#: position table, so raising the limit in ``config.json`` changes nothing else.
BENCH_MAX_POSITIONS = 8192


def default_out_dir() -> Path:
    """Where ``python -m benchmarks`` and ``python -m benchmarks.attention_order``
    write their results without ``--out``: a user cache, never ``docs/``
    (the published pages change only when ``--out docs/benchmarks`` names
    them)."""
    from vllm_seqhooks.tasks import cache_dir

    return cache_dir("benchmarks")


def default_cache_dir() -> Path:
    from vllm_seqhooks.tasks import cache_dir

    return cache_dir("bench")


def bench_model(size: str, dtype: str, cache_dir: Path | None = None) -> Path:
    """A random-weight model from ``vllm_seqhooks.scripted.tiny_model`` with
    ``max_position_embeddings`` raised to :data:`BENCH_MAX_POSITIONS`;
    built once into ``cache_dir`` and reused."""
    from vllm_seqhooks.scripted.tiny_model import build_tiny_model

    cache_dir = Path(cache_dir or default_cache_dir())
    out = cache_dir / f"{size}-{dtype}-pos{BENCH_MAX_POSITIONS}"
    marker = out / ".bench_model.json"
    settings = {"size": size, "dtype": dtype, "max_position_embeddings": BENCH_MAX_POSITIONS}
    try:
        if json.loads(marker.read_text()) == settings:
            return out
    except (OSError, ValueError):
        pass
    src = build_tiny_model(cache_dir / f"{size}-{dtype}-src", size=size, dtype=dtype)
    tmp = cache_dir / f".{out.name}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    cfg_path = tmp / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["max_position_embeddings"] = BENCH_MAX_POSITIONS
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    tok_path = tmp / "tokenizer_config.json"
    tok = json.loads(tok_path.read_text())
    tok["model_max_length"] = BENCH_MAX_POSITIONS
    tok_path.write_text(json.dumps(tok, indent=2, sort_keys=True) + "\n")
    (tmp / ".bench_model.json").write_text(json.dumps(settings))
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def model_params(path: Path) -> int:
    cfg = json.loads((Path(path) / "config.json").read_text())
    h, n, inter, v = (cfg["hidden_size"], cfg["num_hidden_layers"],
                      cfg["intermediate_size"], cfg["vocab_size"])
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    per_layer = h * h * 2 + h * kv * 2 + 3 * h * inter + 2 * h
    return n * per_layer + 2 * v * h + h


def kv_bytes_per_token(path: Path, dtype: str) -> int:
    cfg = json.loads((Path(path) / "config.json").read_text())
    width = {"float32": 4, "bfloat16": 2, "float16": 2}[dtype]
    return 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * width


# --------------------------------------------------------------------------
# Engines
# --------------------------------------------------------------------------

#: The hook tokens of the benchmark models (same ids as the tiny model).
def hook_settings() -> dict[str, Any]:
    from vllm_seqhooks.scripted.llm import TINY_HOOKS

    return dict(TINY_HOOKS)


def engine_kwargs(profile: "Profile", *, kv_tokens: int, scripted: bool) -> dict[str, Any]:
    from vllm_seqhooks.scripted.processor import ScriptedTokensLogitsProcessor

    kw: dict[str, Any] = dict(
        enforce_eager=True,
        dtype=profile.dtype,
        block_size=profile.block_size,
        max_model_len=profile.max_model_len,
        max_num_batched_tokens=profile.max_num_batched_tokens,
        max_num_seqs=profile.max_num_seqs,
        kv_cache_memory_bytes=int(kv_tokens * kv_bytes_per_token(profile.model, profile.dtype)),
        seed=0,
        enable_prefix_caching=True,
    )
    if scripted:
        kw["logits_processors"] = [ScriptedTokensLogitsProcessor]
    return kw


def make_engine(kind: str, profile: "Profile", *, kv_tokens: int, scripted: bool,
                **overrides: Any):
    """``kind``: ``stock`` (``vllm.LLM``), ``off`` (``vllm_seqhooks.LLM``
    without special kwargs) or ``hooks`` (``vllm_seqhooks.LLM`` with the hook
    tokens of the benchmark model)."""
    kw = engine_kwargs(profile, kv_tokens=kv_tokens, scripted=scripted)
    kw.update(overrides)
    model = str(profile.model)
    if kind == "stock":
        import vllm

        return vllm.LLM(model, **kw)
    from vllm_seqhooks.llm import LLM

    if kind == "off":
        return LLM(model, **kw)
    if kind == "hooks":
        return LLM(model, special_kwargs=hook_settings(), **kw)
    if kind == "hooks-arrival":
        return LLM(model, special_kwargs={**hook_settings(), "batch_order": "arrival"}, **kw)
    raise ValueError(kind)


#: A smoke run's engines, once :func:`leave_engines_to_exit` is called:
#: referenced until :func:`exit_leaving_engines` ends the process.
_ENGINES_LEFT_TO_EXIT: list[Any] | None = None


def leave_engines_to_exit() -> None:
    """From now on :func:`close_engine` shuts nothing down; the process ends
    with :func:`exit_leaving_engines`, which frees the engines with it. For
    smoke runs (a check that every workload runs; tiny engines, timings
    meaningless). Why: each shutdown of an in-process engine, by
    :func:`close_engine` or by vLLM's finalizer when the engine is collected
    or the interpreter exits, unfreezes the garbage collector's heap (an
    engine's start freezes it) and collects all of it twice, and the next
    engine's start collects it three times again; with torch and vLLM
    imported each full collection took 0.5 s of CPU: ``python -m benchmarks
    --smoke`` took 42 CPU seconds with them, 20 without (and without its
    throwaway engine), ``benchmarks.splice --smoke`` 24 and 12 (2026-11-28,
    AMD EPYC)."""
    global _ENGINES_LEFT_TO_EXIT
    if _ENGINES_LEFT_TO_EXIT is None:
        _ENGINES_LEFT_TO_EXIT = []


def exit_leaving_engines(code: int) -> NoReturn:
    """End the process now with ``code``, its output flushed, without the
    interpreter's exit handlers (vLLM's finalizers among them, which would
    shut every engine still referenced down: see
    :func:`leave_engines_to_exit`)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def close_engine(llm: Any) -> None:
    if _ENGINES_LEFT_TO_EXIT is not None:
        _ENGINES_LEFT_TO_EXIT.append(llm)  # (referenced: vLLM's finalizer would shut it down)
        return
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:  # noqa: BLE001 - best effort, the process ends soon
        pass
    del llm
    gc.collect()


@dataclass
class Profile:
    """What ``--quick`` / ``--full`` / the smoke test run."""

    name: str
    size: str
    dtype: str
    repeats: int
    #: workload name -> its settings (see each workload module).
    settings: dict[str, Any]
    block_size: int = 32
    max_model_len: int = 6144
    max_num_batched_tokens: int = 4096
    max_num_seqs: int = 256
    model: Path = Path()
    #: A check that every workload runs (its timings mean nothing): no
    #: throwaway engine (:meth:`Bench.prime`), engines left to the process's
    #: exit (:func:`leave_engines_to_exit`).
    smoke: bool = False


class Bench:
    """One benchmark run: the profile, a log, and the engines, each created
    once (on first use) and reused by every workload that needs it."""

    def __init__(self, profile: Profile, log: Callable[[str], None] = print,
                 timeout_s: float = 900.0) -> None:
        self.profile = profile
        self.log = log
        #: Seconds after which one run is aborted (a stuck engine must not
        #: hang a benchmark run); ``--timeout``.
        self.timeout_s = timeout_s
        self.engines: dict[str, Any] = {}
        self.probes: dict[str, "EngineProbe"] = {}
        self.engine_info: dict[str, dict[str, Any]] = {}

    def engine(self, name: str, kind: str, *, kv_tokens: int, scripted: bool,
               **overrides: Any) -> Any:
        llm = self.engines.get(name)
        if llm is None:
            t0 = time.perf_counter()
            llm = make_engine(kind, self.profile, kv_tokens=kv_tokens, scripted=scripted,
                              **overrides)
            secs = time.perf_counter() - t0
            self.engines[name] = llm
            from tests.support.forkjoin import scheduler_of

            self.engine_info[name] = {"kind": kind, "kv_tokens": kv_tokens,
                                      "scripted": scripted, "start_s": round(secs, 1),
                                      "scheduler": type(scheduler_of(llm)).__name__,
                                      **overrides}
            self.log(f"  engine {name} ({kind}) started in {secs:.1f} s")
        return llm

    def prime(self) -> None:
        """Create and close a throwaway engine. Measured here: the first
        engine of a process ran 2-4 % slower than later identical ones (the
        same stock engine, interleaved runs), which would bias whichever
        configuration is created first; after a throwaway engine, identical
        engines agree within about 2 % (the A/A control in the overhead
        workload shows the remaining spread). Not in a smoke run."""
        if getattr(self, "_primed", False) or self.profile.smoke:
            return
        self._primed = True
        t0 = time.perf_counter()
        llm = make_engine("stock", self.profile, kv_tokens=self.profile.max_model_len + 64,
                          scripted=False)
        close_engine(llm)
        self.log(f"  throwaway engine created and closed ({time.perf_counter() - t0:.1f} s)")

    def probe(self, name: str, **kwargs: Any) -> "EngineProbe":
        probe = self.probes.get(name)
        if probe is None:
            probe = self.probes[name] = EngineProbe(self.engines[name], **kwargs)
        return probe

    def close(self, name: str) -> None:
        llm = self.engines.pop(name, None)
        self.probes.pop(name, None)
        if llm is not None:
            close_engine(llm)

    def close_all(self) -> None:
        for name in list(self.engines):
            self.close(name)


# --------------------------------------------------------------------------
# Engine-side counters
# --------------------------------------------------------------------------

@dataclass
class Counters:
    steps: int = 0
    #: Tokens computed (``total_num_scheduled_tokens`` summed over steps).
    computed_tokens: int = 0
    #: Of those: the one newest sampled token of a generating request...
    decode_tokens: int = 0
    #: ... and everything else (prompts, merged tokens, recomputation).
    prefill_tokens: int = 0
    #: Largest number of KV blocks held by requests after a schedule.
    peak_blocks_in_use: int = 0
    #: Largest number of KV blocks held by parked (WAITING_FOR_STREAMING_REQ)
    #: requests after a schedule (native hooks only).
    peak_parked_blocks: int = 0
    peak_running: int = 0
    preemptions: int = 0
    #: Seconds inside ``schedule()``, ``update_from_output()``, and
    #: EngineCore's building (``preprocess_add_request``: the ``Request``
    #: and its block hashes) and adding of a client's requests (no model;
    #: a child is built and added inside the hook scheduler's step), and
    #: the requests the steps scheduled.
    scheduler_s: float = 0.0
    scheduled_request_steps: int = 0
    #: Seconds in the model runner's batch reorder (``_may_reorder_batch``,
    #: vLLM's own and, with hooks, the family grouping around it).
    reorder_s: float = 0.0
    #: Per step: (engine seconds, tokens computed, requests scheduled).
    step_log: list[tuple[float, int, int]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "step_log"}
        return d


class EngineProbe:
    """Counts what an in-process engine computes, identically for every
    engine: each ``schedule()`` result is classified per request into decode
    tokens (a generating request's newest token: one per request and step)
    and prefill tokens (everything else scheduled: prompt tokens not served by
    the prefix cache, merged tokens after a join, recomputation after a
    preemption or eviction). KV blocks in use are read from the block pool.
    Engine seconds per step run from ``schedule()`` to the end of
    ``update_from_output()`` (model forward included, the frontend's output
    processing excluded)."""

    def __init__(self, llm: Any, *, track_parked: bool = False, log_steps: bool = True) -> None:
        from vllm.v1.request import RequestStatus

        from tests.support.forkjoin import scheduler_of
        from tests.support.observed_calls import observe_calls

        self.llm = llm
        self.sched = sched = scheduler_of(llm)
        self.pool = sched.kv_cache_manager.block_pool
        self.track_parked = track_parked
        self.log_steps = log_steps
        self._parked_status = RequestStatus.WAITING_FOR_STREAMING_REQ
        self._t0: float | None = None
        self._cur: tuple[int, int] = (0, 0)
        self.counters = Counters()
        orig_preempt = getattr(sched, "_preempt_request", None)
        inside = [False]

        def in_scheduler(method, *args: Any, **kwargs: Any):
            t0 = time.perf_counter()
            inside[0] = True
            try:
                return method(*args, **kwargs)
            finally:
                inside[0] = False
                self.counters.scheduler_s += time.perf_counter() - t0

        def schedule(method, *args: Any, **kwargs: Any):
            t0 = time.perf_counter()
            out = in_scheduler(method, *args, **kwargs)
            self._record(out, t0)
            return out

        def update_from_output(method, *args: Any, **kwargs: Any):
            res = in_scheduler(method, *args, **kwargs)
            if self._t0 is not None:
                if self.log_steps:
                    self.counters.step_log.append(
                        (time.perf_counter() - self._t0, *self._cur))
                self._t0 = None
            return res

        def add_request(method, *args: Any, **kwargs: Any):
            # A client's requests enter the scheduler here; the hook
            # scheduler's children from inside schedule/update_from_output
            # (timed there already).
            if inside[0]:
                return method(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.counters.scheduler_s += time.perf_counter() - t0

        # (on the engine core's side: the hook scheduler binds its own step
        # methods on itself while plain)
        observe_calls(llm, schedule=schedule, update_from_output=update_from_output,
                      add_request=add_request)
        self._time_request_building(llm)
        if orig_preempt is not None:
            def preempt(*args: Any, **kwargs: Any):
                self.counters.preemptions += 1
                return orig_preempt(*args, **kwargs)

            sched._preempt_request = preempt
        self._time_reorder(llm)

    def _time_request_building(self, llm: Any) -> None:
        """Time EngineCore's ``preprocess_add_request`` (a client request's
        ``Request``, its block hashes included), as a child's ``Request`` is
        built inside the hook scheduler's step: both sides count the
        engine-side work of making a request."""
        from tests.support.forkjoin import engine_core_of

        self._add_timer(engine_core_of(llm), "preprocess_add_request", "scheduler_s")

    def _time_reorder(self, llm: Any) -> None:
        """Time the model runner's ``_may_reorder_batch`` (the same wrapper
        on every engine; a no-op on an engine whose runner is elsewhere)."""
        from tests.support.forkjoin import model_runner_of

        try:
            runner = model_runner_of(llm)
        except (AttributeError, RuntimeError):
            return
        if hasattr(runner, "_may_reorder_batch"):
            self._add_timer(runner, "_may_reorder_batch", "reorder_s")

    def _add_timer(self, obj: Any, method: str, counter: str) -> None:
        """Wrap ``obj.method`` (on the instance) to add its seconds to the
        counter named ``counter``."""
        orig = getattr(obj, method)

        def timed(*args: Any, **kwargs: Any):
            t0 = time.perf_counter()
            try:
                return orig(*args, **kwargs)
            finally:
                c = self.counters
                setattr(c, counter, getattr(c, counter) + time.perf_counter() - t0)

        setattr(obj, method, timed)

    def reset(self) -> None:
        self.counters = Counters()

    def take(self) -> Counters:
        c, self.counters = self.counters, Counters()
        return c

    def blocks_in_use(self) -> int:
        return self.pool.num_gpu_blocks - 1 - self.pool.get_num_free_blocks()

    @property
    def num_blocks(self) -> int:
        return self.pool.num_gpu_blocks - 1

    def _record(self, out: Any, t0: float) -> None:
        total = out.total_num_scheduled_tokens
        if not total:
            return
        c = self.counters
        c.steps += 1
        c.computed_tokens += total
        reqs = self.sched.requests
        decode = 0
        for rid in out.num_scheduled_tokens:
            req = reqs.get(rid)
            # schedule() has already advanced num_computed_tokens.
            if (req is not None and req.num_computed_tokens >= req.num_tokens
                    and req.num_tokens > req.num_prompt_tokens):
                decode += 1
        c.decode_tokens += decode
        c.prefill_tokens += total - decode
        n = len(out.num_scheduled_tokens)
        c.scheduled_request_steps += n
        c.peak_running = max(c.peak_running, n)
        c.peak_blocks_in_use = max(c.peak_blocks_in_use, self.blocks_in_use())
        if self.track_parked:
            parked = 0
            mgr = self.sched.kv_cache_manager
            for req in reqs.values():
                if req.status == self._parked_status:
                    parked += sum(len(g) for g in mgr.get_block_ids(req.request_id))
            c.peak_parked_blocks = max(c.peak_parked_blocks, parked)
        self._t0 = t0
        self._cur = (total, n)


# --------------------------------------------------------------------------
# Scripted families
# --------------------------------------------------------------------------

@dataclass
class Family:
    """One parent request and its scripted children.

    The parent writes ``k`` promises (``<promise>`` payload ``</promise>``),
    then ``think`` tokens of its own (0 by default), then ``<sync>``, then a
    continuation, then EOS; child ``i`` writes
    ``children[i]`` then EOS. ``sequential`` is the same work as one request
    without hooks: each payload followed by its child's output and the merge
    separator, then the parent's own tokens and the continuation.
    """

    prompt: list[int]
    parent_script: list[int]
    children: dict[str, list[int]]
    sequential_script: list[int]
    #: The parent's final output token ids (sampled + merged, EOS included).
    expected_output: list[int]

    @property
    def k(self) -> int:
        return len(self.children)


def make_family(rng: random.Random, *, context: int, k: int, child_tokens: int,
                payload: int, continuation: int, separator: Sequence[int],
                think: int = 0) -> Family:
    from vllm_seqhooks.scripted.tiny_model import (
        BOS_ID, EOS_ID, PROMISE_END_ID, PROMISE_ID, SYNC_ID, TOKENIZER_SIZE)

    first_char = 9  # " " (tiny_model: ids 9..103 are the printable characters)

    def text(n: int) -> list[int]:
        return [rng.randrange(first_char, TOKENIZER_SIZE) for _ in range(n)]

    prompt = [BOS_ID] + text(context - 1)
    payloads = [text(payload) for _ in range(k)]
    outs = [text(child_tokens) for _ in range(k)]
    cont = text(continuation)
    own = text(think)
    parent = []
    for p in payloads:
        parent += [PROMISE_ID, *p, PROMISE_END_ID]
    parent += [*own, SYNC_ID]
    merged: list[int] = []
    for i, o in enumerate(outs):
        if i:
            merged += list(separator)
        merged += o
    sequential: list[int] = []
    for i, (p, o) in enumerate(zip(payloads, outs)):
        sequential += [*p, *o, *separator]
    sequential += own + cont
    return Family(
        prompt=prompt,
        parent_script=parent + cont,
        children={str(i): o for i, o in enumerate(outs)},
        sequential_script=sequential,
        expected_output=parent + merged + cont + [EOS_ID],
    )


def family_params(fam: Family, *, sequential: bool = False):
    from vllm_seqhooks.scripted.processor import scripted_params
    from vllm_seqhooks.scripted.tiny_model import EOS_ID

    if sequential:
        return scripted_params(fam.sequential_script, end="eos", eos_token_id=EOS_ID)
    return scripted_params(fam.parent_script, child_scripts=fam.children, end="eos",
                           child_end="eos", eos_token_id=EOS_ID)


def critical_path_tokens(fam: Family) -> tuple[int, int]:
    """Tokens on the critical path (decode steps one request must wait for):
    ``(forked, sequential)``. Forked: the parent's tokens up to its last
    ``</promise>``, then the longest child (a child starts the step after its
    ``</promise>``), then the continuation (+EOS); the step that prefills the
    merged tokens samples the continuation's first token. Sequential: every
    token the single request writes (+EOS). Both count the prompt's prefill
    as one step (the step that samples the first token)."""
    from vllm_seqhooks.scripted.tiny_model import PROMISE_END_ID, SYNC_ID

    script = fam.parent_script
    sync = script.index(SYNC_ID)
    ends = [i for i, t in enumerate(script[:sync]) if t == PROMISE_END_ID]
    finish_children = max(end + 1 + len(fam.children[str(j)]) + 1
                          for j, end in enumerate(ends))  # +1: the child's EOS
    join = max(sync + 1, finish_children)
    # Step J+1 prefills the merged tokens and samples the continuation's first
    # token; then the rest of the continuation and EOS.
    forked = join + (len(script) - sync - 1) + 1
    sequential = len(fam.sequential_script) + 1
    return forked, sequential


# --------------------------------------------------------------------------
# Running and statistics
# --------------------------------------------------------------------------

def run_generate(llm: Any, prompts: Sequence[list[int]], params: Any) -> tuple[float, list[Any]]:
    """``llm.generate`` on token prompts: (seconds, outputs)."""
    inputs = [{"prompt_token_ids": list(p)} for p in prompts]
    t0 = time.perf_counter()
    outs = llm.generate(inputs, params, use_tqdm=False)
    return time.perf_counter() - t0, outs


def publish(out_dir: Path | None, name: str, results: dict[str, Any], text: str) -> None:
    """Print a benchmark's report ``text`` and, with ``out_dir``, write it
    there as ``name``.md beside its ``results`` as ``name``.json."""
    print(text)
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / f"{name}.json").write_text(json.dumps(results, indent=1))
        (out_dir / f"{name}.md").write_text(text)
        print(f"wrote {out_dir / name}.md and {name}.json")


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def spread(xs: Sequence[float]) -> dict[str, float]:
    xs = [float(x) for x in xs]
    return {"median": median(xs), "min": min(xs) if xs else float("nan"),
            "max": max(xs) if xs else float("nan"), "n": len(xs)}


def fmt_spread(s: dict[str, float], digits: int = 0) -> str:
    """A :func:`spread` as ``median [min–max]`` with ``digits`` decimals."""
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}–{s['max']:.{digits}f}]"


def interleaved(configs: Sequence[str], repeats: int, run: Callable[[str, int], Any],
                *, log: Callable[[str], None] | None = None) -> dict[str, list[Any]]:
    """Run every configuration once per repeat, rotating the order each
    repeat (repeat r starts with configuration r mod n), so that slow drifts
    of a shared machine hit all configurations alike; every other round of
    n repeats the configurations after the first run in reverse, so that
    who follows whom varies too. Returns configuration -> results in repeat
    order."""
    results: dict[str, list[Any]] = {c: [] for c in configs}
    n = len(configs)
    for r in range(repeats):
        order = [configs[(r + i) % n] for i in range(n)]
        if (r // n) % 2 == 1:
            order = [order[0], *order[:0:-1]]
        for c in order:
            results[c].append(run(c, r))
        if log:
            log(f"    repeat {r + 1}/{repeats} done")
    return results


def fit_step_cost(step_logs: Sequence[Sequence[tuple[float, int, int]]]) -> dict[str, float]:
    """Least-squares ``seconds = fixed + per_token * tokens + per_request *
    requests`` over engine steps: what a step costs, and whether fewer steps,
    fewer tokens or fewer requests per step would save time."""
    import numpy as np

    rows = [(sec, tokens, n) for log in step_logs for sec, tokens, n in log]
    nan = float("nan")
    if len(rows) < 4:
        return {"fixed_ms": nan, "per_token_ms": nan, "per_request_ms": nan, "r2": nan,
                "steps": len(rows)}
    a = np.asarray(rows, dtype=float)
    y = a[:, 0]
    x = np.c_[np.ones(len(a)), a[:, 1], a[:, 2]]
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ coef
    ss_tot = float(((y - y.mean()) ** 2).sum())
    return {"fixed_ms": 1000 * float(coef[0]), "per_token_ms": 1000 * float(coef[1]),
            "per_request_ms": 1000 * float(coef[2]),
            "r2": 1 - float((resid ** 2).sum()) / ss_tot if ss_tot else nan,
            "steps": len(rows), "mean_step_ms": 1000 * float(y.mean()),
            "mean_requests": float(a[:, 2].mean())}


# --------------------------------------------------------------------------
# Environment
# --------------------------------------------------------------------------

def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo``), else what Python knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit(dirty_paths: Sequence[str] = ()) -> str:
    """The checkout's short commit ("" outside git); with ``dirty_paths``,
    `` + uncommitted changes`` is added when any of them differs from it."""
    root = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=root, timeout=10).stdout.strip()
        if commit and dirty_paths and subprocess.run(
                ["git", "status", "--porcelain", "--", *dirty_paths], capture_output=True,
                text=True, cwd=root, timeout=10).stdout.strip():
            commit += " + uncommitted changes"
    except (OSError, subprocess.SubprocessError):
        return ""
    return commit


def environment(argv: Sequence[str] | None = None) -> dict[str, Any]:
    import torch
    import vllm

    cpu = cpu_model()
    try:
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem_gib = float("nan")
    commit = git_commit()
    try:
        load = os.getloadavg()
    except OSError:
        load = (float("nan"),) * 3
    return {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "command": "python -m benchmarks " + " ".join(argv if argv is not None else sys.argv[1:]),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_gib, 1),
        "gpu": "none",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "vllm": vllm.__version__,
        "git_commit": commit,
        "load_average_at_start": [round(x, 2) for x in load],
    }
