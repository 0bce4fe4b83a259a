"""PNG plots of the ABACUS experiments, in the paper's layout (matplotlib, Agg).

* Figure 7: elapsed time per configuration, three bars each (client, adaptive,
  server) with 90 % confidence intervals.
* Figure 12: cumulative blocks searched by each filter over time, migrations marked.
* The swing: the filter's progress over time, with the competing load's on periods
  shaded and the migrations marked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

_COLOURS = {"client": "tab:blue", "adaptive": "tab:green", "server": "tab:red"}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_filter(report: dict[str, Any], path: Path) -> Path:
    """Figure 7: grouped bars with confidence intervals (log time axis), and beside
    them each placement's time over the better static placement's."""
    plt = _pyplot()
    cases = report["cases"]
    fig, (ax, rel) = plt.subplots(1, 2, figsize=(11, 4.5))
    width = 0.26
    labels = [f"config {c['case']}\n" + c["label"].replace(", ", ",\n") for c in cases]
    for i, placement in enumerate(("client", "adaptive", "server")):
        xs = [c_i + (i - 1) * width for c_i in range(len(cases))]
        means = [c["placements"][placement]["mean_s"] for c in cases]
        errs = [c["placements"][placement]["ci90_s"] for c in cases]
        ax.bar(xs, means, width, yerr=errs, capsize=3, label=placement, color=_COLOURS[placement])
        best = [
            min(c["placements"]["client"]["mean_s"], c["placements"]["server"]["mean_s"])
            for c in cases
        ]
        rel.bar(
            xs,
            [m / b for m, b in zip(means, best, strict=True)],
            width,
            color=_COLOURS[placement],
            label=placement,
        )
    for a in (ax, rel):
        a.set_xticks(range(len(cases)))
        a.set_xticklabels(labels, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("elapsed time (s, log scale)")
    rel.axhline(1.10, color="black", linestyle="--", linewidth=1)
    rel.annotate("target: adaptive ≤ 1.10", (len(cases) - 0.5, 1.12), ha="right", fontsize=7)
    rel.set_ylabel("time / better static placement")
    size_mb = report["settings"]["size_bytes"] / (1 << 20)
    fig.suptitle(
        f"ABACUS 6.3 filter: {size_mb:g} MiB over {report['link']['name']} (mean of runs, 90% CI)"
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_competition(report: dict[str, Any], path: Path) -> Path:
    """Figure 12: cumulative blocks of each filter over time (first adaptive run),
    with the static runs faint for comparison."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    styles = {"1": "-", "2": "--"}
    for placement, alpha in (("client", 0.3), ("server", 0.3), ("adaptive", 1.0)):
        run = report["runs"][placement][0]
        for name, f in run["filters"].items():
            ts = [t for t, _ in f["trace"]]
            bs = [b for _, b in f["trace"]]
            ax.plot(
                ts,
                bs,
                styles[name],
                color=_COLOURS[placement],
                alpha=alpha,
                label=f"filter {name} ({placement})",
            )
            if placement == "adaptive":
                for m in f["migrations"]:
                    ax.axvline(m["t_s"], color="gray", linestyle=":", linewidth=1)
                    # Filter 1's labels left of the line, filter 2's right of it:
                    # two migrations a moment apart stay readable.
                    ax.annotate(
                        f"filter {name} → {m['direction'].replace('to_', '')}",
                        (m["t_s"], max(bs or [0]) * 0.55),
                        rotation=90,
                        fontsize=7,
                        ha="right" if name == "1" else "left",
                        va="center",
                    )
    ax.set_xlabel("elapsed time (s)")
    ax.set_ylabel("cumulative blocks searched")
    ax.set_title("ABACUS 6.7 competition: two filters, room for one at the server")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_swing(report: dict[str, Any], path: Path) -> Path:
    """Progress of the filter in each placement (first run), load periods shaded."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    adaptive = report["runs"]["adaptive"][0]
    switches = adaptive["switches"]
    end = max(r[0]["elapsed_s"] for r in report["runs"].values())
    on_since = None
    for t, on in switches:
        if on:
            on_since = t
        elif on_since is not None:
            ax.axvspan(on_since, t, color="orange", alpha=0.15)
            on_since = None
    if on_since is not None:
        ax.axvspan(on_since, end, color="orange", alpha=0.15)
    for placement in ("client", "adaptive", "server"):
        trace = report["runs"][placement][0]["trace"]
        ax.plot(
            [t for t, _ in trace],
            [b for _, b in trace],
            color=_COLOURS[placement],
            label=f"{placement} ({report['placements'][placement]['mean_s']:.1f} s)",
        )
    for m in adaptive["migrations"]:
        ax.axvline(m["t_s"], color="black", linestyle=":", linewidth=1)
        ax.annotate(
            m["direction"].replace("to_", "→ "),
            (m["t_s"], 1),
            fontsize=7,
            rotation=90,
            ha="right",
            va="bottom",
        )
    ax.set_xlabel("seconds (shaded: competing load on the node's CPU)")
    ax.set_ylabel("blocks filtered")
    ax.legend(fontsize=7)
    ax.set_title(
        f"swing: load on/off every {report['settings']['period_s']:g} s; "
        f"{len(adaptive['migrations'])} migration(s) in the adaptive run"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
