"""``Serve``: a documented ``vllm serve`` started as pasted (on a free
port), healthy within its budget, and asked what its block asks."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tests.support.doc_commands.blocks import FORKING_PROMPT, FORKJOIN, ROOT, THREADWEAVER
from tests.support.doc_commands.jobs import (CEILING, HEALTHY_IN, PEAK_LIMIT, Handler, Job,
                                             bash_words, report, venv_env)
from tests.support.resource_watch import GIB, Stopwatch, TreeMemory
# -- Serve: serve-and-ask


@dataclass
class Serve(Handler):
    """``vllm serve <embedded model> ...`` lines (one server per distinct
    command, shared by the blocks that paste it) and the block's asks: its
    ``curl`` lines, or a Python client line (``client.completions.create``).
    ``check(answer)`` checks a ``curl``'s JSON answer."""

    check: Callable[[dict], None] | None = None
    server: str | None = None  # a Python client block: the serve command it asks
    kind = "serve"

    def jobs(self, block, commands):
        commands = [re.sub(r"\s+#.*$", "", c) for c in commands]
        serves = [c for c in commands if c.startswith("vllm serve")]
        asks = [c for c in commands if not c.startswith("vllm serve")]
        if block.lang == "python":
            assert self.server is not None, f"{block.where}: Serve(server=...) for a Python ask"
            serves, asks = [self.server], [block.text]
        assert len(serves) == 1, f"{block.where}: one `vllm serve` per Serve block: {serves}"
        (serve,) = serves
        return [Job(self.kind, serve, _serve_and_ask, slow=True, ahead=True,
                    asks=[(block.where, (ask, self.check)) for ask in asks])]


# ------------------------------------------------------------ serve and ask


def _task(model: str):
    from vllm_seqhooks.tasks import forkjoin, threadweaver

    return {FORKJOIN: forkjoin, THREADWEAVER: threadweaver}[model]


def _every_fan_out(task, per_fan_out: int = 2) -> list:
    """Held-out problems, ``per_fan_out`` of each number of children the
    task's model writes (0: it sorts directly), at most twelve."""
    pool = task.heldout_problems(200, seed=4321)
    fan_outs = sorted({len(p.chunks) for p in pool})
    return [p for k in fan_outs for p in [q for q in pool if len(q.chunks) == k][:per_fan_out]][:12]


def _serve_and_ask(job: Job, tmp_path: Path) -> None:
    """The server as pasted (its port: a free one on 127.0.0.1), healthy
    within the budget; each block's asks; held-out problems of every
    fan-out answered right, parents' and children's text alike; a chat
    completion equal to the completion. (For the ThreadWeaver model this is
    also the test of ``vllm serve MODEL --seqhooks auto`` that
    tests/test_threadweaver_model.py had, which started a server of its own.)"""
    import requests
    from openai import OpenAI

    from vllm_seqhooks.local_server import Server, free_port, vllm_command

    words = bash_words(job.key)
    assert words[:2] == ["vllm", "serve"] and Path(vllm_command()).exists()
    model, flags = words[2], words[3:]
    task = _task(model)
    port = free_port()
    log_path = tmp_path / "serve.log"
    clock = Stopwatch()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([vllm_command(), "serve", model, "--host", "127.0.0.1",
                                 "--port", str(port), *flags], cwd=ROOT, env=venv_env(),
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(f"http://127.0.0.1:{port}", proc, log_path)
    memory = TreeMemory(proc.pid).start()
    try:
        healthy = None
        while clock() < CEILING * HEALTHY_IN:
            assert proc.poll() is None, f"vllm serve exited:\n{server.log_tail()}"
            try:
                if requests.get(server.url + "/health", timeout=2).status_code == 200:
                    healthy = clock()
                    break
            except requests.RequestException:
                pass
            time.sleep(0.5)
        assert healthy is not None, f"not healthy in {CEILING * HEALTHY_IN} s:\n{server.log_tail()}"
        for where, (ask, check) in job.asks:
            _ask(ask, check, server.url, port, model, where)
        client = OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=120)
        problems = _every_fan_out(task)
        texts = [client.completions.create(model=model, prompt=p.prompt, temperature=0,
                                           max_tokens=task.PARENT_MAX_TOKENS).choices[0].text
                 for p in problems]
        # the chat template: one user message, the bare problem
        chat = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": problems[0].prompt}],
            temperature=0, max_tokens=task.PARENT_MAX_TOKENS).choices[0].message.content
        log = server.log_tail(10 ** 6)  # (before the stop: vLLM logs its engine's death at SIGINT)
    finally:
        server.stop()
        memory.stop()
    report(job.key, peak_gib=memory.peak / GIB, healthy_s=healthy)
    for p, text in zip(problems, texts):
        assert task.check(p, text) and task.check_full_text(p, text), (p.digits, text)
    assert chat == texts[0], (chat, texts[0])
    assert "Traceback" not in log, log[-3000:]
    if model == FORKJOIN:
        assert "context=payload" in log  # the scheduler says what it runs
    assert memory.peak <= PEAK_LIMIT, f"peak RSS {memory.peak / GIB:.2f} GiB > 3 GiB"
    # (the ceiling of the time to healthy is asserted in the loop above)


def _ask(ask: str, check, url: str, port: int, model: str, where: str) -> None:
    if ask.startswith("curl"):
        words = [w.replace("127.0.0.1:8000", f"127.0.0.1:{port}") for w in bash_words(ask)]
        proc = subprocess.run(words, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, (where, proc.stderr)
        answer = json.loads(proc.stdout)
        assert answer["choices"][0]["text"], (where, answer)
        assert "seqhooks" in answer["kv_transfer_params"], (where, answer)
        if check is not None:
            check(answer)
        return
    # a Python client line: `client` made for this server, `...` the model and a problem
    from openai import OpenAI

    class Fill(ast.NodeTransformer):
        def visit_keyword(self, node):
            if isinstance(node.value, ast.Constant) and node.value.value is Ellipsis:
                node.value = ast.Name(id=f"_{node.arg}", ctx=ast.Load())
            return node

    tree = ast.fix_missing_locations(Fill().visit(ast.parse(textwrap.dedent(ask))))
    (stmt,) = tree.body
    assert isinstance(stmt, ast.Expr)
    namespace = {"client": OpenAI(base_url=url + "/v1", api_key="unused", timeout=120),
                 "_model": model, "_prompt": FORKING_PROMPT[model]}
    answer = eval(compile(ast.Expression(stmt.value), where, "eval"), namespace)
    trace = answer.model_extra["kv_transfer_params"]["seqhooks"]
    if check is not None:
        check(trace)
