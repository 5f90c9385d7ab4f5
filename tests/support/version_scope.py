"""Which test modules can differ between vLLM releases.

A test module that imports nothing that reaches vLLM, in its
own body or in any function, and starts no vLLM process, runs the same on
every release: the vLLM 0.33 part of the suite (``scripts/test_vllm033.sh``)
leaves it out (``-m "not vllm_independent"``); the 0.32 part runs it.

"Reaches vLLM": the module imports ``vllm`` (or verl), or a module of
this repository (``vllm_seqhooks.*``, ``tests.*``, ``benchmarks.*``) that does, followed
through every import in those modules (function bodies too). Naming
``vllm`` or ``vllm serve`` in a string of the tests (a command a test
runs, not a docstring) counts too, and so does naming a script (``.py``,
``.sh``, ``examples/``, ``scripts/``): what a script runs is not followed.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Packages whose import means a release can differ (the 0.33 test venv has
#: the 0.32 venv's torch, transformers and the rest: scripts/setup_vllm033.sh).
VERSIONED = ("vllm", "verl")
#: A string that starts vLLM in a subprocess (a command line, a module to run).
_STARTS_VLLM = re.compile(
    r"(^|[\s/'\"])vllm(\s+serve|\s|$)"      # vllm, vllm serve, .venv/bin/vllm ...
    r"|^vllm_seqhooks(\.[\w.]+)?$"           # a module to run: -m vllm_seqhooks[.check]
    r"|-m\s+vllm_seqhooks"
    r"|\.(py|sh)$|^(examples|scripts|benchmarks)$")  # a script of the repository (it may)


def _module_path(name: str) -> Path | None:
    base = ROOT.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


#: Names a package exports lazily (its ``__getattr__``), and what they import.
_LAZY = {"vllm_seqhooks.LLM": "vllm_seqhooks.llm"}


def _imports(path: Path) -> tuple[set[str], bool]:
    """The modules ``path`` imports anywhere (the package's own lazy
    ``__getattr__`` aside: :data:`_LAZY`), and whether a string in it starts
    vLLM."""
    tree = ast.parse(path.read_text())
    if path == ROOT / "vllm_seqhooks" / "__init__.py":
        tree.body = [n for n in tree.body if not isinstance(n, ast.FunctionDef)]
    names: set[str] = set()
    starts = False
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    if path.name == "__init__.py":
        package = package.rsplit(".", 1)[0] + "._"
    docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
    runs_commands = path.is_relative_to(ROOT / "tests")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: -node.level]
                base = ".".join([*parts, base] if base else parts)
            names.add(base)
            names |= {_LAZY.get(f"{base}.{a.name}", f"{base}.{a.name}") for a in node.names}
        elif (runs_commands and isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in docstrings):
            starts = starts or bool(_STARTS_VLLM.search(node.value))
    return names, starts


@functools.lru_cache(maxsize=None)
def reaches_vllm(name: str) -> bool:
    """Whether importing repository module ``name`` can reach vLLM."""
    path = _module_path(name)
    if path is None:
        return False
    # (a cycle: a module being visited counts as not reaching, for now)
    _visiting.add(name)
    try:
        names, starts = _imports(path)
        if starts:
            return True
        for imported in names:
            top = imported.split(".")[0]
            if top in VERSIONED:
                return True
            if top in ("vllm_seqhooks", "tests", "benchmarks") and imported not in _visiting:
                # the module itself and each package on the way
                parts = imported.split(".")
                for i in range(1, len(parts) + 1):
                    prefix = ".".join(parts[:i])
                    if prefix not in _visiting and reaches_vllm(prefix):
                        return True
        return False
    finally:
        _visiting.discard(name)


_visiting: set[str] = set()


#: Test files of this repository's own test tools, which reach vLLM but
#: whose checks are of the tools, not of vLLM's release: the vLLM 0.33 part
#: leaves them out too (each with the reason; every 0.33 test that starts an
#: engine runs these tools on 0.33).
TOOLS_CHECKED_ON_ONE_RELEASE = {
    "tests/test_mode_workers.py": "the worker pool's reuse, isolation and "
                                  "failure handling, with functions that import no vLLM",
    "tests/test_cpu_profile.py": "the CPU profiler of a command's processes",
    "tests/test_script_outputs.py": "where scripts write, at the level of their arguments",
    "tests/test_testing_tools.py": "the tiny model and the scripted logits processor, "
                                   "which every 0.33 engine test runs and checks token "
                                   "for token",
}


def is_vllm_independent(test_file: str | Path) -> bool:
    """Whether the test module at ``test_file`` runs the same on every
    vLLM release (see the module doc), or checks only this repository's
    test tools (:data:`TOOLS_CHECKED_ON_ONE_RELEASE`)."""
    path = Path(test_file).resolve()
    relative = path.relative_to(ROOT)
    if relative.as_posix() in TOOLS_CHECKED_ON_ONE_RELEASE:
        return True
    return not reaches_vllm(".".join(relative.with_suffix("").parts))


#: The slow (end-to-end) tests the vLLM 0.33 part runs too, besides the
#: tests that reach vLLM and are not slow: whole files, or single test ids
#: where one case of a file covers what can differ (``scripts/test_vllm033.sh``
#: selects them with ``-m every_release``).
END_TO_END_ON_EVERY_RELEASE = (
    "tests/test_forkjoin_e2e.py",
    "tests/test_llm_entrypoint.py",
    "tests/test_serve.py",
    "tests/test_between_training_steps.py",
    "tests/test_verl_between_steps.py",
    "tests/test_request_features.py",
    "tests/test_request_features_reasoning.py",
    "tests/test_verl.py::test_agent_loop_rows_equal_threadweavers_client_loop_over_stock_vllm",
    "tests/test_hook_logprobs.py::test_logprobs_with_hooks_are_the_models[v1-sync-promise]",
    "tests/test_forkjoin_task.py::test_trained_model_with_ngram_speculative_decoding",
    # (the step lock wraps LLMEngine.step, which LLM.generate must go through)
    "tests/test_in_process_steps.py",
)


def runs_on_every_release(nodeid: str) -> bool:
    """Whether the test ``nodeid`` (pytest's, relative to the repository)
    is one of :data:`END_TO_END_ON_EVERY_RELEASE`: its file, its test
    function (every parametrized case) or itself."""
    path = nodeid.split("::", 1)[0]
    function = nodeid.split("[", 1)[0]  # (every parametrized case of a listed test)
    return any(name in END_TO_END_ON_EVERY_RELEASE for name in (path, function, nodeid))
