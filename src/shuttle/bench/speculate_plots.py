"""PNG of ``bench speculate`` in the paper's layout (matplotlib, Agg): per case, the
total time of the loop (Graphs 4.1, 4.3, 4.5-4.7) above the time of the reads alone
(Graphs 4.2, 4.4), against how many times slower than the LAN the link is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

_STYLE = {
    "normal": ("tab:red", "o", "normal read"),
    "thread": ("tab:blue", "s", "thread speculation"),
    "fork": ("tab:green", "^", "fork speculation"),
    "auto": ("black", "x", "auto"),
}


def plot(report: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = report["cases"]
    fig, axes = plt.subplots(
        2, len(cases), figsize=(4.2 * len(cases), 7.5), squeeze=False, sharex=True
    )
    for col, case in enumerate(cases):
        xs = [pt["slowdown"] for pt in case["points"]]
        for row, (key, what) in enumerate((("total_s", "total"), ("reads_s", "reads alone"))):
            ax = axes[row][col]
            for method, (colour, marker, label) in _STYLE.items():
                points = case["points"]
                ys = [pt["methods"][method][key] for pt in points if method in pt["methods"]]
                if len(ys) == len(xs):
                    ax.plot(xs, ys, color=colour, marker=marker, label=label, linewidth=1.2)
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs)
            ax.set_xticklabels([f"{x}×" for x in xs])
            ax.set_title(f"{case['label']}: {what}", fontsize=9)
            ax.grid(True, alpha=0.3)
            if col == 0:
                ax.set_ylabel(f"{what} of {report['config']['iterations']} iterations (s)")
            if row == 1:
                ax.set_xlabel(f"slower than {report['config']['link']} ({report['base_link']})")
    axes[0][0].legend(fontsize=8)
    summary = report["summary"]
    fig.suptitle(
        "speculative remote read (Yi, section 4): "
        f"{report['config']['object_bytes'] // 1024} KB object, "
        f"auto worst {summary.get('auto_over_better_total_worst', float('nan')):.3f}× the better",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
