"""``shuttle bench ...``: the benchmarks, one command each.

Each benchmark module keeps its own logic; this module only declares the commands.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn
from rich.table import Table

from shuttle.errors import UsageError

app = typer.Typer(
    help="Run Shuttle's benchmarks on the live system; each prints its figures and "
    "writes JSON with --json FILE.",
    no_args_is_help=True,
)


@app.callback()
def _bench() -> None:
    """Run Shuttle's benchmarks on the live system."""


@app.command("shaping")
def shaping(
    profile: Annotated[
        str,
        typer.Option(help="Link profile: loopback, san, lan, wan, or e.g. bw=5Mbit,lat=2ms."),
    ] = "lan",
    nbytes: Annotated[
        int | None,
        typer.Option(
            "--bytes",
            min=1,
            help="Bytes per download and upload (default: 1.5 s worth at the profile's rate).",
        ),
    ] = None,
    repeat: Annotated[int, typer.Option(min=1, help="Runs of each mode (medians reported).")] = 3,
    pings: Annotated[int, typer.Option(min=1, help="Round trips timed per run.")] = 20,
    kernel: Annotated[
        bool, typer.Option("--kernel/--no-kernel", help="Also run the kernel-shaped mode (root).")
    ] = True,
    transport: Annotated[
        str,
        typer.Option(
            help="Client side: async (asyncio streams, ShapedStream) or sync (blocking "
            "socket, ShapedSocket)."
        ),
    ] = "async",
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the report here.")] = None,
) -> None:
    """Emulated link shaping (loopback + token bucket) against kernel tbf shaping
    between network namespaces, for the same profile and the same transfers."""
    from shuttle.bench.shaping import TRANSPORTS, default_bytes, run_benchmark
    from shuttle.net.profiles import format_bandwidth, parse_link_profile

    if transport not in TRANSPORTS:
        raise UsageError(f"--transport must be one of {', '.join(TRANSPORTS)}, not {transport!r}")
    link = parse_link_profile(profile)
    size = nbytes if nbytes is not None else default_bytes(link)
    console = Console()
    console.print(
        f"link {link.name}: bandwidth {format_bandwidth(link.bandwidth_bits_per_s)}, "
        f"latency {link.latency_s * 1e3:g} ms, burst {link.effective_burst_bytes} B; "
        f"{size} bytes each way, {repeat} run(s) per mode, {transport} client"
    )
    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), console=console
    ) as bar:
        runs = repeat * (3 if kernel else 2)
        task = bar.add_task("starting", total=runs)
        started = [0]

        def step(what: str) -> None:
            # Called as each run starts: the bar shows the runs already finished.
            bar.update(task, description=what, completed=started[0])
            started[0] += 1

        report = run_benchmark(
            link,
            size,
            repeat=repeat,
            pings=pings,
            kernel=kernel,
            transport=transport,
            progress=step,
        )
        bar.update(task, completed=runs)
    _print_shaping(console, report)
    if json_path is not None:
        json_path.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"wrote {json_path}")


def _print_shaping(console: Console, report: dict[str, Any]) -> None:
    emulated, kernel, unshaped = report["emulated"], report["kernel"], report["unshaped"]
    table = Table(title="emulated shaping against kernel tbf (medians)")
    columns = ("", "unshaped", "closed form", "emulated", "kernel", "closed form (wire)")
    for column in (*columns, "emu/kernel"):
        table.add_column(column, justify="right")
    ratio = report.get("emulated_over_kernel", {})
    for key, label in (
        ("ping_rtt_s", "ping RTT"),
        ("download_s", "download"),
        ("upload_s", "upload"),
    ):
        table.add_row(
            label,
            f"{unshaped[key] * 1e3:.2f} ms",
            f"{report['closed_form'][key] * 1e3:.2f} ms",
            f"{emulated[key] * 1e3:.2f} ms",
            f"{kernel[key] * 1e3:.2f} ms" if key in kernel else "-",
            f"{report['closed_form_wire'][key] * 1e3:.2f} ms",
            f"{ratio[key]:.3f}" if key in ratio else "-",
        )
    for key, label in (("download_bytes_per_s", "download"), ("upload_bytes_per_s", "upload")):
        table.add_row(
            f"{label} rate",
            f"{unshaped[key] * 8 / 1e6:.0f} Mbit/s",
            "",
            f"{emulated[key] * 8 / 1e6:.3f} Mbit/s",
            f"{kernel[key] * 8 / 1e6:.3f} Mbit/s" if key in kernel else "-",
            "",
            "",
        )
    console.print(table)
    if "skipped" in kernel:
        console.print(f"kernel mode skipped: {kernel['skipped']}")
    else:
        console.print(f"kernel mode latency: {kernel['latency']}")
