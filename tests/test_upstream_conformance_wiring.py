"""Wiring of the upstream conformance check (tests/upstream/, docs/conformance.md).

Cheap checks, no download and no upstream code: the plugin's substitution
really puts our schedulers where upstream tests import vLLM's, the hook
configuration it injects is usable, the driver's comparison fails when the
hooks run did not use our schedulers, and the sdist lookup reads a simple
index page.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

UPSTREAM = Path(__file__).resolve().parent / "upstream"


def _load(name: str) -> ModuleType:
    # Loaded by path under a private name: a fresh module (and fresh classes)
    # per test, nothing registered in sys.modules.
    spec = importlib.util.spec_from_file_location(f"_wiring_{name}", UPSTREAM / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_substitution_puts_hook_schedulers_where_upstream_imports_vllms():
    plugin = _load("seqhooks_conformance_plugin")
    import vllm.v1.core.sched.async_scheduler as async_mod
    import vllm.v1.core.sched.scheduler as sched_mod
    from vllm_seqhooks.engine.scheduler import (
        SeqHooksAsyncScheduler,
        SeqHooksMixin,
        SeqHooksSyncScheduler,
    )

    stock_sync, stock_async = sched_mod.Scheduler, async_mod.AsyncScheduler
    undo = plugin.install_substitution()
    try:
        assert undo.stock == (stock_sync, stock_async)
        # What `from vllm.v1.core.sched.scheduler import Scheduler` gives a
        # test module imported after the patch:
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler

        assert Scheduler is not stock_sync and AsyncScheduler is not stock_async
        assert issubclass(Scheduler, SeqHooksSyncScheduler)
        assert issubclass(Scheduler, stock_sync)
        assert not issubclass(Scheduler, stock_async)
        assert issubclass(AsyncScheduler, SeqHooksAsyncScheduler)
        assert issubclass(AsyncScheduler, stock_async)
        assert plugin._is_hook_scheduler(Scheduler)
        assert not plugin._is_hook_scheduler(stock_sync)
        # vLLM's own subclasses keep their stock bases.
        from vllm.v1.core.sched.diffusion_scheduler import DiffusionScheduler

        assert not issubclass(DiffusionScheduler, SeqHooksMixin)
        with pytest.raises(RuntimeError, match="twice"):
            plugin.install_substitution()
    finally:
        undo()
    assert sched_mod.Scheduler is stock_sync
    assert async_mod.AsyncScheduler is stock_async


def test_injected_hook_config_is_resolved_and_keeps_other_keys():
    plugin = _load("seqhooks_conformance_plugin")
    from vllm_seqhooks.config.special_kwargs import ADDITIONAL_CONFIG_KEY, SpecialKwargs

    config = plugin.hooks_config_dict()
    hooks = SpecialKwargs.from_dict(config)
    assert hooks.is_resolved  # no tokenizer needed in EngineCore
    assert len(hooks.hook_token_ids) == 3
    hooks.check_vocab(32000)  # valid for the smallest vocabulary in the tests

    vc = SimpleNamespace(additional_config={"other": 1})
    plugin._inject_hooks_config(vc, ADDITIONAL_CONFIG_KEY, config)
    assert vc.additional_config == {"other": 1, ADDITIONAL_CONFIG_KEY: config}
    mine = {ADDITIONAL_CONFIG_KEY: {"sync_token_id": 1}}
    vc = SimpleNamespace(additional_config=mine)
    plugin._inject_hooks_config(vc, ADDITIONAL_CONFIG_KEY, config)
    assert vc.additional_config is mine  # a test's own hook config wins
    vc = SimpleNamespace(additional_config=None)
    plugin._inject_hooks_config(vc, ADDITIONAL_CONFIG_KEY, config)
    assert vc.additional_config == {ADDITIONAL_CONFIG_KEY: config}


def _report(outcomes: dict[str, str], *, hooks: int, stock: int, mode: str,
            stock_classes: dict[str, int] | None = None) -> dict:
    kind = "hooks" if mode == "hooks" else "stock"
    return {
        "mode": mode,
        "tests": {
            t: {"outcome": o, "schedulers": {kind: 1, "hooks" if kind == "stock" else "stock": 0},
                "message": None if o == "passed" else "AssertionError: boom"}
            for t, o in outcomes.items()
        },
        "collection_errors": {},
        "schedulers_created": {"hooks": hooks, "stock": stock},
        "stock_scheduler_classes": stock_classes or {},
        "stock_base_classes": ["vllm.v1.core.sched.scheduler.Scheduler",
                               "vllm.v1.core.sched.async_scheduler.AsyncScheduler"],
    }


def test_compare_reports_regressions_and_a_missing_substitution():
    driver = _load("conformance_compare")
    stock = _report({"t::a": "passed", "t::b": "passed", "t::c": "failed"},
                    hooks=0, stock=3, mode="stock")
    hooks = _report({"t::a": "passed", "t::b": "failed", "t::c": "failed"},
                    hooks=3, stock=0, mode="hooks")
    cmp = driver.compare(stock, hooks)
    assert [r["test"] for r in cmp["regressions"]] == ["t::b"]
    assert cmp["regressions"][0]["message"] == "AssertionError: boom"
    assert cmp["fail_in_both"] == {"AssertionError: boom": ["t::c"]}
    assert cmp["problems"] == []

    # Both runs secretly on vLLM's classes: identical outcomes, but it fails.
    cmp = driver.compare(stock, stock)
    assert cmp["regressions"] == []
    assert any("built no hook scheduler" in p for p in cmp["problems"])

    # The plain stock class built in the hooks run: substitution missed.
    leaky = _report({"t::a": "passed", "t::b": "passed", "t::c": "failed"},
                    hooks=2, stock=1, mode="hooks",
                    stock_classes={"vllm.v1.core.sched.scheduler.Scheduler": 1})
    assert any("substitution missed" in p for p in driver.compare(stock, leaky)["problems"])


def test_vllms_run_of_the_failures_only_finds_the_same_regressions():
    """``--stock failed``: vLLM's schedulers run only the tests
    the hooks run did not pass; a test ours passes is no regression whatever
    vLLM's do, so the regressions are those of a run of every test."""
    driver = _load("conformance_compare")
    hooks = _report({"t::a": "passed", "t::b": "failed", "t::c": "failed"},
                    hooks=3, stock=0, mode="hooks")
    assert driver.not_passed(hooks) == ["t::b", "t::c"]
    hooks["collection_errors"] = {"u.py::": "ImportError"}
    assert driver.not_passed(hooks) == ["t::b", "t::c", "u.py"]
    hooks["collection_errors"] = {}
    full = _report({"t::a": "passed", "t::b": "passed", "t::c": "failed"},
                   hooks=0, stock=3, mode="stock")
    subset = _report({"t::b": "passed", "t::c": "failed"}, hooks=0, stock=2, mode="stock")
    subset["scope"] = "not passed by the hooks run"
    want = driver.compare(full, hooks)
    got = driver.compare(subset, hooks)
    assert [r["test"] for r in got["regressions"]] == [r["test"] for r in want["regressions"]] \
        == ["t::b"]
    assert got["fail_in_both"] == want["fail_in_both"] and got["problems"] == []
    assert got["pass_only_with_hooks"] == []  # (t::a passed in both: not listed)

    # A failure vLLM's run left out is no pass there: said, not taken as one.
    lost = _report({"t::c": "failed"}, hooks=0, stock=1, mode="stock")
    lost["scope"] = subset["scope"]
    assert any("did not run 1 of the tests" in p for p in driver.compare(lost, hooks)["problems"])

    # Tests of the hooks run that built only vLLM's own subclasses are listed
    # from the hooks run itself.
    hooks["tests"]["t::d"] = {"outcome": "passed", "schedulers": {"stock": 1, "hooks": 0}}
    assert driver.compare(subset, hooks)["not_substituted"] == ["t::d"]
    # Nothing passed with ours: the comparison proves nothing.
    none_passed = _report({"t::b": "failed"}, hooks=1, stock=0, mode="hooks")
    assert any("no upstream test passed with the hook scheduler" in p
               for p in driver.compare(subset, none_passed)["problems"])


def test_sdist_lookup_reads_a_simple_index_page(tmp_path):
    driver = _load("run_conformance")
    sdist = _load("upstream_sdist")
    page = tmp_path / "simple" / "vllm"
    page.mkdir(parents=True)
    sha = driver.SDIST_SHA256
    (page / "index.html").write_text(
        "<html><body>\n"
        '<a href="../../files/vllm-0.31.0.tar.gz#sha256=' + "0" * 64 + '">vllm-0.31.0.tar.gz</a>\n'
        f'<a href="../../files/vllm-0.32.0.tar.gz#sha256={sha}" '
        'data-requires-python="&gt;=3.10">vllm-0.32.0.tar.gz</a>\n'
        "</body></html>\n"
    )
    url, listed = sdist.find_sdist((tmp_path / "simple").as_uri(), None, driver.SDIST_NAME)
    assert url == (tmp_path / "files" / "vllm-0.32.0.tar.gz").as_uri()
    assert listed == sha
    other = tmp_path / "other" / "vllm"
    other.mkdir(parents=True)
    (other / "index.html").write_text('<a href="vllm-0.31.0.tar.gz">vllm-0.31.0.tar.gz</a>')
    with pytest.raises(sdist.DownloadError, match="does not list"):
        sdist.find_sdist((tmp_path / "other").as_uri(), None, driver.SDIST_NAME)


def _failed(schedulers: dict[str, int] | None, **entry) -> dict:
    return {"outcome": "failed", "message": "ValueError: no model here",
            **({"schedulers": schedulers} if schedulers is not None else {}), **entry}


def test_vllms_run_leaves_out_only_failures_that_never_met_the_substitution():
    """``--stock reached`` (the default): of the tests ours did not pass,
    vLLM's schedulers run those that built a scheduler (ours or vLLM's), failed
    through a frame of vllm_seqhooks, or say neither; a failure before any
    scheduler with none of our frames is left out, listed by its reason, and
    is not taken for a test vLLM's run forgot."""
    driver = _load("conformance_compare")
    hooks = _report({"t::a": "passed"}, hooks=2, stock=0, mode="hooks")
    hooks["tests"].update({
        "t::built": _failed({"hooks": 1, "stock": 0}, our_frames=False),
        "t::built_stock": _failed({"hooks": 0, "stock": 1}, our_frames=False),
        "t::ours": _failed({"hooks": 0, "stock": 0}, our_frames=True),
        "t::unknown": _failed({"hooks": 0, "stock": 0}),
        "t::no_count": _failed(None, our_frames=False),
        "t::before": _failed({"hooks": 0, "stock": 0}, our_frames=False),
    })
    hooks["collection_errors"] = {"u.py::": "ImportError"}
    run, left_out = driver.for_vllms_run(hooks, "reached")
    assert run == ["t::built", "t::built_stock", "t::no_count", "t::ours", "t::unknown", "u.py"]
    assert left_out == ["t::before"]
    assert driver.for_vllms_run(hooks, "failed") == (driver.not_passed(hooks), [])

    hooks["collection_errors"] = {}
    stock = _report({t: "failed" for t in run if "::" in t}, hooks=0, stock=3, mode="stock")
    stock["scope"], stock["left_out"] = "reached", left_out
    cmp = driver.compare(stock, hooks)
    assert cmp["problems"] == [] and cmp["regressions"] == []
    assert cmp["failed_before_a_scheduler"] == {"ValueError: no model here": ["t::before"]}
    # Without the list, the left-out test is one vLLM's run did not run.
    del stock["left_out"]
    assert any("did not run 1 of the tests" in p for p in driver.compare(stock, hooks)["problems"])


def test_a_failure_through_vllm_seqhooks_is_told_from_one_that_is_not():
    """The plugin's ``our_frames``: a frame of the vllm_seqhooks package in
    the exception, its cause or its context."""
    from vllm_seqhooks.config.presets import coerce_special_kwargs

    plugin = _load("seqhooks_conformance_plugin")

    def caught(fn):
        try:
            fn()
        except Exception as exc:  # noqa: BLE001
            return exc
        raise AssertionError("did not raise")

    ours = caught(lambda: coerce_special_kwargs(42))
    assert plugin._our_frames(ours)
    assert not plugin._our_frames(caught(lambda: int("x")))

    def wrapped():
        try:
            coerce_special_kwargs(42)
        except Exception as exc:
            raise RuntimeError("config failed") from exc

    assert plugin._our_frames(caught(wrapped))
