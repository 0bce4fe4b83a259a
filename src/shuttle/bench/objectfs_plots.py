"""PNG plots of ABACUS's file-system experiments, in the paper's layout.

* Figure 8: insert and scan on each link, three bars each (client, adaptive, server)
  with 90 % confidence intervals.
* Table 2 as a figure: each phase's time per placement, beside the per-phase optimum.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shuttle.bench.abacus_plots import _COLOURS, _pyplot

PLACEMENTS = ("client", "adaptive", "server")


def plot_cache(report: dict[str, Any], path: Path) -> Path:
    """Figure 8: one group of bars per (workload, link), log time axis."""
    plt = _pyplot()
    groups = [
        (f"{w['workload']}\n{link['link']}", link)
        for w in report["workloads"]
        for link in w["links"]
    ]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.26
    for i, placement in enumerate(PLACEMENTS):
        xs = [g + (i - 1) * width for g in range(len(groups))]
        means = [link["placements"][placement]["mean_s"] for _, link in groups]
        errs = [link["placements"][placement]["ci90_s"] for _, link in groups]
        ax.bar(xs, means, width, yerr=errs, capsize=3, label=placement, color=_COLOURS[placement])
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([g for g, _ in groups])
    ax.set_yscale("log")
    ax.set_ylabel("elapsed time (s, log scale)")
    s = report["settings"]
    ax.set_title(
        f"ABACUS 6.4: {s['records']} records of {s['record_bytes']} B into a "
        f"{s['table_bytes'] >> 10} KB table, {s['block_bytes'] >> 10} KB blocks (mean, 90% CI)"
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_phases(report: dict[str, Any], path: Path) -> Path:
    """Table 2: stacked phase times per placement, with the per-phase optimum, and the
    adaptive run's progress with its migrations."""
    plt = _pyplot()
    link = report["links"][0]
    phases = link["phases"]
    fig, (ax, prog) = plt.subplots(1, 2, figsize=(11, 4.5))
    rows = [*PLACEMENTS, "optimal"]
    bottoms = [0.0] * len(rows)
    for i, phase in enumerate(phases):
        heights = [link["per_phase"][p][i]["mean_s"] for p in PLACEMENTS]
        heights.append(
            min(link["per_phase"]["client"][i]["mean_s"], link["per_phase"]["server"][i]["mean_s"])
        )
        ax.bar(
            rows,
            heights,
            bottom=bottoms,
            color="tab:orange" if phase == "insert" else "tab:cyan",
            edgecolor="black",
            label=phase if i < 2 else None,
        )
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.set_ylabel("seconds (phases stacked)")
    ax.set_title(f"phases {' / '.join(phases)} on {link['link']}")
    ax.legend(fontsize=8)
    trace = link.get("adaptive_trace", [])
    if trace:
        prog.plot([t for t, _ in trace], [n for _, n in trace], color=_COLOURS["adaptive"])
        for m in (link["adaptive_migrations"] or [[]])[0]:
            prog.axvline(
                m["t_s"],
                color=_COLOURS["server" if m["direction"] == "to_server" else "client"],
                linestyle="--",
                linewidth=1,
            )
    prog.set_xlabel("seconds since the first phase began")
    prog.set_ylabel("operations done (adaptive, first run)")
    prog.set_title("adaptive: progress; dashed = cache moved (red: to node, blue: to client)")
    fig.suptitle("ABACUS 6.6: application phases (mean of runs)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
