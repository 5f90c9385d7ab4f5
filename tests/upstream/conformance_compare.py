"""The upstream conformance check's comparison (``run_conformance.py``): the
hooks run's per-test report against vLLM's, and the sanity checks that make the
comparison mean something. No vLLM import."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any


def _counts(data: dict) -> dict[str, int]:
    c = Counter(e.get("outcome") or "unknown" for e in data["tests"].values())
    out = {k: c.get(k, 0) for k in ("passed", "failed", "error", "skipped")}
    for k in ("xfailed", "xpassed", "unknown"):
        if c.get(k):
            out[k] = c[k]
    out["collection_errors"] = len(data.get("collection_errors", {}))
    return out


def _per_file(data: dict) -> dict[str, dict[str, int]]:
    out: dict[str, Counter] = {}
    for t, e in data["tests"].items():
        out.setdefault(t.split("::")[0], Counter())[e.get("outcome") or "unknown"] += 1
    for t in data.get("collection_errors", {}):
        out.setdefault(t.split("::")[0], Counter())["not_collected"] += 1
    return {f: dict(c) for f, c in sorted(out.items())}


def _fmt(c: dict[str, int]) -> str:
    parts = [f"{c['passed']} passed", f"{c['failed']} failed", f"{c['error']} errors",
             f"{c['skipped']} skipped"]
    parts += [f"{c[k]} {k}" for k in ("xfailed", "xpassed", "unknown") if c.get(k)]
    if c["collection_errors"]:
        parts.append(f"{c['collection_errors']} modules not collected")
    return ", ".join(parts)


def _first_line(msg: str | None) -> str:
    msg = (msg or "").strip()
    return msg.splitlines()[0][:300] if msg else ""


def _reason(msg: str | None) -> str:
    """A failure message, whitespace collapsed and shortened (for grouping)."""
    text = " ".join((msg or "").split())
    text = re.sub(r"\[type=value_error, input_value=.*", "", text)
    return text[:400] or "(no message)"


def _by_reason(entries: dict[str, dict], tests) -> dict[str, list[str]]:
    """``tests`` (ids of ``entries``) grouped by their failure's
    :func:`_reason`, each group sorted."""
    out: dict[str, list[str]] = {}
    for t in sorted(tests):
        out.setdefault(_reason(entries.get(t, {}).get("message")), []).append(t)
    return out


def not_passed(hooks: dict) -> list[str]:
    """The tests the hooks run did not pass, and the files it could not
    collect: what vLLM's schedulers must run for a comparison (a test ours
    passes is no regression whatever vLLM's do)."""
    return sorted({t for t, e in hooks["tests"].items() if e.get("outcome") != "passed"}
                  | {t.split("::")[0] for t in hooks.get("collection_errors", {})})


def reached_a_scheduler(entry: dict) -> bool:
    """Whether a test of the hooks run built a scheduler (ours or vLLM's:
    the count starts in ``Scheduler.__init__``, before anything can fail) or
    failed through a frame of ``vllm_seqhooks`` (``our_frames``; an entry
    without either key, whose test did not get that far, counts as having
    reached one). A failure that did neither never met the substitution, the
    one thing the two runs differ in: vLLM's schedulers cannot change its
    outcome."""
    if "schedulers" not in entry or "our_frames" not in entry:
        return True
    built = entry["schedulers"] or {}
    return bool(built.get("hooks") or built.get("stock") or entry["our_frames"])


def for_vllms_run(hooks: dict, scope: str) -> tuple[list[str], list[str]]:
    """The tests and files vLLM's schedulers must run after the hooks run,
    and those they need not: with ``scope`` ``"failed"`` every one
    :func:`not_passed`; with ``"reached"`` those that :func:`reached_a_scheduler`
    and the files not collected, the others left out (second list)."""
    wanted = not_passed(hooks)
    if scope == "failed":
        return wanted, []
    tests = hooks["tests"]
    left_out = [t for t in wanted if t in tests and not reached_a_scheduler(tests[t])]
    return [t for t in wanted if t not in left_out], left_out


def compare(stock: dict, hooks: dict) -> dict[str, Any]:
    """``stock``: vLLM's run of every test (``"scope": "all"``, the default)
    or of :func:`for_vllms_run` of ``hooks`` only (``"scope"`` says which;
    ``"left_out"`` lists the failures it need not run, grouped by reason in
    ``failed_before_a_scheduler``)."""
    st, hk = stock["tests"], hooks["tests"]
    every_test = stock.get("scope", "all") == "all"
    stock_pass = {t for t, e in st.items() if e.get("outcome") == "passed"}
    regressions = []
    for t in sorted(stock_pass):
        e = hk.get(t)
        if e is None or e.get("outcome") != "passed":
            regressions.append({
                "test": t,
                "hooks_outcome": e.get("outcome") if e else "not run (not collected)",
                "message": (e or {}).get("message"),
                "when": (e or {}).get("when"),
                "traceback": (e or {}).get("longrepr"),
            })
    only_hooks_pass = sorted(t for t, e in hk.items()
                             if e.get("outcome") == "passed" and t not in stock_pass
                             and (every_test or t in st))
    both_fail = _by_reason(st, (t for t, e in st.items() if e.get("outcome") in ("failed", "error")
                                and hk.get(t, {}).get("outcome") != "passed"))
    # Substitution: tests that built schedulers in the stock run must have
    # built ours in the hooks run.
    # (with vLLM's run of the failures only: the tests of the hooks run that
    # built vLLM's schedulers and none of ours)
    built_stock = st if every_test else hk
    not_substituted = sorted(
        t for t, e in built_stock.items()
        if (e.get("schedulers") or {}).get("stock")
        and not (hk.get(t, {}).get("schedulers") or {}).get("hooks")
    )
    sched_tests_stock = sum(1 for e in st.values() if (e.get("schedulers") or {}).get("stock"))
    sched_tests_hooks = sum(1 for e in hk.values() if (e.get("schedulers") or {}).get("hooks"))
    hook_samples = {t: e["hook_tokens_sampled"] for t, e in hk.items()
                    if e.get("hook_tokens_sampled")}
    problems = []
    if every_test and not stock_pass:
        problems.append("no upstream test passed with the stock scheduler")
    if not every_test and not any(e.get("outcome") == "passed" for e in hk.values()):
        problems.append("no upstream test passed with the hook scheduler")
    left_out = set(stock.get("left_out", ()))
    unrun = [t for t in not_passed(hooks) if "::" in t and t not in st and t not in left_out]
    if not every_test and unrun:
        problems.append(f"vLLM's run did not run {len(unrun)} of the tests ours did not "
                        f"pass (e.g. {unrun[0]}): nothing says they pass there")
    if hooks["schedulers_created"]["hooks"] == 0:
        problems.append("the hooks run built no hook scheduler (the substitution "
                        "did not happen, or the selected tests build none): the "
                        "comparison proves nothing")
    if stock["schedulers_created"]["hooks"]:
        problems.append("the stock run built hook schedulers")
    # vLLM's own subclasses (DiffusionScheduler, ...) legitimately stay stock
    # in the hooks run; the plain classes must never be built there.
    missed = {c: n for c, n in hooks.get("stock_scheduler_classes", {}).items()
              if c in hooks.get("stock_base_classes", [])}
    if missed:
        problems.append("the hooks run built vLLM's plain Scheduler/AsyncScheduler "
                        f"(substitution missed): {missed}")
    if hook_samples:
        problems.append(f"{len(hook_samples)} test(s) sampled a hook token id; pick "
                        "other ids in seqhooks_conformance_plugin.HOOK_TOKEN_IDS")
    return {
        "regressions": regressions,
        "failed_before_a_scheduler": _by_reason(hk, left_out),
        "pass_only_with_hooks": only_hooks_pass,
        "fail_in_both": both_fail,
        "not_substituted": not_substituted,
        "stock_classes_in_hooks_run": hooks.get("stock_scheduler_classes", {}),
        "scheduler_tests": {"stock_run": sched_tests_stock, "hooks_run": sched_tests_hooks},
        "hook_tokens_sampled": hook_samples,
        "problems": problems,
    }

