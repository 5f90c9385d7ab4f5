"""Scripts and benchmarks never overwrite what ships (issue 49).

One convention everywhere: results go to ``--out``; without it, a script
writes into the user cache (``${XDG_CACHE_HOME:-~/.cache}/vllm-seqhooks/``)
or, for the benchmarks that print a report, nowhere. The shipped models
(``vllm_seqhooks/data/``) and pages (``docs/``) change only when ``--out``
names them. Checked at the level of each script's arguments (no engine);
``python -m benchmarks.report`` runs for real (it only renders)."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = (ROOT / "docs", ROOT / "vllm_seqhooks")


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    """The user cache of this test: ``$XDG_CACHE_HOME/vllm-seqhooks``."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "vllm-seqhooks"


def script(name: str):
    """``scripts/NAME.py`` as a module (scripts/ is not a package)."""
    path = ROOT / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_script_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def outside_shipped(path: Path) -> bool:
    path = Path(path).resolve()
    return not any(path.is_relative_to(s) for s in SHIPPED)


class _Parsed(Exception):
    pass


def parsed(main, argv: list[str]) -> tuple[argparse.Namespace, argparse.ArgumentParser]:
    """What ``main(argv)`` parses, and its parser, stopping ``main`` right
    there (before any engine, server or file)."""
    real = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, args=None, namespace=None):
        raise _Parsed(real(self, args, namespace), self)

    argparse.ArgumentParser.parse_args = parse_and_stop
    try:
        main(argv)
    except _Parsed as stop:
        return stop.args
    finally:
        argparse.ArgumentParser.parse_args = real
    raise AssertionError(f"{main} returned without parsing its arguments")


def test_the_cache_follows_xdg_then_home(cache, tmp_path, monkeypatch):
    from vllm_seqhooks.tasks import cache_dir, trained_model_dir

    assert cache_dir() == cache
    assert trained_model_dir("forkjoin_model") == cache / "models" / "forkjoin_model"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir("eval") == tmp_path / "home" / ".cache" / "vllm-seqhooks" / "eval"


# --------------------------------------------------------------------------
# scripts/
# --------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["promise", "threadweaver"])
def test_training_writes_the_cache_unless_out_names_the_shipped_model(cache, task):
    train = script("train_tiny_forkjoin")
    name = {"promise": "forkjoin_model", "threadweaver": "threadweaver_model"}[task]
    args = train.parser().parse_args(["--task", task, "--steps", "3"])
    out = train.output_dir(args)
    assert out == cache / "models" / name
    assert outside_shipped(out)
    shipped = f"vllm_seqhooks/data/{name}"
    assert (ROOT / shipped).is_dir()
    args = train.parser().parse_args(["--task", task, "--out", shipped])
    assert train.output_dir(args) == Path(shipped)
    assert "--out names it" in " ".join(train.parser().format_help().split())


def test_eval_forkjoin_writes_the_cache_unless_out_docs(cache):
    ev = script("eval_forkjoin")
    doc, js = ev.output_paths(ev.parser().parse_args([]))
    assert (doc, js) == (cache / "eval" / "forkjoin_model.md",
                         cache / "eval" / "forkjoin_eval.json")
    assert outside_shipped(doc) and outside_shipped(js)
    doc, js = ev.output_paths(ev.parser().parse_args(["--out", "docs"]))
    assert (doc, js) == (Path("docs/forkjoin_model.md"), Path("docs/forkjoin_eval.json"))
    assert (ROOT / doc).is_file() and (ROOT / js).is_file()
    assert "--out docs" in " ".join(ev.parser().format_help().split())


def test_eval_threadweaver_writes_the_cache_unless_out_docs(cache):
    ev = script("eval_threadweaver")
    js = ev.output_path(ev.parser().parse_args([]))
    assert js == cache / "eval" / "threadweaver_eval.json" and outside_shipped(js)
    js = ev.output_path(ev.parser().parse_args(["--out", "docs"]))
    assert js == Path("docs/threadweaver_eval.json") and (ROOT / js).is_file()
    assert "--out docs" in " ".join(ev.parser().format_help().split())


# --------------------------------------------------------------------------
# benchmarks/
# --------------------------------------------------------------------------


@pytest.mark.parametrize("profile", ["--smoke", "--quick", "--full", "--extra"])
def test_benchmarks_write_the_cache_unless_out_docs(cache, profile):
    from benchmarks.__main__ import build_parser, output_dir

    out = output_dir(build_parser().parse_args([profile]))
    assert out == cache / "benchmarks" and outside_shipped(out)
    assert output_dir(build_parser().parse_args([profile, "--out", "docs/benchmarks"])) == Path(
        "docs/benchmarks")
    assert "--out docs/benchmarks" in " ".join(build_parser().format_help().split())


def test_attention_order_writes_the_cache_unless_out_docs(cache):
    from benchmarks import attention_order

    out = attention_order.output_dir(attention_order.parser().parse_args([]))
    assert out == cache / "benchmarks" and outside_shipped(out)
    args = attention_order.parser().parse_args(["--out", "docs/benchmarks"])
    assert attention_order.output_dir(args) == Path("docs/benchmarks")
    assert "--out docs/benchmarks" in " ".join(attention_order.parser().format_help().split())


def test_report_re_renders_into_the_cache_unless_out_dir_is_docs(cache, capsys):
    """``python -m benchmarks.report docs/benchmarks/results-quick.json``
    renders the published run into the cache, not beside its input."""
    from benchmarks import report

    src = ROOT / "docs" / "benchmarks" / "results-quick.json"
    published = sorted(src.parent.glob("*-quick.*"))
    before = {p: p.stat().st_mtime_ns for p in published}
    assert report.main([str(src)]) == 0
    assert (cache / "benchmarks" / "results-quick.md").is_file()
    assert (cache / "benchmarks" / "results-quick.json").is_file()
    assert f"wrote {cache / 'benchmarks'}" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in published} == before
    assert report.output_dir([str(src), "docs/benchmarks"]) == Path("docs/benchmarks")


#: The benchmarks that print their report and write files only with --out.
PRINTING = [
    ("benchmarks.rollout", ["--smoke"]),
    ("benchmarks.splice", ["--smoke"]),
    ("benchmarks.formats", ["--smoke"]),
    ("benchmarks.many_users", []),
    ("benchmarks.verl_rollout", ["--smoke"]),
    ("benchmarks.step.__main__", ["--workload", "scheduler"]),
]


@pytest.mark.parametrize("module,argv", PRINTING, ids=[m for m, _ in PRINTING])
def test_printing_benchmarks_write_only_where_out_says(module, argv):
    main = importlib.import_module(module).main
    args, parser = parsed(main, argv)
    assert args.out is None
    args, _ = parsed(main, [*argv, "--out", "docs/benchmarks"])
    assert args.out == Path("docs/benchmarks")
    assert "--out docs/benchmarks" in " ".join(parser.format_help().split())


def test_serve_load_writes_only_where_out_says():
    from benchmarks import serve_load

    args, _ = parsed(serve_load.main, [])
    assert args.out is None


def test_publish_says_where_it_wrote(tmp_path, capsys):
    from benchmarks.common import publish

    publish(None, "x", {"a": 1}, "report")
    assert capsys.readouterr().out == "report\n"
    publish(tmp_path / "out", "x", {"a": 1}, "report")
    assert f"wrote {tmp_path / 'out' / 'x'}.md and x.json" in capsys.readouterr().out
    assert sorted(os.listdir(tmp_path / "out")) == ["x.json", "x.md"]
