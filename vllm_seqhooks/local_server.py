"""Start and stop a real ``vllm serve`` on 127.0.0.1 and read its
``/metrics`` (the install check; tests, benchmarks and examples use it too).
No vLLM import."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

def vllm_command() -> str:
    """The ``vllm`` console script next to this interpreter."""
    return str(Path(sys.executable).with_name("vllm"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    url: str
    proc: subprocess.Popen
    log_path: Path

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text()[-n:]
        except OSError:
            return ""

    def stop(self, timeout: float = 30) -> None:
        if self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


#: Free ports :func:`start_on_free_port` tries: another process may bind the one
#: :func:`free_port` found before ``vllm serve`` does (seen on a busy
#: machine, beside Ray clusters, which bind many ports).
PORT_ATTEMPTS = 3


class ServerExited(RuntimeError):
    """The server's process exited before ``/health`` answered."""

    def __init__(self, message: str, log_tail: str) -> None:
        super().__init__(message)
        self.log_tail = log_tail

    @property
    def port_taken(self) -> bool:
        return "Address already in use" in self.log_tail


def start_server(model: str, *flags: str, log_path: str | os.PathLike,
                 timeout: float = 300, env: dict[str, str] | None = None) -> Server:
    """``vllm serve model *flags`` on a free port of 127.0.0.1; returns once
    ``/health`` answers (raises with the log's tail if it exits or times out;
    see :func:`start_on_free_port`)."""
    return start_on_free_port(
        lambda port: [vllm_command(), "serve", model, "--host", "127.0.0.1", "--port", str(port),
                      *flags],
        log_path=log_path, timeout=timeout, env=env)


def start_on_free_port(make_cmd: Callable[[int], list[str]], *, log_path: str | os.PathLike,
                       timeout: float = 300, env: dict[str, str] | None = None) -> Server:
    """:func:`start_command` of ``make_cmd(port)`` on a port :func:`free_port`
    found; when the server exits because another process bound that port
    first, again on another, :data:`PORT_ATTEMPTS` in all."""
    def attempt() -> Server:
        port = free_port()
        return start_command(make_cmd(port), port, log_path=log_path, timeout=timeout, env=env)

    for _ in range(PORT_ATTEMPTS - 1):
        try:
            return attempt()
        except ServerExited as exc:
            if not exc.port_taken:
                raise
    return attempt()


def start_command(cmd: list[str], port: int, *, log_path: str | os.PathLike,
                  timeout: float = 300, env: dict[str, str] | None = None) -> Server:
    """Run ``cmd`` (a server listening on ``port`` of 127.0.0.1) as
    :func:`start_server` runs ``vllm serve``."""
    import requests

    log_path = Path(log_path)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)
    server = Server(f"http://127.0.0.1:{port}", proc, log_path)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            tail = server.log_tail()
            raise ServerExited(f"vllm serve exited with {proc.returncode}:\n{tail}", tail)
        try:
            if requests.get(server.url + "/health", timeout=2).status_code == 200:
                return server
        except requests.RequestException:
            pass
        time.sleep(0.25)
    server.stop()
    raise RuntimeError(f"vllm serve did not become healthy:\n{server.log_tail()}")


def scrape(url: str) -> dict[str, float]:
    """``/metrics`` as {"name{labels}": value}."""
    import requests

    out = {}
    for line in requests.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        key, _, value = line.rpartition(" ")
        out[key] = float(value)
    return out


def metric(samples: dict[str, float], name: str) -> float:
    """Sum of a metric over its label sets."""
    return sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))
