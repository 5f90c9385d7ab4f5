#!/usr/bin/env python3
"""Upstream conformance: vLLM's own scheduler tests, stock vs. hooks.

Usage (from the repository root; see docs/conformance.md):

    bash scripts/upstream_conformance.sh            # or
    .venv/bin/python tests/upstream/run_conformance.py [options] [test paths]

Runs the test suite of the installed vLLM's release (``--vllm-version`` picks
another); ``RELEASES`` lists the releases it knows (0.32.0, 0.33.0), each with
its sdist, sha256 and test selection.

1. Fetches vLLM's sdist (``vllm-VERSION.tar.gz``, which ships upstream's test
   suite) from the package index pip is configured with, checks its sha256 and
   caches it in a directory outside the repository (upstream code is never
   copied into this repository).
2. Extracts ``tests/`` (and ``pyproject.toml``, for pytest's settings) next to
   it and writes an offline Hugging Face cache holding only the ``config.json``
   files the selected tests need (tests/upstream/hf_configs/).
3. Runs the selected upstream tests with pytest and
   ``seqhooks_conformance_plugin``: with ours substituted for ``Scheduler``
   and ``AsyncScheduler``, then with vLLM's the tests ours did not pass that
   reached a scheduler (``--stock``: ``reached``, ``failed`` or ``all``).
4. Compares: every test that passes with the stock schedulers must pass with
   ours; the hooks run must really have built our schedulers and must never
   have sampled a hook token. Prints both pass counts and the tests that pass
   with stock but not with ours, and writes ``results/summary.json`` under
   the cache directory.

Exit status: 0 conformant; 1 a difference (or a failed sanity check);
2 a run did not complete; 3 the sdist could not be downloaded.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # (the sibling modules, also when loaded by path)
    sys.path.insert(0, str(HERE))
from conformance_compare import (  # noqa: E402
    _counts,
    _first_line,
    _fmt,
    _per_file,
    compare,
    for_vllms_run,
)
from upstream_sdist import DownloadError, extract, fetch_sdist, log  # noqa: E402
REPO = HERE.parents[1]
PLUGIN = "seqhooks_conformance_plugin"
HF_CONFIGS = HERE / "hf_configs"


class Release(NamedTuple):
    """One vLLM release whose test suite this check runs. (A NamedTuple, not
    a dataclass: tests load this file without registering it as a module.)"""

    version: str
    #: The sdist's file name on the package index (it ships ``tests/``).
    sdist: str
    #: Its sha256 as published on the package index (checked on download).
    sha256: str
    #: The sdist's top directory.
    top: str
    #: Upstream test files run in both modes (paths inside the sdist). All of
    #: them build schedulers, KV cache managers or the connectors' scheduler
    #: side and run offline on CPU; docs/conformance.md lists what fails in
    #: both and why, and what is not selected.
    selection: tuple[str, ...]


#: 0.32.0's selection.
_SELECTION_0_32: tuple[str, ...] = (
    # the scheduler itself
    "tests/v1/core/test_scheduler.py",
    "tests/v1/core/test_async_scheduler.py",
    "tests/v1/core/test_output.py",
    "tests/v1/core/test_repetition_detection.py",
    "tests/v1/core/test_deferred_block_free.py",
    "tests/v1/core/test_worker_slot_overflow.py",
    "tests/v1/core/test_swa_inflight_window_free.py",
    "tests/v1/core/test_mamba_align_chunk_split.py",
    "tests/v1/structured_output/test_scheduler_speculative_padding.py",
    "tests/v1/spec_decode/test_dynamic_sd.py",
    "tests/v1/spec_decode/test_dflash_lookahead.py",
    # preemption and priorities
    "tests/v1/core/test_priority_preemption_bug.py",
    "tests/v1/core/test_priority_scheduler_random.py",
    # streaming input (the session path our joins use)
    "tests/v1/streaming_input/test_scheduler_streaming.py",
    # prefix caching and the KV cache manager
    "tests/v1/core/test_prefix_caching.py",
    "tests/v1/core/test_prefix_replay.py",
    "tests/v1/core/prefix_cache/test_partial_prefix_cache_hits.py",
    "tests/v1/core/prefix_cache/test_partial_prefix_cache_primitives.py",
    "tests/v1/core/prefix_cache/test_mamba_eagle_resume_checkpoint.py",
    "tests/v1/core/test_single_type_kv_cache_manager.py",
    "tests/v1/core/test_kv_sharing.py",
    "tests/v1/core/test_contiguous_kv_packing.py",
    "tests/v1/core/test_kv_cache_metrics.py",
    "tests/v1/core/test_encoder_cache_manager.py",
    # KV / EC connectors driven through the scheduler
    "tests/v1/kv_connector/unit/test_remote_prefill_lifecycle.py",
    "tests/v1/kv_connector/unit/test_remote_decode_lifecycle.py",
    "tests/v1/kv_connector/unit/test_error_propagation.py",
    "tests/v1/kv_connector/unit/test_invalid_blocks_correctness.py",
    "tests/v1/kv_connector/unit/test_kv_load_failure_recovery.py",
    "tests/v1/kv_connector/unit/test_cache_pollution_prevention.py",
    "tests/v1/kv_connector/unit/test_scheduler_kv_connector_override.py",
    "tests/v1/kv_connector/unit/test_decode_bench_connector.py",
    "tests/v1/kv_connector/unit/offloading_connector/test_scheduler.py",
    "tests/v1/simple_kv_offload/test_scheduler.py",
    "tests/v1/ec_connector/unit/test_ec_transfer_params.py",
)

#: 0.33.0 renames and removes none of these files. The scheduler-related test
#: files it adds are not selected (docs/conformance.md, "Not selected"): the
#: UMBP connector tests (ROCm with the ``mori`` package only; they build the
#: connector's own scheduler side, not vLLM's scheduler),
#: ``v1/e2e/general/test_hisparse.py`` (an engine with weights),
#: ``v1/core/test_kv_cache_planning.py`` / ``test_kv_cache_config_builder.py``
#: (KV cache sizing split out of ``test_kv_cache_utils.py``, which is not
#: selected either: they build no scheduler), and
#: ``v1/kv_offload/cpu/test_capacity.py`` (offload capacity arithmetic).
_SELECTION_0_33: tuple[str, ...] = _SELECTION_0_32

#: The releases this check knows, oldest first: version -> sdist, its sha256
#: as published on the package index, top directory, and test selection.
RELEASES: dict[str, Release] = {
    r.version: r
    for r in (
        Release(
            version="0.32.0",
            sdist="vllm-0.32.0.tar.gz",
            sha256="d2c957d5eee3d0985012151315ddc62cbe0cd368fc96a5fc3510438d9dddf2ad",
            top="vllm-0.32.0",
            selection=_SELECTION_0_32,
        ),
        Release(
            version="0.33.0",
            sdist="vllm-0.33.0.tar.gz",
            sha256="f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112",
            top="vllm-0.33.0",
            selection=_SELECTION_0_33,
        ),
    )
}

#: The oldest release: the default of the lookup helpers below when called
#: without a release (tests/test_upstream_conformance_wiring.py uses these).
_DEFAULT = next(iter(RELEASES.values()))
SDIST_NAME = _DEFAULT.sdist
SDIST_SHA256 = _DEFAULT.sha256

EXIT_OK, EXIT_DIFF, EXIT_RUN, EXIT_DOWNLOAD = 0, 1, 2, 3



def write_hf_cache(cache: Path) -> Path:
    """An offline Hugging Face cache holding only config.json files: one per
    ``hf_configs/<org>--<name>.json``, as model ``<org>/<name>``."""
    hf_home = cache / "hf"
    hub = hf_home / "hub"
    shutil.rmtree(hub, ignore_errors=True)
    for cfg in sorted(HF_CONFIGS.glob("*.json")):
        org, _, name = cfg.stem.partition("--")
        text = cfg.read_text()
        json.loads(text)  # fail early on a broken file
        commit = hashlib.sha1(text.encode()).hexdigest()
        repo = hub / f"models--{org}--{name}"
        snap = repo / "snapshots" / commit
        snap.mkdir(parents=True)
        (snap / "config.json").write_text(text)
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(commit)
    return hf_home


# -------------------------------------------------------------------- runs
def run_env(cache: Path, hf_home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        HF_HOME=str(hf_home),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        VLLM_CACHE_ROOT=str(cache / "vllm-cache"),
    )
    env.pop("HF_HUB_CACHE", None)
    env.pop("HUGGINGFACE_HUB_CACHE", None)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p
    )
    return env


def pytest_cmd(args, src: Path, mode: str, report: Path, paths: list[str]) -> list[str]:
    cmd = [
        args.python, "-m", "pytest",
        "-p", PLUGIN, f"--seqhooks-mode={mode}", f"--seqhooks-report={report}",
        f"--seqhooks-test-timeout={args.test_timeout}",
        "-c", str(src / "pyproject.toml"), "--rootdir", str(src),
        # Upstream's root conftest needs packages we do not install; the
        # subdirectory ones (e.g. the KV connector tests' CPU block sizes)
        # are loaded.
        "--confcutdir", str(src / "tests" / "v1"),
        "--continue-on-collection-errors",
        "-p", "no:cacheprovider",
        "-q", "--tb=short", "-o", "console_output_style=classic",
    ]
    if args.k:
        cmd += ["-k", args.k]
    return cmd + paths


def start_run(args, src: Path, env: dict[str, str], mode: str, results: Path,
              paths: list[str]):
    report = results / f"{mode}.json"
    report.unlink(missing_ok=True)
    logf = open(results / f"{mode}.log", "w")
    cmd = pytest_cmd(args, src, mode, report, paths)
    logf.write("$ " + " ".join(cmd) + "\n\n")
    logf.flush()
    proc = subprocess.Popen(cmd, cwd=src, env=env, stdout=logf, stderr=subprocess.STDOUT)
    return proc, logf, report, time.time()


def wait_run(mode: str, proc, logf, report: Path, t0: float, deadline: float) -> dict | None:
    try:
        proc.wait(timeout=max(1.0, deadline - time.time()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        log(f"{mode}: killed after the run timeout (see {logf.name})")
        logf.close()
        return None
    logf.close()
    took = time.time() - t0
    if not report.is_file():
        log(f"{mode}: pytest exited {proc.returncode} without a report "
            f"(see {logf.name}):")
        print(_tail(Path(logf.name), 30), flush=True)
        return None
    data = json.loads(report.read_text())
    data["wall_s"] = round(took, 1)
    return data


def _tail(path: Path, n: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


#: What vLLM's run holds for each ``--stock`` choice (its report's ``scope``;
#: ``"all"`` is what :func:`conformance_compare.compare` reads as every test).
STOCK_SCOPES = {
    "all": "all",
    "failed": "the tests ours did not pass",
    "reached": "the tests ours did not pass that reached a scheduler or vllm_seqhooks",
}

#: Above this many tests the hooks run did not pass, vLLM's run takes their
#: files rather than each test id (a command line of reasonable length).
MAX_STOCK_IDS = 300


def run_both(args, src: Path, env: dict[str, str], results: Path,
             paths: list[str]) -> tuple[dict | None, dict | None]:
    """Every selected test with vLLM's schedulers and with ours
    (``--stock all``), at once with ``--jobs 2``."""
    runs: dict[str, dict | None] = {}
    if args.jobs == 2:
        started = {m: start_run(args, src, env, m, results, paths) for m in ("stock", "hooks")}
        deadline = time.time() + args.run_timeout
        for m, r in started.items():
            runs[m] = wait_run(m, *r, deadline=deadline)
    else:
        for m in ("stock", "hooks"):
            runs[m] = _run(args, src, env, m, results, paths)
    return runs["stock"], runs["hooks"]


def run_hooks_then_stock_on_failures(args, src: Path, env: dict[str, str], results: Path,
                                     paths: list[str]) -> tuple[dict | None, dict | None]:
    """The selected tests with our schedulers, then with vLLM's only those
    ours did not pass (``--stock failed``), or only those of them that
    reached a scheduler or our code (``--stock reached``, the default;
    :func:`conformance_compare.for_vllms_run`): the same regressions as
    :func:`run_both` for a fraction of the work."""
    hooks = _run(args, src, env, "hooks", results, paths)
    if hooks is None:
        return None, None
    failed, left_out = for_vllms_run(hooks, args.stock)
    scope = STOCK_SCOPES[args.stock]
    if left_out:
        log(f"stock run: not needed for {len(left_out)} test(s) the hook scheduler did not "
            "pass: each failed before building any scheduler, with no frame of "
            "vllm_seqhooks in its exception (--stock failed runs them too)")
    if not failed:
        log("stock run: not needed (no other test failed with the hook scheduler)")
        return {"scope": scope, "left_out": left_out, "tests": {}, "collection_errors": {},
                "schedulers_created": {"hooks": 0, "stock": 0}, "scheduler_classes": {},
                "wall_s": 0.0}, hooks
    log(f"stock run: the {len(failed)} test(s) the hook scheduler did not pass"
        + (" having reached a scheduler or vllm_seqhooks" if left_out else ""))
    if len(failed) > MAX_STOCK_IDS:
        failed = sorted({t.split("::")[0] for t in failed})
    stock = _run(args, src, env, "stock", results, failed)
    if stock is not None:
        stock["scope"] = scope
        stock["left_out"] = left_out
    return stock, hooks


def _run(args, src: Path, env: dict[str, str], mode: str, results: Path,
         paths: list[str]) -> dict | None:
    r = start_run(args, src, env, mode, results, paths)
    data = wait_run(mode, *r, deadline=time.time() + args.run_timeout)
    if data is not None:
        log(f"{mode:5s} run: {_fmt(_counts(data))}  [{data['wall_s']:.0f} s]")
    return data


# --------------------------------------------------------------------- main
def _outside_repo_or_ignored(path: Path) -> bool:
    try:
        path.relative_to(REPO.resolve())
    except ValueError:
        return True
    probe = path / "src"
    res = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", str(probe)],
                         capture_output=True, check=False)
    return res.returncode == 0


def default_cache(version: str) -> Path:
    env = os.environ.get("SEQHOOKS_UPSTREAM_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "vllm-seqhooks" / f"upstream-conformance-{version}"


def installed_vllm_version(python: str) -> str | None:
    """The release of the vLLM that ``python`` imports, without its local
    label (``0.32.0+cpu`` -> ``0.32.0``); None when it has none."""
    code = 'import importlib.metadata as m; print(m.version("vllm"))'
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True,
                             timeout=120, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out.partition("+")[0] or None


def choose_release(requested: str | None, installed: str | None) -> Release:
    """The release whose tests run: ``--vllm-version`` if given, else the
    installed one. Raises ValueError when it is not in ``RELEASES``."""
    version = requested or installed
    if version is None:
        raise ValueError("cannot read the installed vLLM's version (is vLLM "
                         "installed in --python?); pass --vllm-version")
    version = version.partition("+")[0]
    if version not in RELEASES:
        raise ValueError(f"vLLM {version} is not one of the releases this check "
                         f"knows ({', '.join(RELEASES)}); add it to RELEASES in "
                         "tests/upstream/run_conformance.py")
    return RELEASES[version]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*",
                    help="upstream test paths/ids to run instead of the default selection")
    ap.add_argument("--vllm-version", default=None, choices=list(RELEASES),
                    help="the release whose tests run (default: that of the vLLM "
                         "installed in --python)")
    ap.add_argument("--cache-dir", type=Path, default=None,
                    help="cache directory (default: $SEQHOOKS_UPSTREAM_CACHE or "
                         "~/.cache/vllm-seqhooks/upstream-conformance-VERSION); "
                         "must be outside the repository or git-ignored")
    ap.add_argument("--python", default=sys.executable,
                    help="interpreter with vLLM and vllm_seqhooks (default: this one)")
    ap.add_argument("--sdist", default=os.environ.get("SEQHOOKS_VLLM_SDIST"),
                    help="use this vllm-VERSION.tar.gz instead of downloading it "
                         "(also $SEQHOOKS_VLLM_SDIST)")
    ap.add_argument("-k", default=None, help="pytest -k expression for both runs")
    ap.add_argument("--stock", choices=("reached", "failed", "all"), default="reached",
                    help="which tests run with vLLM's schedulers: 'failed': the "
                         "hooks run first, then vLLM's schedulers only on the tests "
                         "ours did not pass (a test ours passes is no regression "
                         "whatever vLLM's do); 'reached' (the default): of those, "
                         "only the ones that built a scheduler or failed through "
                         "vllm_seqhooks' code (the others never met the "
                         "substitution, the runs' one difference); 'all': every "
                         "test with both (to see what passes with ours only)")
    ap.add_argument("--jobs", type=int, choices=(1, 2),
                    default=2 if (os.cpu_count() or 1) >= 2 else 1,
                    help="with --stock all, 2: run the stock and hooks runs at "
                         "the same time (default: 2 with 2 or more CPUs, else 1; "
                         "each run is one single-threaded pytest process)")
    ap.add_argument("--test-timeout", type=int, default=120,
                    help="per-test time limit in seconds (0: none)")
    ap.add_argument("--run-timeout", type=int, default=900,
                    help="time limit for each pytest run in seconds")
    ap.add_argument("--show-traceback-lines", type=int, default=25,
                    help="traceback lines printed per difference")
    args = ap.parse_args(argv)
    if os.sep in args.python:
        # The runs start in the extracted sources; abspath, not realpath (a
        # venv's python is a symlink that must stay inside the venv).
        args.python = os.path.abspath(args.python)

    t_start = time.time()
    installed = installed_vllm_version(args.python)
    try:
        release = choose_release(args.vllm_version, installed)
    except ValueError as e:
        log(f"ERROR: {e}")
        return EXIT_RUN
    if installed != release.version:
        log(f"WARNING: running vLLM {release.version}'s tests against the installed "
            f"vLLM {installed or '(unknown)'}: the tests import the installed one")
    cache = (args.cache_dir or default_cache(release.version)).resolve()
    cache.mkdir(parents=True, exist_ok=True)
    if not _outside_repo_or_ignored(cache):
        log(f"ERROR: cache directory {cache} is inside the repository and not "
            "git-ignored: upstream code must never be committed here. Use a "
            "directory outside the repository (or e.g. .cache/, which is ignored).")
        return EXIT_RUN
    log(f"vLLM {release.version} upstream scheduler tests: stock vs vllm_seqhooks "
        f"(python: {args.python})")
    log(f"cache: {cache}")
    try:
        sdist = fetch_sdist(cache, args.python, args.sdist, release)
    except DownloadError as e:
        log("ERROR: could not download vLLM's source distribution "
            f"{release.sdist} (it holds the upstream test suite) from the package "
            "index pip is configured with.")
        log(f"  {e}")
        log("  Give this machine access to the index, or pass --sdist PATH "
            "(or SEQHOOKS_VLLM_SDIST=PATH) with a copy of the file.")
        log("FAILED: the upstream conformance check did NOT run.")
        return EXIT_DOWNLOAD
    src = extract(sdist, cache, release)
    hf_home = write_hf_cache(cache)
    results = cache / "results"
    results.mkdir(exist_ok=True)
    (results / "summary.json").unlink(missing_ok=True)
    paths = args.paths or list(release.selection)
    missing = [p for p in paths if not (src / p.split("::")[0]).exists()]
    if missing:
        log(f"ERROR: not in the sdist: {', '.join(missing)}")
        return EXIT_RUN
    env = run_env(cache, hf_home)
    log(f"running {len(paths)} upstream test file(s) with our schedulers and, with "
        f"vLLM's, {STOCK_SCOPES[args.stock]} (logs: {results}/{{stock,hooks}}.log)")

    if args.stock == "all":
        stock, hooks = run_both(args, src, env, results, paths)
    else:
        stock, hooks = run_hooks_then_stock_on_failures(args, src, env, results, paths)
    if stock is None or hooks is None:
        log("FAILED: a pytest run did not complete; nothing was compared.")
        return EXIT_RUN

    cmp = compare(stock, hooks)
    cs, ch = _counts(stock), _counts(hooks)
    every_test = stock.get("scope", "all") == "all"
    wall = time.time() - t_start
    summary = {
        "vllm_version": release.version,
        "vllm_installed": installed,
        "sdist": str(sdist),
        "source": str(src),
        "selection": paths,
        "k": args.k,
        "stock_scope": stock.get("scope", "all"),
        "stock": {"counts": cs, "wall_s": stock["wall_s"],
                  "schedulers_created": stock["schedulers_created"],
                  "scheduler_classes": stock["scheduler_classes"],
                  "vllm_seqhooks_modules": stock.get("vllm_seqhooks_modules"),
                  "collection_errors": sorted(stock["collection_errors"])},
        "hooks": {"counts": ch, "wall_s": hooks["wall_s"],
                  "schedulers_created": hooks["schedulers_created"],
                  "scheduler_classes": hooks["scheduler_classes"],
                  "hooks_config": hooks["hooks_config"],
                  "late_rebinds": hooks["late_rebinds"],
                  "collection_errors": sorted(hooks["collection_errors"])},
        **cmp,
        "per_file": {f: {"stock": _per_file(stock).get(f, {}), "hooks": c}
                     for f, c in _per_file(hooks).items()},
        "wall_s": round(wall, 1),
        "ok": not cmp["regressions"] and not cmp["problems"],
    }
    (results / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
    print_report(summary, cmp, stock, hooks, args.show_traceback_lines)
    log(f"summary: {results / 'summary.json'}  (wall time {wall:.0f} s)")
    if summary["ok"]:
        if every_test:
            log(f"OK: all {cs['passed']} upstream tests that pass with vLLM's scheduler "
                "pass with the hook scheduler.")
        else:
            left_out = len(stock.get("left_out", ()))
            log(f"OK: {ch['passed']} upstream tests pass with the hook scheduler; of "
                f"those it did not pass, {len(stock['tests'])} do not pass with vLLM's "
                f"either, {left_out} failed before building any scheduler (not run "
                "with vLLM's: --stock failed runs them; --stock all runs every test "
                "with both).")
        return EXIT_OK
    log(f"FAILED: {len(cmp['regressions'])} difference(s), {len(cmp['problems'])} problem(s).")
    return EXIT_DIFF


def print_report(summary: dict, cmp: dict, stock: dict, hooks: dict,
                 traceback_lines: int) -> None:
    """Both runs' counts, what the hooks run built, and each difference."""
    log()
    scope = "" if summary["stock_scope"] == "all" else f" ({summary['stock_scope']})"
    log(f"stock schedulers{scope}: {_fmt(summary['stock']['counts'])}")
    log(f"hook schedulers  : {_fmt(summary['hooks']['counts'])}")
    log(f"schedulers built : stock run {stock['schedulers_created']['stock']} stock "
        f"(in {cmp['scheduler_tests']['stock_run']} tests); hooks run "
        f"{hooks['schedulers_created']['hooks']} hook + "
        f"{hooks['schedulers_created']['stock']} stock (hook ones in "
        f"{cmp['scheduler_tests']['hooks_run']} tests)")
    if cmp["not_substituted"]:
        log(f"built only vLLM's own scheduler subclasses in the hooks run "
            f"({len(cmp['not_substituted'])}, e.g. DiffusionScheduler): "
            + ", ".join(cmp["not_substituted"][:5])
            + (" ..." if len(cmp["not_substituted"]) > 5 else ""))
    for reason, tests in cmp["failed_before_a_scheduler"].items():
        log(f"failed before building any scheduler, not run with vLLM's ({len(tests)}): "
            f"{reason[:200]}")
    if cmp["pass_only_with_hooks"]:
        log(f"pass with hooks but not with stock ({len(cmp['pass_only_with_hooks'])}): "
            + ", ".join(cmp["pass_only_with_hooks"]))
    for p in cmp["problems"]:
        log(f"PROBLEM: {p}")
    for t, ids in cmp["hook_tokens_sampled"].items():
        log(f"  {t} sampled hook token(s) {ids}")
    regs = cmp["regressions"]
    if regs:
        log()
        log(f"{len(regs)} upstream test(s) pass with vLLM's scheduler but not with ours:")
        for r in regs:
            log(f"- {r['test']}  [{r['hooks_outcome']}"
                + (f" in {r['when']}" if r.get("when") and r["when"] != "call" else "") + "]")
            if r.get("message"):
                log(f"    {_first_line(r['message'])}")
            if traceback_lines and r.get("traceback"):
                lines = r["traceback"].rstrip().splitlines()[-traceback_lines:]
                print("\n".join("      | " + ln for ln in lines), flush=True)
    log()


if __name__ == "__main__":
    sys.exit(main())
