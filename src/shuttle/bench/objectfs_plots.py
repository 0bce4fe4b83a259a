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


def plot_cases(report: dict[str, Any], path: Path, title: str) -> Path:
    """Figure 6 / Figure 10: one group of bars per case (mean, 90 % CI), and each
    placement's time over the better static placement's."""
    plt = _pyplot()
    cases = report["cases"]
    fig, (ax, rel) = plt.subplots(1, 2, figsize=(11, 4.5))
    width = 0.26
    labels = [c["label"] for c in cases]
    for i, placement in enumerate(PLACEMENTS):
        xs = [g + (i - 1) * width for g in range(len(cases))]
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
        a.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("elapsed time (s)")
    rel.axhline(1.10, color="black", linestyle="--", linewidth=1)
    rel.set_ylabel("time / better static placement")
    ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_raid(report: dict[str, Any], path: Path) -> Path:
    for c in report["cases"]:
        c.setdefault("label", f"{c['workload']}\n{c['link']}")
    s = report["settings"]
    return plot_cases(
        report,
        path,
        f"ABACUS 6.2 RAID 5: {s['clients']} clients, {s['file_bytes'] >> 20} MB each, "
        f"{s['io_bytes'] >> 10} KB I/O, {s['unit_bytes'] >> 10} KB units, 4+1 (mean, 90% CI)",
    )


def plot_directory(report: dict[str, Any], path: Path) -> Path:
    """Figure 10 (bars per case) beside Figure 11 (the first adaptive run of the high
    contention case, or of the first case when there is none: each client's cumulative
    inserts and retries over time)."""
    plt = _pyplot()
    cases = report["cases"]
    fig, (ax, tl) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.26
    for i, placement in enumerate(PLACEMENTS):
        xs = [g + (i - 1) * width for g in range(len(cases))]
        means = [c["placements"][placement]["mean_s"] for c in cases]
        errs = [c["placements"][placement]["ci90_s"] for c in cases]
        ax.bar(xs, means, width, yerr=errs, capsize=3, label=placement, color=_COLOURS[placement])
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels([c["label"] for c in cases], fontsize=8)
    ax.set_ylabel("elapsed time (s)")
    ax.legend(fontsize=8)
    ax.set_title("Figure 10: inserts by four clients")
    shown = next((c for c in cases if c["contention"] == "high"), cases[0] if cases else None)
    if shown is not None:
        for n, timeline in enumerate(shown["adaptive_timeline"]):
            if not timeline:
                continue
            t0 = timeline[0][0]
            ts = [s[0] - t0 for s in timeline]
            style = "-" if n == 0 else ":"
            tl.plot(
                ts,
                [s[1] for s in timeline],
                style,
                color="tab:green",
                label=f"client {n + 1} inserts",
            )
            tl.plot(
                ts,
                [s[2] for s in timeline],
                style,
                color="tab:red",
                label=f"client {n + 1} retries",
            )
        tl.set_xlabel("seconds")
        tl.set_ylabel("cumulative count")
        tl.set_title(f"Figure 11: adaptive, {shown['contention']} contention, {shown['link']}")
        tl.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
