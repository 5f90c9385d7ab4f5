"""Running what a block says (its process tree's memory and time measured),
the jobs a block becomes, and the handlers that run or check a block as it
is: ``Run``, ``CI``, ``NotHere``, ``All``, ``Mixed``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tests.support.crash_like import crash_like
from tests.support.doc_commands.blocks import ROOT, Block
from tests.support.resource_watch import GIB, Stopwatch, TreeMemory
from tests.support.run_ahead import say

#: Issue 49, item 1.
PEAK_LIMIT = 3 * GIB
HEALTHY_IN = 60
CEILING = 3  # times the documented or implied time


# ----------------------------------------------------------- running things


def venv_env(**extra: str) -> dict[str, str]:
    """This environment with the venv's bin first on PATH (``vllm``,
    ``python`` and ``curl`` as a user of the venv has them)."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(extra)
    return env


@dataclass
class Measured:
    returncode: int
    output: str
    stdout: str
    seconds: float
    peak: int


def run_measured(cmd: list[str], timeout: float, cwd: Path = ROOT,
                 environ: dict[str, str] | None = None, **env: str) -> Measured:
    """Run ``cmd``, sampling its process tree's RSS; stdout and stderr apart.
    Its environment: ``environ`` whole, or this one with the venv first on
    PATH and ``env`` added."""
    clock = Stopwatch()
    environ = venv_env(**env) if environ is None else environ
    proc = subprocess.Popen(cmd, cwd=cwd, env=environ, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    with TreeMemory(proc.pid) as memory:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            out, err = proc.communicate()
    return Measured(proc.returncode, out + err, out, clock(), memory.peak)


def report(what: str, **figures: Any) -> None:
    shown = ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                      for k, v in figures.items())
    say(f"\n[docs budget] {what}: {shown}")


def check_budget(what: str, m: Measured, seconds: float) -> None:
    report(what, peak_gib=m.peak / GIB, seconds=m.seconds)
    assert m.peak <= PEAK_LIMIT, f"{what}: peak RSS {m.peak / GIB:.2f} GiB > 3 GiB"
    assert m.seconds <= CEILING * seconds, f"{what}: {m.seconds:.0f} s > {CEILING} x {seconds} s"


def bash_words(text: str) -> list[str]:
    """``text``'s words as bash splits them (quotes, ``$'\\n'``, comments),
    substitutions run with the venv first on PATH."""
    proc = subprocess.run(["bash", "-c", f"printf '%s\\0' {text}"], capture_output=True,
                          text=True, env=venv_env(), cwd=ROOT, check=True)
    return proc.stdout.split("\0")[:-1]


def source_has(path: str, needle: str, code_only: bool = False) -> bool:
    lines = (ROOT / path).read_text().splitlines()
    if code_only:
        lines = [line.split(" #")[0] for line in lines if not line.lstrip().startswith("#")]
    return any(needle in line for line in lines)


# ------------------------------------------------------------------- the jobs
# A handler turns a block (or one of its commands) into jobs; equal jobs
# (the same command in two pages) run once, listing both.


@dataclass
class Job:
    kind: str
    key: str
    run: Callable[["Job", Path], None]
    slow: bool = False
    ahead: bool = False  # a subprocess's wait: run ahead, beside another (AHEAD)
    sources: list[str] = field(default_factory=list)
    asks: list[tuple[str, Any]] = field(default_factory=list)  # Serve: (where, ask)

    @property
    def id(self) -> str:
        return f"{self.kind}: {self.key}"[:150]


class Handler:
    kind = ""

    def jobs(self, block: Block, commands: list[str]) -> list[Job]:
        raise NotImplementedError


# -- Run: as pasted


@dataclass
class Run(Handler):
    """As pasted. ``after``: run only what follows it in the command (the
    rest is another handler's); ``expect``: texts the output must hold;
    ``seconds``: the time the page states or implies."""

    expect: tuple[str, ...] = ()
    seconds: float = HEALTHY_IN
    engine: bool = True
    after: str | None = None
    check: Callable[[str], None] | None = None
    kind = "run"

    def jobs(self, block, commands):
        if block.lang == "python":
            return [Job(self.kind, _python_key(block.text), self._run_python(block.text),
                        slow=self.engine, ahead=self.engine)]
        out = []
        for command in commands:
            if self.after is not None:
                command = command.split(self.after, 1)[1].strip()
            command = re.sub(r"\s+#.*$", "", command)
            # (the same command: `python` is the venv's, first on PATH)
            key = re.sub(r"^\.venv/bin/python ", "python ", command)
            out.append(Job(self.kind, key, self._run_shell(command), slow=self.engine,
                           ahead=self.engine))
        return out

    def _finish(self, what: str, m: Measured) -> None:
        assert m.returncode == 0, m.output[-3000:]
        assert not crash_like(m.output), crash_like(m.output)
        for text in self.expect:
            assert text in m.stdout, (text, m.stdout[-3000:])
        if self.check is not None:
            self.check(m.stdout)
        if self.engine:
            check_budget(what, m, self.seconds)
        else:
            report(what, seconds=m.seconds)

    def _run_shell(self, command: str):
        def run(job: Job, tmp_path: Path) -> None:
            self._finish(command, run_measured(["bash", "-c", command], timeout=900))
        return run

    def _run_python(self, snippet: str):
        def run(job: Job, tmp_path: Path) -> None:
            if "LLM(" in snippet:  # vLLM's CPU workers start with spawn
                assert 'if __name__ == "__main__":' in snippet
            path = tmp_path / "snippet.py"
            path.write_text(snippet)
            self._finish(job.sources[0], run_measured([sys.executable, str(path)], timeout=900))
        return run


def _python_key(text: str) -> str:
    return " ".join(text.split())[:200]


# -- CI and NotHere


@dataclass
class CI(Handler):
    """A command CI runs itself: ``runner`` has an uncommented line holding
    ``line``; ``executable``: a script the page runs as ``./script`` has
    its executable bit."""

    runner: str
    line: str
    executable: str | None = None
    kind = "ci"

    def jobs(self, block, commands):
        return [Job(self.kind, f"{self.runner} runs {self.line!r}", self._check)]

    def _check(self, job: Job, tmp_path: Path) -> None:
        assert source_has(self.runner, self.line, code_only=True), (self.runner, self.line)
        if self.executable:
            assert os.access(ROOT / self.executable, os.X_OK), f"{self.executable} is not executable"


@dataclass
class NotHere(Handler):
    """Not runnable here: ``reason`` says why; ``covered``: (file, text)
    pairs naming what covers it instead, each file holding its text."""

    reason: str
    covered: tuple[tuple[str, str], ...] = ()
    kind = "not here"

    def jobs(self, block, commands):
        return [Job(self.kind, f"{block.where}: {self.reason}"[:120], self._check)]

    def _check(self, job: Job, tmp_path: Path) -> None:
        assert len(self.reason) > 20
        for path, needle in self.covered:
            assert source_has(path, needle), f"{path} no longer holds {needle!r}"


@dataclass
class All(Handler):
    """Several handlers for the same commands."""

    handlers: tuple[Handler, ...]

    def jobs(self, block, commands):
        return [j for h in self.handlers for j in h.jobs(block, commands)]


@dataclass
class Mixed(Handler):
    """A block whose commands need different handlers: each command is
    claimed by exactly one key (a regular expression ``re.search`` finds in
    it)."""

    parts: dict[str, Handler]

    def jobs(self, block, commands):
        out = []
        claimed = {key: [] for key in self.parts}
        for command in commands:
            keys = [key for key in self.parts if re.search(key, command)]
            assert len(keys) == 1, (
                f"{block.where}: the command {command!r} is claimed by {keys or 'no key'} of "
                "its Mixed entry: give it exactly one")
            claimed[keys[0]].append(command)
        stale = [key for key, cmds in claimed.items() if not cmds]
        assert not stale, f"{block.where}: Mixed keys matching no command: {stale}"
        for key, cmds in claimed.items():
            out += self.parts[key].jobs(block, cmds)
        return out
