"""``shuttle bench shaping|stream``: the transport under every call.

Concepts: how faithfully the emulated link shapes traffic (``shaping``: the token
bucket on loopback against kernel ``tc ... tbf`` between network namespaces, for the
same transfers) and how close a node streams to the wire (``stream``: one large
object against a raw TCP transfer of the same bytes). The commands only parse their
options and print; the measuring is in :mod:`shuttle.bench.shaping` and
:mod:`shuttle.bench.stream`. ``shuttle.bench.cli`` registers them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from shuttle.bench.session import benchmark
from shuttle.bench.session import status as bench_status
from shuttle.errors import UsageError


@benchmark("bench shaping")
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
    json_path: Annotated[
        Path | None, typer.Option("--json-out", help="Write the report here.")
    ] = None,
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
    with bench_status("shaping", console) as update:
        report = run_benchmark(
            link,
            size,
            repeat=repeat,
            pings=pings,
            kernel=kernel,
            transport=transport,
            progress=update,
        )
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
        for direction, counters in kernel["tbf"].items():
            console.print(f"tbf {direction.replace('_', ' ')}: {counters}")


@benchmark("bench stream")
def stream(
    nbytes: Annotated[int, typer.Option("--bytes", min=1, help="Object size (default 1 GiB).")] = 1
    << 30,
    repeat: Annotated[int, typer.Option(min=1, help="Timed runs of each (medians compared).")] = 3,
    window: Annotated[int, typer.Option(min=1, help="1 MiB requests kept in flight.")] = 8,
    node: Annotated[
        str | None, typer.Option(help="Use this node (HOST:PORT) instead of starting one.")
    ] = None,
    tls: Annotated[
        bool,
        typer.Option(
            "--tls",
            help="Also stream from a node serving TLS, interleaved (target: at least 60% of "
            "Shuttle without TLS).",
        ),
    ] = False,
    json_path: Annotated[
        Path | None, typer.Option("--json-out", help="Write the report here.")
    ] = None,
) -> None:
    """Stream one large object from a node against a raw TCP transfer of the same bytes
    between two processes (target: Shuttle at least 60% of raw)."""
    from shuttle.bench.stream import StreamConfig
    from shuttle.bench.stream import run as run_stream

    console = Console()
    config = StreamConfig(nbytes=nbytes, repeat=repeat, node=node, window=window, tls=tls)
    with bench_status("stream", console) as update:
        report = run_stream(config, progress=update)
    table = Table(title=f"streaming {nbytes / (1 << 20):.0f} MiB over loopback")
    for col in ("path", "median s", "MiB/s", "client CPU s/GiB", "node CPU s/GiB"):
        table.add_column(col, justify="right")
    for name in ("raw_tcp", "shuttle", "shuttle_tls"):
        r = report.get(name)
        if r:
            cpu = r.get("cpu_s_per_gib") or {}
            client_cpu, node_cpu = cpu.get("client"), cpu.get("node")
            table.add_row(
                name,
                f"{r['median_s']:.3f}",
                f"{r['mib_per_s']:.0f}",
                "" if client_cpu is None else f"{client_cpu:.2f}",
                "" if node_cpu is None else f"{node_cpu:.2f}",
            )
    console.print(table)
    console.print(
        f"Shuttle / raw TCP throughput: {report['shuttle_over_raw_throughput']:.2f} (target ≥ 0.60)"
    )
    if "shuttle_tls_over_shuttle_throughput" in report:
        console.print(
            "Shuttle over TLS / Shuttle without: "
            f"{report['shuttle_tls_over_shuttle_throughput']:.2f} (target ≥ 0.60)"
        )
    if json_path is not None:
        json_path.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"report written to {json_path}")
