"""``shuttle trace ...``: record, convert, inspect and generate traces."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from shuttle.traces.pathfilter import PathFilter
    from shuttle.traces.record import TraceRecord
    from shuttle.traces.summary import TraceSummary

# The command tree is built whenever ``shuttle`` starts: the readers and recorders come
# in when a command runs (tests/unit/test_cli_start.py).

app = typer.Typer(
    help="Record, convert and inspect I/O traces (strace, nfsdump, block traces), record "
    "the mobile application and generate the background workload.",
    no_args_is_help=True,
)
console = Console(stderr=True)

#: Records between progress-bar updates (an update per record would dominate).
_PROGRESS_EVERY = 20_000

FormatOpt = Annotated[
    str,
    typer.Option(
        "--format",
        "-f",
        help="Input format: auto, csv (canonical), strace, nfsdump, blockcsv or vscsi.",
    ),
]
SortOpt = Annotated[
    bool,
    typer.Option(
        "--sort",
        help="Sort the whole trace by time in memory (for traces that are not "
        "time-ordered, e.g. pieces of several traces concatenated).",
    ),
]


IncludeOpt = Annotated[
    list[str] | None,
    typer.Option("--include", help="Keep only files starting with this prefix. Repeatable."),
]
ExcludeOpt = Annotated[
    list[str] | None,
    typer.Option("--exclude", help="Leave out files starting with this prefix. Repeatable."),
]
IncludeFromOpt = Annotated[
    Path | None,
    typer.Option(help="Keep only the files listed in this text file (one per line)."),
]
ExcludeFromOpt = Annotated[
    Path | None,
    typer.Option(help="Leave out the files listed in this text file (one per line)."),
]


def _skips(reader_skipped: dict[str, int], paths: PathFilter) -> dict[str, int]:
    skipped = dict(reader_skipped)
    if paths.dropped:
        skipped["path filter"] = paths.dropped
    return skipped


def with_progress(records: Iterable[TraceRecord], label: str) -> Iterator[TraceRecord]:
    """Yield ``records`` while a spinner on stderr counts them."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TextColumn("{task.completed:,} records"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(label, total=None)
        n = 0
        for n, r in enumerate(records, start=1):
            if n % _PROGRESS_EVERY == 0:
                progress.update(task, completed=n)
            yield r
        progress.update(task, completed=n)


@app.command()
def convert(
    source: Annotated[Path, typer.Argument(help="Trace to read.")],
    out: Annotated[
        Path, typer.Argument(help="Canonical CSV to write (.gz compresses; - is stdout).")
    ],
    format: FormatOpt = "auto",
    sort: SortOpt = False,
    include: IncludeOpt = None,
    exclude: ExcludeOpt = None,
    include_from: IncludeFromOpt = None,
    exclude_from: ExcludeFromOpt = None,
) -> None:
    """Convert a trace in any supported format to Shuttle's canonical CSV."""
    from shuttle.traces import io
    from shuttle.traces.formats import get_reader, read_trace
    from shuttle.traces.pathfilter import path_filter

    reader = get_reader(_format(source, format))
    paths = path_filter(include or (), exclude or (), include_from, exclude_from)
    records = paths.apply(read_trace(source, reader=reader, sort=sort))
    n = io.write_csv(out, with_progress(records, f"converting {source.name}"))
    skipped = ", ".join(f"{k}: {v:,}" for k, v in sorted(_skips(reader.skipped, paths).items()))
    console.print(f"wrote {n:,} records to {out}" + (f" (skipped {skipped})" if skipped else ""))


@app.command()
def info(
    trace: Annotated[Path, typer.Argument(help="Trace to summarise.")],
    format: FormatOpt = "auto",
    sort: SortOpt = False,
    json_out: Annotated[
        Path | None, typer.Option("--json-out", help="Also write the summary as JSON here.")
    ] = None,
    include: IncludeOpt = None,
    exclude: ExcludeOpt = None,
    include_from: IncludeFromOpt = None,
    exclude_from: ExcludeFromOpt = None,
) -> None:
    """Print a trace's record count, duration, clients, files, operation mix and bytes."""
    from shuttle.traces.formats import get_reader, read_trace
    from shuttle.traces.pathfilter import path_filter
    from shuttle.traces.summary import summarize

    name = _format(trace, format)
    reader = get_reader(name)
    paths = path_filter(include or (), exclude or (), include_from, exclude_from)
    records = paths.apply(read_trace(trace, reader=reader, sort=sort))
    summary = summarize(with_progress(records, "reading"))
    skipped = _skips(reader.skipped, paths)
    print_summary(summary, f"{trace} ({name})", skipped)
    if json_out is not None:
        data = {"trace": str(trace), "format": name, **summary.to_dict()}
        data["skipped"] = skipped
        json_out.write_text(json.dumps(data, indent=2) + "\n")


def print_summary(summary: TraceSummary, title: str, skipped: dict[str, int]) -> None:
    """Render a summary as two rich tables on stdout."""
    out = Console()
    table = Table(title=title, show_header=False)
    table.add_row("records", f"{summary.records:,}")
    table.add_row("duration", f"{summary.duration_s:,.3f} s")
    table.add_row("rate", f"{summary.rate_per_s:,.1f} records/s")
    table.add_row("clients", f"{summary.clients:,}")
    table.add_row("files", f"{summary.files:,}")
    table.add_row("metadata requests", f"{summary.metadata_fraction:.1%}")
    table.add_row("bytes read", f"{summary.bytes_read:,}")
    table.add_row("bytes written", f"{summary.bytes_written:,}")
    if summary.out_of_order:
        table.add_row("out of order", f"{summary.out_of_order:,}")
    for reason, n in sorted(skipped.items()):
        table.add_row(f"skipped: {reason}", f"{n:,}")
    out.print(table)
    mix = Table(title="operation mix")
    mix.add_column("op")
    mix.add_column("records", justify="right")
    mix.add_column("share", justify="right")
    for op, n in summary.ops.most_common():
        mix.add_row(op.value, f"{n:,}", f"{n / summary.records:.1%}")
    out.print(mix)


@app.command(context_settings={"allow_interspersed_args": False})
def record(
    command: Annotated[list[str], typer.Argument(help="The command to run, after --.")],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Canonical CSV to write (.gz compresses).")
    ] = Path("-"),
    under: Annotated[
        Path | None,
        typer.Option("--under", help="Keep only files under this directory."),
    ] = None,
    keep_strace: Annotated[
        Path | None, typer.Option("--keep-strace", help="Also keep strace's raw log here.")
    ] = None,
) -> None:
    """Run a real program under strace -f -tt -T and write its file I/O as a trace.

    Example: shuttle trace record --out cat.csv -- cat /etc/os-release
    """
    from shuttle.traces import io
    from shuttle.traces.formats import read_trace
    from shuttle.traces.recorder import record_strace
    from shuttle.traces.strace import StraceReader

    with tempfile.TemporaryDirectory(prefix="shuttle-trace-") as tmp:
        log = keep_strace or Path(tmp) / "strace.log"
        # With the trace on stdout, the command's own output goes to stderr.
        code = record_strace(command, log, stdout=2 if str(out) == "-" else None, check=False)
        prefix = str(under.resolve()) + "/" if under is not None else None
        reader = StraceReader(
            cwd=os.getcwd(),
            include=(lambda p: p.startswith(prefix)) if prefix is not None else None,
        )
        n = io.write_csv(out, read_trace(log, reader=reader))
    console.print(f"{command[0]} exited with status {code}; wrote {n:,} records to {out}")


def _format(path: Path, format: str) -> str:
    from shuttle.traces.formats import READERS, format_names, get_reader

    if format == "auto":
        from shuttle.traces.formats import detect_format

        return detect_format(path)
    if format not in READERS and format not in format_names():
        get_reader(format)  # raises the UsageError that lists the names
    return format


@app.command("record-agrep")
def record_agrep_command(
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Trace to write (its .json sidecar goes beside).")
    ] = Path("data/traces/agrep-stdlib.csv.gz"),
    tree: Annotated[
        Path | None,
        typer.Option("--tree", help="Source tree to search (default: the Python stdlib)."),
    ] = None,
    pattern: Annotated[str, typer.Option("--pattern", help="What tre-agrep searches for.")] = (
        "file server"
    ),
    errors: Annotated[
        int, typer.Option("--errors", min=0, max=9, help="Errors allowed in a match.")
    ] = 1,
    runs: Annotated[
        int, typer.Option("--runs", min=1, help="Untraced runs measured for CPU time.")
    ] = 5,
) -> None:
    """Record the mobile application: real tre-agrep over the stdlib, think time from CPU.

    The I/O sequence comes from strace; the think time from tre-agrep's CPU time per
    byte measured without strace; the timeline is as if every I/O took no time.
    """
    from shuttle.traces.agrep import record_agrep

    with console.status("recording tre-agrep") as status:
        meta = record_agrep(
            out, tree=tree, pattern=pattern, errors=errors, runs=runs, progress=status.update
        )
    console.print(
        f"wrote {meta['records']:,} records ({meta['metadata_fraction']:.1%} metadata) over "
        f"{meta['tree_files']:,} files / {meta['tree_bytes'] / 1e6:.1f} MB to {out}; "
        f"CPU {meta['cpu_s_per_byte'] * 1e9:.2f} ns/byte, think time {meta['think_s_total']:.2f} s"
    )


@app.command("generate-background")
def generate_background_command(
    out: Annotated[Path, typer.Argument(help="Canonical CSV to write (.gz compresses).")],
    hours: Annotated[
        float, typer.Option("--hours", min=0.0, help="Length of the trace in hours.")
    ] = 12.0,
    seed: Annotated[int, typer.Option("--seed", help="Seed of every random choice.")] = 0,
    rate: Annotated[
        float | None,
        typer.Option("--rate", min=0.0, help="Mean requests/s over whole days (default 820)."),
    ] = None,
    clients: Annotated[
        int | None, typer.Option("--clients", min=1, help="Client workstations (default 236).")
    ] = None,
) -> None:
    """Generate the synthetic background workload (the Auspex stand-in) as a trace.

    Writes OUT and, beside it, a JSON sidecar with the full configuration and seed.
    Every parameter is documented in shuttle.traces.background.BackgroundConfig.
    """
    from dataclasses import replace

    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from shuttle.traces import io
    from shuttle.traces.agrep import sidecar_path
    from shuttle.traces.background import BackgroundConfig, generate_columns

    config = replace(BackgroundConfig(), duration_s=hours * 3600.0)
    if rate is not None:
        config = replace(config, request_rate_per_s=rate)
    if clients is not None:
        config = replace(config, clients=clients)

    def records() -> Iterator[TraceRecord]:
        columns = (
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TextColumn("{task.fields[n]:,} records"),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=console, transient=True) as progress:
            task = progress.add_task("generating", total=config.duration_s, n=0)
            n = 0
            for chunk in generate_columns(config, seed):
                n += len(chunk)
                yield from chunk.records()
                progress.update(task, completed=float(chunk.time_s[-1]), n=n)

    n = io.write_csv(out, records())
    meta = {"trace": out.name, "seed": seed, "records": n, "config": config.to_dict()}
    sidecar_path(out).write_text(json.dumps(meta, indent=2) + "\n")
    console.print(f"wrote {n:,} records ({hours:g} h, seed {seed}) to {out}")
