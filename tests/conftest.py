"""Shared pytest fixtures: the tiny offline model and engine settings.

The tests' tools are the package ``tests.support``: the repository's root
goes first on ``sys.path`` and on ``PYTHONPATH`` (every process a test
starts -- engine cores, ``vllm serve``, Ray workers -- imports them the same
way), with the directory of the tests' own vLLM plugin
(:mod:`tests.support.ray_on_cpu`), and then verl's side directory when it is
there (``<repo>/.verl``, or ``$SEQHOOKS_VERL_DIR``: ``scripts/setup.sh``
installs verl and the packages it needs that vLLM does not bring there,
outside the venv, since verl pins what vLLM cannot have; verl's server and
vLLM's worker processes import verl too, hence ``PYTHONPATH``). After the
root: verl also ships top-level ``tests`` and ``scripts`` packages.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

_ROOT = Path(__file__).resolve().parents[1]
_PATHS = [str(_ROOT), str(_ROOT / "tests" / "support" / "ray_plugin")]
#: verl's side directory (``scripts/setup.sh``; the verl tests skip without it).
VERL_DIR = Path(os.environ.get("SEQHOOKS_VERL_DIR") or _ROOT / ".verl")
if (VERL_DIR / "verl" / "__init__.py").is_file():
    _PATHS.append(str(VERL_DIR.resolve()))
for _path in reversed(_PATHS):
    if _path not in sys.path:
        sys.path.insert(0, _path)
os.environ["PYTHONPATH"] = os.pathsep.join(
    [*_PATHS, *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                if p and p not in _PATHS)])

from tests.support.vllm_cache import pin_vllm_cache_root  # noqa: E402
from vllm_seqhooks.scripted.tiny_model import TINY_ENGINE_KWARGS as TINY_LLM_KWARGS  # noqa: E402

pin_vllm_cache_root()  # (one vLLM cache per release, whatever XDG_CACHE_HOME a test sets)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Path (str) of the tiny random Llama model, built once per session."""
    from vllm_seqhooks.scripted.tiny_model import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny_model") / "model"))


@pytest.fixture(scope="session")
def tiny_llm_kwargs(tiny_model_dir: str) -> dict[str, Any]:
    """``vllm.LLM`` keyword arguments for the tiny model (copy before editing)."""
    return dict(model=tiny_model_dir, **TINY_LLM_KWARGS)


@pytest.fixture(autouse=True)
def _live_vllm_envs():
    """vLLM caches its environment variables once an in-process EngineCore
    starts (``vllm.envs.enable_envs_cache``); tests switch
    ``VLLM_ENABLE_V1_MULTIPROCESSING`` between engines, so read them live."""
    envs = sys.modules.get("vllm.envs")
    if envs is not None and hasattr(envs, "disable_envs_cache"):
        envs.disable_envs_cache()
    yield


@pytest.fixture(autouse=True)
def _no_stale_cpu_tp_segments():
    """vLLM's CPU tensor-parallel backend leaves its shared-memory segments
    in /dev/shm when its workers are killed; a later engine given the same
    port then fails to start (errno 17). Remove those no process maps."""
    from tests.support.cpu_shm import remove_stale_cpu_shm

    remove_stale_cpu_shm()
    yield


@pytest.fixture(autouse=True)
def _metrics_env_restored():
    """Hook metrics name their snapshot directory and its owner in
    ``os.environ`` (:mod:`vllm_seqhooks.engine.metrics_export`), where they
    stay for the process's later engines and the ``vllm serve`` processes it
    starts. A test that parses the ``vllm serve`` flags in this process
    makes it look like a ``vllm serve``: every server started later would
    then share this process's directory and show its in-process engines
    (two ``engine="0"`` series). Each test gets the variables as they were
    before it."""
    from vllm_seqhooks.engine.metrics import ENV_DIR
    from vllm_seqhooks.engine.metrics_export import OWNER_ENV

    before = {name: os.environ.get(name) for name in (ENV_DIR, OWNER_ENV)}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def pytest_collection_modifyitems(config, items):
    """Mark the tests of modules that run the same on every vLLM release
    (``vllm_independent``), which the vLLM 0.33 part of the suite leaves out,
    and the end-to-end tests it runs (``every_release``):
    :mod:`tests.support.version_scope`."""
    from tests.support.version_scope import is_vllm_independent, runs_on_every_release

    independent: dict[str, bool] = {}
    for item in items:
        path = str(item.path)
        if path not in independent:
            independent[path] = is_vllm_independent(path)
        if independent[path]:
            item.add_marker(pytest.mark.vllm_independent)
        if runs_on_every_release(item.nodeid):
            item.add_marker(pytest.mark.every_release)


# ------------------------------------------------ the per-file time table
_file_seconds: dict[str, float] = {}
_file_tests: "dict[str, int]" = {}


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::", 1)[0]
    _file_seconds[path] = _file_seconds.get(path, 0.0) + report.duration
    if report.when == "call" or (report.when == "setup" and report.skipped):
        _file_tests[path] = _file_tests.get(path, 0) + 1


def pytest_terminal_summary(terminalreporter):
    """With ``SEQHOOKS_TEST_STARTUP_LOG`` set (``scripts/test.sh`` sets it):
    each test file's seconds, tests and engine / ``vllm serve`` start-ups
    (:mod:`tests.support.startup_log`), also written to
    ``SEQHOOKS_TEST_TABLE`` when set."""
    from collections import Counter

    from tests.support import startup_log

    log = os.environ.get(startup_log.ENV_VAR)
    if not log or not _file_seconds:
        return
    text = startup_log.table(_file_seconds, startup_log.counts(log), Counter(_file_tests))
    terminalreporter.write_sep("=", "seconds and start-ups per test file")
    terminalreporter.write(text)
    out = os.environ.get("SEQHOOKS_TEST_TABLE")
    if out:
        Path(out).write_text(text)


def pytest_sessionfinish(session):
    """The engine-mode workers (:mod:`tests.support.mode_workers`) stop
    with the session, not at the interpreter's exit after pytest's report."""
    workers = sys.modules.get("tests.support.mode_workers")
    if workers is not None:
        workers.POOL.stop()
