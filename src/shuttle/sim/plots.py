"""PNG plots of a sweep in the paper's layout (Figures 2-7), drawn with matplotlib (Agg).

Lines are named as the paper names them, *which/where*: which traffic is measured
(the mobile application or the Background) and where the application ran (Client
or Server). Points are evenly spaced in sweep order (cache sizes double from one
point to the next, so this is a log axis; the infinite cache sits last).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shuttle.sim.metrics import COMPONENTS

#: Colours and markers per line, stable across figures.
_STYLE = {
    ("mobile", "client"): ("tab:blue", "o", "-"),
    ("mobile", "server"): ("tab:red", "s", "-"),
    ("background", "client"): ("tab:blue", "o", "--"),
    ("background", "server"): ("tab:red", "s", "--"),
    ("background", "none"): ("tab:gray", "^", ":"),
}
_COMPONENT_LABELS = {
    "cpu_queue_s": "CPU queue",
    "cpu_service_s": "CPU service",
    "disk_queue_s": "disk queue",
    "disk_service_s": "disk service",
    "network_s": "network",
    "cache_wait_s": "cache wait",
}
_COMPONENT_COLOURS = {
    "cpu_queue_s": "#f4a582",
    "cpu_service_s": "#ca0020",
    "disk_queue_s": "#92c5de",
    "disk_service_s": "#0571b0",
    "network_s": "#7b3294",
    "cache_wait_s": "#fdb863",
}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _value(summary: dict[str, Any], key: str) -> float:
    value = summary[key]
    return float("inf") if value == "inf" else float(value)


def _line_name(which: str, where: str, mobile_name: str) -> str:
    return f"{mobile_name if which == 'mobile' else 'Background'}/{where.capitalize()}"


def _lines(
    ax: Any,
    doc: dict[str, Any],
    key: str,
    which: tuple[str, ...],
    scale: float,
    mobile_name: str,
) -> None:
    xs = list(range(len(doc["points"])))
    for traffic in which:
        for placement in doc["placements"]:
            if traffic == "mobile" and placement == "none":
                continue
            colour, marker, dash = _STYLE[(traffic, placement)]
            ys = [
                _value(point["placements"][placement], f"{traffic}_{key}") * scale
                for point in doc["points"]
            ]
            ax.plot(
                xs,
                ys,
                color=colour,
                marker=marker,
                linestyle=dash,
                label=_line_name(traffic, placement, mobile_name),
            )
            if traffic == "mobile" and key == "run_time_s":
                # Runs cut off at the time limit: the value is a lower bound.
                for x, point in zip(xs, doc["points"], strict=True):
                    if point["placements"][placement]["mobile_unfinished_runs"]:
                        ax.annotate(
                            "unfinished",
                            (x, ys[x]),
                            textcoords="offset points",
                            xytext=(4, 6),
                            fontsize=7,
                            color=colour,
                        )


def _axes(ax: Any, doc: dict[str, Any], ylabel: str, title: str) -> None:
    ax.set_xticks(range(len(doc["points"])))
    ax.set_xticklabels(["∞" if p["x"] == "inf" else p["x"] for p in doc["points"]])
    ax.set_xlabel(doc["x_label"])
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def plot_sweep(doc: dict[str, Any], out_dir: Path, mobile_name: str = "agrep") -> list[Path]:
    """Write the sweep's figures into ``out_dir``; return their paths."""
    plt = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    cache = doc["sweep"] == "cache-size"
    numbers = (2, 3, 4, 5) if cache else (6, None, 7, None)
    prefix = doc["sweep"]
    written = []

    fig, ax = plt.subplots(figsize=(6, 4))
    _lines(ax, doc, "run_time_s", ("mobile",), 1.0, mobile_name)
    if not cache:
        ax.set_yscale("log")
    _axes(
        ax,
        doc,
        "run time (s)",
        _title(numbers[0], f"{mobile_name} run time vs " + doc["x_label"]),
    )
    written.append(_save(fig, out_dir / f"{prefix}-run-time.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    _lines(ax, doc, "hit_rate", ("background",), 100.0, mobile_name)
    _lines(ax, doc, "server_hit_rate", ("mobile",), 100.0, mobile_name)
    ax.set_ylim(-3, 103)
    _axes(ax, doc, "block requests hitting the server cache (%)", _title(numbers[1], "hit rate"))
    written.append(_save(fig, out_dir / f"{prefix}-hit-rate.png"))

    for key, what, name in (
        ("mean_response_s", "all requests (incl. metadata)", "response-all"),
        ("mean_block_response_s", "block requests only", "response-blocks"),
    ):
        fig, ax = plt.subplots(figsize=(6, 4))
        _lines(ax, doc, key, ("mobile", "background"), 1000.0, mobile_name)
        # Saturated points are thousands of times slower than the rest.
        ax.set_yscale("log")
        number = numbers[2] if name == "response-all" else None
        _axes(ax, doc, "mean response time (ms)", _title(number, f"response time, {what}"))
        written.append(_save(fig, out_dir / f"{prefix}-{name}.png"))

    placement = "client" if "client" in doc["placements"] else doc["placements"][0]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    xs = list(range(len(doc["points"])))
    breakdowns = [p["placements"][placement]["background_breakdown_s"] for p in doc["points"]]
    totals = [1000.0 * sum(b.values()) for b in breakdowns]
    # A saturated point would flatten every other bar: clip the axis at a few times
    # the typical total and print the clipped totals on their bars.
    ceiling = min(max(totals), 4.0 * sorted(totals)[len(totals) // 2]) * 1.1
    bottom = [0.0] * len(xs)
    for component in COMPONENTS:
        heights = [1000.0 * b[component] for b in breakdowns]
        ax.bar(
            xs,
            heights,
            bottom=bottom,
            color=_COMPONENT_COLOURS[component],
            label=_COMPONENT_LABELS[component],
        )
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_ylim(0, ceiling)
    for x, total in zip(xs, totals, strict=True):
        if total > ceiling:
            ax.annotate(
                f"{total:,.0f} ms",
                (x, ceiling),
                textcoords="offset points",
                xytext=(0, -12),
                ha="center",
                fontsize=6,
                color="white",
                fontweight="bold",
            )
    _axes(
        ax,
        doc,
        "mean response time (ms)",
        _title(
            numbers[3],
            f"background response time by part, {mobile_name} at the {placement}",
        ),
    )
    written.append(_save(fig, out_dir / f"{prefix}-breakdown.png"))
    return written


def _title(number: int | None, text: str) -> str:
    return f"(paper Fig. {number}) {text}" if number else text
