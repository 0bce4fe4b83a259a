"""The output of ``bench lookaside``: its report as the paper's table (seconds, their
spread and the win over no store per bandwidth and store, with what each store
supplied against what rsync finds unchanged) and as a PNG of two panels (build time
per bandwidth, the win of each store). The runs and the report are in
:mod:`shuttle.bench.lookaside`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def table_lines(report: dict[str, Any]) -> list[str]:
    """The table in the paper's form: seconds (stdev) and [win %] per store."""
    cols = report["columns"]
    heads = ["bandwidth", *[("no store" if c == "none" else c) for c in cols]]
    lines = []
    width = 20
    lines.append(f"{heads[0]:<10}" + "".join(f"{h:>{width}}" for h in heads[1:]))
    for bw, row in report["rows"].items():
        tree = report["trees"][bw]
        cells = []
        for c in cols:
            cell = row[c]
            text = f"{cell['mean_s']:.1f} ({cell['stdev_s']:.1f})"
            if c != "none":
                text += f" [{cell['win_pct']:+.1f}%]"
            cells.append(text)
        lines.append(f"{bw:<10}" + "".join(f"{t:>{width}}" for t in cells))
        lines.append(f"{'':<10}  tree: {tree['files']} files, {tree['bytes'] / 1e6:.2f} MB")
        against = [
            f"{c}: {row[c]['rsync']['supplied_bytes'] / 1e6:.2f} of "
            f"{row[c]['rsync']['matched'] / 1e6:.2f} MB "
            f"({row[c]['rsync']['supplied_over_matched_pct']:.0f}%)"
            for c in cols
            if "rsync" in row.get(c, {})
        ]
        if against:
            lines.append(
                f"{'':<10}  supplied by the store / unchanged per rsync: " + "; ".join(against)
            )
    return lines


def plot(report: dict[str, Any], path: Path) -> None:
    """Two panels: build time per bandwidth (log scale) and the win of each store."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = report["columns"]
    bws = list(report["rows"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    x = range(len(bws))
    for c in cols:
        ys = [report["rows"][bw][c]["mean_s"] for bw in bws]
        left.plot(list(x), ys, marker="o", label="no store" if c == "none" else f"store {c}")
    left.set_yscale("log")
    left.set_xticks(list(x))
    left.set_xticklabels(
        [f"{bw}\n({report['trees'][bw]['bytes'] / 1e6:.1f} MB)" for bw in bws], fontsize=8
    )
    left.set_ylabel("build time (s, log)")
    left.set_title("Build over the mount (tree size per bandwidth)")
    left.legend(fontsize=8)
    stores = cols[1:]
    width = 0.8 / max(1, len(stores))
    for i, s in enumerate(stores):
        wins = [report["rows"][bw][s]["win_pct"] for bw in bws]
        label = f"{s} (current)" if i == 0 else f"{s} ({i} back)"
        right.bar([xi + (i - (len(stores) - 1) / 2) * width for xi in x], wins, width, label=label)
    right.axhline(0, color="black", linewidth=0.8)
    right.axhline(-2, color="red", linewidth=0.6, linestyle="--")
    right.set_xticks(list(x))
    right.set_xticklabels(bws)
    right.set_ylabel("win over no store (%)")
    right.set_title("Lookaside win (dashed: the -2% target)")
    right.legend(fontsize=8)
    project = report["config"]["project"]
    fig.suptitle(f"Lookaside (Figure 6): compileall of {project} {cols[1]} over shuttle mount")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
