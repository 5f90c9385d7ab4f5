"""A Ray cluster of several "nodes" on this machine, for tests of vLLM's Ray
executor and Ray data parallelism with hooks (``ray start`` processes, no
vLLM import).

Each node is a ``ray start`` raylet with its own CPU count, node IP and
environment: the head on the host's address, node ``k`` on ``127.0.0.<k+1>``
(vLLM's Ray data parallelism tells nodes apart by IP, and every 127/8 address
reaches this machine). ``Ray CPU`` resources are what the test-only switch
(``SEQHOOKS_TEST_RAY_ON_CPU=1``, :mod:`tests.support.ray_on_cpu`)
gives vLLM as devices. Token authentication is off (a loopback cluster of
one test).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.ray_on_cpu import ENV_VAR as RAY_ON_CPU_ENV


def ray_command() -> str:
    """The ``ray`` console script next to this interpreter."""
    return str(Path(sys.executable).with_name("ray"))


#: Ray starts its worker processes (here: vLLM's engine and TP workers) at
#: nice 15. Beside the suite's other lanes (nice 0) they got about 3 % of a
#: core: a two-node ``vllm serve`` never became healthy in 300 s in the CI
#: run of stop 63, and, with three background engines on this machine, its
#: TP workers logged nothing in 4 minutes after "Creating actor" (the 55 s
#: test fails the same way here). Ray's own setting puts them at nice 0.
WORKER_NICENESS = {"RAY_worker_niceness": "0"}


def ray_env(**extra: str) -> dict[str, str]:
    """This process's environment for Ray and vLLM processes of a test
    cluster: the switch on, token authentication off, logs not deduplicated,
    workers at the tests' priority (:data:`WORKER_NICENESS`)."""
    env = dict(os.environ)
    env.update({RAY_ON_CPU_ENV: "1", "RAY_AUTH_MODE": "disabled", "RAY_DEDUP_LOGS": "0",
                "RAY_USAGE_STATS_ENABLED": "0", **WORKER_NICENESS})
    env.update(extra)
    return env


@dataclass
class LocalRayCluster:
    """``with LocalRayCluster(tmp, [1, 1]) as cluster:`` starts a head with
    one CPU and a second node with one; ``cluster.address`` is what
    ``RAY_ADDRESS`` must say. ``node_env[k]`` adds variables to node ``k``'s
    processes (Ray workers inherit their raylet's environment)."""

    temp_dir: Path
    cpus_per_node: list[int]
    node_env: list[dict[str, str]] = field(default_factory=list)
    port: int = 0
    logs: list[Path] = field(default_factory=list)
    #: Ray's session directory: short (Ray's socket paths must fit in 107
    #: bytes), removed by :meth:`stop`.
    ray_temp: str = ""

    def __enter__(self) -> "LocalRayCluster":
        from tests.support.server import free_port

        self.temp_dir = Path(self.temp_dir)
        self.temp_dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        self.ray_temp = tempfile.mkdtemp(prefix="seqhooks-ray-")
        try:
            for k, cpus in enumerate(self.cpus_per_node):
                self._start_node(k, cpus)
        except Exception:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a driver (``vllm serve``) joining this cluster."""
        return ray_env(RAY_ADDRESS=self.address, **extra)

    def _start_node(self, k: int, cpus: int) -> None:
        extra = self.node_env[k] if k < len(self.node_env) else {}
        if k == 0:
            where = ["--head", "--port", str(self.port), "--temp-dir", self.ray_temp,
                     "--include-dashboard=false"]
        else:
            where = ["--address", self.address, "--node-ip-address", f"127.0.0.{k + 1}"]
        log = self.temp_dir / f"ray-node{k}.log"
        self.logs.append(log)
        with open(log, "w") as out:
            done = subprocess.run([ray_command(), "start", *where, "--num-cpus", str(cpus),
                                   "--num-gpus", "0", "--disable-usage-stats"],
                                  stdout=out, stderr=subprocess.STDOUT, env=ray_env(**extra),
                                  timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"ray start (node {k}) failed:\n{log.read_text()[-3000:]}")

    def stop(self) -> None:
        """``ray stop --force``: stops every Ray process of this machine's
        user (tests run one cluster at a time)."""
        subprocess.run([ray_command(), "stop", "--force"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, env=ray_env(), timeout=120)
        if self.ray_temp:
            shutil.rmtree(self.ray_temp, ignore_errors=True)

    def log_tail(self, n: int = 3000) -> str:
        return "\n".join(p.read_text()[-n:] for p in self.logs if p.exists())


def ray_installed() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return Path(ray_command()).exists()
