"""``shuttle bench jail|durable``: what the run-time's guarantees cost a call.

Concepts: the price of two promises the run-time makes about mobile objects: that
shipped code runs jailed (``jail``: start-up, a shipped filter, and another client's
put while grep runs the worst patterns) and that a durable object's change is on its
home's disk before the call is answered (``durable``: against the same call of a
plain object). The commands only parse their options and print; the measuring is in
:mod:`shuttle.bench.jail` and :mod:`shuttle.bench.durable`. ``shuttle.bench.cli``
registers them.
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


@benchmark("bench jail")
def jail(
    starts: Annotated[int, typer.Option(min=1, help="Start-ups timed on each side.")] = 20,
    filter_runs: Annotated[int, typer.Option(min=1, help="Filter runs on each side.")] = 3,
    filter_bytes: Annotated[int, typer.Option(min=1 << 16, help="Bytes the filter reads.")] = 16
    << 20,
    link: Annotated[str, typer.Option(help="Link profile of the filter's client.")] = "lan",
    grep_bytes: Annotated[int, typer.Option(min=1 << 16, help="Bytes each pattern scans.")] = 16
    << 20,
    json_path: Annotated[
        Path | None, typer.Option("--json-out", help="Write the report here.")
    ] = None,
) -> None:
    """What the jail of shipped code costs (start-up; ABACUS filter config 1 shipped,
    jailed against --unsafe-code, target within 5 %), and another client's 1 KiB
    put+get while grep runs the worst patterns (target: within 50 ms)."""
    from rich.markup import escape

    from shuttle.bench.jail import JailBenchSettings
    from shuttle.bench.jail import run as run_jail

    console = Console()
    settings = JailBenchSettings(
        starts=starts,
        filter_runs=filter_runs,
        filter_bytes=filter_bytes,
        link=link,
        grep_bytes=grep_bytes,
    )
    with bench_status("jail", console) as update:
        report = run_jail(settings, progress=update)
    table = Table(title="the jail of shipped code")
    table.add_column("measure")
    table.add_column("jail", justify="right")
    table.add_column("unjailed", justify="right")
    table.add_column("ratio", justify="right")
    up = report["startup"]
    table.add_row(
        "create -> first call (median)",
        f"{up['jail']['median_s'] * 1e3:.0f} ms",
        f"{up['unjailed']['median_s'] * 1e3:.0f} ms",
        f"{up['ratio_median']:.2f}",
    )
    fil = report["filter_config_1"]
    table.add_row(
        f"filter config 1, shipped, {fil['link']} (mean)",
        f"{fil['jail']['mean_s']:.3f} s",
        f"{fil['unjailed']['mean_s']:.3f} s",
        f"{fil['ratio_mean']:.3f}",
    )
    console.print(table)
    pat = report["worst_patterns"]
    grid = Table(title="1 KiB put+get while grep runs a pattern (same node)")
    grid.add_column("pattern")
    grid.add_column("grep MB/s", justify="right")
    grid.add_column("put+get median", justify="right")
    grid.add_column("max", justify="right")
    grid.add_row(
        "(quiet node)",
        "",
        f"{pat['quiet']['median_s'] * 1e3:.2f} ms",
        f"{pat['quiet']['max_s'] * 1e3:.2f} ms",
    )
    for name, row in pat.items():
        if isinstance(row, dict) and "grep_s" in row:
            grid.add_row(
                escape(name),
                f"{row['grep_mb_per_s']:.0f}",
                f"{row.get('median_s', 0) * 1e3:.2f} ms",
                f"{row.get('max_s', 0) * 1e3:.2f} ms",
            )
    console.print(grid)
    console.print(
        f"worst put+get {pat['worst_put_get_s'] * 1e3:.1f} ms "
        f"({'within' if pat['within_target'] else 'OVER'} the 50 ms target)"
    )


@benchmark("bench durable")
def durable(
    calls: Annotated[int, typer.Option(min=1, help="Calls per timed round.")] = 50,
    rounds: Annotated[int, typer.Option(min=1, help="Interleaved rounds per case.")] = 6,
    link: Annotated[
        str | None, typer.Option(help="The client's link profile (lan, wan, ...; default none).")
    ] = None,
    json_path: Annotated[
        Path | None, typer.Option("--json-out", help="Write the report here.")
    ] = None,
) -> None:
    """What durability costs a call: a durable object's changing call (its state
    written at its home before the answer) against the same call of a plain object,
    at its home node, at another node and at the client (two local nodes)."""
    from shuttle.bench.durable import run as run_durable

    console = Console()
    with bench_status("durable", console) as update:
        report = run_durable(calls=calls, rounds=rounds, link=link, progress=update)
    table = Table(title="a call of a durable object against a plain one (median µs per call)")
    for col in ("where", "change: durable", "plain", "ratio", "read: durable", "plain", "ratio"):
        table.add_column(col, justify="right")
    for case, r in report["cases"].items():
        table.add_row(
            case.replace("_", " "),
            f"{r['changing_call_durable_us']:.0f}",
            f"{r['changing_call_plain_us']:.0f}",
            f"{r['changing_ratio']:.2f}",
            f"{r['read_durable_us']:.0f}",
            f"{r['read_plain_us']:.0f}",
            f"{r['read_ratio']:.2f}",
        )
    console.print(table)
    if json_path is not None:
        json_path.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"report written to {json_path}")
