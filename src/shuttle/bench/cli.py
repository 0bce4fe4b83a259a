"""``shuttle bench ...``: the benchmarks, one command each.

Each benchmark module keeps its own logic; this module only declares the commands.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from shuttle.bench.abacus_cli import app as abacus_app
from shuttle.bench.ceph_cli import app as ceph_app
from shuttle.bench.session import benchmark, scratch_dir
from shuttle.bench.session import lines as progress_lines
from shuttle.bench.session import status as bench_status
from shuttle.errors import UsageError

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


@app.command("shaping")
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
            "four slices), so that a rerun repeats the figures; 0: --pages each, as in the "
            "cold and mixed passes.",
        ),
    ] = 3.0,
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
            "(1-10), and report how far the figures moved between the runs.",
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
    for count, rep in by_count.items():
        names = (
            "remote_cold",
            "remote_warm",
            "mixed_warm",
            "mixed_cold",
            "mixed_paged_warm",
            "mixed_paged_cold",
            "redis",
        )
        for name in names:
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
    if captions:
        table.caption = "\n".join(captions)
    return table


@app.command("hostile")
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


@app.command("jail")
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


@app.command("durable")
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


@app.command("flood")
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


@app.command("stream")
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


@app.command("speculate")
@benchmark("bench speculate")
def speculate(
    iterations: Annotated[int, typer.Option(min=1, help="Reads per run (the paper: 100).")] = 100,
    slowdowns: Annotated[
        str, typer.Option(help="How many times slower than --link, comma-separated.")
    ] = "1,2,4,8,16,32",
    cases: Annotated[
        str,
        typer.Option(
            help="LOCAL_MS:P pairs: local processing between reads and the probability of "
            "a remote write before each read (the paper's test cases 1 and 2)."
        ),
    ] = "30:0,60:0,60:0.1,60:0.25",
    methods: Annotated[
        str, typer.Option(help="Any of normal, thread, fork, auto, comma-separated.")
    ] = "normal,thread,fork,auto",
    object_bytes: Annotated[int, typer.Option(min=16, help="Object size (the paper: 10 KB).")] = (
        10 * 1024
    ),
    link: Annotated[str, typer.Option(help="The link profile slowed down (default: lan).")] = "lan",
    work: Annotated[str, typer.Option(help="Local processing: busy (CPU loop) or sleep.")] = "busy",
    seed: Annotated[int, typer.Option(help="Seed of the remote-write pattern.")] = 1,
    node: Annotated[
        str | None, typer.Option(help="Use this node (HOST:PORT) instead of starting one.")
    ] = None,
    json_path: Annotated[
        Path | None, typer.Option("--json-out", help="Write the report here.")
    ] = None,
    plot_path: Annotated[
        Path | None, typer.Option("--plot", help="Write a PNG of the paper's graphs here.")
    ] = None,
) -> None:
    """Speculative remote read (Yi, section 4): normal read against thread and fork
    speculation and auto, over a LAN slowed 1x to 32x, with remote writes at rate p."""
    from shuttle.bench.speculate import SpeculateConfig, parse_cases, print_report
    from shuttle.bench.speculate import run as run_speculate

    try:
        factors = tuple(int(k) for k in slowdowns.split(","))
    except ValueError:
        raise UsageError(f"--slowdowns: integers separated by commas, not {slowdowns!r}") from None
    config = SpeculateConfig(
        iterations=iterations,
        slowdowns=factors,
        cases=parse_cases(cases),
        methods=tuple(m.strip() for m in methods.split(",")),
        object_bytes=object_bytes,
        link=link,
        work=work,
        seed=seed,
        node=node,
    )
    console = Console()
    # Progress as plain lines: a spinner's refresh thread would compete for the
    # interpreter with the thread branches being measured.
    report = run_speculate(config, progress=progress_lines("speculate", console))
    print_report(report)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"report written to {json_path}")
    if plot_path is not None:
        from shuttle.bench.speculate_plots import plot

        plot_path.parent.mkdir(parents=True, exist_ok=True)
        console.print(f"plot written to {plot(report, plot_path)}")


@app.command("lookaside")
@benchmark("bench lookaside")
def lookaside(
    project: Annotated[
        str, typer.Argument(help="PyPI project whose sdists are built (default: django).")
    ] = "django",
    releases: Annotated[
        str,
        typer.Option(
            "--releases",
            help="CURRENT,ONE_BACK,TWO_BACK,...: the release in Shuttle, then the stores' "
            "releases (default: 5.0.4,5.0.3,5.0,4.2,4.1 for django).",
        ),
    ] = "",
    bandwidths: Annotated[
        str,
        typer.Option(
            "--bandwidths", help="Link bandwidths, comma-separated (LAN latency on each)."
        ),
    ] = "100kbit,1Mbit,10Mbit,100Mbit,1Gbit",
    runs: Annotated[int, typer.Option(min=1, help="Cold builds per cell (mean, stdev).")] = 1,
    target_s: Annotated[
        float,
        typer.Option(
            "--target-s",
            min=1.0,
            help="Shrink the tree at slow links to this many seconds of transfer.",
        ),
    ] = 90.0,
    jobs: Annotated[int, typer.Option(min=0, help="compileall -j (0: every core).")] = 0,
    subdir: Annotated[
        str,
        typer.Option(
            "--subdir",
            help="Build this directory of the release (auto: the project's package "
            "directory if the sdist has one; empty: every .py file).",
        ),
    ] = "auto",
    validation: Annotated[
        str, typer.Option("--validation", help="The mount's validation mode.")
    ] = "callback",
    attr_timeout: Annotated[
        float,
        typer.Option("--attr-timeout", min=0.0, help="The mount's --attr-timeout (seconds)."),
    ] = 60.0,
    smoke: Annotated[
        bool,
        typer.Option("--smoke", help="A generated tiny project in 3 releases, no download (CI)."),
    ] = False,
    out: Annotated[
        Path,
        typer.Option("--out", help="Directory for lookaside.json and lookaside.png."),
    ] = Path("benchmarks/results/lookaside"),
    workdir: Annotated[
        Path | None,
        typer.Option("--workdir", help="Scratch directory (default: a temporary one)."),
    ] = None,
    cache_dir: Annotated[
        str | None,
        typer.Option(
            "--cache-dir",
            help="Keep downloaded sdists and their trees here (default: $SHUTTLE_BENCH_CACHE, "
            "else ~/.cache/shuttle/bench-lookaside; a few releases take hundreds of MB); "
            "'' keeps them in the scratch directory, removed at the end.",
        ),
    ] = None,
) -> None:
    """Lookaside caching (the paper's Figure 6): a cold `compileall` of a project's
    current release over `shuttle mount`, with no store and with stores holding the
    current and older releases, at each bandwidth."""
    import shutil

    from shuttle.bench.lookaside import RELEASES_DEFAULT, Config, plot, table_lines
    from shuttle.bench.lookaside import run as run_lookaside

    if releases:
        chosen = [r.strip() for r in releases.split(",") if r.strip()]
    elif smoke:
        chosen = ["3", "2", "1"]
    elif project.lower() == "django":
        chosen = list(RELEASES_DEFAULT)
    else:
        raise UsageError("--releases CURRENT,ONE_BACK,... is needed for a project but django")
    config = Config(
        project=project,
        releases=chosen,
        bandwidths=[b.strip() for b in bandwidths.split(",") if b.strip()],
        runs=runs,
        target_s=target_s,
        jobs=jobs,
        tiny=smoke,
        subdir=subdir,
        validation=validation,
        attr_timeout_s=attr_timeout,
    )
    if cache_dir is not None:
        config.cache_dir = Path(cache_dir) if cache_dir else None
    console = Console()
    scratch = workdir or scratch_dir("shuttle-bench-lookaside-")
    try:
        report = run_lookaside(config, scratch, progress_lines("lookaside", console))
    finally:
        if workdir is None:
            shutil.rmtree(scratch, ignore_errors=True)
    for line in table_lines(report):
        console.print(line, highlight=False, soft_wrap=True)
    for name, target in report["targets"].items():
        verdict = "met" if target["met"] else "NOT met"
        paper = "" if target["paper"] is None else f", paper {target['paper']}%"
        console.print(f"target {name}: ours {target['ours']}%{paper}: {verdict}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "lookaside.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, out / "lookaside.png")
    console.print(f"report written to {out / 'lookaside.json'} and {out / 'lookaside.png'}")
