"""Every fenced shell and Python block of README.md and docs/ is tested as
pasted, or listed here as not runnable with the reason (issue 49, item 8).

The blocks are read from the pages (so they cannot drift): every fenced block
whose language is bash, sh, shell, console or python, and a bare ``` block
that holds a command (``vllm serve``, ``python``, ``curl``, ...). ``REGISTRY``
maps each block -- its file and a distinctive piece of its text, robust to
edits of the prose around it -- to exactly one way of handling it;
``test_every_block_is_registered_once`` fails on a block no entry or two
entries match, and on an entry no block matches, saying what to do. The ways:

- ``Run``: as pasted, from the checkout's root with the venv first on
  ``PATH`` (``bash -c`` for shell, a temporary .py file for Python): exit
  status 0, nothing crash-like in the output, what the block's comments
  promise.
- ``Serve``: ``vllm serve <embedded model> ...`` started as pasted on a free
  port of 127.0.0.1 (the one change: the port, in the serve line and in the
  block's ``curl``), then asked: the block's ``curl`` or Python client line,
  held-out problems answered right, and ``/v1/chat/completions`` with the
  bare problem as the one user message giving the completion's text. Blocks
  serving the same command share one server.
- ``Flags``: a ``vllm serve MODEL ...`` line whose MODEL is a placeholder,
  with an embedded model in its place, parsed in this process by ``vllm
  serve``'s own parser (with the plugin's hook flags): a flag that does not
  exist or a bad value fails; each hook flag given lands in the hook
  configuration, and what ``--seqhooks NAME`` names fills the rest. A
  ``--help`` line is run as pasted.
- ``Kwargs``: ``LLM(model, special_kwargs=...)`` with a placeholder model:
  the value through ``coerce_special_kwargs`` and resolved against an
  embedded model's tokenizer, as ``vllm_seqhooks.LLM`` does before it starts
  an engine.
- ``Options``: a script's command that is not run here (the reason says
  why): its options are parsed by the script's own ``argparse`` parser (run
  up to ``parse_args``, which then ends it), so a documented option that does
  not exist, or a bad value, fails.
- ``Overrides``: verl command-line overrides: the ``$(...)`` in them run as
  pasted, the files and names they give exist.
- ``CI``: a command CI itself runs: the link is checked (``.ci/run`` runs
  it, ``scripts/test.sh`` calls it), the command is not run again.
- ``NotHere``: not runnable here, with the reason, naming what covers it
  instead; the named file must hold the named text.

``Mixed`` splits a block by command when its lines need different ways.

Budgets (issue 49, item 1: each documented command at or under 3 GiB peak,
healthy within 60 s here): every command that starts an engine has the RSS
of its whole process tree sampled every 0.2 s
(``tests.support.resource_watch``), and the peak must be at most 3 GiB. Its
time -- to ``/health`` for a server, to exit for a command -- is measured and
printed (``-s`` shows it) and asserted only against a generous ceiling, three
times the documented or implied time (180 s for "healthy within 60 s"): this
project keeps timed assertions out of tests except where an issue demands
them, and the suite must pass on a busy machine.

Time (issue 51: over 60 s, and why): six documented commands start an
engine (the two demos, the two ``LLM`` snippets, the two ``vllm serve``),
each as three processes importing torch and vLLM (the command's, vLLM's
EngineCore and its worker: about 30 CPU-seconds a command here), and no two
are the same command, so none can share another's run: on two cores that is
about two minutes however it is arranged. The jobs that wait on a
subprocess (``Job.ahead``: those six, ``--help``, the ``Options`` parses)
start at the module's first test, two at a time (``AHEAD``,
:mod:`tests.support.run_ahead`), the others' tests running meanwhile; so a
command's measured time includes another one running beside it (the
ceilings above allow for it; ``SEQHOOKS_DOCS_AHEAD=1`` measures each
alone), and its peak RSS is its own process tree's as before.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.support.resource_watch import GIB, Stopwatch, TreeMemory
from tests.support.run_ahead import RunAhead, say

ROOT = Path(__file__).resolve().parents[1]
CRASH_LIKE = ("Traceback", "exited unexpectedly", "force killing")
SHELL_LANGS = {"bash", "sh", "shell", "console"}
LANGS = SHELL_LANGS | {"python"}
#: A bare ``` block holding one of these at the start of a line is a command.
BARE_COMMAND = re.compile(
    r"^\s*(\$ )?(vllm |python|\.venv/|\./scripts/|bash |curl |pip |torchrun |ray |[A-Z_]+=\S+ )",
    re.M)
FORKJOIN = "vllm_seqhooks/data/forkjoin_model"
THREADWEAVER = "vllm_seqhooks/data/threadweaver_model"
TAG_FORMATS = ("threadweaver", "multiverse", "npr", "parallel-r1")
#: A problem each embedded model answers by forking (the pages' own).
FORKING_PROMPT = {FORKJOIN: "sort 9081726354=", THREADWEAVER: "sort 0125073179975761="}
#: Issue 49, item 1.
PEAK_LIMIT = 3 * GIB
HEALTHY_IN = 60
CEILING = 3  # times the documented or implied time


# ----------------------------------------------------------------- the blocks


@dataclass(frozen=True)
class Block:
    path: str  # relative to the checkout
    line: int  # of the opening fence
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    def commands(self) -> list[str]:
        """Shell: the logical lines (continuations joined), comment-only and
        empty lines left out. Python: the block."""
        if self.lang == "python":
            return [self.text]
        joined = self.text.replace("\\\n", " ")
        return [line.strip() for line in joined.splitlines()
                if line.strip() and not line.strip().startswith("#")]

    def comments(self) -> list[str]:
        return [line.strip() for line in self.text.splitlines() if line.strip().startswith("#")]


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def read_blocks() -> list[Block]:
    out = []
    for path in doc_files():
        text = path.read_text()
        for m in re.finditer(r"^```([\w-]*)[^\n]*\n(.*?)^```", text, re.S | re.M):
            lang, body = m.group(1).lower(), m.group(2)
            if lang in LANGS or (lang == "" and BARE_COMMAND.search(body)):
                out.append(Block(str(path.relative_to(ROOT)), text[:m.start()].count("\n") + 1,
                                 lang or "bash", body))
    return out


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


def run_measured(cmd: list[str], timeout: float, cwd: Path = ROOT, **env: str) -> Measured:
    """Run ``cmd``, sampling its process tree's RSS; stdout and stderr apart."""
    clock = Stopwatch()
    proc = subprocess.Popen(cmd, cwd=cwd, env=venv_env(**env), stdout=subprocess.PIPE,
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
        assert not [c for c in CRASH_LIKE if c in m.output], m.output[-3000:]
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


# -- Flags: parsed by `vllm serve`'s parser


@dataclass
class Flags(Handler):
    """``vllm serve MODEL ...`` lines, MODEL replaced by an embedded model
    (the ThreadWeaver one, whose character-level tokenizer writes any tag,
    for a tag format; else the promise model); ``[...]`` is optional (parsed
    with and without), ``...`` left out. ``by_id``: comment lines
    ``# or by id: --flags N M K`` are parsed too, the capital letters being
    the promise model's ids of <sync>, <promise>, </promise>."""

    by_id: bool = False
    kind = "flags"

    def jobs(self, block, commands):
        out = []
        for command in commands:
            command = re.sub(r"\s+#.*$", "", command)
            words = shlex.split(command.replace("$'", "'"), comments=True)
            while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
                words = words[1:]  # RAY_ADDRESS=...: the environment, not a flag
            assert words[:2] == ["vllm", "serve"], f"{block.where}: not a serve line: {command}"
            if any(w.startswith("--help") for w in words):
                out.append(Job("run", command, _run_help, ahead=True))
            else:
                out.append(Job(self.kind, command, _parse_serve_line))
        if self.by_id:
            for comment in block.comments():
                m = re.match(r"#\s*or by id:\s*(--.*)$", comment)
                if m:
                    out.append(Job(self.kind, "vllm serve MODEL " + m.group(1), _parse_by_id))
        return out


def _model_for(words: list[str]) -> str:
    fmt = words[words.index("--seqhooks") + 1] if "--seqhooks" in words else None
    return THREADWEAVER if fmt in TAG_FORMATS or "--fork-tag" in words else FORKJOIN


def _variants(command: str) -> list[str]:
    """``[...]``: optional; ``...``: more of the same (left out)."""
    m = re.search(r"\[([^\]]*)\]", command)
    if not m:
        return [command.replace("...", "").strip()]
    return [v for inner in ("", m.group(1)) for v in
            _variants(command[:m.start()] + inner + command[m.end():])]


def serve_parser():
    """``vllm serve``'s own parser (``vllm``'s main builds the same), the
    hook flags added by the plugin as vLLM's plugin loading does. (tests/
    test_plugin.py's ``serve_parser`` has the engine arguments only; the
    pages also use the server's, such as ``--headless``.)"""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from vllm_seqhooks.plugin import register

    register()
    parser = FlexibleArgumentParser()
    subcommand = ServeSubcommand()
    subcommand.subparser_init(parser.add_subparsers(dest="subparser"))
    return parser, subcommand


def parse_serve(words: list[str]):
    """``vllm serve *words`` parsed, its hook configuration checked: each
    hook flag given is in it, what ``--seqhooks`` names fills the rest."""
    from vllm_seqhooks import SpecialKwargs
    from vllm_seqhooks.config.presets import expand
    from vllm_seqhooks.engine import SCHEDULER_CLASS_PATH
    from vllm_seqhooks.engine.serve_flags import FLAGS

    parser, subcommand = serve_parser()
    ns = parser.parse_args(["serve", *words])
    subcommand.validate(ns)
    assert ns.scheduler_cls == SCHEDULER_CLASS_PATH, words
    got = SpecialKwargs.from_additional_config(ns.additional_config)
    assert got.is_resolved, words
    given = {}
    for i, word in enumerate(words):
        if word in FLAGS:
            name, kwargs = FLAGS[word]
            value = words[i + 1]
            given[name] = kwargs["type"](value) if "type" in kwargs else value
    for name, value in given.items():
        assert getattr(got, name) == value, (name, getattr(got, name), value)
    if "--seqhooks" in words:
        preset = expand(words[words.index("--seqhooks") + 1], words[0])
        for name, value in preset.items():
            if name not in given and name != "format" and hasattr(got, name):
                assert getattr(got, name) == value, (name, getattr(got, name), value)
    return ns, got


def _parse_serve_line(job: Job, tmp_path: Path) -> None:
    for variant in _variants(job.key):
        words = bash_words(variant)
        while re.fullmatch(r"[A-Z_]+=\S*", words[0]):
            words = words[1:]
        words = words[2:]
        if words[0] == "MODEL":
            words[0] = _model_for(words)
        assert Path(ROOT / words[0]).is_dir(), words[0]
        parse_serve(words)


def _promise_ids() -> dict[str, int]:
    from vllm_seqhooks.engine.engine_args import load_tokenizer

    tok = load_tokenizer(FORKJOIN)
    return {letter: tok.convert_tokens_to_ids(text) for letter, text in
            (("N", "<sync>"), ("M", "<promise>"), ("K", "</promise>"))}


def _parse_by_id(job: Job, tmp_path: Path) -> None:
    ids = _promise_ids()
    for variant in _variants(job.key):
        words = [str(ids.get(w, w)) for w in bash_words(variant)][2:]
        words[0] = FORKJOIN
        _ns, got = parse_serve(words)
        assert (got.sync_token_id, got.promise_token_id) == (ids["N"], ids["M"])


_HELP_SHOWN: dict[str, str] = {}


def _run_help(job: Job, tmp_path: Path) -> None:
    """``vllm serve --help=...``: as pasted; every hook flag the pages use is
    listed."""
    from vllm_seqhooks.engine.serve_flags import FLAGS

    m = run_measured(["bash", "-c", re.sub(r"\s+#.*$", "", job.key)], timeout=300)
    assert m.returncode == 0, m.output[-3000:]
    assert "Sequence hooks (vllm-seqhooks)" in m.stdout, m.stdout[-3000:]
    for flag in ["--seqhooks", *FLAGS]:
        assert flag in m.stdout, flag
    report(job.key, seconds=m.seconds)


# -- Kwargs: LLM(model, special_kwargs=...)


@dataclass
class Kwargs(Handler):
    """Each ``LLM(model, special_kwargs=...)`` call of a Python block, the
    model a placeholder: the block's imports run, the value evaluated,
    coerced and resolved against an embedded model as ``vllm_seqhooks.LLM``
    does before its engine starts; each key a dict gives is in the result."""

    kind = "kwargs"

    def jobs(self, block, commands):
        tree = ast.parse(block.text)
        imports = [ast.get_source_segment(block.text, n) for n in tree.body
                   if isinstance(n, (ast.Import, ast.ImportFrom))]
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
                 and getattr(n.func, "id", None) == "LLM"]
        assert calls, f"{block.where}: no LLM(...) call"
        out = []
        for call in calls:
            (kw,) = [k for k in call.keywords if k.arg == "special_kwargs"]
            value = ast.get_source_segment(block.text, kw.value)
            out.append(Job(self.kind, f"LLM(model, special_kwargs={' '.join(value.split())})",
                           _check_kwargs(imports, value)))
        return out


def _check_kwargs(imports: list[str], value_source: str):
    def run(job: Job, tmp_path: Path) -> None:
        from vllm_seqhooks.config.presets import coerce_special_kwargs
        from vllm_seqhooks.engine.engine_args import hook_engine_args, load_tokenizer

        namespace: dict[str, Any] = {}
        exec("\n".join(imports), namespace)
        value = eval(value_source, namespace)
        fmt = value if isinstance(value, str) else (
            value.get("format") if isinstance(value, dict) else None)
        model = THREADWEAVER if fmt in TAG_FORMATS else FORKJOIN
        hooks = coerce_special_kwargs(value, model)
        hooks = hooks.resolve(load_tokenizer(model))
        assert hooks.is_resolved
        assert hook_engine_args(hooks, {})["additional_config"]["seqhooks"]
        if isinstance(value, dict):
            for name, v in value.items():
                if name != "format":
                    assert getattr(hooks, name) == v, (name, getattr(hooks, name), v)
    return run


# -- Options: a script's options parsed by its own parser, not run

_DRY_PARSE = r"""
import argparse, json, os, runpy, sys

class Parsed(BaseException):
    pass

_parse_args = argparse.ArgumentParser.parse_args
_parse_known = argparse.ArgumentParser.parse_known_args
_inside = [0]

def parse_args(self, args=None, namespace=None):
    _inside[0] += 1
    try:
        ns = _parse_args(self, args, namespace)
    finally:
        _inside[0] -= 1
    raise Parsed(vars(ns))

def parse_known_args(self, args=None, namespace=None):
    if _inside[0]:
        return _parse_known(self, args, namespace)
    ns, rest = _parse_known(self, args, namespace)
    raise Parsed({**vars(ns), "(not parsed)": rest})

argparse.ArgumentParser.parse_args = parse_args
argparse.ArgumentParser.parse_known_args = parse_known_args
for how, target, *argv in json.loads(sys.argv[1]):
    sys.argv = [target, *argv]
    try:
        if how == "-m":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
            runpy.run_path(target, run_name="__main__")
    except Parsed as parsed:
        print("PARSED", json.dumps(parsed.args[0], default=str), flush=True)
    except SystemExit as exc:
        print("EXIT", exc.code, flush=True)
    except Exception as exc:  # (the next script is parsed all the same)
        print("ERROR", repr(exc), flush=True)
    else:
        print("RAN", flush=True)
"""


@dataclass
class Options(Handler):
    """Not run here (``reason``); each command's options parsed by its
    script's own argparse parser (the script runs up to ``parse_args``,
    which ends it): every block's commands in one process (the scripts
    import torch and vLLM before they parse: once, not once per block)."""

    reason: str
    kind = "options"

    def jobs(self, block, commands):
        assert self.reason
        _OPTION_COMMANDS.append(tuple(commands))
        return [Job(self.kind, " ; ".join(re.sub(r"\s+#.*$", "", c) for c in commands),
                    _dry_parse(commands), ahead=True)]


#: Every Options block's commands, parsed in one process by the first
#: Options job to run (:func:`_parse_all_options`).
_OPTION_COMMANDS: list[tuple[str, ...]] = []
_OPTIONS_PARSED: dict[tuple[str, ...], tuple[list[str], str]] = {}
_OPTIONS_LOCK = threading.Lock()


def _dry_parse(commands: list[str]):
    def run(job: Job, tmp_path: Path) -> None:
        _dry_parse_argvs(commands)  # (this block's own checks, before the shared run)
        with _OPTIONS_LOCK:
            if not _OPTIONS_PARSED:
                _parse_all_options(tmp_path)
        lines, output = _OPTIONS_PARSED[tuple(commands)]
        assert len(lines) == len(commands), output[-3000:]
        for command, line in zip(commands, lines):
            assert line.startswith("PARSED "), (command, line, output[-3000:])
            parsed = json.loads(line.split(" ", 1)[1])
            assert not parsed.get("(not parsed)"), (command, parsed)
    return run


def _dry_parse_argvs(commands: tuple[str, ...] | list[str]) -> list[list[str]]:
    argvs = []
    for command in commands:
        words = bash_words(command)
        assert Path(words[0]).name.startswith("python"), command
        if words[1] == "-m":
            module = words[2]
            spec_path = ROOT / module.replace(".", "/")
            source = (spec_path / "__main__.py" if spec_path.is_dir()
                      else spec_path.with_suffix(".py"))
            argvs.append(["-m", module, *words[3:]])
        else:
            source = ROOT / words[1]
            argvs.append(["path", words[1], *words[2:]])
        # (a script that reads sys.argv itself would run for real: refused)
        assert "parse_args(" in source.read_text(), f"{source}: no argparse parser"
    return argvs


def _parse_all_options(tmp_path: Path) -> None:
    """Every registered block's commands through ``_DRY_PARSE`` in one
    process; each block's result lines (and the output) kept for it. (A
    block whose commands fail their own checks is left out: its job says
    why.)"""
    blocks, argvs = [], []
    for commands in dict.fromkeys(_OPTION_COMMANDS):
        try:
            argvs += _dry_parse_argvs(commands)
        except AssertionError:
            continue
        blocks.append(commands)
    m = run_measured([sys.executable, "-c", _DRY_PARSE, json.dumps(argvs)], timeout=600,
                     XDG_CACHE_HOME=str(tmp_path / "cache"))
    lines = [line for line in m.stdout.splitlines()
             if line.startswith(("PARSED", "EXIT", "RAN", "ERROR"))]
    for commands in blocks:
        _OPTIONS_PARSED[commands] = (lines[:len(commands)], m.output)
        lines = lines[len(commands):]
    report(f"options of {len(blocks)} blocks, one process", seconds=m.seconds)


# -- Overrides: verl command-line overrides


@dataclass
class Overrides(Handler):
    """verl's ``key=value`` overrides (a part of a training command, not a
    command): each key is in verl's PPO trainer configuration, the
    ``$(...)`` runs as pasted and gives an agent-loop file that exists, and
    ``default_agent_loop`` names an agent loop such a file registers."""

    kind = "overrides"

    def jobs(self, block, commands):
        return [Job(self.kind, c, _check_overrides) for c in commands]


def _verl_config_keys() -> set[str]:
    import importlib.util

    import yaml

    spec = importlib.util.find_spec("verl")
    assert spec is not None, "verl is not importable (scripts/setup.sh installs it)"
    config = Path(spec.origin).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    keys: set[str] = set()

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                keys.add(prefix + str(k))
                walk(v, prefix + str(k) + ".")

    walk(yaml.safe_load(config.read_text()), "")
    return keys


def _check_overrides(job: Job, tmp_path: Path) -> None:
    import yaml

    from vllm_seqhooks.integrations import verl as seqhooks_verl

    keys = _verl_config_keys()
    registered = {item["name"] for path in (seqhooks_verl.AGENT_LOOPS,
                                            seqhooks_verl.AGENT_LOOPS_AS_SINGLE_TURN)
                  for item in yaml.safe_load(Path(path).read_text())}
    for word in bash_words(job.key):
        key, value = word.split("=", 1)
        assert key in keys, f"{key} is not in verl's PPO trainer configuration"
        if key.endswith("agent_loop_config_path"):
            assert Path(value).is_file(), value
            names = {item["name"] for item in yaml.safe_load(Path(value).read_text())}
            assert names & {"seqhooks_agent", "single_turn_agent"}, names
        if key.endswith("default_agent_loop"):
            assert value in registered, (value, registered)


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


# ------------------------------------------------------------ serve and ask


def _task(model: str):
    from vllm_seqhooks.tasks import forkjoin, threadweaver

    return {FORKJOIN: forkjoin, THREADWEAVER: threadweaver}[model]


def _serve_and_ask(job: Job, tmp_path: Path) -> None:
    """The server as pasted (its port: a free one on 127.0.0.1), healthy
    within the budget; each block's asks; held-out problems answered right;
    a chat completion equal to the completion."""
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
        problems = task.heldout_problems(12, seed=4321)
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
    assert all(task.check_full_text(p, t) for p, t in zip(problems, texts)), texts
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


# ------------------------------------------------------ what blocks promise


def _readme_curl_answer(answer: dict) -> None:
    text = answer["choices"][0]["text"]
    assert "<sync>" in text and text.endswith("=0123456789"), text
    assert len(answer["kv_transfer_params"]["seqhooks"]["children"]) == 3


def _child_budget(limit: int):
    def check(trace: dict) -> None:
        assert trace["children"], trace
        assert all(c["num_output_tokens"] <= limit for c in trace["children"]), trace
    return check


def _readme_python(stdout: str) -> None:
    # the model wrote its promises, the engine merged the children after <sync>
    assert "<sync>" in stdout and "join of ['0', '1', '2']" in stdout, stdout[-3000:]
    assert "=0123456789" in stdout  # sort 9081726354, answered


def _threadweaver_python(stdout: str) -> None:
    # The model forks at </Outlines>, the engine merges its four threads, the
    # conclusion is the answer. (Not the whole text token for token: its
    # fourth thread sorts 5761 as 1677, one of the model's 0.5 % of errors,
    # and its conclusion is right all the same.)
    digits = "0125073179975761"
    assert "</Outlines>\n<Thread>\n1:" in stdout and "<Thread>\n4:" in stdout, stdout[-3000:]
    assert f"<Conclusion>\n{''.join(sorted(digits))}</Conclusion>" in stdout, stdout[-3000:]


_DEMO = Run(expect=("5/5 correct",))
_BENCH_REASON = (
    "measurement runs of minutes (1 to 26) on both cores, those with --out docs/benchmarks "
    "rewriting the published pages; CI runs every workload at its smallest size "
    "(--smoke, tests/test_benchmarks_smoke.py) and checks where each writes "
    "(tests/test_script_outputs.py)")

#: vLLM 0.32's and 0.33's own scheduler tests: scripts/test.sh runs both parts.
_CONFORMANCE = {
    r"^PYTHON=\.venv033/bin/python bash scripts/upstream_conformance\.sh": All((
        CI("scripts/test.sh", "bash scripts/test_vllm033.sh"),
        CI("scripts/test_vllm033.sh", 'PYTHON="$PY" bash scripts/upstream_conformance.sh'))),
    r"^bash scripts/upstream_conformance\.sh": CI(
        "scripts/test.sh", 'PYTHON="$PY" bash scripts/upstream_conformance.sh'),
}

#: (file, a piece of the block's text) -> how it is tested.
REGISTRY: dict[tuple[str, str], Handler] = {
    # ---------------------------------------------------------------- README
    ("README.md", "./scripts/setup.sh && .venv/bin/python -m vllm_seqhooks"): Mixed({
        r"^\./scripts/setup\.sh && ": All((
            CI(".ci/run", "bash scripts/setup.sh", executable="scripts/setup.sh"),
            Run(expect=("5/5 correct", "<sync>"), after="&&"))),
        r"^\./scripts/test\.sh": CI(".ci/run", "bash scripts/test.sh", executable="scripts/test.sh"),
    }),
    ("README.md", 'LLM("vllm_seqhooks/data/forkjoin_model", special_kwargs="auto"'):
        Run(check=_readme_python),
    ("README.md", 'LLM("path/to/your/model"'): Kwargs(),
    ("README.md", "vllm serve MODEL --seqhooks auto      #"): Flags(by_id=True),
    ("README.md", "curl -s 127.0.0.1:8000/v1/completions"): Serve(check=_readme_curl_answer),
    # ------------------------------------------------------------ docs/*.md
    ("docs/testing.md", "./scripts/test.sh        # the whole suite"):
        CI(".ci/run", "bash scripts/test.sh", executable="scripts/test.sh"),
    ("docs/install.md", "./scripts/setup.sh          #"):
        CI(".ci/run", "bash scripts/setup.sh", executable="scripts/setup.sh"),
    ("docs/install.md", "pip install vllm==0.32.0"): NotHere(
        "GPU installs (vLLM's CUDA wheel from PyPI) into the user's environment; the install "
        "check it ends with runs on CPU from the wheel in tests/test_wheel.py",
        covered=(("tests/test_wheel.py", '"-m", "vllm_seqhooks.check"'),)),
    ("docs/conformance.md", "bash scripts/upstream_conformance.sh                              #"):
        Mixed(_CONFORMANCE),
    ("docs/conformance.md", "bash scripts/upstream_conformance.sh\nPYTHON"): Mixed(_CONFORMANCE),
    ("docs/deployment.md", "ray start --head --port 6379"): Mixed({
        "^ray start ": NotHere(
            "several machines (a Ray cluster over nodes); tests/test_ray.py runs a local "
            "multi-node Ray cluster with the same flags",
            covered=(("tests/test_ray.py", "--distributed-executor-backend"),)),
        "vllm serve MODEL": Flags(),
    }),
    ("docs/deployment.md", "--data-parallel-rpc-port 13345 --api-server-count 1"): Flags(),
    ("docs/deployment.md", "torchrun --nproc-per-node 2 -m tests.support.spmd_rank"): NotHere(
        "two ranks, each with an engine, for a test's output directory (OUT_DIR): "
        "tests/test_spmd.py runs this command",
        covered=(("tests/test_spmd.py", '"tests.support.spmd_rank"'),)),
    ("docs/deployment.md", "--data-parallel-backend ray --data-parallel-size-local 1"): Flags(),
    ("docs/rl.md", "# a sketch: model, prompt, params, openai_client and MODEL are yours"): NotHere(
        "a sketch whose names are the reader's; examples/rl_rollout.py runs it whole "
        "(tests/test_readme_snippets.py::test_rl_rollout_example_runs_reproducibly), "
        "tests/test_rollout.py its rows",
        covered=(("examples/rl_rollout.py", "rollout.training_rows(out)"),
                 ("examples/rl_rollout.py", "rollout.per_call_rows(out)"),
                 ("tests/test_readme_snippets.py", "def test_rl_rollout_example_runs_reproducibly"))),
    ("docs/rl.md", "pip install --no-deps -r requirements/verl.txt"): NotHere(
        "installs into the environment; scripts/setup.sh installs the same requirements "
        "file with --no-deps (CI: .ci/run)",
        covered=(("scripts/setup.sh", "-r requirements/verl.txt"),)),
    ("docs/rl.md", "print(v.AGENT_LOOPS_AS_SINGLE_TURN)"): Overrides(),
    ("docs/rl.md", "default_agent_loop=seqhooks_agent"): Overrides(),
    ("docs/rl.md", "from omegaconf import OmegaConf"): Run(
        engine=False, expect=("scheduler_cls: vllm_seqhooks.engine.scheduler.SeqHooksScheduler",
                              "worker_extension_cls:", "additional_config:")),
    ("docs/serving.md", "vllm serve MODEL --seqhooks auto    #"): Flags(),
    ("docs/serving.md", "client.completions.create(model=..., prompt=..."): Serve(
        server=f"vllm serve {FORKJOIN} --seqhooks auto --dtype float32 --enforce-eager",
        check=_child_budget(64)),
    ("docs/threadweaver_model.md", "python -m vllm_seqhooks --model "
                                   "vllm_seqhooks/data/threadweaver_model   # the demo: five"):
        Mixed({"^python -m vllm_seqhooks ": _DEMO, "^vllm serve ": Serve()}),
    ("docs/threadweaver_model.md", 'LLM("vllm_seqhooks/data/threadweaver_model"'):
        Run(check=_threadweaver_python),
    ("docs/threadweaver_model.md",
     "--steps 1500 \\\n    --out vllm_seqhooks/data/threadweaver_model\n"):
        Options("a 40-minute training run that overwrites the embedded model"),
    ("docs/threadweaver_model.md", "scripts/eval_threadweaver.py --out docs"): Mixed({
        r"scripts/train_tiny_forkjoin\.py ": Options("a 40-minute training run that overwrites the "
                                          "embedded model"),
        r"scripts/eval_threadweaver\.py ": Options("a 10-minute evaluation that rewrites "
                                        "docs/threadweaver_eval.json and its page"),
        r"-m vllm_seqhooks --model ": _DEMO,
        r"-m pytest tests/test_threadweaver_model\.py": CI("scripts/test.sh", "-m pytest tests "),
    }),
    # ------------------------------------------------------ docs/benchmarks
    ("docs/benchmarks/README.md", ".venv/bin/python -m benchmarks --quick    #"): Mixed({
        r"-m benchmarks\.report ": NotHere(
            "rewrites the published tables and chart; tests/test_script_outputs.py re-renders "
            "results-quick.json into the cache with this module",
            covered=(("tests/test_script_outputs.py", "benchmarks.report"),)),
        r"-m benchmarks(?!\.report )": Options(_BENCH_REASON),
    }),
    ("docs/benchmarks/serve_load.md", "benchmarks.serve_load --requests 200"):
        Options(_BENCH_REASON),
    # --------------------------------------------------------- docs/formats
    ("docs/formats/README.md", "--seqhooks npr --fork-min-tokens 64"): Flags(),
    ("docs/formats/README.md", 'LLM(model, special_kwargs="threadweaver")'): Kwargs(),
    ("docs/formats/multiverse.md", "vllm serve MODEL --seqhooks multiverse"): Flags(),
    ("docs/formats/npr.md", "vllm serve MODEL --seqhooks npr"): Flags(),
    ("docs/formats/parallel-r1.md", "vllm serve MODEL --seqhooks parallel-r1"): Flags(),
    ("docs/formats/promise.md", "vllm serve MODEL --seqhooks promise"):
        Mixed({"^vllm serve MODEL ": Flags(), f"^vllm serve {FORKJOIN} ": Serve()}),
    ("docs/formats/splice.md", '"join": "splice"'): Kwargs(),
    ("docs/formats/splice.md", "--seqhooks multiverse --join splice"): Flags(),
    ("docs/formats/threadweaver.md", "vllm serve MODEL --seqhooks threadweaver\n"):
        Mixed({"^vllm serve MODEL ": Flags(), f"^vllm serve {THREADWEAVER} ": Serve()}),
    ("docs/formats/threadweaver.md", "scripts/threadweaver_sft_by_hand.py"): Options(
        "needs ThreadWeaver's own source (--simple-eval PATH/...), and rewrites a page's "
        "data; tests/test_formats_oracle.py checks the same texts against ThreadWeaver's "
        "functions"),
}


# ---------------------------------------------------------------- collection


def collect() -> tuple[list[Job], list[str]]:
    """The jobs of every block, equal ones merged; and the registry's
    problems (unregistered, doubly registered, stale entries)."""
    problems: list[str] = []
    jobs: dict[tuple[str, str], Job] = {}
    used: set[tuple[str, str]] = set()
    for block in read_blocks():
        keys = [key for key in REGISTRY if key[0] == block.path and key[1] in block.text]
        used.update(keys)
        if len(keys) != 1:
            first = next((c for c in block.commands()), block.text)[:70]
            problems.append(
                f"{block.where} ({block.lang} block starting {first!r}) is matched by "
                f"{len(keys)} registry entries{': ' + str(keys) if keys else ''}: add exactly one "
                f"entry to REGISTRY in tests/test_docs_commands.py, keyed by "
                f"({block.path!r}, <a piece of text only this block of the page holds>), saying "
                "how it runs (Run, Serve, Flags, Kwargs, Options, Overrides, CI, or NotHere "
                "with the reason)")
            continue
        try:
            new = REGISTRY[keys[0]].jobs(block, block.commands())
        except AssertionError as exc:
            problems.append(f"{block.where}: {exc}")
            continue
        for job in new:
            merged = jobs.setdefault((job.kind, job.key), job)
            merged.sources.append(block.where)
            if merged is not job:
                merged.asks += job.asks
    problems += [f"REGISTRY entry {key} matches no block (stale: remove or update it)"
                 for key in REGISTRY if key not in used]
    return list(jobs.values()), problems


JOBS, PROBLEMS = collect()


def test_every_block_is_registered_once():
    assert not PROBLEMS, "\n".join(PROBLEMS)
    assert len(read_blocks()) >= 30  # (the extraction did find the pages' blocks)


def _params(slow: bool):
    return [pytest.param(job, id=job.id, marks=[pytest.mark.slow] if slow else [])
            for job in JOBS if job.slow == slow]


#: How many jobs marked ``ahead`` run at once (``SEQHOOKS_DOCS_AHEAD=1``:
#: one at a time, each command's time measured alone).
AHEAD = int(os.environ.get("SEQHOOKS_DOCS_AHEAD", "2"))


@pytest.fixture(scope="module", autouse=True)
def ahead(request, tmp_path_factory):
    """The selected jobs marked ``ahead`` (each waits on a subprocess),
    started at the module's first test, :data:`AHEAD` at a time, the servers
    first and then the other commands starting an engine (the longest); each
    test takes its own job's result."""
    selected = [item.callspec.params["job"] for item in request.session.items
                if getattr(item, "module", None) is request.module and hasattr(item, "callspec")
                and "job" in item.callspec.params]
    runs = RunAhead(AHEAD)
    order = sorted((j for j in selected if j.ahead), key=lambda j: (j.kind != "serve", not j.slow))
    for job in order:
        tmp = tmp_path_factory.mktemp("ahead")
        runs.submit(_ahead_key(job), lambda job=job, tmp=tmp: job.run(job, tmp))
    yield runs
    runs.close()


def _ahead_key(job: Job) -> str:
    return f"{job.kind}: {job.key}"


def _run(job: Job, tmp_path: Path, ahead: RunAhead) -> None:
    if _ahead_key(job) in ahead:
        ahead.result(_ahead_key(job))
    else:
        job.run(job, tmp_path)


@pytest.mark.parametrize("job", _params(False))
def test_block(job: Job, tmp_path, ahead):
    """Commands that start no engine (the sources: ``job.sources``)."""
    _run(job, tmp_path, ahead)


@pytest.mark.parametrize("job", _params(True))
def test_block_starting_an_engine(job: Job, tmp_path, ahead):
    """Commands that start an engine, with the budgets of issue 49."""
    _run(job, tmp_path, ahead)
