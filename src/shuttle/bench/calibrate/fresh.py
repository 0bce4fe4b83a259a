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

Before its reads, each process does what ``shuttle grep --placement server`` does
inside its timer (``apps/grep.py``: the run-time dials the node on its first call, the
object's making, after the timer starts; the command's ``stat`` of the keys before it
is another connection, closed by then): it makes the grep at the node from a run-time
that has not dialled yet (``made_s``: dial, authentication, the object's making), makes
a second one over the open connection (``create_s``: the making alone), and drains the
first as the console does, ``next`` until done, then ``progress``, timing each call and
the node's CPU over them. The dial as the timer sees it (``connect_s``) is the one less
the other; a process's first read is no longer the dial (it used to be taken for it,
and on wan it carried a first file three times the median: 0.24 s against a 0.064 s
dial, benchmarks/README.md).

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
#: Console calls (``next``) each fresh process makes at most to the grep it drains at
#: the node: a grep over 16 MB asks for 62 batches of 256 KiB; 256 of them, 64 MB.
FRESH_CONSOLE_CALLS = 256
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
    returned (the first is left out of the per-call figures: a process's first read
    pays its warming up), and the node's CPU and the process's own over the calls
    after the first."""

    starts: tuple[float, ...]
    walls: tuple[float, ...]
    sizes: tuple[int, ...]
    node_cpu_s: float
    client_cpu_s: float
    #: The console's calls to the grep drained at the node (``next`` until done, then
    #: ``progress``): each one's start and wall, the bytes of its answer, and the
    #: node's CPU over all of them.
    call_starts: tuple[float, ...] = ()
    call_walls: tuple[float, ...] = ()
    call_node_cpu_s: float = 0.0
    #: Making a grep at the node and asking where it is, over the open connection
    #: (``create_s`` in the module's words; started at ``create_start``), and the same
    #: at the client.
    server_setup_s: float = 0.0
    client_setup_s: float = 0.0
    #: Bytes of the arguments that made the object (its keys among them).
    create_bytes: int = 0
    #: The first making at the node, from a run-time that had not dialled the node:
    #: the dial, the authentication and the making, as ``shuttle grep`` times them.
    made_s: float = 0.0
    create_start: float = 0.0
    call_reply_bytes: tuple[int, ...] = ()

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
            "made_s": self.made_s,
            "create_start": self.create_start,
            "call_reply_bytes": list(self.call_reply_bytes),
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
            float(data.get("made_s", 0.0)),
            float(data.get("create_start", 0.0)),
            tuple(int(v) for v in data.get("call_reply_bytes", ())),
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
    program: dict[str, Any] | None = None,
) -> ProcessReads:
    """As ``shuttle grep --placement server`` inside its timer, from a run-time of
    this process that has not dialled ``node``: make a grep over the keys of ``spots``
    at the node (``program``: the program's grep options, its pattern among them;
    else the calibration's pattern), make a second one over the open connection, and
    drain the first (at most ``console_calls`` ``next`` calls, then ``progress``).
    Then read ``spots`` back to back over ``link`` until they are done or
    ``budget_s`` has passed, and make a grep at the client as ``shuttle grep
    --placement client`` does."""
    from shuttle.runtime import values
    from shuttle.runtime.client import Runtime

    node_cpu = node_cpu_clock(pid, node)
    starts: list[float] = []
    walls: list[float] = []
    sizes: list[int] = []
    call_starts: list[float] = []
    call_walls: list[float] = []
    call_replies: list[int] = []
    keys = list(dict.fromkeys(k for k, _, _ in spots))
    options = dict(program or {"pattern": REFERENCE_PATTERN})
    with Runtime.connect(cluster, link=link) as rt:
        storage = rt.storage(node)
        params: dict[str, Any] = {**options, "storage": storage, "keys": keys}
        create_bytes = len(values.pack(params))

        def make(site: str) -> tuple[Any, float, float]:
            t = time.perf_counter()
            ref = rt.create(
                "grep", at=node if site == "server" else None, placement="static", **params
            )
            rt.where(ref)
            return ref, t, time.perf_counter() - t

        grep, _, made_s = make("server")  # the dial is in it, as in shuttle grep's timer
        try:
            second, create_start, create_s = make("server")
            rt.destroy(second)
            with rt.console("calibrate-grep"):
                n0 = node_cpu()
                done = False
                while not done and len(call_walls) < max(1, console_calls):
                    t = time.perf_counter()
                    answer = grep.next()
                    call_walls.append(time.perf_counter() - t)
                    call_starts.append(t)
                    call_replies.append(len(values.pack(answer)))
                    done = bool(answer[0])
                t = time.perf_counter()
                answer = grep.progress()
                call_walls.append(time.perf_counter() - t)
                call_starts.append(t)
                call_replies.append(len(values.pack(answer)))
                call_node_s = node_cpu() - n0
        finally:
            rt.destroy(grep)
        with rt.console("calibrate"):

            def one(spot: Spot) -> None:
                t = time.perf_counter()
                data = storage.read(*spot)
                walls.append(time.perf_counter() - t)
                starts.append(t)
                sizes.append(len(data))

            one(spots[0])  # left out of the figures (the process's first read)
            n0, c0 = node_cpu(), time.process_time()
            started = time.perf_counter()
            for spot in spots[1:]:
                one(spot)
                if time.perf_counter() - started > budget_s:
                    break
            node_s, client_s = node_cpu() - n0, time.process_time() - c0
        at_client, _, client_setup_s = make("client")
        rt.destroy(at_client)
    return ProcessReads(
        tuple(starts),
        tuple(walls),
        tuple(sizes),
        node_s,
        client_s,
        tuple(call_starts),
        tuple(call_walls),
        call_node_s,
        create_s,
        client_setup_s,
        create_bytes,
        made_s,
        create_start,
        tuple(call_replies),
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
        request.get("program"),
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
    console_calls: int = FRESH_CONSOLE_CALLS,
    budget_s: float = FRESH_BUDGET_S,
    program: dict[str, Any] | None = None,
) -> list[ProcessReads]:
    """Replay ``spots`` in ``processes`` fresh processes, one after another (each as
    :func:`replay`; ``program``: the grep options of the program the reads are from).

    Raises :class:`ConfigError` when there is nothing to read or the node does not run
    here, and :class:`ShuttleError` (with the child's last line of error) when a
    process fails."""
    if len(spots) < 2:
        raise ConfigError(
            f"the per-call cost needs at least 2 reads to replay, not {len(spots)}: the "
            "first opens the connection; give `shuttle sim predict` at least 2 objects "
            "(more KEYS, or a prefix that holds more) or `shuttle sim calibrate` "
            "--calls 2 or more"
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
                    "program": program,
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
    #: A process's first read less its median (kept for the record: the dial used to
    #: be taken from it, but the first read's own size is in it too).
    first_read_extra_s: float
    wall_s: float
    per_process: tuple[dict[str, float], ...]

    def spread(self, name: str) -> float:
        values = [p[name] for p in self.per_process]
        middle = statistics.median(values)
        return (max(values) - min(values)) / abs(middle) if middle else math.inf

    def to_json(self) -> dict[str, Any]:
        names = ("node_cpu_s", "residual_s", "first_read_extra_s", "wall_s")
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
                "first_read_extra_s": run.walls[0] - statistics.median(run.walls[1:]),
                "wall_s": statistics.fmean(run.walls[1:]),
                # Does a process get faster as it goes (its first calls warming it)?
                "early_wall_s": statistics.fmean(run.walls[1 : 1 + EDGE_CALLS]),
                "late_wall_s": statistics.fmean(run.walls[-EDGE_CALLS:]),
            }
        )
    return PerCallCost(
        node_cpu_s=statistics.median(r["node_cpu_s"] for r in rows),
        residual_s=statistics.median(r["residual_s"] for r in rows),
        first_read_extra_s=statistics.median(r["first_read_extra_s"] for r in rows),
        wall_s=statistics.median(r["wall_s"] for r in rows),
        per_process=tuple(rows),
    )


@dataclass(frozen=True)
class ConsoleCallCost:
    """What ``shuttle grep --placement server`` pays inside its timer, over fresh
    processes, each figure the median over them: the dial (``connect_s``); making the
    object at the node beyond the model's call for it (``server_setup_s``) and at the
    client (``client_setup_s``); and per console call of the drain, the node's CPU
    (``node_cpu_s``: the object's work and the call's) and what is left of its wall
    besides the link and that CPU (``residual_s``)."""

    node_cpu_s: float
    residual_s: float
    server_setup_s: float
    client_setup_s: float
    connect_s: float
    #: The node's CPU over a whole drain, and its calls (the program's work at the node).
    drain_node_cpu_s: float
    calls: float
    per_process: tuple[dict[str, float], ...]

    def to_json(self) -> dict[str, Any]:
        names = (
            "node_cpu_s", "residual_s", "server_setup_s", "client_setup_s", "connect_s",
            "drain_node_cpu_s", "calls",
        )  # fmt: skip
        out: dict[str, Any] = {name: getattr(self, name) for name in names}
        out["per_process"] = list(self.per_process)
        return out


def console_call_cost(
    runs: Sequence[ProcessReads],
    profile: LinkProfile,
    request_bytes: float,
    reply_header_bytes: float,
    request_header_bytes: float = 0.0,
    call_cpu_s: float = 0.0,
) -> ConsoleCallCost | None:
    """The figures of each process's drain (None when no process drained): every call
    replayed through the link's buckets at its instant, with ``request_bytes`` up and
    ``reply_header_bytes`` plus its answer down, the node working the process's mean
    node CPU per call; the making replayed before them with ``request_header_bytes``
    plus the object's arguments up.

    ``connect_s``: the first making (from a run-time that had not dialled) less the
    second (over the open connection). ``server_setup_s``: the second making's wall
    beyond its link time, the call's residual and ``call_cpu_s`` (a call's own node
    CPU): the model charges the making as a console call with the arguments' bytes,
    and this is what it costs beyond such a call."""
    timed = [r for r in runs if r.call_walls and r.made_s > 0.0]
    if not timed:
        return None
    rows: list[dict[str, float]] = []
    for run in timed:
        n = len(run.call_walls)
        node_s = run.call_node_cpu_s / n
        replies = run.call_reply_bytes or (0,) * n
        residuals = call_residuals_s(
            (run.create_start, *run.call_starts),
            (run.server_setup_s, *run.call_walls),
            profile,
            [request_header_bytes + run.create_bytes] + [request_bytes] * n,
            [reply_header_bytes] + [reply_header_bytes + b for b in replies],
            [call_cpu_s] + [node_s] * n,
        )
        residual = statistics.fmean(residuals[1:])
        rows.append(
            {
                "calls": float(n),
                "node_cpu_s": node_s,
                "drain_node_cpu_s": run.call_node_cpu_s,
                "residual_s": residual,
                "connect_s": run.made_s - run.server_setup_s,
                "made_s": run.made_s,
                "create_s": run.server_setup_s,
                "server_setup_s": residuals[0] - residual,
                "client_setup_s": run.client_setup_s,
                "drain_wall_s": sum(run.call_walls),
            }
        )

    def median(name: str) -> float:
        return statistics.median(r[name] for r in rows)

    return ConsoleCallCost(
        node_cpu_s=median("node_cpu_s"),
        residual_s=median("residual_s"),
        server_setup_s=median("server_setup_s"),
        client_setup_s=median("client_setup_s"),
        connect_s=median("connect_s"),
        drain_node_cpu_s=median("drain_node_cpu_s"),
        calls=median("calls"),
        per_process=tuple(rows),
    )


@dataclass(frozen=True)
class ProgramGrep:
    """The program whose reads the processes replay, as a grep: its options (pattern,
    ``ignore_case``, ``block_bytes``, ``batch_bytes``) and its object's CPU in the
    recording (every gap but the console's, at speed 1)."""

    options: dict[str, Any]
    think_s: float
    #: Its console's calls after the making (``next`` ..., ``progress``; 0: unknown):
    #: a drain cut short by the processes' cap did that share of the work.
    calls: int = 0


def program_work(
    cost: ConsoleCallCost, call_cpu_s: float, program: ProgramGrep, factor: float
) -> dict[str, Any]:
    """The program's object at the node, from its drains: the node's CPU over a drain
    less each call's own (``call_cpu_s``) is the object's work there, its local reads
    included; per second of the object's recorded CPU, at the node's factor, that is
    ``mobile_server_cpu_ratio`` (stated at speed 1: times ``factor``), and the local
    reads cost nothing apart (they are in it). Measured on the program itself, where
    the hosted fit inferred it from three other objects' wall times (on the idle
    machine's table its ratio moved from 0.92 to 1.23 between rows, and the server
    placements at half and quarter speed came out 13-23 % short)."""
    work_s = max(0.0, cost.drain_node_cpu_s - cost.calls * call_cpu_s)
    done = min(1.0, cost.calls / program.calls) if program.calls else 1.0
    ratio_at_factor = work_s / (program.think_s * done)
    return {
        "program_work_node_cpu_s": work_s,
        "program_think_s": program.think_s,
        "mobile_server_cpu_ratio_at_factor": ratio_at_factor,
        "mobile_server_cpu_ratio": ratio_at_factor * factor,
        "local_read_cpu_per_request_s": 0.0,
        "local_read_cpu_per_block_s": 0.0,
    }


if __name__ == "__main__":  # pragma: no cover - run as a child by fresh_reads
    sys.exit(main(sys.argv[1:]))
