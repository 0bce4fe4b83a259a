"""``shuttle bench hostile|flood``: a node under clients that mean it harm.

Concepts: what a node's limits hold against hostile clients: its memory under
stalled frames and clients that never read, a put meanwhile, and thousands of idle
connections (``hostile``); a key holder's connect and put under a flood of
connections that never authenticate (``flood``). The commands only parse their
options and print; the measuring is in :mod:`shuttle.bench.hostile` and
:mod:`shuttle.bench.flood`. ``shuttle.bench.cli`` registers them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from shuttle.bench.session import benchmark
from shuttle.bench.session import status as bench_status


@benchmark("bench hostile")
def hostile(
    stalled: Annotated[
        int, typer.Option(min=0, help="Connections stalled on a claimed 16 MiB frame.")
    ] = 128,
    non_readers: Annotated[
        int, typer.Option(min=0, help="Connections pipelining 16 MiB reads, never reading.")
    ] = 3,
    idle: Annotated[int, typer.Option(min=0, help="Idle connections opened at the end.")] = 10_000,
    json_path: Annotated[
        Path | None, typer.Option("--json-out", help="Write the report here.")
    ] = None,
) -> None:
    """What hostile clients cost a node: its memory under stalled frames and clients that
    never read (target: < 256 MiB together), a put meanwhile against the same put on the
    quiet node, and thousands of idle connections (writes must keep working)."""
    from shuttle.bench.hostile import HostileConfig
    from shuttle.bench.hostile import run as run_hostile

    console = Console()
    config = HostileConfig(stalled=stalled, non_readers=non_readers, idle=idle)
    with bench_status("hostile", console) as update:
        report = run_hostile(config, progress=update)
    table = Table(title="what hostile clients cost a node")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("node memory at start", f"{report['node_rss_start_mib']:.0f} MiB")
    table.add_row(f"+ {stalled} stalled 16 MiB frames", f"{report['stalled_frames_mib']:.0f} MiB")
    table.add_row(
        f"+ {non_readers} clients never reading", f"{report['stalled_and_non_readers_mib']:.0f} MiB"
    )
    table.add_row("1 KiB put, quiet node", f"{report['put_quiet_s'] * 1e3:.2f} ms")
    table.add_row(
        "1 KiB put, under both",
        f"{report['put_under_hostile_s'] * 1e3:.2f} ms ({report['put_ratio_to_quiet']:.2f}x)",
    )
    table.add_row(f"+ {idle} idle connections", f"{report['idle_connections_mib']:.0f} MiB")
    table.add_row("put with them open", str(report["put_with_idle"])[:60])
    table.add_row(
        "connection cap / refused", f"{report['connections_max']} / {report['connections_refused']}"
    )
    console.print(table)
    if json_path is not None:
        json_path.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"report written to {json_path}")


def flood(
    connections: Annotated[
        int, typer.Option(min=1, help="Connections that never send HELLO (or start TLS).")
    ] = 1000,
    rounds: Annotated[int, typer.Option(min=1, help="Quiet and flooded rounds, interleaved.")] = 5,
    puts: Annotated[int, typer.Option(min=1, help="Connects and puts timed per round.")] = 5,
    connections_max: Annotated[
        int, typer.Option(min=2, help="The node's connection cap (the report's was 64).")
    ] = 64,
    tls: Annotated[bool, typer.Option("--tls", help="The node serves TLS.")] = False,
    json_path: Annotated[
        Path | None, typer.Option("--json-out", help="Write the report here.")
    ] = None,
) -> None:
    """A flood of connections that never authenticate against a key holder's connect and
    1 KiB put (target: at most 100 ms slower than on the quiet node)."""
    from shuttle.bench.flood import FloodConfig
    from shuttle.bench.flood import run as run_flood

    console = Console()
    config = FloodConfig(
        connections=connections,
        rounds=rounds,
        puts=puts,
        connections_max=connections_max,
        tls=tls,
    )
    with bench_status("flood", console) as update:
        report = run_flood(config, progress=update)
    table = Table(title=f"a key holder's connect + 1 KiB put, {connections} silent connections")
    for col in ("", "p50 ms", "max ms"):
        table.add_column(col, justify="right")
    for name in ("quiet_s", "flooded_s"):
        r = report[name]
        top = f"{r['max'] * 1e3:.1f}" if r["max"] is not None else "-"
        table.add_row(name.removesuffix("_s"), f"{r['p50'] * 1e3:.1f}", top)
    console.print(table)
    console.print(
        f"delay p50 {report['delay_p50_s'] * 1e3:.1f} ms (target ≤ 100 ms); refused "
        f"{report['refused']}; node: {report['node']}"
    )
    if json_path is not None:
        json_path.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"report written to {json_path}")
