"""``shuttle bench ...``: the benchmarks, one command each.

Each benchmark module keeps its own logic; the commands only parse options and print.
They are declared by family: ``abacus_cli`` (ABACUS's experiments, ``bench abacus``),
``ceph_cli`` (``bench ceph``), ``transport_cli`` (``shaping``, ``stream``),
``hostile_cli`` (``hostile``, ``flood``), ``runtime_cli`` (``jail``, ``durable``),
``client_reads_cli`` (``speculate``, ``lookaside``), and here ``netrand`` (random
page-sized fetches, with its ``--clients`` and ``--workers`` passes). This module
makes the ``shuttle bench`` group and registers them all, in the order ``--help``
lists them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from shuttle.bench import client_reads_cli, hostile_cli, runtime_cli, transport_cli
from shuttle.bench.abacus_cli import app as abacus_app
from shuttle.bench.ceph_cli import app as ceph_app
from shuttle.bench.session import benchmark
from shuttle.bench.session import status as bench_status

app = typer.Typer(
    help="Run Shuttle's benchmarks on the live system; each prints its figures and "
    "writes JSON with --json-out FILE.",
    no_args_is_help=True,
)


app.add_typer(abacus_app, name="abacus")
app.add_typer(ceph_app, name="ceph")


@app.callback()
def _bench() -> None:
    """Run Shuttle's benchmarks on the live system."""


app.command("shaping")(transport_cli.shaping)


@app.command("netrand")
@benchmark("bench netrand")
def netrand(
    pages: Annotated[int, typer.Option(min=1, help="Pages per run (the paper: 400).")] = 400,
    rounds: Annotated[
        int, typer.Option(min=1, help="Runs per mode (for stable percentiles).")
    ] = 20,
    file_bytes: Annotated[
        int, typer.Option(min=4096, help="Size of the generated file (default 128 MiB).")
    ] = 128 << 20,
    generator: Annotated[
        str, typer.Option(help="lcg (the paper's 17x+123 mod 65521) or seeded.")
    ] = "lcg",
    seed: Annotated[int, typer.Option(help="Seed of the page sequence (round r uses seed+r).")] = 1,
    node: Annotated[
        str | None, typer.Option(help="Use this node (HOST:PORT) instead of starting one.")
    ] = None,
    link: Annotated[
        str | None, typer.Option(help="Emulated link to the node: san, lan, wan, bw=..,lat=..")
    ] = None,
    cpu_factor: Annotated[
        float, typer.Option(help="CPU speed of the node started here (0.5: a slow server).")
    ] = 1.0,
    redis: Annotated[
        bool, typer.Option("--redis/--no-redis", help="Measure the Redis anchor too.")
    ] = True,
    pin: Annotated[
        bool,
        typer.Option(
            "--pin/--no-pin",
            help="Run client, node and Redis on one CPU (same placement for all; see "
            "shuttle.bench.placement). --no-pin leaves it to the scheduler.",
        ),
    ] = True,
    cpu: Annotated[
        int | None, typer.Option(help="The CPU to pin to (default: the highest allowed).")
    ] = None,
    clients: Annotated[
        list[str] | None,
        typer.Option(
            help="Also read from N concurrent client processes (e.g. 1,8,64, or repeat the "
            "option): throughput and p50/p99, cold and warm, against Redis with N clients. "
            "Each client reads --pages pages per pass; the warm, Redis and mixed_paged "
            "passes last --pass-seconds."
        ),
    ] = None,
    pass_seconds: Annotated[
        float,
        typer.Option(
            help="With --clients: how long every client reads in the warm, Redis and "
            "mixed_paged passes (its pages over and over; the three passes interleaved in "
            "--slices slices), so that a rerun repeats the figures; 0: --pages each, as in "
            "the cold and mixed passes.",
        ),
    ] = 12.0,
    slices: Annotated[
        int,
        typer.Option(
            help="With --clients: cut each timed pass into this many slices (1-64), warm, "
            "Redis and mixed_paged alternating, each warm slice paired with the Redis one "
            "after it; more, shorter slices put the machine's drift on both servers more "
            "evenly.",
        ),
    ] = 12,
    node_cache_bytes: Annotated[
        int,
        typer.Option(
            min=0,
            help="Block cache of the node started here (default 64 MiB). With --clients, "
            "the mixed_paged pass's missing readers cycle over an object twice this size.",
        ),
    ] = 64 << 20,
    node_cache_block_bytes: Annotated[
        int | None,
        typer.Option(
            help="Block size of that cache, the unit a node-cache miss reads and copies "
            "(a power of two, at least 512; default: the node's, 64 KiB).",
        ),
    ] = None,
    repeat: Annotated[
        int,
        typer.Option(
            help="With --clients: run each count's passes this many times back to back "
            "(1-10), and report how far the figures moved between the runs, and whether "
            "warm ÷ redis moved between runs by what its slices move within one (the "
            "passes too short) or by more (the runs themselves differ).",
        ),
    ] = 1,
    tls: Annotated[
        bool,
        typer.Option(
            "--tls",
            help="Also a node serving TLS and Redis's TLS port, in the same rounds: warm "
            "fetches over TLS against Redis over TLS (target ≤ 1.25) and against no TLS.",
        ),
    ] = False,
    workers: Annotated[
        str | None,
        typer.Option(
            help="Instead: compare nodes of that many processes each (shuttle serve "
            "--workers), e.g. 1,2, the first the anchor: warm reads from --clients client "
            "processes (the first count; default 8) pinned to one CPU (--cpu), the nodes "
            "unpinned, --pages pages per client per pass, passes interleaved over --rounds "
            "rounds (--cpu-factor slows the nodes); pages/s, the ratio per round, and where "
            "the CPU went.",
        ),
    ] = None,
    json_path: Annotated[
        Path | None, typer.Option("--json-out", help="Write the report here.")
    ] = None,
) -> None:
    """Random 4 KiB page fetches: local file (pread) against the same file through a
    Shuttle node, cold and warm, with Redis on loopback as the fast-fetch anchor."""
    from shuttle.bench.netrand import NetrandConfig
    from shuttle.bench.netrand import run as run_netrand
    from shuttle.bench.netrand_clients import parse_clients

    if workers is not None:
        _netrand_workers(
            workers,
            parse_clients(clients or ["8"]),
            pages,
            rounds,
            file_bytes,
            seed,
            cpu,
            cpu_factor,
            json_path,
        )
        return

    config = NetrandConfig(
        pages=pages,
        rounds=rounds,
        file_bytes=file_bytes,
        generator=generator,
        seed=seed,
        node=node,
        link=link,
        cpu_factor=cpu_factor,
        redis=redis,
        pin=pin,
        cpu=cpu,
        clients=tuple(parse_clients(clients or [])),
        pass_seconds=pass_seconds,
        slices=slices,
        tls=tls,
        node_cache_bytes=node_cache_bytes,
        node_cache_block_bytes=node_cache_block_bytes,
        repeat=repeat,
    )
    console = Console()
    with bench_status("netrand", console) as update:
        report = run_netrand(config, progress=update)
    table = Table(title=f"netrand: {pages} random 4 KiB pages × {rounds} rounds")
    for col in (
        "mode",
        "p50 µs",
        "p90 µs",
        "p99 µs",
        "max µs",
        "mean µs",
        "pages/s",
        f"{pages} pages, s",
    ):
        table.add_column(col, justify="right")
    modes = ("local_cold", "remote_cold", "local", "remote_warm", "remote_miss", "redis")
    for mode in (*modes, "remote_warm_tls", "redis_tls"):
        s = report.get(mode)
        if not s:
            continue
        table.add_row(
            mode,
            *(f"{s[k]:.1f}" for k in ("p50_us", "p90_us", "p99_us", "max_us", "mean_us")),
            f"{s['pages_per_s']:.0f}",
            f"{s['run_s_mean']:.4f}",
        )
    console.print(table)
    console.print(
        f"remote/local p50 (warm): {report['remote_over_local_p50']:.2f}   "
        f"remote/local p50 (cold): {report['remote_cold_over_local_cold_p50']:.2f}   "
        f"(paper, cold NFS over 10 Mb/s: ~1.5)"
    )
    console.print(
        "node-cache miss over a page-cache hit ÷ node-cache hit, p50: "
        f"{report['remote_miss_over_remote_warm_p50']:.2f} (target ≤ 2)"
    )
    if "remote_over_redis_p50" in report:
        console.print(
            f"Shuttle/Redis p50 (warm): {report['remote_over_redis_p50']:.2f} (target ≤ 1.25)"
        )
    if "remote_tls_over_redis_tls_p50" in report:
        console.print(
            "over TLS, Shuttle/Redis p50 (warm): "
            f"{report['remote_tls_over_redis_tls_p50']:.2f} (target ≤ 1.25)   "
            f"Shuttle TLS/plain: {report['remote_tls_over_remote_p50']:.2f}   "
            f"Redis TLS/plain: {report['redis_tls_over_redis_p50']:.2f}"
        )
    pinned_cpu = report["placement"]["pinned_cpu"]
    console.print("placement: " + ("scheduler's" if pinned_cpu is None else f"CPU {pinned_cpu}"))
    if report.get("clients"):
        console.print(_netrand_clients_table(report["clients"], pages, pass_seconds))
    if json_path is not None:
        json_path.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"report written to {json_path}")


def _netrand_workers(
    workers: str,
    clients: list[int],
    pages: int,
    rounds: int,
    file_bytes: int,
    seed: int,
    cpu: int | None,
    cpu_factor: float,
    json_path: Path | None,
) -> None:
    """``bench netrand --workers``: nodes of 1, 2... processes, interleaved."""
    from shuttle.bench.netrand_workers import WorkersConfig, parse_workers
    from shuttle.bench.netrand_workers import run as run_workers

    config = WorkersConfig(
        workers=parse_workers(workers),
        clients=clients[0],
        pages=pages,
        rounds=rounds,
        file_bytes=file_bytes,
        seed=seed,
        cpu=cpu,
        cpu_factor=cpu_factor,
    )
    console = Console()
    with bench_status("netrand --workers", console) as update:
        report = run_workers(config, progress=update)
    table = Table(
        title=f"netrand --workers: {config.clients} clients on CPU "
        f"{report['placement']['clients_cpu']}, {pages} warm pages each per pass, "
        f"{rounds} rounds" + (f", node CPU factor {cpu_factor:g}" if cpu_factor != 1.0 else "")
    )
    for col in (
        "processes",
        "pages/s (median)",
        "p50 µs",
        "p99 µs",
        "node cores",
        "client cores",
        "node CPU µs/page",
        "client CPU µs/page",
        "machine busy",
    ):
        table.add_column(col, justify="right")
    for count, rep in report["by_workers"].items():
        table.add_row(
            count,
            f"{rep['pages_per_s_median']:.0f}",
            f"{rep['p50_us_median']:.1f}",
            f"{rep['p99_us_median']:.1f}",
            f"{rep['node_cores_median']:.2f}",
            f"{rep['client_cores_median']:.2f}",
            f"{rep['node_cpu_us_per_page_median']:.1f}",
            f"{rep['client_cpu_us_per_page_median']:.1f}",
            f"{rep['cpu_busy_median']:.0%}",
        )
    console.print(table)
    for name, ratio in report["ratios"].items():
        console.print(
            f"pages/s {name.replace('_over_', ' ÷ ')} processes, per round: median "
            f"{ratio['median']:.3f} (min {ratio['min']:.3f}, max {ratio['max']:.3f})"
        )
    if json_path is not None:
        json_path.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"report written to {json_path}")


def _netrand_clients_table(by_count: dict[str, Any], pages: int, seconds: float) -> Table:
    """``bench netrand --clients``: one row per client count and pass; the ratios are
    Shuttle over Redis with as many clients; "node" is inline/pooled requests."""
    timed = f"warm, redis and mixed_paged {seconds:g} s, the others " if seconds else ""
    table = Table(title=f"netrand, concurrent clients ({timed}{pages} pages each per pass)")
    columns = ("N", "pass", "pages/s", "p50 µs", "p99 µs", "÷redis p50", "p99", "thr", "node")
    for col in (*columns, "CPU µs/req client+server"):
        table.add_column(col, justify="right")
    from shuttle.bench.netrand_summary import OVER_REDIS

    for count, rep in by_count.items():
        for name in (*OVER_REDIS, "redis"):
            s = rep.get(name)
            if not s:
                continue
            ratio = rep.get(f"{name}_over_redis") or {}
            node = rep.get("node", {}).get(name.rsplit("_", 1)[0] if "mixed" in name else name)
            # The pass's node counters go on its first row only (they count both halves).
            if name.endswith("_cold") and "mixed" in name:
                node = None
            table.add_row(
                count,
                name.removeprefix("remote_"),
                f"{s['pages_per_s']:.0f}",
                f"{s['p50_us']:.0f}",
                f"{s['p99_us']:.0f}",
                *(f"{ratio[k]:.2f}" if k in ratio else "" for k in ("p50", "p99", "throughput")),
                f"{node['inline']}/{node['pooled']}" if node else "",
                f"{s['client_cpu_us_per_req']:.0f}"
                + (f"+{s['server_cpu_us_per_req']:.0f}" if "server_cpu_us_per_req" in s else ""),
            )
    # The miss path's target: a mixed pass's throughput ≥ 0.8 of the all-warm pass's.
    notes = [
        f"{count}: mixed/warm {rep['mixed_over_warm']:.2f}, "
        f"mixed_paged/warm {rep['mixed_paged_over_warm']:.2f}"
        + (
            " (by slice "
            + ", ".join(f"{x['throughput']:.2f}" for x in rep["mixed_paged_slices"])
            + ")"
            if rep.get("mixed_paged_slices")
            else ""
        )
        + (
            f", its missing readers' reads that missed {rep['mixed_paged_missed']:.2f}"
            if "mixed_paged_missed" in rep
            else ""
        )
        for count, rep in by_count.items()
        if "mixed_paged_over_warm" in rep and "mixed_over_warm" in rep
    ]
    captions = []
    if notes:
        captions.append("throughput ÷ all-warm (target ≥ 0.8): " + "; ".join(notes))
    # The interleaved warm and Redis slices: how much the machine moved under the run.
    captions += [
        f"{count}: warm ÷ redis throughput by slice "
        + ", ".join(f"{x['throughput']:.2f}" for x in rep["slices"])
        + (
            f" (pooled {rep['remote_warm_over_redis']['throughput']:.3f}, median of the "
            f"pairs {rep['remote_warm_over_redis']['throughput_pair_median']:.3f})"
            if "throughput_pair_median" in rep.get("remote_warm_over_redis", {})
            else ""
        )
        + (
            f"; slices' throughput range: warm {rep['spread']['remote_warm']['range_pct']:.0f} %"
            f", redis {rep['spread']['redis']['range_pct']:.0f} %"
            if "remote_warm" in rep.get("spread", {}) and "redis" in rep.get("spread", {})
            else ""
        )
        for count, rep in by_count.items()
        if rep.get("slices")
    ]
    # --repeat: how far a rerun moved the headline figures.
    for count, rep in by_count.items():
        reruns = rep.get("reruns")
        if not reruns:
            continue
        moved = ", ".join(
            f"{name} {s['min']:.3g}-{s['max']:.3g} ({s['range_pct']:.0f} %)"
            for name, s in reruns["spread"].items()
        )
        captions.append(f"{count}: over {reruns['runs']} runs, {moved}")
        noise = reruns.get("noise")
        if noise:
            captions.append(
                f"{count}: warm ÷ redis, sd of a slice pair within a run "
                f"{noise['within_run_pct']:.1f} %, of a run's figure expected from it "
                f"{noise['expected_between_pct']:.1f} %, seen between runs "
                f"{noise['between_runs_pct']:.1f} %"
            )
    if captions:
        table.caption = "\n".join(captions)
    return table


app.command("hostile")(hostile_cli.hostile)
app.command("jail")(runtime_cli.jail)
app.command("durable")(runtime_cli.durable)
app.command("flood")(hostile_cli.flood)
app.command("stream")(transport_cli.stream)
app.command("speculate")(client_reads_cli.speculate)
app.command("lookaside")(client_reads_cli.lookaside)
