"""The GPU-timed grid's page: its rows as tables, with the ratios the issue
asks for (native against sequential and against the loop, the A/A control,
native's distance to the critical-path limit). Pure."""

from __future__ import annotations

from typing import Any

COLUMNS = (
    ("config", "configuration"), ("families", "families"),
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
            out.append(dict(
                profile=profile, families=n,
                aa=round(p50["sequential-aa"] / p50["sequential"], 3),
                native_vs_sequential=round(p50["native"] / p50["sequential"], 3),
                native_vs_loop=round(p50["native"] / p50["loop"], 3),
                native_vs_critical_path=round(p50["native"] / c["native"]["critical_path_s"], 3),
                host_kept_up=all(v["host_kept_up"] for v in c.values())))
    return out


def markdown(rows: list[dict[str, Any]], command: str) -> str:
    lines = ["# GPU-timed grid", "", "Modelled: each engine step waits as long as the named "
             "GPU would take for it (docs/benchmarks/gpu_timed_model.md); everything else "
             "(vLLM's server, engine core, scheduler, async scheduling, the clients) is real "
             "and runs on this machine's CPU.", "", "```bash", command, "```", "",
             "## Ratios (p50 family latency)", "",
             "| profile | families | A/A | native / sequential | native / loop "
             "| native / critical path | host kept up |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in ratios(rows):
        lines.append(f"| {r['profile']} | {r['families']} | {r['aa']} | "
                     f"{r['native_vs_sequential']} | {r['native_vs_loop']} | "
                     f"{r['native_vs_critical_path']} | {r['host_kept_up']} |")
    for profile in dict.fromkeys(r["profile"] for r in rows):
        lines += ["", f"## {profile}", "",
                  "| " + " | ".join(h for _, h in COLUMNS) + " |",
                  "| --- | " + " | ".join("---:" for _ in COLUMNS[1:]) + " |"]
        for r in rows:
            if r["profile"] == profile:
                lines.append("| " + " | ".join(str(r[k]) for k, _ in COLUMNS) + " |")
    return "\n".join(lines) + "\n"
