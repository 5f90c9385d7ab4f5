"""The README's Python snippet and its serve-and-ask commands for the
embedded model, run the way a user pastes them: extracted from README.md
(so they cannot drift), from the checkout's root, with the venv's
interpreter and ``vllm``. The only change made to a pasted command: the
server's port (a free one, on 127.0.0.1) in both the serve and the curl
line."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CRASH_LIKE = ("Traceback", "exited unexpectedly", "force killing")


def _section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end > 0 else None]


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


@pytest.mark.slow
def test_python_snippet_runs_as_pasted(tmp_path):
    snippet = _blocks(_section("Python"), "python")[0]
    assert 'if __name__ == "__main__":' in snippet
    path = tmp_path / "snippet.py"
    path.write_text(snippet)
    proc = subprocess.run([sys.executable, str(path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    # the model wrote its promises, the engine merged the children after <sync>
    assert "<sync>" in proc.stdout and "join of ['0', '1', '2']" in proc.stdout, output[-3000:]
    assert "=0123456789" in proc.stdout  # sort 9081726354, answered
    assert not [c for c in CRASH_LIKE if c in output], output[-3000:]


def _serve_and_ask() -> tuple[list[str], list[str]]:
    (block,) = [b for b in _blocks(_section("Serving"), "bash")
                if "vllm serve vllm_seqhooks/data/forkjoin_model" in b]
    lines = block.replace("\\\n", " ").strip().splitlines()
    serve = [shlex.split(line) for line in lines if line.startswith("vllm serve")]
    ask = [shlex.split(line) for line in lines if line.startswith("curl")]
    assert len(serve) == 1 and len(ask) == 1, block
    return serve[0], ask[0]


@pytest.mark.slow
def test_serve_command_runs_as_pasted(tmp_path):
    """The README's serve-and-ask commands; then, on the same server (one
    flag, ``--seqhooks auto``), 12 held-out problems answered with their
    full text right, and the scheduler's log saying what it runs."""
    from vllm_seqhooks.check import trained_outputs
    from vllm_seqhooks.tasks import forkjoin as task
    from tests.support.server import start_server, vllm_command

    serve, ask = _serve_and_ask()
    assert serve[:2] == ["vllm", "serve"] and Path(vllm_command()).exists()
    server = start_server(serve[2], *serve[3:], log_path=tmp_path / "serve.log")
    try:
        port = server.url.rsplit(":", 1)[1]
        ask = [a.replace("127.0.0.1:8000", f"127.0.0.1:{port}") for a in ask]
        proc = subprocess.run(ask, cwd=ROOT, capture_output=True, text=True, timeout=120)
        problems = task.heldout_problems(12, seed=4321)
        outputs = trained_outputs(server.url, serve[2], problems)
        log = server.log_tail(10 ** 6)  # (before the stop: vLLM logs its engine's death at SIGINT)
    finally:
        server.stop()
    assert all(task.check_full_text(p, text) for p, (text, _ids) in zip(problems, outputs))
    assert "context=payload" in log  # the scheduler says what it runs
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    text = answer["choices"][0]["text"]
    assert "<sync>" in text and text.endswith("=0123456789"), text
    trace = answer["kv_transfer_params"]["seqhooks"]
    assert len(trace["children"]) == 3
    assert "Traceback" not in log, log[-3000:]


@pytest.mark.slow
def test_rl_rollout_example_runs_reproducibly():
    """``examples/rl_rollout.py --problems 3``: its third group (``sort 9=``)
    never forks and still gets its rows; the seeded samples repeat run to
    run; the process exits cleanly."""
    cmd = [sys.executable, str(ROOT / "examples" / "rl_rollout.py"), "--problems", "3"]
    runs = [subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
            for _ in range(2)]
    for proc in runs:
        output = proc.stdout + proc.stderr
        assert proc.returncode == 0, output[-3000:]
        assert not [c for c in CRASH_LIKE if c in output], output[-3000:]
    groups = [[line for line in proc.stdout.splitlines()
               if line.startswith(("problem", "  reward"))] for proc in runs]
    assert groups[0] == groups[1]
    assert "problem 2: 'sort 9='" in runs[0].stdout
    (plain,) = [i for i, line in enumerate(groups[0]) if line.startswith("problem 2")]
    assert all("1 per-call rows" in line for line in groups[0][plain + 1:plain + 9])
