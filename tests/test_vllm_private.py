"""The private vLLM API the engine package relies on
(``vllm_seqhooks/engine/vllm_private/``): present with the expected
signatures on the installed vLLM (each supported release, as that release is
expected to have them), and reported, naming what changed, when it
changes."""

from __future__ import annotations

import pytest


def test_pinned_private_vllm_api_is_present():
    """Fails loudly when vLLM differs from the supported release it says it
    is: every private name the
    scheduler and the batch grouping use, with its signature."""
    from vllm_seqhooks.engine import vllm_private

    assert vllm_private.problems() == []
    assert vllm_private.model_runner_problems() == []
    assert vllm_private.input_batch_problems() == []
    assert vllm_private.v2_model_runner_problems() == []
    assert vllm_private.splice_problems() == []
    assert vllm_private.v2_splice_problems() == []
    assert vllm_private.cpu_seed_problems() == []


def test_a_changed_private_api_is_reported(monkeypatch):
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.worker.gpu_input_batch import InputBatch

    from vllm_seqhooks.engine import vllm_private

    monkeypatch.setattr(Scheduler, "_free_request", lambda self, request: None)
    monkeypatch.setattr(InputBatch, "swap_states", lambda self, a, b: None)
    assert any("swap_states" in p for p in vllm_private.input_batch_problems())
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    monkeypatch.setattr(GPUModelRunner, "_bookkeeping_sync", lambda self, *a: None)
    assert any("_bookkeeping_sync" in p for p in vllm_private.cpu_seed_problems())
    from vllm.v1.worker.gpu import model_runner as v2

    monkeypatch.setattr(v2, "sort_batch_req_ids", lambda reqs, drafts: list(reqs))
    monkeypatch.setattr(v2.GPUModelRunner, "prepare_attn", lambda self, batch, extra: None)
    assert any("prepare_attn" in p for p in vllm_private.v2_splice_problems())
    assert any("sort_batch_req_ids" in p for p in vllm_private.v2_model_runner_problems())
    assert any("_free_request" in p for p in vllm_private.problems())
    assert any("swap_states" in p for p in vllm_private.model_runner_problems())
    monkeypatch.setattr(vllm_private, "_checked", False)
    with pytest.raises(vllm_private.VllmPrivateAPIError, match="_free_request"):
        vllm_private.check()


def test_frontend_private_api_is_present():
    from vllm_seqhooks.engine import vllm_private

    assert vllm_private.input_processor_problems() == []
    assert vllm_private.output_processor_problems() == []


def test_a_changed_frontend_api_is_reported(monkeypatch):
    from vllm.v1.engine.input_processor import InputProcessor

    from vllm_seqhooks.engine import vllm_private

    monkeypatch.setattr(InputProcessor, "_validate_params", lambda self, params: None)
    assert any("_validate_params" in p for p in vllm_private.input_processor_problems())


def test_a_changed_output_processor_is_reported(monkeypatch):
    from vllm.v1.engine.output_processor import RequestState

    from vllm_seqhooks.engine import vllm_private

    monkeypatch.setattr(RequestState, "make_request_output",
                        lambda self, new_token_ids, pooling_output, finish_reason: None)
    found = vllm_private.output_processor_problems()
    assert any("make_request_output" in p for p in found)


def test_the_worker_interface_the_gpu_timed_worker_implements_is_checked(monkeypatch):
    """benchmarks.gpu_timed's worker answers the CPU worker's two step
    methods and reads the scheduler output's fields: present on this
    release, and a change is named."""
    from vllm.v1.worker.cpu_worker import CPUWorker

    from vllm_seqhooks.engine.vllm_private.worker_api import worker_api_problems

    assert worker_api_problems() == []
    monkeypatch.setattr(CPUWorker, "sample_tokens", lambda self, grammar: None)
    assert any("sample_tokens" in p for p in worker_api_problems())


def test_the_gpu_timed_workers_queue_readers_nap_where_vllms_spin(monkeypatch):
    """The GPU-timed worker's process looks at its queue with a nap in
    between where vLLM's reader only yields (the second after a read), and
    waits for the writer's notification after it, as vLLM's does. The reader
    is vLLM's class without its zmq sockets (a real context's ``term`` once
    aborted the whole pytest process in a clean-clone run)."""
    import time
    from types import SimpleNamespace

    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    from vllm_seqhooks.engine.vllm_private.worker_api import READER_NAP_S, queue_readers_nap

    monkeypatch.setattr(SpinCondition, "wait", SpinCondition.wait)  # (restored after)
    naps, polls = [], []
    sleep = time.sleep
    monkeypatch.setattr(time, "sleep", lambda s: (naps.append(s), sleep(s)))
    reader = SpinCondition.__new__(SpinCondition)
    reader.is_reader, reader.busy_loop_s = True, 1
    reader.read_cancel_socket = reader.local_notify_socket = object()
    reader.poller = SimpleNamespace(poll=lambda timeout=None: polls.append(timeout) or [])
    queue_readers_nap()
    queue_readers_nap()
    # (as after a read; 0.33 also looks at its socket every 2 s from there)
    reader.last_read = reader.last_notify_poll = time.monotonic()
    reader.wait(timeout_ms=0)
    assert naps == [READER_NAP_S] and polls == []  # once: installed once
    reader.last_read -= 2 * reader.busy_loop_s
    reader.wait(timeout_ms=7)  # idle: vLLM's wait on the notification
    assert naps == [READER_NAP_S] and polls == [7]


# ----------------------------------------------------------- one port onto vLLM
#: vLLM classes whose private methods and attributes the engine reaches.
VLLM_CLASSES = (
    "vllm.v1.core.sched.scheduler:Scheduler",
    "vllm.v1.core.sched.async_scheduler:AsyncScheduler",
    "vllm.v1.core.sched.request_queue:FCFSRequestQueue",
    "vllm.v1.core.sched.output:SchedulerOutput",
    "vllm.v1.core.kv_cache_manager:KVCacheManager",
    "vllm.v1.core.kv_cache_manager:KVCacheBlocks",
    "vllm.v1.core.block_pool:BlockPool",
    "vllm.v1.request:Request",
    "vllm.v1.worker.gpu_input_batch:InputBatch",
    "vllm.v1.worker.gpu_model_runner:GPUModelRunner",
    "vllm.v1.worker.worker_base:WorkerBase",
    "vllm.v1.engine.input_processor:InputProcessor",
    "vllm.v1.engine.output_processor:RequestState",
    "vllm.v1.engine.output_processor:OutputProcessor",
    "vllm.v1.engine.core:EngineCore",
    "vllm.sampling_params:SamplingParams",
)


def _vllm_private_names() -> set[str]:
    """Every ``_name`` (not dunder) a class above or a vLLM base of it
    defines or sets on ``self``."""
    import importlib
    import inspect
    import re

    names: set[str] = set()
    for spec in VLLM_CLASSES:
        module, name = spec.split(":")
        for klass in getattr(importlib.import_module(module), name).__mro__:
            if not klass.__module__.startswith("vllm."):
                continue
            names |= {n for n in vars(klass) if n.startswith("_") and not n.startswith("__")}
            try:
                names |= set(re.findall(r"self\.(_[a-z]\w*)", inspect.getsource(klass)))
            except (OSError, TypeError):
                pass
    return names


def _engine_modules():
    from pathlib import Path

    import vllm_seqhooks.engine as engine

    root = Path(engine.__file__).parent
    return [p for p in sorted(root.glob("*.py"))]


def _private_uses(path, names):
    """(line, expression) of each use of a name in ``names`` as an
    attribute, except vLLM's own method called as ``super()._x`` (or
    ``Scheduler._x``) inside the override ``_x``."""
    import ast

    tree = ast.parse(path.read_text())
    allowed: set[int] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name in names:
            for node in ast.walk(fn):
                if isinstance(node, ast.Attribute) and node.attr == fn.name and (
                        ast.unparse(node.value) in ("super()", "Scheduler")):
                    allowed.add(id(node))
    return [(node.lineno, ast.unparse(node)) for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr in names
            and id(node) not in allowed]


def test_engine_reaches_vllm_privates_only_through_the_port():
    """No module of ``engine/`` outside ``vllm_private/`` calls a private
    vLLM method or touches a private attribute of a vLLM object; the hook
    scheduler's overrides call only vLLM's own method of their name."""
    names = _vllm_private_names()
    assert {"_preempt_request", "_all_token_ids", "_update_request_as_session"} <= names
    found = {p.name: uses for p in _engine_modules() if (uses := _private_uses(p, names))}
    assert found == {}


def test_the_check_catches_a_private_call(tmp_path):
    names = _vllm_private_names()
    module = tmp_path / "part.py"
    module.write_text("def f(sched, req):\n    sched._free_request_blocks(req)\n"
                      "    return req._all_token_ids\n"
                      "class S:\n    def _free_request(self, r):\n"
                      "        return super()._free_request(r)\n")
    assert sorted(_private_uses(module, names)) == [(2, "sched._free_request_blocks"),
                                            (3, "req._all_token_ids")]


def test_every_private_override_is_in_the_table():
    """The hook scheduler's overrides of private vLLM methods are exactly
    the table's (vllm_private/overrides.py), each with its reasons, and
    each signature is checked at start-up."""
    from vllm.v1.core.sched.scheduler import Scheduler

    from vllm_seqhooks.engine.scheduler import SeqHooksMixin
    from vllm_seqhooks.engine.vllm_private.overrides import OVERRIDDEN, OVERRIDES
    from vllm_seqhooks.engine.vllm_private.scheduler import SCHEDULER_METHODS

    overridden = {n for n in vars(SeqHooksMixin)
                  if n.startswith("_") and not n.startswith("__") and hasattr(Scheduler, n)}
    assert overridden == OVERRIDDEN
    assert OVERRIDDEN <= {name for name, _ in SCHEDULER_METHODS}
    assert all(o.why and o.relies_on and o.can_go for o in OVERRIDES)


def test_session_assumptions_are_checked(monkeypatch):
    """Parking's use of vLLM's session path (vllm_private/sessions.py):
    what it relies on holds on the installed vLLM, as its release is
    expected to have it; a release checked against the other one's
    expectations is reported by name (each difference is told apart)."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import RequestStatus

    from vllm_seqhooks.engine import vllm_private
    from vllm_seqhooks.engine.vllm_private.releases import RELEASES, installed

    release = installed()
    assert vllm_private.session_problems(release) == []
    other = next(r for r in RELEASES.values() if r.version != release.version)
    found = vllm_private.session_problems(other)
    assert any("_update_request_as_session no longer cuts" in p for p in found)
    assert any("queue" in p and "kept" in p for p in found)

    def handle_stopped_elsewhere(self, request):
        if not request.resumable:
            return True
        request.status = RequestStatus.WAITING_FOR_STREAMING_REQ
        self.num_waiting_for_streaming_input += 1
        return False

    monkeypatch.setattr(Scheduler, "_handle_stopped_request", handle_stopped_elsewhere)
    if not release.kept_requests_queued_after_loop:  # (0.33's already does not queue)
        found = vllm_private.session_problems(release)
        assert found == [
            "Scheduler._handle_stopped_request no longer queues the kept request itself"]
        assert any("queues the kept request" in p for p in vllm_private.problems())


def test_only_the_supported_vllm_releases_start(monkeypatch):
    """A vLLM that is not a supported release is refused at start-up,
    naming the releases that are."""
    from vllm_seqhooks.engine import vllm_private
    from vllm_seqhooks.engine.vllm_private import releases

    assert releases.SUPPORTED_VERSIONS == ("0.32.0", "0.33.0")
    assert releases.installed().version == releases.installed_version()
    monkeypatch.setattr(vllm_private, "installed_version", lambda: "0.34.0")
    assert vllm_private.problems() == [
        "vLLM 0.34.0 is installed; vllm-seqhooks supports vLLM 0.32.0 and 0.33.0 "
        "(the releases it was tested on)"]
    monkeypatch.setattr(vllm_private, "_checked", False)
    with pytest.raises(vllm_private.VllmPrivateAPIError, match="supports vLLM 0.32.0 and 0.33.0"):
        vllm_private.check()

@pytest.mark.parametrize("uncomputed", [1, 3, 0])
def test_a_resumed_session_keeps_exactly_its_computed_tokens(uncomputed):
    """``sessions.resume_session`` (a join's resume): the request keeps its
    first ``num_computed_tokens`` tokens and then the update's, on every
    supported release (0.32 cuts there itself; 0.33 keeps up to the last
    token and asserts that is not below the computed ones, so the port cuts
    first): the last sampled token uncomputed (1), a parent whose KV ends
    earlier (3: tokens cut after a stop, or spilled), and one whose every
    token was computed (0)."""
    from functools import partial
    from types import SimpleNamespace

    from vllm import SamplingParams
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import Request, RequestStatus, StreamingUpdate

    from vllm_seqhooks.engine.vllm_private.sessions import resume_session
    from tests.support.sched_setup import block_hasher

    req = Request(request_id="r", prompt_token_ids=list(range(10, 20)),
                  sampling_params=SamplingParams(max_tokens=20), pooling_params=None,
                  arrival_time=0.0, block_hasher=block_hasher(4))
    for t in range(30, 36):
        req.append_output_token_ids(t)
    req.num_computed_tokens = req.num_tokens - uncomputed
    req.status = RequestStatus.WAITING_FOR_STREAMING_REQ
    kept = list(req.all_token_ids[: req.num_computed_tokens])
    sched = SimpleNamespace(hash_block_size=4, num_waiting_for_streaming_input=1,
                            log_stats=False)
    sched._update_request_as_session = partial(Scheduler._update_request_as_session, sched)
    update = StreamingUpdate(mm_features=None, prompt_token_ids=[90, 91], max_tokens=5,
                             arrival_time=1.0, sampling_params=SamplingParams(max_tokens=5))
    resume_session(sched, req, update)
    assert list(req.all_token_ids) == kept + [90, 91]
    assert list(req.prompt_token_ids) == kept + [90, 91]
    assert req.num_output_tokens == 0 and req.status == RequestStatus.WAITING
    fresh = Request(request_id="f", prompt_token_ids=kept + [90, 91],
                    sampling_params=SamplingParams(max_tokens=5), pooling_params=None,
                    arrival_time=0.0, block_hasher=block_hasher(4))
    assert req.block_hashes == fresh.block_hashes
