"""The package's layout (README, "Layout"): what each subpackage may import,
no import cycles, and a top level that holds only what users address."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import vllm_seqhooks

PACKAGE = Path(vllm_seqhooks.__file__).resolve().parent
NAME = "vllm_seqhooks"

#: What of this package each subpackage may import (the top level may
#: import anything).
MAY_IMPORT = {
    "config": {"config", "formats", "core"},
    "core": {"core"},
    "formats": {"formats", "core"},
    "engine": {"engine", "config", "core", "formats"},
    "loops": {"loops", "config", "core", "formats"},
    "tasks": {"tasks", "config", "core", "formats", "scripted.tiny_model"},
    "scripted": {"scripted", "config", "llm"},
    "integrations": {"integrations", "config", "core", "engine", "rollout"},
}
#: The pure subpackages: no vLLM, no torch.
PURE = ("config", "core", "formats")
#: Modules at the top level: what users address.
TOP_LEVEL = {"__init__", "__main__", "check", "llm", "local_server", "plugin", "rollout"}
#: Directories of the package that are not Python packages.
NOT_CODE = {"data", "__pycache__"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        if NOT_CODE & set(rel.parts):
            continue
        name = ".".join(rel.parts)
        out[name.removesuffix(".__init__")] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The module of this package that ``name`` (a module or a name in one)
    is, or None outside the package."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> dict[str, int]:
    """Every import in ``module`` (also inside functions and under
    TYPE_CHECKING): imported name -> line."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.setdefault(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            found.setdefault(source, node.lineno)
            for alias in node.names:
                found.setdefault(f"{source}.{alias.name}", node.lineno)
    return found


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module in MODULES:
        targets = {_resolve(name) for name in _imports(module) if name.startswith(NAME)}
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_walk_sees_the_package():
    assert {"vllm_seqhooks.engine.scheduler", "vllm_seqhooks.core.request_tree",
            "vllm_seqhooks.formats.events"} <= set(MODULES)
    graph = _graph()
    assert "vllm_seqhooks.core.join_plan" in graph["vllm_seqhooks.core.request_tree"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def _allowed(target: str, allowed: set[str]) -> bool:
    rel = target.split(".", 1)[1] if "." in target else ""
    return any(rel == a or rel.startswith(a + ".") for a in allowed)


def test_subpackages_import_only_what_the_layout_allows():
    wrong = []
    for module in MODULES:
        parts = module.split(".")
        if len(parts) < 3 or parts[1] not in MAY_IMPORT:
            continue  # the top level (and subpackages' __init__)
        for name, line in _imports(module).items():
            top = name.split(".")[0]
            if parts[1] in PURE and top in ("vllm", "torch"):
                wrong.append(f"{module}:{line} imports {name} (a pure package)")
            target = _resolve(name) if top == NAME else None
            if target and not _allowed(target, MAY_IMPORT[parts[1]]):
                wrong.append(f"{module}:{line} imports {name}")
    assert wrong == []


def test_pure_packages_load_without_vllm_or_torch():
    pure = sorted(m for m in MODULES if len(m.split(".")) > 1 and m.split(".")[1] in PURE)
    code = (f"import importlib, json, sys\nfor m in {pure!r}: importlib.import_module(m)\n"
            "print(json.dumps(sorted(k for k in sys.modules if k.split('.')[0] "
            "in ('vllm', 'torch'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert len(pure) > 20
    assert json.loads(out.stdout) == []


def test_top_level_holds_only_what_users_address():
    top = {p.stem for p in PACKAGE.glob("*.py")}
    assert top == TOP_LEVEL
    subpackages = {p.name for p in PACKAGE.iterdir() if p.is_dir()} - NOT_CODE
    assert subpackages == {"config", "core", "formats", "engine", "loops", "tasks", "scripted",
                           "integrations"}


def test_class_paths_given_to_vllm_name_the_classes():
    from vllm_seqhooks.engine import SCHEDULER_CLASS_PATH, WORKER_EXTENSION_CLASS_PATH

    for path, name in ((SCHEDULER_CLASS_PATH, "SeqHooksScheduler"),
                       (WORKER_EXTENSION_CLASS_PATH, "SeqHooksWorkerExtension")):
        module, attr = path.rsplit(".", 1)
        assert attr == name
        assert isinstance(getattr(importlib.import_module(module), attr), type)


def test_the_package_never_imports_the_tests_tools():
    """The wheel holds ``vllm_seqhooks`` only: nothing in it imports
    ``tests`` (the tests' tools, ``tests/support``), at any level."""
    wrong = [f"{module}:{line} imports {name}" for module in MODULES
             for name, line in _imports(module).items() if name.split(".")[0] == "tests"]
    assert wrong == []
    assert not any("testing" in m.split(".") for m in MODULES)


def test_every_name_imported_from_the_package_exists():
    """``from vllm_seqhooks.x import name`` and ``from tests.x import name``
    (the tests' tools, another test module's names) in the package, the tests and their tools, benchmarks, scripts and
    examples (function-level imports included) name something that module
    has: a function moved away fails here, not in a benchmark run or in a
    slow test's fixture."""
    import importlib

    roots = [PACKAGE, *(PACKAGE.parent / d for d in ("benchmarks", "scripts", "examples",
                                                      "tests"))]
    missing = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            if NOT_CODE & set(path.parts):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                        and node.module.split(".")[0] in (NAME, "tests")):
                    continue
                module = importlib.import_module(node.module)
                for alias in node.names:
                    if not (hasattr(module, alias.name)
                            or _is_submodule(f"{node.module}.{alias.name}")):
                        missing.append(f"{path}:{node.lineno} {node.module}.{alias.name}")
    assert missing == []


def _is_submodule(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # the parent is a module, not a package
        return False


def _scheduler_given_to(tree: ast.AST) -> list[str]:
    """The callees that the methods of the classes in ``tree`` hand their
    instance (``self``) to (a bound method handed to a part is a named
    callback, not the scheduler)."""
    given = []
    for call in [n for n in ast.walk(tree) if isinstance(n, ast.Call)
                 and ast.unparse(n.func) not in ("getattr", "hasattr", "isinstance")]:
        for arg in [*call.args, *(k.value for k in call.keywords)]:
            if isinstance(arg, ast.Name) and arg.id == "self":
                given.append(ast.unparse(call.func))
    return given


def test_no_part_of_the_engine_receives_the_scheduler():
    """Each part of the engine receives the fork/join state, the port onto
    vLLM's scheduler (``vllm_private.SchedulerPort``, the only one handed
    the scheduler) and the parts it calls, never the scheduler itself; and
    no module of the engine reaches through a ``sched`` back-pointer."""
    scheduler = PACKAGE / "engine" / "scheduler.py"
    given = set(_scheduler_given_to(ast.parse(scheduler.read_text())))
    assert "vllm_private.SchedulerPort" in given
    # Only the port, and vLLM's own method for vLLM's stand-in schedulers.
    assert {g for g in given if not g.startswith("vllm_private.")} == {
        "Scheduler._get_local_prefix_cache_hit"}
    probe = ast.parse("class S:\n def __init__(self):\n  self.a = Part(self, 1)\n")
    assert _scheduler_given_to(probe) == ["Part"]  # (the walk finds one)
    reach_backs = []
    for path in sorted((PACKAGE / "engine").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr == "sched"
                    and isinstance(node.value, ast.Name) and node.value.id == "self"):
                reach_backs.append(f"{path.name}:{node.lineno}")
    assert reach_backs == []
