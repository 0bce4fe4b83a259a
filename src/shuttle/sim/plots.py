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
                _lower_bounds(ax, doc, placement, xs, ys, colour, marker)


def _lower_bounds(
    ax: Any,
    doc: dict[str, Any],
    placement: str,
    xs: list[int],
    ys: list[float],
    colour: str,
    marker: str,
) -> None:
    """Runs cut off at the time limit: the value is a lower bound. Draw the point
    hollow with an arrow pointing up (no text, so neighbours cannot collide)."""
    for x, y, point in zip(xs, ys, doc["points"], strict=True):
        if not point["placements"][placement]["mobile_unfinished_runs"]:
            continue
        ax.plot([x], [y], marker=marker, markersize=9, color=colour, markerfacecolor="white")
        ax.annotate(
            "",
            xy=(x, y),
            xytext=(0, 22),
            textcoords="offset points",
            arrowprops={"arrowstyle": "<-", "color": colour, "lw": 1.5},
        )


def _lower_bound_legend(ax: Any) -> None:
    from matplotlib.lines import Line2D

    handles, labels = ax.get_legend_handles_labels()
    handles.append(
        Line2D([], [], color="black", marker="$\\uparrow$", markersize=9, linestyle="none")
    )
    labels.append("cut off at the time limit: at least this")
    ax.legend(handles, labels, fontsize=8)


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


def plot_sweep(doc: dict[str, Any], out_dir: Path, mobile_name: str | None = None) -> list[Path]:
    """Write the sweep's figures into ``out_dir``; return their paths.

    ``mobile_name`` names the mobile program in titles and legends (default: the
    name its source recorded in the document, else "mobile").
    """
    if mobile_name is None:
        mobile_name = str(doc.get("config", {}).get("mobile", {}).get("name", "mobile"))
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
    if any(
        point["placements"][p]["mobile_unfinished_runs"]
        for point in doc["points"]
        for p in doc["placements"]
        if p != "none"
    ):
        # Room above the highest point for its arrow, and a legend entry for it.
        low, high = ax.get_ylim()
        ax.set_ylim(low, high * 1.25 if not cache else high + 0.18 * (high - low))
        _lower_bound_legend(ax)
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
    written.append(
        _breakdown(doc, placement, numbers[3], mobile_name, out_dir / f"{prefix}-breakdown.png")
    )
    return written


def _breakdown(
    doc: dict[str, Any], placement: str, number: int | None, mobile_name: str, path: Path
) -> Path:
    """Fig. 5: the background's mean response time by part, in ms and as shares.

    A saturated point is hundreds of times the others, so the upper panel clips its
    axis (the clipped bars carry their total and largest part) and the lower panel
    shows every bar's parts as shares of its total, so that what dominates a
    saturated point (waiting for locked blocks at tiny caches) stays visible.
    """
    plt = _pyplot()
    fig, (top, bottom_ax) = plt.subplots(
        2, 1, figsize=(6.5, 6.2), sharex=True, gridspec_kw={"height_ratios": [3, 2]}
    )
    xs = list(range(len(doc["points"])))
    breakdowns = [p["placements"][placement]["background_breakdown_s"] for p in doc["points"]]
    totals = [1000.0 * sum(b.values()) for b in breakdowns]
    ceiling = min(max(totals), 4.0 * sorted(totals)[len(totals) // 2]) * 1.1
    bottom = [0.0] * len(xs)
    share_bottom = [0.0] * len(xs)
    for component in COMPONENTS:
        heights = [1000.0 * b[component] for b in breakdowns]
        shares = [100.0 * h / t if t else 0.0 for h, t in zip(heights, totals, strict=True)]
        style = {"color": _COMPONENT_COLOURS[component], "label": _COMPONENT_LABELS[component]}
        top.bar(xs, heights, bottom=bottom, **style)
        bottom_ax.bar(xs, shares, bottom=share_bottom, color=style["color"])
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        share_bottom = [b + h for b, h in zip(share_bottom, shares, strict=True)]
    top.set_ylim(0, ceiling)
    for x, total, parts in zip(xs, totals, breakdowns, strict=True):
        if total > ceiling:
            largest = max(COMPONENTS, key=lambda c: parts[c])
            share = 1000.0 * parts[largest] / total
            top.annotate(
                f"{total:,.0f} ms\n{share:.0%}\n{_COMPONENT_LABELS[largest]}",
                (x, ceiling),
                textcoords="offset points",
                xytext=(0, -8),
                ha="center",
                va="top",
                fontsize=6,
                color="black",
                bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.85},
            )
    top.set_ylabel("mean response time (ms)")
    top.set_title(
        _title(number, f"background response time by part, {mobile_name} at the {placement}"),
        fontsize=10,
    )
    top.grid(True, alpha=0.3)
    top.legend(fontsize=7, ncol=2)
    bottom_ax.set_ylim(0, 100)
    bottom_ax.set_ylabel("share of the response (%)")
    bottom_ax.set_xticks(xs)
    bottom_ax.set_xticklabels(["∞" if p["x"] == "inf" else p["x"] for p in doc["points"]])
    bottom_ax.set_xlabel(doc["x_label"])
    bottom_ax.grid(True, alpha=0.3)
    return _save(fig, path)


def _title(number: int | None, text: str) -> str:
    return f"(paper Fig. {number}) {text}" if number else text
