"""Hooks on vLLM's Ray executor (issue 23): tensor parallelism with Ray
workers on one node (``ray.init()`` started by vLLM) and across two Ray
nodes of this machine behind ``vllm serve``, through the test-only switch
``SEQHOOKS_TEST_RAY_ON_CPU=1`` (vLLM 0.32's CPU platform has no Ray device
key). Answers and fork/join trees equal the single-process engine's; the
worker extension is loaded in every Ray worker.

Skipped when Ray is not installed (``pip install -e .[ray]``;
``scripts/setup.sh`` installs it).

Longer than a minute (about three on a quiet 2-core machine), because what
it tests is process start-ups: the three slow tests each start fresh
processes importing vLLM and Ray -- vLLM's own ``ray.init()`` with two TP
worker actors; then two ``ray start`` clusters, each behind a ``vllm
serve`` whose engine and workers are Ray actors. The clusters cannot be
one: the TP test needs one Ray CPU per node (so its two workers land on
different nodes), the DP test two per node (the rank's device and its
engine actor). The single-process references are in-process engines (about
a second each to start), shared by the two-node tests."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.ray_cluster import WORKER_NICENESS, ray_installed

pytestmark = pytest.mark.skipif(
    not ray_installed(), reason="Ray is not installed (pip install -e '.[ray]')")

#: Imports vLLM's CPU platform and Ray executor once, then, for each value
#: of the switch (argv[1], JSON), forks a child that sets it, loads vLLM's
#: plugins as a fresh vLLM process does and prints what the probe sees, one
#: JSON line per value: {value: [exit status, line or traceback]}.
_SWITCH_PROBES = """
import json, os, sys, traceback
import vllm.platforms.cpu, vllm.v1.executor.ray_executor_v2  # (once, before the forks)
results = {}
for value in json.loads(sys.argv[1]):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        if value:  # (the driver starts without it)
            os.environ["SEQHOOKS_TEST_RAY_ON_CPU"] = value
        try:
            from vllm.plugins import load_general_plugins
            load_general_plugins()
            from vllm.platforms.cpu import CpuPlatform
            from vllm.v1.executor import ray_executor_v2 as rx
            out, code = " ".join([repr(CpuPlatform.ray_device_key), rx.RayWorkerProc.__name__,
                                  repr(rx.RayExecutorV2._get_actor_resource_kwargs())]), 0
        except BaseException:
            out, code = traceback.format_exc(), 1
        os.write(write, out.encode())
        os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        out = f.read()
    results[value] = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), out]
print(json.dumps(results))
"""
_SWITCH_VALUES = ["", "1"]


@pytest.fixture(scope="module")
def switch_probes() -> dict[str, list]:
    """The probe with the switch unset and set, in forks of one process
    that imported vLLM (one vLLM import, not two)."""
    env = {k: v for k, v in os.environ.items() if k != "SEQHOOKS_TEST_RAY_ON_CPU"}
    out = subprocess.run([sys.executable, "-c", _SWITCH_PROBES, json.dumps(_SWITCH_VALUES)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("value", _SWITCH_VALUES)
def test_the_switch_changes_nothing_unless_asked(switch_probes, value):
    """Without ``SEQHOOKS_TEST_RAY_ON_CPU=1`` the tests' plugin (found by
    vLLM's own plugin loader on the ``PYTHONPATH`` conftest sets) leaves vLLM's CPU
    platform refusing Ray; with it, Ray CPUs are its devices, the worker
    actors take no resources beside their bundle's, and the executor starts
    the CPU worker class."""
    code, line = switch_probes[value]
    assert code == 0, line[-3000:]
    if value:
        assert line == "'CPU' CpuRayWorkerProc {'num_gpus': 0}"
    else:
        assert line.startswith("'' RayWorkerProc {'num_gpus': 0, 'resources': {'': ")


def test_ray_on_cpu_switch_api_is_present_and_checked(monkeypatch):
    """What the test-only Ray switch patches (tests/support/ray_on_cpu.py)
    exists under the pin, and a change is reported by name."""
    from vllm.v1.executor import ray_executor_v2

    from tests.support.ray_on_cpu import ray_on_cpu_problems

    assert ray_on_cpu_problems() == []
    monkeypatch.setattr(ray_executor_v2.RayExecutorV2, "_get_actor_resource_kwargs",
                        lambda self: {})
    monkeypatch.delattr(ray_executor_v2.RayWorkerProc, "get_node_and_physical_gpu_ids")
    found = ray_on_cpu_problems()
    assert any("_get_actor_resource_kwargs" in p for p in found)
    assert any("get_node_and_physical_gpu_ids" in p for p in found)



#: Seconds a Ray-backed ``vllm serve`` may take to answer /health: four
#: processes import vLLM one after another (API server, engine core, two
#: Ray actors); with three other engines on this machine's two cores it took
#: 155 s (the TP test, workers at nice 0), so twice the default's margin.
_RAY_SERVER_TIMEOUT = 600


def _serve_flags(engine_kwargs: dict) -> list[str]:
    """``vllm serve`` flags for ``vllm.LLM`` keyword arguments."""
    flags = []
    for key, value in engine_kwargs.items():
        flag = "--" + key.replace("_", "-")
        flags += [flag] if value is True else [flag, str(value)]
    return flags


def _one_core_per_node() -> list[dict[str, str]]:
    """The environment of two Ray nodes, each binding its vLLM worker to its
    own core (skips the test on a machine with fewer than two)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("two Ray nodes need two CPUs")
    return [{"VLLM_CPU_OMP_THREADS_BIND": str(cpu)} for cpu in cpus[:2]]


def _strip_ids(tree: str) -> str:
    return re.sub(r"request \S+", "request", tree)


def _answers(llm, task, prompts) -> list[tuple[str, str]]:
    from vllm import SamplingParams

    from vllm_seqhooks import format_tree

    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=task.PARENT_MAX_TOKENS),
                        use_tqdm=False)
    return [(o.outputs[0].text, _strip_ids(format_tree(o.hook_trace))) for o in outs]


def _one_process(task, prompts) -> list[tuple[str, str]]:
    """An embedded model's answers and trees on one process's engine: this
    one's (in-process, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the reference
    crosses no process boundary, and the engine starts in about a second
    instead of the dozen a multiprocess one takes here). The variables the
    CPU worker leaves in ``os.environ`` are taken back, so the Ray engines
    and servers started later do not inherit them."""
    from vllm_seqhooks import LLM

    environ = dict(os.environ)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        llm = LLM(str(task.model_dir()), special_kwargs="auto", **task.ENGINE_KWARGS)
        try:
            return _answers(llm, task, prompts)
        finally:
            llm.shutdown()
    finally:
        os.environ.clear()
        os.environ.update(environ)


@pytest.fixture(scope="module")
def forkjoin_reference():
    """The embedded fork/join model's answers and trees, one process."""
    from vllm_seqhooks.__main__ import demo_problems
    from vllm_seqhooks.tasks import forkjoin as task

    prompts = [p.prompt for p in demo_problems(7)]
    answers = _one_process(task, prompts)
    assert sum(a[0].count("<sync>") for a in answers) >= 3  # the model forks
    return prompts, answers


@pytest.mark.slow
def test_tensor_parallel_ray_workers_on_one_node(monkeypatch):
    """``distributed_executor_backend="ray"``, TP = 2, no cluster running:
    vLLM's own ``ray.init()`` starts one; both Ray workers load the hook
    worker extension (families contiguous in their batches) and the
    embedded ThreadWeaver model's answers and trees (the engine forking at
    its outline, children joined by text) equal one process's. (The
    fork/join model is compared over Ray in the two-node tests below.)"""
    from vllm_seqhooks import LLM
    from vllm_seqhooks.tasks import threadweaver as task

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("two Ray workers need two CPUs")
    prompts = [p.prompt for p in task.heldout_problems(6)]
    reference = _one_process(task, prompts)
    assert sum(tree.count("[merged") for _, tree in reference) >= 10  # children joined
    monkeypatch.setenv("SEQHOOKS_TEST_RAY_ON_CPU", "1")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    for name, value in WORKER_NICENESS.items():  # vLLM's ray.init() starts the raylet
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", f"{cpus[0]}|{cpus[1]}")
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc(callable)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    llm = LLM(str(task.model_dir()), special_kwargs="auto", **task.ENGINE_KWARGS,
              tensor_parallel_size=2, distributed_executor_backend="ray")
    try:
        got = _answers(llm, task, prompts)
        flags = llm.collective_rpc(
            lambda self: type(self.model_runner.__dict__.get("_seqhooks_family_grouping")).__name__)
        workers = llm.collective_rpc(lambda self: type(self).__name__)
        niceness = llm.collective_rpc(lambda self: os.nice(0))
    finally:
        llm.shutdown()
    assert got == reference
    assert all(task.check(p, text) for p, (text, _) in zip(task.heldout_problems(6), got))
    assert flags == ["FamilyGrouping"] * 2
    assert len(workers) == 2
    assert niceness == [0, 0]  # not Ray's 15: starved beside the other lanes


@pytest.mark.slow
def test_vllm_serve_tensor_parallel_across_two_ray_nodes(forkjoin_reference, tmp_path):
    """``vllm serve --distributed-executor-backend ray --tensor-parallel-size
    2`` on a Ray cluster of two nodes (one CPU each, so one TP worker on each
    node): answers and trees over HTTP equal one process's."""
    import ray
    from openai import OpenAI
    from transformers import AutoTokenizer

    from vllm_seqhooks import format_tree, get_hook_trace
    from vllm_seqhooks.tasks import forkjoin as task
    from tests.support.ray_cluster import LocalRayCluster
    from tests.support.server import start_server

    node_env = _one_core_per_node()
    prompts, reference = forkjoin_reference
    model = str(task.model_dir())
    with LocalRayCluster(tmp_path / "cluster", [1, 1], node_env) as cluster:
        srv = start_server(model, "--seqhooks", "auto", "--distributed-executor-backend", "ray",
                           "--tensor-parallel-size", "2", *_serve_flags(task.ENGINE_KWARGS),
                           log_path=tmp_path / "server.log", env=cluster.env(),
                           timeout=_RAY_SERVER_TIMEOUT)
        try:
            client = OpenAI(base_url=srv.url + "/v1", api_key="unused")
            tok = AutoTokenizer.from_pretrained(model)

            def ask(prompt):  # concurrently: every step crosses the two nodes
                r = client.completions.create(model=model, prompt=prompt, temperature=0,
                                              max_tokens=task.PARENT_MAX_TOKENS)
                return r.choices[0].text, _strip_ids(format_tree(get_hook_trace(r, tok)))

            with ThreadPoolExecutor(len(prompts)) as pool:
                got = list(pool.map(ask, prompts))
            ray.init(address=cluster.address, logging_level="ERROR")
            try:
                nodes = {node for pg in ray.util.placement_group_table().values()
                         if pg["state"] == "CREATED"
                         for node in pg["bundles_to_node_id"].values()}
            finally:
                ray.shutdown()
        finally:
            srv.stop()
        assert len(nodes) == 2, cluster.log_tail()
    assert got == reference


@pytest.mark.slow
def test_ray_data_parallel_across_two_nodes(forkjoin_reference, tmp_path):
    """``vllm serve --data-parallel-size 2 --data-parallel-backend ray
    --data-parallel-size-local 1`` on two Ray nodes: one engine actor per
    node; concurrent families spread over both ranks, each trace naming its
    rank, answers equal one process's; ``/metrics`` counts each rank's own
    joins (the plugin has vLLM carry ``SEQHOOKS_METRICS_DIR`` to the engine
    actors)."""
    import time

    from openai import OpenAI

    from vllm_seqhooks.tasks import forkjoin as task
    from tests.support.ray_cluster import LocalRayCluster
    from tests.support.server import metric, scrape, start_server

    node_env = _one_core_per_node()
    prompts, reference = forkjoin_reference
    model = str(task.model_dir())
    # per node: one Ray CPU as the rank's device, one for its engine actor
    with LocalRayCluster(tmp_path / "cluster", [2, 2], node_env) as cluster:
        srv = start_server(model, "--seqhooks", "auto", "--data-parallel-size", "2",
                           "--data-parallel-backend", "ray", "--data-parallel-size-local", "1",
                           "--api-server-count", "1", *_serve_flags(task.ENGINE_KWARGS),
                           log_path=tmp_path / "server.log", env=cluster.env(),
                           timeout=_RAY_SERVER_TIMEOUT)
        try:
            client = OpenAI(base_url=srv.url + "/v1", api_key="unused")

            def ask(prompt):
                r = client.completions.create(model=model, prompt=prompt, temperature=0,
                                              max_tokens=task.PARENT_MAX_TOKENS)
                params = r.model_extra.get("kv_transfer_params") or {}
                return r.choices[0].text, params.get("seqhooks")  # (None: no hook fired)

            with ThreadPoolExecutor(2 * len(prompts)) as pool:
                got = list(pool.map(ask, prompts * 2))
            forked = [trace for _, trace in got if trace and trace["children"]]
            deadline = time.time() + 15
            while metric(scrape(srv.url), "vllm:seqhooks_joins_total") < len(forked):
                assert time.time() < deadline, srv.log_tail()
                time.sleep(0.3)
            m = scrape(srv.url)
        finally:
            srv.stop()
    assert [text for text, _ in got] == [text for text, _ in reference] * 2
    ranks = [trace["engine"] for trace in forked]
    assert set(ranks) == {"0", "1"}, ranks
    for rank in ("0", "1"):
        key = next(k for k in m if k.startswith("vllm:seqhooks_joins_total{")
                   and f'engine="{rank}"' in k)
        assert m[key] == ranks.count(rank)
