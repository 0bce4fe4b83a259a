"""``shuttle bench ceph netrand|stream|filter``: Shuttle on Ceph, against librados and
with the OSD as a third placement site (issue 12; docs/ceph.md).

Each starts its own local Ceph (``--osds``) and nodes, prints a table, and writes JSON
with ``--json-out FILE``; whatever it could not measure (no RADOS store in this build, no
network namespaces) is named in the output and the JSON's ``skipped`` / ``notes``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from shuttle.bench.session import benchmark
from shuttle.bench.session import lines as progress_lines

app = typer.Typer(
    help="Shuttle on Ceph: a node on the RADOS store against a node on files and against "
    "librados (netrand, stream), and grep at the client, the node or the OSD (filter).",
    no_args_is_help=True,
)
console = Console(width=None if sys.stdout.isatty() else 160)

JsonOpt = Annotated[Path | None, typer.Option("--json-out", help="Write the report here.")]
OsdsOpt = Annotated[int, typer.Option(min=1, max=16, help="OSDs of the local Ceph.")]


def _write(report: dict[str, Any], path: Path | None) -> None:
    for mode, why in report.get("skipped", {}).items():
        console.print(f"[yellow]skipped {mode}[/]: {why}")
    for note in report.get("notes", []):
        console.print(f"[yellow]note[/]: {note}")
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"report written to {path}")


def _target(report: dict[str, Any]) -> None:
    for name, mode in (("target", "rados_node"), ("target_direct", "rados_node_direct")):
        target = report.get(name)
        if target is not None:
            console.print(f"target, {mode}: {'met' if target['met'] else 'NOT met'} ({target})")
    same = report.get("p50_over_librados_key")
    if same is not None:
        console.print(
            f"p50 / librados_key (the nodes' own RADOS object): {same}; paired "
            f"{report.get('p50_over_librados_key_paired')}"
        )
    direct = report.get("direct_client")
    if direct is not None:
        console.print(f"rados_node_direct's client, all rounds: {direct}")


@app.command("netrand")
@benchmark("bench ceph netrand")
def netrand(
    pages: Annotated[int, typer.Option(min=1, help="Random 4 KiB pages per round.")] = 400,
    rounds: Annotated[int, typer.Option(min=1, help="Measured rounds (after one warm-up).")] = 10,
    file_bytes: Annotated[int, typer.Option(min=4096, help="Size of the object.")] = 64 << 20,
    osds: OsdsOpt = 3,
    compare: Annotated[
        Path | None,
        typer.Option(
            "--compare",
            help="Another checkout's src folder: a RADOS node running that code is "
            "measured too, interleaved (git archive main | tar -x -C /tmp/main; "
            "--compare /tmp/main/src).",
        ),
    ] = None,
    wait_for_trust: Annotated[
        bool,
        typer.Option(
            "--wait-for-trust/--no-wait-for-trust",
            help="Time the RADOS nodes once their 4 s probation is over (their caches "
            "trusted), or as soon as their watch is confirmed, as a node just started "
            "serves (and as this benchmark did before issue 26).",
        ),
    ] = True,
    node_cache_bytes: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Every node's block cache in bytes (default: the node's, 64 MiB); below "
            "PAGES × 4 KiB the warm reads miss it.",
        ),
    ] = None,
    node_block_bytes: Annotated[
        int | None,
        typer.Option(
            min=512,
            help="Every node's cache block size in bytes (default: the node's, 4 KiB): "
            "what a node reads from RADOS (or its disk) for a page that misses its cache.",
        ),
    ] = None,
    direct: Annotated[
        bool,
        typer.Option(
            "--direct/--no-direct",
            help="Measure rados_node_direct too: a second RADOS node whose client has Ceph "
            "credentials and reads the node's misses from the OSDs itself (docs/ceph.md, "
            '"A client that reads a miss from the OSD itself").',
        ),
    ] = True,
    direct_remember_s: Annotated[
        float,
        typer.Option(
            min=0,
            help="How long rados_node_direct's client reads a key its node named from "
            "RADOS without asking the node again (0: it asks every time, and pays the "
            "node's hop on every miss).",
        ),
    ] = 1.0,
    json_path: JsonOpt = None,
) -> None:
    """Random 4 KiB reads: a node on the RADOS store, a node on local files, librados
    directly and a client that reads a RADOS node's misses from the OSDs itself, in the
    same run, with the RADOS nodes' counters (how their timed reads were answered).
    Target: the RADOS node's warm p50 within 2x the file node's when the object fits its
    block cache, within 1.0x librados's when it does not."""
    from shuttle.bench.ceph_netrand import CephNetrandConfig, run_netrand

    config = CephNetrandConfig(
        pages=pages,
        rounds=rounds,
        file_bytes=file_bytes,
        osds=osds,
        compare_src=None if compare is None else str(compare),
        wait_for_trust=wait_for_trust,
        node_cache_bytes=node_cache_bytes,
        node_block_bytes=node_block_bytes,
        direct_remember_s=direct_remember_s if direct else None,
    )
    report = run_netrand(config, progress_lines("ceph netrand", console))
    table = Table(title=f"4 KiB random reads, warm: {pages} pages × {rounds} rounds")
    heads = (
        "mode",
        "p50 µs",
        "p90 µs",
        "p99 µs",
        "mean µs",
        "p50 / librados",
        "node CPU µs/read",
        "client CPU µs/read",
    )
    for col in heads:
        table.add_column(col, justify="right")
    cpu = report.get("node_cpu_us_per_read", {})
    mine = report.get("client_cpu_us_per_read", {})
    for mode, s in report["modes"].items():
        ratio = report["p50_over_librados"].get(mode)
        table.add_row(
            mode,
            *(f"{s[k]:.0f}" for k in ("p50_us", "p90_us", "p99_us", "mean_us")),
            "-" if ratio is None else f"{ratio:.2f}",
            f"{cpu[mode]:.0f}" if mode in cpu else "-",
            f"{mine[mode]:.0f}" if mode in mine else "-",
        )
    console.print(table)
    _rados_counters(report)
    _target(report)
    _write(report, json_path)


def _rados_counters(report: dict[str, Any]) -> None:
    """How each RADOS node answered its timed reads (docs/ceph.md, the counters)."""
    counters = report.get("rados_counters", {})
    if not counters:
        return
    table = Table(title="RADOS node counters over the timed reads")
    cols = (
        "timed_reads",
        "inline_hits",
        "stat_free_hits",
        "validations",
        "cold_reads",
        "aio_reads",
        "partial_reads",
        "direct_answers",
    )
    heads = ("inline share", "p50 / file node", "paired", "p50 / librados", "paired")
    for col in ("mode", *cols, "cache_hits", "cache_misses", *heads):
        table.add_column(col, justify="right")
    ratios = (
        "p50_over_file_node",
        "p50_over_file_node_paired",
        "p50_over_librados",
        "p50_over_librados_paired",
    )
    for mode, c in counters.items():
        shown = [report.get(name, {}).get(mode) for name in ratios]
        table.add_row(
            mode,
            *(str(c.get(k, 0)) for k in (*cols, "cache_hits", "cache_misses")),
            f"{c['inline_share']:.3f}",
            *("-" if r is None else f"{r:.2f}" for r in shown),
        )
    console.print(table)
    for mode, c in counters.items():
        if c.get("aio_reads"):
            console.print(
                f"{mode}: {c.get('aio_bytes_per_read', 0)} bytes read from RADOS per timed "
                f"read; of its misses, {c.get('partial_reads', 0)} read only the page asked "
                f"for, {c.get('whole_reads', 0)} whole blocks ({c.get('ghost_hits', 0)} "
                "of a block missed within the cache's reach)"
            )
    if report.get("p50_over_compare") is not None:
        console.print(
            f"rados_node / the node compared against (--compare), p50: "
            f"{report['p50_over_compare']:.2f} (paired "
            f"{report.get('p50_over_compare_paired') or 0:.2f})"
        )
    console.print(
        "paired: the median over rounds of each round's p50 ratio (steadier under load "
        "that comes and goes)"
    )


#: The RADOS store's object limit (``store.rados.RADOS_OBJECT_BYTES_MAX``; not imported
#: here, so that ``--help`` does not load librados).
STREAM_BYTES_MAX = 64 << 20


@app.command("stream")
@benchmark("bench ceph stream")
def stream(
    nbytes: Annotated[
        int,
        typer.Option(
            "--bytes",
            min=1 << 20,
            max=STREAM_BYTES_MAX,
            help="Object size (at most the RADOS store's object limit, 64 MiB).",
        ),
    ] = STREAM_BYTES_MAX,
    repeat: Annotated[int, typer.Option(min=1, help="Measured runs (after one warm-up).")] = 3,
    window: Annotated[int, typer.Option(min=1, help="1 MiB reads in flight.")] = 8,
    osds: OsdsOpt = 3,
    json_path: JsonOpt = None,
) -> None:
    """One object in 1 MiB reads: a node on the RADOS store, a node on local files, and
    librados (one read at a time, and WINDOW in flight); target: the RADOS node at
    least 1/1.5 of librados's throughput."""
    from shuttle.bench.ceph_stream import CephStreamConfig, run_stream

    config = CephStreamConfig(nbytes=nbytes, repeat=repeat, window=window, osds=osds)
    report = run_stream(config, progress_lines("ceph stream", console))
    table = Table(title=f"{nbytes >> 20} MiB in 1 MiB reads (medians of {repeat})")
    for col in ("mode", "median s", "MiB/s", "/ librados"):
        table.add_column(col, justify="right")
    for mode, s in report["modes"].items():
        ratio = report["throughput_over_librados"].get(mode)
        table.add_row(
            mode,
            f"{s['median_s']:.3f}",
            f"{s['mib_per_s']:.0f}",
            "-" if ratio is None else f"{ratio:.2f}",
        )
    console.print(table)
    _target(report)
    _write(report, json_path)


@app.command("filter")
@benchmark("bench ceph filter")
def filter_(
    size: Annotated[int, typer.Option(min=1 << 16, help="Bytes of the text.")] = 16 << 20,
    link: Annotated[str, typer.Option(help="Client–node link profile.")] = "bw=10Mbit,lat=0.5ms",
    pattern: Annotated[str, typer.Option(help="The fixed string searched.")] = "ERROR 4242",
    match_fraction: Annotated[
        float, typer.Option(help="Fraction of lines holding the pattern.")
    ] = 0.001,
    runs: Annotated[int, typer.Option(min=1, help="Runs per site (interleaved).")] = 2,
    sites: Annotated[str, typer.Option(help="Static sites, comma-separated.")] = "client,node,osd",
    shaping: Annotated[
        str, typer.Option(help="kernel (namespaces + tc tbf), emulated, or auto.")
    ] = "auto",
    osd_cpu_ratio: Annotated[
        float, typer.Option(help="The OSD's CPU for the search over Python's (Lua/re).")
    ] = 0.8,
    history: Annotated[
        bool,
        typer.Option(
            "--history/--no-history",
            help="Later model runs reuse the first run's measurements instead of probing.",
        ),
    ] = True,
    osds: OsdsOpt = 3,
    json_path: JsonOpt = None,
) -> None:
    """A selective grep over a text in Ceph at the client, the node and the OSD (cls_lua),
    and where the placement model puts it, on a shaped link (target on 10 Mbit/s: the
    model picks the OSD or the node and finishes within 10% of the best static site)."""
    from shuttle.bench.ceph_filter import FilterSettings, run_filter

    settings = FilterSettings(
        size_bytes=size,
        link=link,
        pattern=pattern,
        match_fraction=match_fraction,
        runs=runs,
        sites=tuple(s.strip() for s in sites.split(",") if s.strip()),
        shaping=shaping,
        osd_cpu_ratio=osd_cpu_ratio,
        osds=osds,
        history=history,
    )
    report = run_filter(settings, progress_lines("ceph filter", console))
    table = Table(
        title=f"grep {pattern!r} over {size >> 20} MiB, link {link} ({report['shaping']} "
        f"shaping), node store {report['node_store']}"
    )
    for col in ("site", "mean s", "runs s"):
        table.add_column(col, justify="right")
    for site, s in report["sites"].items():
        table.add_row(site, f"{s['mean_s']:.3f}", " ".join(f"{t:.3f}" for t in s["runs_s"]))
    console.print(table)
    plan = report["model_plan"]
    if plan is not None:
        predicted = ", ".join(f"{k} {v:.3f} s" for k, v in plan["response_s"].items())
        console.print(f"model: chose {report['model_sites']}; predicted {predicted}")
    console.print(
        f"model / best static ({report['best_static']}): {report['model_over_best_static']:.3f} "
        f"(first run, with its probe: {report['model_first_over_best_static']:.3f})"
    )
    _target(report)
    _write(report, json_path)
