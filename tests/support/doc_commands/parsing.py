"""Blocks checked by parsing, not running: ``vllm serve`` flags by vLLM's
own parser (``Flags``), ``special_kwargs`` values (``Kwargs``), a script's
options by its own parser (``Options``), verl overrides (``Overrides``)."""

from __future__ import annotations

import ast
import json
import re
import shlex
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.doc_commands.blocks import FORKJOIN, ROOT, TAG_FORMATS, THREADWEAVER
from tests.support.doc_commands.jobs import Handler, Job, bash_words, report, run_measured
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
