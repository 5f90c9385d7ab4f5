"""pytest plugin for the upstream conformance check (docs/conformance.md).

``tests/upstream/run_conformance.py`` runs vLLM's own scheduler tests (0.32.0
or 0.33.0, from the installed release's sdist, extracted into a cache outside
this repository) twice, in a pytest session rooted in the extracted sources,
with this plugin loaded as ``-p seqhooks_conformance_plugin`` (its directory
on ``PYTHONPATH``; the module name is deliberately not under ``tests.``, which
is upstream's package there):

``--seqhooks-mode=stock``
    vLLM's classes untouched; the plugin only records outcomes and counts the
    schedulers each test builds (a transparent wrapper around
    ``Scheduler.__init__``). The plugin does not import ``vllm_seqhooks``.

``--seqhooks-mode=hooks``
    before any upstream test module is imported, ``Scheduler`` and
    ``AsyncScheduler`` in ``vllm.v1.core.sched.scheduler`` /
    ``vllm.v1.core.sched.async_scheduler`` are replaced by subclasses of our
    ``SeqHooksSyncScheduler`` / ``SeqHooksAsyncScheduler``. Every way the tests
    reach the classes (``from ... import Scheduler`` at module level or inside
    a function, ``create_scheduler()``'s default ``scheduler_cls``, the
    connector tests' own factories, test-local subclasses) then gets ours.
    Their ``__init__`` puts a hook configuration into
    ``vllm_config.additional_config["seqhooks"]`` when the test's config has
    none (upstream tests never set one), with hook token ids the tests never
    sample; a sampled hook token is recorded and fails the check.

Both modes write a JSON report (``--seqhooks-report``): per test id its
outcome, failure text, and how many hook / stock schedulers it built. The
driver compares the two reports.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import sys
import time
from collections import Counter
from typing import Any, Callable

import pytest

MODE_STOCK = "stock"
MODE_HOOKS = "hooks"

#: Hook token ids for the hooks run. Upstream's scheduler tests sample small
#: ids (0..~1000), their prompts use ids < 1000, and EOS is 50256 (OPT); the
#: smallest vocabulary among their models is llava's (32064), so these ids are
#: valid for every model and never sampled.
HOOK_TOKEN_IDS: dict[str, int] = {
    "sync_token_id": 31990,
    "promise_token_id": 31991,
    "promise_end_token_id": 31992,
}

#: Attribute set on the plugin's scheduler classes (for the counters and for
#: tests/test_upstream_conformance_wiring.py).
CONFORMANCE_MARK = "_seqhooks_conformance"

_SCHED_MODULE = "vllm.v1.core.sched.scheduler"
_ASYNC_MODULE = "vllm.v1.core.sched.async_scheduler"

#: Longest failure text kept per test in the report.
_MAX_LONGREPR = 6000


def hooks_config_dict() -> dict[str, Any]:
    """The ``additional_config["seqhooks"]`` value used in the hooks run:
    resolved ids (no tokenizer needed), defaults otherwise."""
    from vllm_seqhooks.config.special_kwargs import SpecialKwargs

    return SpecialKwargs(**HOOK_TOKEN_IDS, merge_separator_token_ids=[]).to_dict()


# --------------------------------------------------------------- recorder
class _Recorder:
    """Per-test bookkeeping shared by the hooks below and the scheduler
    classes (module global: the classes must reach it from any test)."""

    def __init__(self) -> None:
        self.current: Counter[str] = Counter()
        self.classes: set[str] = set()
        self.hook_tokens: set[int] = set()
        self.totals: Counter[str] = Counter()
        #: Classes of the stock schedulers built (and by how many tests).
        self.stock_classes: Counter[str] = Counter()

    def reset(self) -> None:
        self.current = Counter()
        self.classes = set()
        self.hook_tokens = set()

    def scheduler_created(self, sched: Any) -> None:
        cls = type(sched)
        kind = "hooks" if _is_hook_scheduler(cls) else "stock"
        self.current[kind] += 1
        self.totals[kind] += 1
        name = f"{cls.__module__}.{cls.__qualname__}"
        if kind == "stock" and name not in self.classes:
            self.stock_classes[name] += 1
        self.classes.add(name)

    def hook_tokens_sampled(self, ids: set[int]) -> None:
        self.hook_tokens |= ids
        self.totals["hook_token_samples"] += 1


RECORDER = _Recorder()


def _is_hook_scheduler(cls: type) -> bool:
    if getattr(cls, CONFORMANCE_MARK, False):
        return True
    mod = sys.modules.get("vllm_seqhooks.engine.scheduler")
    return mod is not None and issubclass(cls, mod.SeqHooksMixin)


def _install_counter(stock_scheduler: type) -> None:
    """Count every scheduler built (vLLM's ``Scheduler.__init__`` runs for all
    of them: ``AsyncScheduler``, ours and test subclasses call it)."""
    orig = stock_scheduler.__init__
    if getattr(orig, "_seqhooks_counting", False):
        return

    @functools.wraps(orig)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        RECORDER.scheduler_created(self)
        orig(self, *args, **kwargs)

    __init__._seqhooks_counting = True  # type: ignore[attr-defined]
    stock_scheduler.__init__ = __init__


# ------------------------------------------------------------ substitution
_CLASSES: tuple[type, type] | None = None


def conformance_classes() -> tuple[type, type]:
    """(sync, async) scheduler classes used in place of vLLM's: our
    ``SeqHooksSyncScheduler`` / ``SeqHooksAsyncScheduler`` plus an
    ``__init__`` that supplies the hook configuration upstream tests lack."""
    global _CLASSES
    if _CLASSES is not None:
        return _CLASSES
    # Import our module (and through it vLLM's classes) *before* anything is
    # patched: our classes must subclass the stock ones.
    from vllm_seqhooks.config.special_kwargs import ADDITIONAL_CONFIG_KEY
    from vllm_seqhooks.engine.scheduler import SeqHooksAsyncScheduler, SeqHooksSyncScheduler

    config = hooks_config_dict()

    class _ConformanceMixin:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            vllm_config = kwargs.get("vllm_config", args[0] if args else None)
            _inject_hooks_config(vllm_config, ADDITIONAL_CONFIG_KEY, config)
            super().__init__(*args, **kwargs)

        def _update_request_with_output(self, request, new_token_ids, *args, **kwargs):
            # getattr: some upstream tests build instances without __init__.
            hooks = getattr(self, "hooks", None)
            hit = hooks.hook_token_ids.intersection(new_token_ids) if hooks else ()
            if hit:
                RECORDER.hook_tokens_sampled(set(hit))
            return super()._update_request_with_output(
                request, new_token_ids, *args, **kwargs
            )

    class ConformanceSeqHooksSyncScheduler(_ConformanceMixin, SeqHooksSyncScheduler):
        """``SeqHooksSyncScheduler`` standing in for vLLM's ``Scheduler``."""

    class ConformanceSeqHooksAsyncScheduler(_ConformanceMixin, SeqHooksAsyncScheduler):
        """``SeqHooksAsyncScheduler`` standing in for vLLM's ``AsyncScheduler``."""

    for cls in (ConformanceSeqHooksSyncScheduler, ConformanceSeqHooksAsyncScheduler):
        setattr(cls, CONFORMANCE_MARK, True)
    _CLASSES = (ConformanceSeqHooksSyncScheduler, ConformanceSeqHooksAsyncScheduler)
    return _CLASSES


def _inject_hooks_config(vllm_config: Any, key: str, config: dict[str, Any]) -> None:
    if vllm_config is None:
        return
    current = getattr(vllm_config, "additional_config", None)
    if isinstance(current, dict) and key in current:
        return
    new = dict(current) if isinstance(current, dict) else {}
    new[key] = dict(config)
    vllm_config.additional_config = new


def install_substitution() -> Callable[[], None]:
    """Replace vLLM's ``Scheduler``/``AsyncScheduler`` module attributes with
    the conformance classes; returns a function that undoes it."""
    import importlib
    import pkgutil

    sync_cls, async_cls = conformance_classes()
    # vLLM's own subclasses (DiffusionScheduler, ...) must keep their stock
    # bases: import every module of the package before patching.
    import vllm.v1.core.sched as sched_pkg

    for info in pkgutil.iter_modules(sched_pkg.__path__):
        importlib.import_module(f"{sched_pkg.__name__}.{info.name}")
    sched_mod = sys.modules[_SCHED_MODULE]
    async_mod = sys.modules[_ASYNC_MODULE]
    stock_sync, stock_async = sched_mod.Scheduler, async_mod.AsyncScheduler
    if _is_hook_scheduler(stock_sync) or _is_hook_scheduler(stock_async):
        raise RuntimeError("scheduler substitution installed twice")
    if not (issubclass(sync_cls, stock_sync) and issubclass(async_cls, stock_async)):
        raise RuntimeError(
            "vllm_seqhooks' schedulers do not subclass the stock ones: was "
            "vllm_seqhooks.engine.scheduler imported after a patch?"
        )
    sched_mod.Scheduler = sync_cls
    async_mod.AsyncScheduler = async_cls

    def undo() -> None:
        sched_mod.Scheduler = stock_sync
        async_mod.AsyncScheduler = stock_async

    undo.stock = (stock_sync, stock_async)  # type: ignore[attr-defined]
    return undo


# ------------------------------------------------------------- pytest hooks
class _TestTimeout(Exception):
    pass


class _Session:
    def __init__(self, config: pytest.Config) -> None:
        self.mode: str = config.getoption("seqhooks_mode")
        self.report_path: str | None = config.getoption("seqhooks_report")
        self.timeout: int = int(config.getoption("seqhooks_test_timeout"))
        self.results: dict[str, dict[str, Any]] = {}
        self.collection_errors: dict[str, str] = {}
        self.late_rebinds: list[str] = []
        self.stock: tuple[type, type] | None = None
        self.started = time.time()


_SESSION: _Session | None = None


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("seqhooks", "vllm-seqhooks upstream conformance")
    group.addoption("--seqhooks-mode", choices=(MODE_STOCK, MODE_HOOKS),
                    default=None, help="stock: vLLM's schedulers; hooks: ours")
    group.addoption("--seqhooks-report", default=None,
                    help="write the per-test JSON report here")
    group.addoption("--seqhooks-test-timeout", default="120",
                    help="fail a test that runs longer (seconds, 0: off)")


def pytest_configure(config: pytest.Config) -> None:
    global _SESSION
    if config.getoption("seqhooks_mode") is None:
        return
    _SESSION = s = _Session(config)
    import vllm.v1.core.sched.async_scheduler  # noqa: F401
    import vllm.v1.core.sched.scheduler as sched_mod

    stock_sync = sched_mod.Scheduler
    if s.mode == MODE_HOOKS:
        undo = install_substitution()
        s.stock = undo.stock  # type: ignore[attr-defined]
    else:
        s.stock = (stock_sync, sys.modules[_ASYNC_MODULE].AsyncScheduler)
    _install_counter(s.stock[0])


def pytest_collection_finish(session: pytest.Session) -> None:
    """Hooks run: any upstream module still holding a stock class (none is
    expected: they are imported after the patch) is rebound and listed."""
    s = _SESSION
    if s is None or s.mode != MODE_HOOKS:
        return
    sync_cls, async_cls = conformance_classes()
    swap = {id(s.stock[0]): sync_cls, id(s.stock[1]): async_cls}
    for name, mod in list(sys.modules.items()):
        if not (name == "tests" or name.startswith("tests.")) or mod is None:
            continue
        for attr, value in list(vars(mod).items()):
            repl = swap.get(id(value))
            if repl is not None:
                setattr(mod, attr, repl)
                s.late_rebinds.append(f"{name}.{attr}")


def pytest_collectreport(report: pytest.CollectReport) -> None:
    s = _SESSION
    if s is not None and report.failed:
        s.collection_errors[report.nodeid] = _text(report)[-_MAX_LONGREPR:]


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    if _SESSION is not None:
        RECORDER.reset()
        _SESSION.results[nodeid] = {"outcome": None}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    s = _SESSION
    if s is None or s.timeout <= 0 or not hasattr(signal, "SIGALRM"):
        return (yield)

    def on_alarm(signum: int, frame: Any) -> None:
        raise _TestTimeout(f"test ran longer than {s.timeout}s (--seqhooks-test-timeout)")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(s.timeout)
    try:
        return (yield)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A failure's entry says whether its exception passed through this
    project's code (``our_frames``: a frame of the ``vllm_seqhooks``
    package anywhere in the exception or its causes): with no scheduler
    built either, the hooks run's substitution cannot have reached it
    (``run_conformance.py --stock reached``)."""
    report = yield
    s = _SESSION
    if s is not None and report.failed and call.excinfo is not None:
        entry = s.results.setdefault(item.nodeid, {"outcome": None})
        entry["our_frames"] = entry.get("our_frames", False) or _our_frames(call.excinfo.value)
    return report


@functools.lru_cache(maxsize=1)
def _package_roots() -> tuple[str, ...]:
    """The ``vllm_seqhooks`` package's directories, each ending in a
    separator (found without importing it)."""
    import importlib.util

    spec = importlib.util.find_spec("vllm_seqhooks")
    return tuple(os.path.join(os.path.realpath(d), "") for d in
                 (spec.submodule_search_locations or ())) if spec else ()


def _our_frames(exc: BaseException) -> bool:
    """Whether a traceback of ``exc``, its causes or contexts has a frame in
    the ``vllm_seqhooks`` package (True when the package cannot be found:
    nothing then says the failure is not ours)."""
    roots = _package_roots()
    if not roots:
        return True
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        tb = e.__traceback__
        while tb is not None:
            if os.path.realpath(tb.tb_frame.f_code.co_filename).startswith(roots):
                return True
            tb = tb.tb_next
        todo += [e.__cause__, e.__context__]
    return False


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    s = _SESSION
    if s is None:
        return
    entry = s.results.setdefault(report.nodeid, {"outcome": None})
    outcome = entry["outcome"]
    if report.when == "setup":
        if report.failed:
            outcome = "error"
        elif report.skipped:
            outcome = "skipped"
    elif report.when == "call":
        # Sub-tests (unittest subTest / pytest subtests) report "call" several
        # times: a failure anywhere fails the test.
        if outcome == "failed":
            pass
        elif hasattr(report, "wasxfail"):
            outcome = "xpassed" if report.passed else "xfailed"
        elif report.passed:
            outcome = "passed"
        elif report.failed:
            outcome = "failed"
        else:
            outcome = "skipped"
    elif report.when == "teardown" and report.failed and outcome in ("passed", None):
        outcome = "error"
    entry["outcome"] = outcome
    entry["duration_s"] = round(entry.get("duration_s", 0.0) + report.duration, 3)
    if report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        entry.setdefault("message", getattr(crash, "message", None) or _text(report)[-500:])
        entry.setdefault("when", report.when)
        entry.setdefault("longrepr", _text(report)[-_MAX_LONGREPR:])
    if report.when == "teardown":
        entry["schedulers"] = {"hooks": RECORDER.current["hooks"],
                               "stock": RECORDER.current["stock"]}
        if RECORDER.classes:
            entry["scheduler_classes"] = sorted(RECORDER.classes)
        if RECORDER.hook_tokens:
            entry["hook_tokens_sampled"] = sorted(RECORDER.hook_tokens)


def _text(report: Any) -> str:
    try:
        return str(report.longreprtext)
    except Exception:  # pragma: no cover - defensive
        return str(report.longrepr)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    s = _SESSION
    if s is None or not s.report_path:
        return
    import vllm

    counts = Counter(e["outcome"] or "unknown" for e in s.results.values())
    data = {
        "mode": s.mode,
        "vllm_version": getattr(vllm, "__version__", None),
        "vllm_path": os.path.dirname(vllm.__file__),
        "scheduler_classes": (
            [f"{c.__module__}.{c.__qualname__}" for c in conformance_classes()]
            if s.mode == MODE_HOOKS
            else [f"{c.__module__}.{c.__qualname__}" for c in s.stock or ()]
        ),
        "hooks_config": hooks_config_dict() if s.mode == MODE_HOOKS else None,
        "pytest_exitstatus": int(exitstatus),
        "duration_s": round(time.time() - s.started, 1),
        "counts": dict(counts),
        "collection_errors": s.collection_errors,
        "schedulers_created": {"hooks": RECORDER.totals["hooks"],
                               "stock": RECORDER.totals["stock"]},
        # class name -> number of tests that built one (stock classes only)
        "stock_scheduler_classes": dict(RECORDER.stock_classes),
        "stock_base_classes": [f"{c.__module__}.{c.__qualname__}" for c in s.stock or ()],
        "late_rebinds": s.late_rebinds,
        # (vLLM may load our CLI-flags entry point, vllm_seqhooks.plugin, in
        # either run: it adds flags and does not touch scheduling.)
        "vllm_seqhooks_modules": sorted(m for m in sys.modules
                                        if m.split(".")[0] == "vllm_seqhooks"),
        "tests": s.results,
    }
    os.makedirs(os.path.dirname(os.path.abspath(s.report_path)), exist_ok=True)
    tmp = s.report_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, s.report_path)


# ---------------------------------------------------------------- fixtures
@pytest.fixture
def caplog_vllm(caplog: pytest.LogCaptureFixture):
    """Stand-in for upstream's root-conftest fixture of the same name (that
    conftest is not loaded: it needs packages this project does not use):
    ``caplog`` at INFO with the ``vllm`` logger propagating to the root."""
    logger = logging.getLogger("vllm")
    previous = logger.propagate
    logger.propagate = True
    try:
        with caplog.at_level(logging.INFO):
            yield caplog
    finally:
        logger.propagate = previous
