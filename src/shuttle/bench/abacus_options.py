"""What every ``shuttle bench abacus ...`` command shares: its options (the link, the
runs, the window H and B_thresh, the CPUs to pin to, where the report goes), the
console its tables print on, and the report's output (JSON, and a PNG beside it), with
the mean ± 90% CI format the tables use.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

#: Tables are wide; a pipe or a log file gets them unwrapped.
console = Console(width=None if sys.stdout.isatty() else 160)

JsonOpt = Annotated[Path | None, typer.Option("--json-out", help="Write the report here.")]
PlotOpt = Annotated[
    Path | None, typer.Option("--plot", help="Write the PNG here (default: beside --json-out).")
]
SizeOpt = Annotated[int, typer.Option("--size", help="Bytes of the object the filters read.")]
LinkOpt = Annotated[str, typer.Option(help="Client–node link profile (lan: 10 Mbit/s).")]
RunsOpt = Annotated[int, typer.Option(min=1, help="Runs per placement (mean and 90% CI).")]
WindowOpt = Annotated[float, typer.Option(help="The observation window H, seconds.")]
ThresholdOpt = Annotated[float, typer.Option(help="B_thresh as a fraction of H.")]
BlockOpt = Annotated[int, typer.Option(help="Bytes per filter call (a block).")]
CpuOpt = Annotated[
    int | None, typer.Option(help="CPU to pin the client to (default: the lowest usable).")
]
NodeCpuOpt = Annotated[
    int | None, typer.Option(help="CPU to pin the node to (default: the highest usable).")
]


def write_json(report: dict[str, Any], json_path: Path | None) -> None:
    """Write the report as JSON to ``json_path`` (its directory made), if one is given."""
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"report written to {json_path}")


def write_report(
    report: dict[str, Any],
    json_path: Path | None,
    plot_path: Path | None,
    plot: Callable[[dict[str, Any], Path], Any],
) -> None:
    """Write the JSON (if ``json_path``) and the PNG: at ``plot_path``, or beside the JSON."""
    write_json(report, json_path)
    png = plot_path or (json_path.with_suffix(".png") if json_path is not None else None)
    if png is not None:
        plot(report, png)
        console.print(f"plot written to {png}")


def mean_ci(summary: dict[str, Any]) -> str:
    """A summary's mean and 90% confidence interval, in seconds: ``1.23 ± 0.04``."""
    return f"{summary['mean_s']:.2f} ± {summary['ci90_s']:.2f}"


def placement_cells(placements: dict[str, Any]) -> tuple[str, str, str]:
    """A row's three placements, each as :func:`mean_ci`: at the client, adaptive, at
    the server."""
    return (
        mean_ci(placements["client"]),
        mean_ci(placements["adaptive"]),
        mean_ci(placements["server"]),
    )


def comma_list(text: str) -> tuple[str, ...]:
    """A comma-separated option's items, stripped, empty ones left out."""
    return tuple(x.strip() for x in text.split(",") if x.strip())


def right_aligned_table(title: str, columns: Iterable[str]) -> Table:
    """A table titled ``title`` with ``columns``, each right-aligned (figures)."""
    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify="right")
    return table
