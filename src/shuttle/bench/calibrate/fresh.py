"""The program's reads timed in fresh processes: the per-call cost a run pays.

A live run (``shuttle grep``) is a process of its own, and the figure a prediction is
compared with is the median over several. A calibration timed its reads inside one
long-lived process, after thousands of other calls; on an idle machine the wall time
per call left over besides the node's CPU (the per-message residual) came out at 11 to
229 µs on loopback over calibrations minutes apart, while the live medians held within
10 % (benchmarks/README.md, "The simulator against the live system"). So the per-call
cost is timed as the live runs are: ``processes`` fresh interpreters each replay the
program's reads (its keys, offsets and lengths, in its order, back to back, as the
recording made them) over the link in force, and each reports every call's wall time
and the node's CPU over its calls. A figure is the median over the processes, as the
live figure is the median over runs; the spread over processes is kept beside it.

Each process's first read opens its connection: its excess over the process's median
read is the connection's cost (``connect_s``), and it is left out of the rest.

The child side is :func:`replay` (``python -m shuttle.bench.calibrate.fresh REQUEST
OUT``: a JSON request in, a JSON report out); the parent side :func:`fresh_reads`; the
figures :func:`per_call_cost`, pure, tested without a node.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shuttle.bench.calibrate.link import call_residuals_s
from shuttle.bench.calibrate.phases import REFERENCE_PATTERN, TINY_BYTES
from shuttle.bench.calibrate.result import LIVE_BLOCK_BYTES
from shuttle.bench.calibrate.timing import node_cpu_clock
from shuttle.errors import ConfigError, ShuttleError
from shuttle.net.profiles import LinkProfile

#: Fresh processes whose median is the per-call cost: five, so one disturbed process
#: (a burst of another program on a shared core) is outvoted twice over.
FRESH_PROCESSES = 5
#: ... and in a quick calibration (``calls`` under ``QUICK_CALLS``): the median of two
#: is their mean, enough for a smoke run.
FRESH_PROCESSES_QUICK = 2
QUICK_CALLS = 50
#: Console calls each fresh process makes to a grep at the node when the program's
#: count is not given: a grep over 16 MB asks for 61 batches of 256 KiB.
FRESH_CONSOLE_CALLS = 60
#: Wall time a process spends on its reads at most: a loopback grep's 1,226 reads take
#: under a second; on a shaped link the budget stops the replay (lan: some 300 reads).
FRESH_BUDGET_S = 3.0
#: Reads a process replays at most, whatever the budget (a request file stays small).
FRESH_READS_MAX = 4096
#: A process that does not answer within this is stuck (a dead node): its error is
#: raised rather than waited on forever.
FRESH_TIMEOUT_S = 120.0

#: Calls at each end of a process's reads whose mean wall times are kept apart.
EDGE_CALLS = 100

#: One read to replay: ``(key, offset, length)``.
Spot = tuple[str, int, int]


@dataclass(frozen=True)
class ProcessReads:
    """One fresh process's reads: each call's start and wall time and the bytes it
    returned (the first call opened the connection), and the node's CPU and the
    process's own over the calls after the first."""

    starts: tuple[float, ...]
    walls: tuple[float, ...]
    sizes: tuple[int, ...]
    node_cpu_s: float
    client_cpu_s: float
    #: Console calls (``progress``) to a grep made at the node over the same keys,
    #: timed like the reads (the first, the object's first call, apart), and the node's
    #: CPU over the calls after the first.
    call_starts: tuple[float, ...] = ()
    call_walls: tuple[float, ...] = ()
    call_node_cpu_s: float = 0.0
    #: Making that grep at the node and asking where it is, as ``shuttle grep
    #: --placement server`` does before its first call; and the same at the client.
    server_setup_s: float = 0.0
    client_setup_s: float = 0.0
    #: Bytes of the arguments that made the object (its keys among them).
    create_bytes: int = 0

    @property
    def calls(self) -> int:
        """Reads after the first (the ones the per-call figures are over)."""
        return len(self.walls) - 1

    def to_json(self) -> dict[str, Any]:
        return {
            "starts": list(self.starts),
            "walls": list(self.walls),
            "sizes": list(self.sizes),
            "node_cpu_s": self.node_cpu_s,
            "client_cpu_s": self.client_cpu_s,
            "call_starts": list(self.call_starts),
            "call_walls": list(self.call_walls),
            "call_node_cpu_s": self.call_node_cpu_s,
            "server_setup_s": self.server_setup_s,
            "client_setup_s": self.client_setup_s,
            "create_bytes": self.create_bytes,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProcessReads:
        return cls(
            tuple(float(v) for v in data["starts"]),
            tuple(float(v) for v in data["walls"]),
            tuple(int(v) for v in data["sizes"]),
            float(data["node_cpu_s"]),
            float(data["client_cpu_s"]),
            tuple(float(v) for v in data.get("call_starts", ())),
            tuple(float(v) for v in data.get("call_walls", ())),
            float(data.get("call_node_cpu_s", 0.0)),
            float(data.get("server_setup_s", 0.0)),
            float(data.get("client_setup_s", 0.0)),
            int(data.get("create_bytes", 0)),
        )


# --- the child ------------------------------------------------------------------------


def replay(
    cluster: Path,
    link: str | None,
    node: str,
    pid: int,
    spots: Sequence[Spot],
    budget_s: float,
    console_calls: int = 0,
) -> ProcessReads:
    """Read ``spots`` from ``node`` back to back over ``link``, in a run-time of this
    process, until they are done or ``budget_s`` has passed; then make a grep over
    their keys at the client and at the node (as ``shuttle grep`` does) and call the
    one at the node ``console_calls`` times (within the same budget)."""
    from shuttle.runtime import values
    from shuttle.runtime.client import Runtime

    node_cpu = node_cpu_clock(pid, node)
    starts: list[float] = []
    walls: list[float] = []
    sizes: list[int] = []
    call_starts: list[float] = []
    call_walls: list[float] = []
    keys = list(dict.fromkeys(k for k, _, _ in spots))
    with Runtime.connect(cluster, link=link) as rt:
        storage = rt.storage(node)
        with rt.console("calibrate"):

            def one(spot: Spot) -> None:
                t = time.perf_counter()
                data = storage.read(*spot)
                walls.append(time.perf_counter() - t)
                starts.append(t)
                sizes.append(len(data))

            one(spots[0])  # opens the connection
            n0, c0 = node_cpu(), time.process_time()
            started = time.perf_counter()
            for spot in spots[1:]:
                one(spot)
                if time.perf_counter() - started > budget_s:
                    break
            node_s, client_s = node_cpu() - n0, time.process_time() - c0
            setup: dict[str, float] = {}
            params: dict[str, Any] = {
                "pattern": REFERENCE_PATTERN,
                "storage": storage,
                "keys": keys,
            }
            create_bytes = len(values.pack(params))
            for site in ("client", "server"):
                t = time.perf_counter()
                grep = rt.create(
                    "grep", at=node if site == "server" else None, placement="static", **params
                )
                rt.where(grep)
                setup[site] = time.perf_counter() - t
                if site == "client":
                    rt.destroy(grep)
            call_node_s = 0.0
            try:
                n0 = node_cpu()
                started = time.perf_counter()
                for i in range(console_calls + 1 if console_calls else 0):
                    if i == 1:
                        n0 = node_cpu()
                    t = time.perf_counter()
                    grep.progress()
                    call_walls.append(time.perf_counter() - t)
                    call_starts.append(t)
                    if time.perf_counter() - started > budget_s and i >= 2:
                        break
                if len(call_walls) > 1:
                    call_node_s = node_cpu() - n0
            finally:
                rt.destroy(grep)
    return ProcessReads(
        tuple(starts),
        tuple(walls),
        tuple(sizes),
        node_s,
        client_s,
        tuple(call_starts),
        tuple(call_walls),
        call_node_s,
        setup["server"],
        setup["client"],
        create_bytes,
    )


def main(argv: Sequence[str]) -> int:
    """``python -m shuttle.bench.calibrate.fresh REQUEST OUT``."""
    request = json.loads(Path(argv[0]).read_text())
    done = replay(
        Path(request["cluster"]),
        request["link"],
        request["node"],
        int(request["pid"]),
        [(str(k), int(o), int(n)) for k, o, n in request["spots"]],
        float(request["budget_s"]),
        int(request.get("console_calls", 0)),
    )
    Path(argv[1]).write_text(json.dumps(done.to_json()))
    return 0


# --- the parent -----------------------------------------------------------------------


def fresh_reads(
    cluster: Path,
    link: str | None,
    node: str,
    pid: int | None,
    spots: Sequence[Spot],
    *,
    processes: int,
    console_calls: int = 0,
    budget_s: float = FRESH_BUDGET_S,
) -> list[ProcessReads]:
    """Replay ``spots`` in ``processes`` fresh processes, one after another.

    Raises :class:`ConfigError` when there is nothing to read or the node does not run
    here, and :class:`ShuttleError` (with the child's last line of error) when a
    process fails."""
    if len(spots) < 2:
        raise ConfigError(
            f"the per-call cost needs at least 2 reads to replay, not {len(spots)}: the "
            "first opens the connection; give the program's reads or more --calls"
        )
    if pid is None:
        node_cpu_clock(pid, node)  # raises the error that says what to do
    out = []
    with tempfile.TemporaryDirectory(prefix="shuttle-calibrate-") as tmp:
        request = Path(tmp) / "request.json"
        request.write_text(
            json.dumps(
                {
                    "cluster": str(cluster),
                    "link": link,
                    "node": node,
                    "pid": pid,
                    "spots": [list(s) for s in spots[:FRESH_READS_MAX]],
                    "budget_s": budget_s,
                    "console_calls": console_calls,
                }
            )
        )
        for i in range(processes):
            report = Path(tmp) / f"reads-{i}.json"
            argv = [
                sys.executable,
                "-m",
                "shuttle.bench.calibrate.fresh",
                str(request),
                str(report),
            ]
            try:
                done = subprocess.run(
                    argv, capture_output=True, text=True, check=False, timeout=FRESH_TIMEOUT_S
                )
            except subprocess.TimeoutExpired:
                raise ShuttleError(
                    f"a fresh process timing reads of node {node} gave no answer in "
                    f"{FRESH_TIMEOUT_S:.0f} s; is the node up (`shuttle cluster status`)?"
                ) from None
            if done.returncode != 0 or not report.exists():
                last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                raise ShuttleError(
                    f"a fresh process timing reads of node {node} failed (exit "
                    f"{done.returncode}): {last}"
                )
            out.append(ProcessReads.from_json(json.loads(report.read_text())))
    return out


# --- the figures ----------------------------------------------------------------------


def read_blocks(size: int) -> int:
    """The model's blocks for a read returning ``size`` bytes (at least one)."""
    return max(1, math.ceil(size / LIVE_BLOCK_BYTES))


def mean_blocks(runs: Sequence[ProcessReads]) -> float:
    """Blocks per read over every process's reads after its first."""
    blocks = [read_blocks(size) for r in runs for size in r.sizes[1:]]
    return statistics.fmean(blocks) if blocks else 1.0


def small_spots(keys: Sequence[str], calls: int) -> list[Spot]:
    """Without the program's reads: ``calls`` + 1 small reads round the calibration's
    tiny objects (the first opens the connection)."""
    return [(keys[i % len(keys)], 0, TINY_BYTES) for i in range(calls + 1)]


@dataclass(frozen=True)
class PerCallCost:
    """The per-call figures over fresh processes: each the median over the processes
    (``per_process`` keeps every process's, ``spread`` (max - min) / median)."""

    node_cpu_s: float
    residual_s: float
    connect_s: float
    wall_s: float
    per_process: tuple[dict[str, float], ...]

    def spread(self, name: str) -> float:
        values = [p[name] for p in self.per_process]
        middle = statistics.median(values)
        return (max(values) - min(values)) / abs(middle) if middle else math.inf

    def to_json(self) -> dict[str, Any]:
        names = ("node_cpu_s", "residual_s", "connect_s", "wall_s")
        return {
            **{name: getattr(self, name) for name in names},
            "processes": len(self.per_process),
            "spread": {name: self.spread(name) for name in names},
            "per_process": list(self.per_process),
        }


def node_cpu_per_call_s(runs: Sequence[ProcessReads]) -> float:
    """The node's CPU per read: the median over processes of each one's mean."""
    return statistics.median(r.node_cpu_s / r.calls for r in runs)


def per_call_cost(
    runs: Sequence[ProcessReads],
    profile: LinkProfile,
    request_bytes: float,
    reply_header_bytes: float,
    node_s: Callable[[int], float],
) -> PerCallCost:
    """What each process's reads took beyond the link and the node: every read after
    the first replayed through the link's buckets at its instant, carrying
    ``request_bytes`` up and ``reply_header_bytes`` plus its data down, the node
    working ``node_s(bytes returned)`` on it (the model's node CPU for that read);
    the mean of what is left is the process's residual. A process's first read less
    its median is its connection's cost. Each figure: the median over processes."""
    if not runs:
        raise ConfigError("no fresh processes timed; give processes >= 1")
    rows: list[dict[str, float]] = []
    for run in runs:
        n = run.calls
        if n < 1:
            raise ConfigError(
                "a fresh process timed only the read that opened its connection; "
                "give it more reads or a longer budget"
            )
        residuals = call_residuals_s(
            run.starts[1:],
            run.walls[1:],
            profile,
            [request_bytes] * n,
            [reply_header_bytes + size for size in run.sizes[1:]],
            [node_s(size) for size in run.sizes[1:]],
        )
        rows.append(
            {
                "calls": float(n),
                "node_cpu_s": run.node_cpu_s / n,
                "client_cpu_s": run.client_cpu_s / n,
                "residual_s": statistics.fmean(residuals),
                "connect_s": max(0.0, run.walls[0] - statistics.median(run.walls[1:])),
                "wall_s": statistics.fmean(run.walls[1:]),
                # Does a process get faster as it goes (its first calls warming it)?
                "early_wall_s": statistics.fmean(run.walls[1 : 1 + EDGE_CALLS]),
                "late_wall_s": statistics.fmean(run.walls[-EDGE_CALLS:]),
            }
        )
    return PerCallCost(
        node_cpu_s=statistics.median(r["node_cpu_s"] for r in rows),
        residual_s=statistics.median(r["residual_s"] for r in rows),
        connect_s=statistics.median(r["connect_s"] for r in rows),
        wall_s=statistics.median(r["wall_s"] for r in rows),
        per_process=tuple(rows),
    )


@dataclass(frozen=True)
class ConsoleCallCost:
    """A console call's figures over fresh processes, each the median over them: the
    node's CPU per call, the residual (wall less link and node CPU), and what making
    the object and asking where it is cost, at the node beyond a call and at the
    client."""

    node_cpu_s: float
    residual_s: float
    server_setup_s: float
    client_setup_s: float
    per_process: tuple[dict[str, float], ...]

    def to_json(self) -> dict[str, Any]:
        names = ("node_cpu_s", "residual_s", "server_setup_s", "client_setup_s")
        out: dict[str, Any] = {name: getattr(self, name) for name in names}
        out["per_process"] = list(self.per_process)
        return out


def console_call_cost(
    runs: Sequence[ProcessReads],
    profile: LinkProfile,
    request_bytes: float,
    reply_bytes: float,
    header_bytes: float = 0.0,
) -> ConsoleCallCost | None:
    """The console calls' figures (None when no process made two calls): every call
    after a process's first replayed through the link's buckets with ``request_bytes``
    (``header_bytes`` of them the header) up and ``reply_bytes`` down, the node
    working the median node CPU per call.

    Making the object at the node costs, beyond a call, its wall less the process's
    median call and less its larger arguments' time at the link's rate (the model's
    first call carries those bytes already)."""
    timed = [r for r in runs if len(r.call_walls) > 1]
    if not timed:
        return None
    node_s = statistics.median(r.call_node_cpu_s / (len(r.call_walls) - 1) for r in timed)
    rate = profile.bandwidth_bytes_per_s
    rows: list[dict[str, float]] = []
    for run in timed:
        n = len(run.call_walls) - 1
        extra_bytes = max(0.0, run.create_bytes - (request_bytes - header_bytes))
        create_link_s = 0.0 if rate is None else extra_bytes / rate
        residuals = call_residuals_s(
            run.call_starts[1:], run.call_walls[1:], profile,
            [request_bytes] * n, [reply_bytes] * n, [node_s] * n,
        )  # fmt: skip
        rows.append(
            {
                "calls": float(n),
                "node_cpu_s": run.call_node_cpu_s / n,
                "residual_s": statistics.fmean(residuals),
                "server_setup_s": run.server_setup_s
                - statistics.median(run.call_walls[1:])
                - create_link_s,
                "client_setup_s": run.client_setup_s,
            }
        )
    return ConsoleCallCost(
        node_cpu_s=node_s,
        residual_s=statistics.median(r["residual_s"] for r in rows),
        server_setup_s=statistics.median(r["server_setup_s"] for r in rows),
        client_setup_s=statistics.median(r["client_setup_s"] for r in rows),
        per_process=tuple(rows),
    )


if __name__ == "__main__":  # pragma: no cover - run as a child by fresh_reads
    sys.exit(main(sys.argv[1:]))
