"""The GPU-timed grid's page: its rows as tables, with the ratios the issue
asks for (native against sequential and against the loop, the A/A control,
native's distance to the critical-path limit). Pure."""

from __future__ import annotations

from typing import Any

COLUMNS = (
    ("config", "configuration"), ("families", "families"), ("time_scale", "time scale"),
    ("family_latency_p50_s", "latency p50 (s)"), ("family_latency_p99_s", "p99 (s)"),
    ("tokens_per_s", "tokens/s"), ("engine_steps", "steps"),
    ("modelled_gpu_s", "modelled GPU (s)"), ("wall_s", "wall (s)"),
    ("engine_cpu_per_step_ms", "scheduler CPU / step (ms)"),
    ("modelled_step_ms", "modelled step (ms)"),
    ("engine_cpu_per_request_step_us", "per request-step (us)"),
    ("critical_path_s", "critical path p50 (s)"),
)


def _by(rows: list[dict[str, Any]], profile: str, n: int) -> dict[str, dict[str, Any]]:
    return {r["config"]: r for r in rows if r["profile"] == profile and r["families"] == n}


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per profile and size: sequential-aa / sequential (the A/A control),
    native / sequential, native / loop (p50 latency), native p50 over the
    critical-path limit."""
    out = []
    for profile in dict.fromkeys(r["profile"] for r in rows):
        for n in dict.fromkeys(r["families"] for r in rows if r["profile"] == profile):
            c = _by(rows, profile, n)
            p50 = {k: v["family_latency_p50_s"] for k, v in c.items()}
            cpu = {k: v["engine_cpu_per_step_ms"] for k, v in c.items()}
            out.append(dict(
                profile=profile, families=n,
                time_scale=c["sequential"].get("time_scale", 1.0),
                aa=round(p50["sequential-aa"] / p50["sequential"], 3),
                native_vs_sequential=round(p50["native"] / p50["sequential"], 3),
                native_vs_loop=round(p50["native"] / p50["loop"], 3),
                native_vs_critical_path=round(p50["native"] / c["native"]["critical_path_s"], 3),
                in_process_vs_loop=round(p50["native-in-process"] / p50["loop"], 3),
                plain_hooks_vs_stock_cpu_per_step=round(
                    cpu["plain-hooks"] / cpu["plain-stock"], 3),
                plain_hooks_vs_stock_cpu_per_request_step=round(
                    c["plain-hooks"]["engine_cpu_per_request_step_us"]
                    / c["plain-stock"]["engine_cpu_per_request_step_us"], 3),
                native_vs_loop_per_request_step=round(
                    c["native"]["engine_cpu_per_request_step_us"]
                    / c["loop"]["loop_cpu_per_request_step_us"], 3),
                native_fits_step=c["native"]["engine_cpu_per_step_ms"]
                <= c["native"]["modelled_step_ms"],
                stock_fits_step=c["sequential"]["engine_cpu_per_step_ms"]
                <= c["sequential"]["modelled_step_ms"],
                host_kept_up=all(v["host_kept_up"] for v in c.values())))
    return out


def largest_fitting(rows: list[dict[str, Any]]) -> dict[str, int | None]:
    """Per profile: the most families at once at which native's scheduler
    CPU per step stayed under the modelled step (None: at none)."""
    out: dict[str, int | None] = {}
    for r in ratios(rows):
        best = out.get(r["profile"])
        if r["native_fits_step"] and (best is None or r["families"] > best):
            best = r["families"]
        out[r["profile"]] = best
    return out


def markdown(rows: list[dict[str, Any]], command: str) -> str:
    lines = ["# GPU-timed grid", "", "Modelled: each engine step waits as long as the named "
             "GPU would take for it (docs/benchmarks/gpu_timed_model.md), times the size's "
             "time scale: where this host could not keep up with the modelled GPU, its "
             "steps wait 2, 4 or 8 times as long and every time is divided back, so the "
             "figures are those of a host that many times as fast, except the scheduler's "
             "CPU, which is this host's (benchmarks/gpu_timed/time_scale.py); everything else "
             "(vLLM's server, engine core, scheduler, async scheduling, the clients) is real "
             "and runs on this machine's CPU: each engine's processes on one half of the "
             "cores, the API servers and the clients on the other "
             "(benchmarks/gpu_timed/host_split.py). Where `host kept up` is False, the "
             "modelled GPU was idle for more than a tenth of the run's wall time: the host "
             "(here two cores) fell behind, so that row's latencies are partly the host's "
             "(for the loop, also its own round trips, which leave a GPU waiting on any "
             "host).", "", "```bash", command, "```", "",
             "## Ratios (p50 family latency)", "",
             "| profile | families | time scale | A/A | native / sequential | native / loop "
             "| native / critical path | native in-process / loop | host kept up |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in ratios(rows):
        lines.append(f"| {r['profile']} | {r['families']} | {r['time_scale']} | {r['aa']} | "
                     f"{r['native_vs_sequential']} | {r['native_vs_loop']} | "
                     f"{r['native_vs_critical_path']} | {r['in_process_vs_loop']} | "
                     f"{r['host_kept_up']} |")
    lines += ["", "## The scheduler inside the GPU's step", "",
              "Scheduler thread-CPU (schedule, update from output, add request) per step "
              "and per scheduled request-step.", "",
              "| profile | families | plain traffic: hooks / stock, per step "
              "| per request-step "
              "| native / loop (its client's CPU counted), per request-step "
              "| native fits the step | stock fits the step |",
              "| --- | ---: | ---: | ---: | ---: | --- | --- |"]
    for r in ratios(rows):
        lines.append(f"| {r['profile']} | {r['families']} | "
                     f"{r['plain_hooks_vs_stock_cpu_per_step']} | "
                     f"{r['plain_hooks_vs_stock_cpu_per_request_step']} | "
                     f"{r['native_vs_loop_per_request_step']} | {r['native_fits_step']} | "
                     f"{r['stock_fits_step']} |")
    lines += [""] + [f"Largest number of families at once at which native's scheduler fits "
                     f"the modelled step, {p}: {n}" for p, n in largest_fitting(rows).items()]
    for profile in dict.fromkeys(r["profile"] for r in rows):
        lines += ["", f"## {profile}", "",
                  "| " + " | ".join(h for _, h in COLUMNS) + " |",
                  "| --- | " + " | ".join("---:" for _ in COLUMNS[1:]) + " |"]
        for r in rows:
            if r["profile"] == profile:
                lines.append("| " + " | ".join(str(r[k]) for k, _ in COLUMNS) + " |")
    return "\n".join(lines) + "\n"
