"""The GPU-timed grid's chart (``gpu_timed.png``; needs matplotlib): per
profile, p50 family latency against families at once for every
configuration with the critical-path limit, and native's scheduler CPU per
step against the modelled step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

LATENCY_CONFIGS = ("sequential", "loop", "native", "native-in-process")


def chart(rows: list[dict[str, Any]], command: str, path: Path) -> bool:
    """Writes the chart to ``path``; False when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    profiles = list(dict.fromkeys(r["profile"] for r in rows))
    fig, axes = plt.subplots(2, len(profiles), figsize=(5.5 * len(profiles), 8.5),
                             squeeze=False)
    fig.suptitle(f"GPU-timed grid: modelled GPU steps, a real vLLM host\n`{command}`",
                 fontsize=9)
    for col, profile in enumerate(profiles):
        mine = [r for r in rows if r["profile"] == profile]
        sizes = sorted({r["families"] for r in mine})

        def series(config: str, key: str) -> list[float | None]:
            by = {r["families"]: r[key] for r in mine if r["config"] == config}
            return [by.get(n) for n in sizes]

        ax = axes[0][col]
        for config in LATENCY_CONFIGS:
            ax.plot(sizes, series(config, "family_latency_p50_s"), marker="o", label=config)
        ax.plot(sizes, series("native", "critical_path_s"), ls="--", marker="x", color="grey",
                label="critical path (native's steps)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.set_title(profile, fontsize=10)
        ax.set_ylabel("p50 family latency (modelled s)")
        ax.legend(fontsize=7)

        ax = axes[1][col]
        ax.plot(sizes, series("native", "engine_cpu_per_step_ms"), marker="o",
                label="native: scheduler CPU / step")
        ax.plot(sizes, series("sequential", "engine_cpu_per_step_ms"), marker="s",
                label="stock (sequential): scheduler CPU / step")
        ax.plot(sizes, series("native", "modelled_step_ms"), ls="--", marker="x", color="grey",
                label="native: modelled GPU step")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.set_xlabel("families at once")
        ax.set_ylabel("ms per step")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
