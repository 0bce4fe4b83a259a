"""ABACUS 6.2 on the live system: adapting to network topology, the RAID 5 object.

Two clients each write a 4 MB file of their own sequentially, in small writes, through
a ``file`` object (static at the client) over a ``raid5`` object over five nodes'
storage objects (4 data + 1 parity columns, 32 KB stripe units); then each reads its
file back with one column marked failed (every read of that column rebuilds it from
the other four). The RAID object runs statically at the client, adaptive (starting at
the client), or statically at a node (the node that holds its first column).

The clients are two threads of this process, each with a run-time of its own, pinned
to the client CPU; the five nodes share the other CPU (the storage side's CPU is the
contended resource, as in the paper). The links from the client to every node are
emulated (LAN: 10 Mbit/s, SAN: 100 Mbit/s); the nodes reach each other over loopback,
the servers' own fast network.
"""

from __future__ import annotations

import functools
import secrets
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from shuttle.bench.abacus import PLACEMENTS, Bench, Progress, bench_node, migrations_of, summary
from shuttle.bench.session import run_clients
from shuttle.net.profiles import parse_link_profile
from shuttle.runtime.config import RuntimeConfig

FILE_BYTES = 4 << 20
WRITE_BYTES = 8 << 10
UNIT_BYTES = 32 << 10
COLUMNS = 5
CLIENTS = 2
#: Column marked failed for the degraded reads.
FAILED_COLUMN = 1
WORKLOADS = ("write", "degraded-read")


@dataclass
class RaidSettings:
    """Everything ``shuttle bench abacus raid`` takes as a flag."""

    links: tuple[str, ...] = ("lan", "san")
    runs: int = 3
    window_s: float = 0.25
    threshold: float = 0.3
    file_bytes: int = FILE_BYTES
    io_bytes: int = WRITE_BYTES
    unit_bytes: int = UNIT_BYTES
    clients: int = CLIENTS
    client_cpu: int | None = None
    node_cpu: int | None = None


@dataclass
class ClientRun:
    elapsed_s: float
    where: str
    migrations: list[dict[str, Any]] = field(default_factory=list)


def _one_client(
    rc: Bench,
    config: RuntimeConfig,
    placement: str,
    key: str,
    workload: str,
    settings: RaidSettings,
    barrier: threading.Barrier,
    out: list[ClientRun],
) -> None:
    with rc.runtime(config) as rt:
        columns = [n.node_id for n in rc.nodes]
        raid = rt.create(
            "raid5",
            at=columns[0] if placement == "server" else None,
            placement="auto" if placement == "adaptive" else "static",
            storages=[rt.storage(n) for n in columns],
            key=key,
            unit_bytes=settings.unit_bytes,
        )
        file = rt.create("file", placement="static", backing=raid, key=key, layer="raid5")
        if workload == "degraded-read":
            raid.mark_failed(FAILED_COLUMN)
        piece = secrets.token_bytes(settings.io_bytes)
        barrier.wait()
        wall0 = time.time()
        start = time.monotonic()
        with rt.console("raid"):
            for offset in range(0, settings.file_bytes, settings.io_bytes):
                if workload == "write":
                    file.write(offset, piece)
                else:
                    file.read(offset, settings.io_bytes)
        elapsed = time.monotonic() - start
        where = "client" if rt.where(raid) == rt.id else "server"
        moves = migrations_of(rt, raid, wall0)
        rt.destroy(file)
        rt.destroy(raid)
    out.append(ClientRun(elapsed, where, moves))


def run_raid(
    rc: Bench, config: RuntimeConfig, placement: str, workload: str, settings: RaidSettings
) -> list[ClientRun]:
    """Both clients at once; each writes (or reads back) its own file."""
    out: list[ClientRun] = []
    barrier = threading.Barrier(settings.clients)
    errors: list[BaseException] = []

    def client(i: int) -> None:
        try:
            _one_client(
                rc, config, placement, f"bench/raid/file{i}", workload, settings, barrier, out
            )
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    run_clients([functools.partial(client, i) for i in range(settings.clients)], barrier)
    if errors:
        raise errors[0]
    return out


def run_raid_benchmark(settings: RaidSettings, progress: Progress) -> dict[str, Any]:
    """Figure 6: write and degraded read on each link, three placements, ``runs`` times."""
    config = RuntimeConfig(window_s=settings.window_s, threshold_fraction=settings.threshold)
    node_args = ["--window", str(settings.window_s), "--threshold", str(settings.threshold)]
    report: dict[str, Any] = {
        "experiment": "abacus-6.2-raid",
        "settings": asdict(settings),
        "cases": [],
    }
    for link_name in settings.links:
        link = parse_link_profile(link_name)
        with bench_node(
            link,
            size_bytes=0,
            nodes=COLUMNS,
            node_args=node_args,
            client_cpu=settings.client_cpu,
            node_cpu=settings.node_cpu,
        ) as rc:
            for workload in WORKLOADS:
                runs: dict[str, list[list[ClientRun]]] = {p: [] for p in PLACEMENTS}
                for i in range(settings.runs):
                    for placement in PLACEMENTS:
                        progress(f"{link_name} {workload} run {i + 1}/{settings.runs}: {placement}")
                        runs[placement].append(run_raid(rc, config, placement, workload, settings))
                report["cases"].append(_case(link_name, workload, runs))
    return report


def _case(link: str, workload: str, runs: dict[str, list[list[ClientRun]]]) -> dict[str, Any]:
    # A run's time is the slower client's (the experiment ends when both are done).
    times = {p: [max(c.elapsed_s for c in run) for run in runs[p]] for p in PLACEMENTS}
    means = {p: statistics.fmean(times[p]) for p in PLACEMENTS}
    best = min(means["client"], means["server"])
    return {
        "link": link,
        "workload": workload,
        "placements": {p: summary(times[p]) for p in PLACEMENTS},
        "adaptive_over_best_static": round(means["adaptive"] / best, 4),
        "better_static": "client" if means["client"] <= means["server"] else "server",
        "server_over_client": round(means["server"] / means["client"], 4),
        "adaptive_where": [[c.where for c in run] for run in runs["adaptive"]],
        "adaptive_migrations": [[c.migrations for c in run] for run in runs["adaptive"]],
        "target_met": means["adaptive"] <= 1.10 * best,
    }
