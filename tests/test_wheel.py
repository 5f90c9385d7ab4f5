"""The wheel is the product: built from the checkout (no C compiler), it holds
the package, its two embedded models and nothing the tests grew; installed
into a fresh virtualenv next to vLLM, with no checkout on the path,
``python -m vllm_seqhooks`` answers 5/5 within the documented commands'
budget (3 GiB; this is the README command's test), ``python -m vllm_seqhooks.check``
(the install check a user runs: three real ``vllm serve`` processes; on CPU
all of it) passes every row.

The fresh virtualenv gets vLLM from the project's venv (one ``.pth`` line
naming its ``site-packages``, whose own ``.pth`` files -- the editable
install of this checkout among them -- are therefore not run) and the
``vllm`` command pip would write for it; the package comes from the wheel
only.

Longer than a minute (about 110 s on a quiet 2-core machine), because it runs
what a user runs after installing the wheel, each a fresh process tree
importing vLLM: the README's demo (a multiprocess engine, about 20 s; the
``--scripted`` demo runs in tests/test_demo.py, and the scripted model from
the wheel in the install check) and the install check
(three ``vllm serve`` processes one after another, about a minute). Building
the wheel and installing it (``--no-deps --no-index``, vLLM beside it by a
``.pth`` line) take a few seconds, once per module."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.support.crash_like import crash_like
from tests.support.doc_commands.jobs import HEALTHY_IN, check_budget, run_measured

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _clean_env(**extra: str) -> dict[str, str]:
    """This environment without the checkout: no PYTHONPATH (conftest puts
    the root there), no compiler."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(CC="false", CXX="false", **extra)
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "-w", str(out), str(ROOT)],
        capture_output=True, text=True, timeout=600, env=_clean_env())
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (path,) = out.glob("vllm_seqhooks-*.whl")
    return path


@pytest.fixture(scope="module")
def fresh_python(wheel, tmp_path_factory) -> Path:
    """A fresh virtualenv's interpreter: vLLM beside it, the wheel in it."""
    venv = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.check_output(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        text=True).strip())
    (site / "vllm_beside.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "--disable-pip-version-check", str(wheel)],
        capture_output=True, text=True, timeout=300, env=_clean_env())
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    # The console script pip writes for vLLM's `vllm` entry point.
    (venv / "bin" / "vllm").write_text(
        f"#!{python}\nimport sys\nfrom vllm.entrypoints.cli.main import main\n"
        "if __name__ == '__main__':\n    sys.exit(main())\n")
    (venv / "bin" / "vllm").chmod(0o755)
    return python


def test_the_wheel_holds_the_package_and_its_models_only(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"vllm_seqhooks", wheel.name.split("-py3")[0] + ".dist-info"}, tops
    packages = {n.split("/")[1] for n in names if n.startswith("vllm_seqhooks/")
                and n.count("/") > 1}
    assert packages == {"config", "core", "data", "engine", "formats", "integrations", "loops",
                        "scripted", "tasks"}
    # verl's agent-loop registrations travel with the package
    for yaml_file in ("agent_loops.yaml", "agent_loops_as_single_turn.yaml"):
        assert f"vllm_seqhooks/integrations/verl/{yaml_file}" in names
    assert not [n for n in names if n.endswith((".c", ".h", ".so")) or "testing" in n]
    for model in ("forkjoin_model", "threadweaver_model"):
        assert f"vllm_seqhooks/data/{model}/config.json" in names
    entry_points = zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "seqhooks = vllm_seqhooks.plugin:register" in entry_points
    assert "-py3-none-any.whl" in wheel.name  # pure Python: no build step on install


def test_the_package_comes_from_the_wheel(fresh_python, tmp_path):
    where = subprocess.run(
        [fresh_python, "-c", "import vllm_seqhooks, vllm; print(vllm_seqhooks.__file__); "
         "print(vllm.__version__)"],
        capture_output=True, text=True, cwd=tmp_path, env=_clean_env(), check=True)
    package, version = where.stdout.split()
    assert package.startswith(str(fresh_python.parents[1])), package
    assert not package.startswith(str(ROOT))


def test_the_readme_main_command_runs_from_the_wheel(fresh_python, tmp_path):
    """The README's first command after setup, ``python -m vllm_seqhooks``
    (the trained model: 5/5), as a user runs it, and within the documented
    commands' budget: this run is the README block's test
    (tests/test_docs_commands.py registers it here; the same command from
    the checkout differs only in where the package is imported from)."""
    run = run_measured([str(fresh_python), "-m", "vllm_seqhooks"], timeout=900, cwd=tmp_path,
                       environ=_clean_env())
    assert run.returncode == 0, run.output[-3000:]
    assert "5/5 correct" in run.stdout, run.stdout[-2000:]
    assert "<sync>" in run.stdout and "join of" in run.stdout, run.stdout[-2000:]
    # The engine is shut down before the interpreter exits: no warning that
    # reads like a crash (vLLM force-killing EngineCore, "exited unexpectedly").
    assert not crash_like(run.output), crash_like(run.output)
    assert "[shutdown]" not in run.output, run.output[-2000:]
    check_budget("python -m vllm_seqhooks (from the wheel)", run, HEALTHY_IN)


def test_install_check_passes_from_the_wheel(fresh_python, tmp_path):
    """The install check (on this machine's defaults: CPU, the V1 runner):
    three real servers, every row of its table passes."""
    out = subprocess.run(
        [fresh_python, "-m", "vllm_seqhooks.check", "--problems", "12",
         "--log-dir", str(tmp_path / "logs")],
        capture_output=True, text=True, timeout=1200, cwd=tmp_path, env=_clean_env())
    table = out.stdout
    assert out.returncode == 0, table + out.stderr[-3000:]
    rows = [line for line in table.splitlines() if line.endswith(("PASS", "FAIL")) or "  (" in line]
    assert not any(" FAIL" in r for r in rows), table
    for config, check in [("scripted", "continuation == fresh request"),
                          ("scripted", "nothing left allocated"),
                          ("trained", "answers correct"),
                          ("trained+ngram", "draft tokens verified"),
                          ("trained+ngram", "tokens == without speculation")]:
        assert any(r.startswith(config + " ") and check in r and "PASS" in r for r in rows), (
            config, check, table)
    assert table.strip().splitlines()[-1].endswith("0 failed")
    # The servers ran the wheel's package, not the checkout's.
    logs = "".join(p.read_text() for p in (tmp_path / "logs").glob("*.log"))
    assert str(ROOT / "vllm_seqhooks") not in logs
