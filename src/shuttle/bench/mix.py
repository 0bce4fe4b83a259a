"""``shuttle bench abacus mix``: placement for aggregate throughput under many clients.

ABACUS 6.7 has two applications compete for one node. At scale the question is the
one Bhardwaj, Kulkarni and Stutsman ask ("Adaptive Placement for In-memory Storage
Functions", USENIX ATC 2020): many clients run a mix of *cheap* functions, which should
run at the node and save the transfer, and *CPU-heavy* ones, which should run at their
clients so that they do not saturate the node. That paper reports +85 % aggregate
throughput over running every function at the server and +10 % over running every
function at the clients.

Here ``clients`` client processes (forked, each with its own run-time, its own
emulated link to the nodes and its own listening port) each make two filters over an
object on its node: a cheap one (passes ``cheap_pass`` of each block, burns
``cheap_cpu_s_per_mb``) and a heavy one (passes ``heavy_pass``, burns
``heavy_cpu_s_per_mb``), each called from its own console (so each is a stack the
node's resource manager sees). In a pass every client calls them in a closed loop for
``duration_s``, picking the cheap one with probability ``cheap_share`` (seeded per
client and run, the same sequence in every placement). Four placements, interleaved
run by run (every other run in the reverse order): every filter static at its client,
every filter static at the node, the oracle split (every cheap filter static at the
node, every heavy one at its client; ``split=False`` leaves it out), and adaptive (both
start at the client; the run-time moves them); with ``partial``, partial splits too
(the first K clients' cheap filters at the node): the best split of a run is the
ceiling. A pass reports the calls completed from ``warmup_s`` to its end (steady
state, the figure the target is read from) and over the whole pass, per kind, and
where each filter ended.

**Two cores.** The node runs on one CPU and every client on the other
(:func:`shuttle.bench.abacus.choose_cpus`), so the clients together have one core and
the node one. A node whose CPU is as fast as all its clients' together never
saturates before they do, which is not the case being asked about (many client
machines, one storage server): the node runs with ``--cpu-factor`` (default 0.05: its
objects burn twenty times the CPU for the same work), so the clients together have
twenty times its CPU. Links are per client (each client's run-time shapes its own
connections), as on a switched LAN where each machine has its own port: the LAN
profile's rate and latency with a deeper token bucket (:data:`LINK_DEFAULT`).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import multiprocessing.connection
import multiprocessing.synchronize
import os
import random
import re
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from shuttle.bench.abacus import Bench, Progress, bench_node, ci90
from shuttle.bench.stream import process_cpu_s
from shuttle.client.client import Client
from shuttle.client.model import NodeAddress
from shuttle.errors import ConfigError
from shuttle.net.profiles import parse_link_profile
from shuttle.runtime.client import Runtime
from shuttle.runtime.config import RuntimeConfig

#: The placements, in the order each run makes them. ``split`` is an oracle, not a
#: policy: it knows the kinds and puts every cheap filter at the node and every heavy
#: one at its client, the placement the adaptive run-time should find when the node
#: has the CPU for every cheap filter. ``split-K`` (``--partial K``, between ``split``
#: and ``adaptive``) puts only the first K clients' cheap filters at the node: when
#: the node saturates, all of them is not the best placement, and the best of the
#: splits a run makes is the ceiling adaptive is read against.
PLACEMENTS = ("client", "server", "split", "adaptive")
#: Prefix of the partial splits' placement names (``split-4``: four cheap filters at
#: the node).
PARTIAL_PREFIX = "split-"
#: The two kinds of function every client calls.
KINDS = ("cheap", "heavy")
#: More client processes than this measure the machine's process table, not placement.
CLIENTS_MAX = 256
#: Nodes the benchmark can spread the objects over (the issue asks for 1-3).
NODES_MAX = 3
#: How long a client may take to set up or finish a pass before the benchmark gives up
#: on it (64 clients making two objects each on a loaded core take a few seconds).
PASS_TIMEOUT_S = 300.0
#: Clients that set up a pass at once (connect their run-time, make their two filters):
#: 64 at once on a loaded machine left a node too starved to finish their handshakes
#: within the client's 5 s, and a pass's setup is not what the benchmark measures.
SETUP_AT_ONCE = 4
#: How long the clients get, all together, to close their run-times and exit after the
#: last pass before they are killed.
CLIENTS_STOP_S = 20.0
#: Memory each filter declares: small, so the node's memory never limits placement
#: here (its CPU does).
FILTER_MEMORY_BYTES = 1 << 20
#: The LAN profile's 10 Mbit/s and 0.5 ms with a 64 KiB token bucket: the default bucket
#: (1 ms of traffic, 1.25 KB) wakes a client's shaper 210 times per 256 KiB block, and
#: 16 to 64 clients sharing one core spent it on that (at 16 clients the client-side
#: CPU, not the links, bounded every placement). The rate is the same.
LINK_DEFAULT = "bw=10Mbit,lat=0.5ms,burst=64KiB"
#: Prefix of the data objects' keys (one per node).
DATA_PREFIX = "bench/mix-"
#: The many-clients rule's note on a node's queue and its arrivals, in the decision
#: log (runtime/placement_choice.py): the wait per call, stacks on their way, held back.
_QUEUE_NOTE = re.compile(
    r"waits ([0-9.]+) s a call beyond the model.*?; (\d+) stacks on their way there, "
    r"\d+ at most, (\d+) held back"
)


@dataclass
class MixSettings:
    """Everything ``shuttle bench abacus mix`` takes as a flag."""

    clients: int = 16
    cheap_share: float = 0.5
    nodes: int = 1
    link: str = LINK_DEFAULT
    runs: int = 3
    duration_s: float = 20.0
    warmup_s: float = 8.0
    window_s: float = 1.0
    threshold: float = 0.3
    #: The nodes scale each stack's B_thresh by its share of its client's time
    #: (``shuttle serve --threshold-share``; docs/runtime.md, "Many clients").
    threshold_share: bool = False
    block_bytes: int = 256 << 10
    object_bytes: int = 8 << 20
    cheap_pass: float = 0.05
    cheap_cpu_s_per_mb: float = 0.0002
    heavy_pass: float = 1.0
    heavy_cpu_s_per_mb: float = 0.008
    node_cpu_factor: float = 0.05
    seed: int = 1
    client_cpu: int | None = None
    node_cpu: int | None = None
    #: Where to copy the nodes' decision logs of every adaptive pass (None: nowhere).
    logs_dir: Path | None = None
    #: Also run the oracle ``split`` placement (:data:`PLACEMENTS`) in every run.
    split: bool = True
    #: Partial splits to run too: for each K, the first K clients' cheap filters at
    #: the node and every other filter at its client (``split-K``).
    partial: tuple[int, ...] = ()
    #: The nodes' limit on stacks on their way to them and not yet observed
    #: (``shuttle serve --arrivals-max``; None: the node's default).
    arrivals_max: int | None = None

    def placements(self) -> tuple[str, ...]:
        """The placements each run makes, in order: the uniform ones, the splits
        (every cheap filter at the node, then the partial ones), adaptive."""
        fixed = tuple(p for p in PLACEMENTS[:-1] if self.split or p != "split")
        partial = tuple(f"{PARTIAL_PREFIX}{k}" for k in self.partial)
        return (*fixed, *partial, PLACEMENTS[-1])

    def check(self) -> None:
        """Refuse settings that cannot make a meaningful run, saying which and why."""
        if not 1 <= self.clients <= CLIENTS_MAX:
            raise ConfigError(f"--clients must be 1..{CLIENTS_MAX}, got {self.clients}")
        if not 0.0 <= self.cheap_share <= 1.0:
            raise ConfigError(
                f"--cheap-share is the fraction of calls that are cheap, 0..1; "
                f"got {self.cheap_share!r}"
            )
        if not 1 <= self.nodes <= NODES_MAX:
            raise ConfigError(f"--nodes must be 1..{NODES_MAX}, got {self.nodes}")
        if not 0.0 <= self.warmup_s < self.duration_s:
            raise ConfigError(
                f"--warmup ({self.warmup_s:g} s) must be ≥ 0 and shorter than --duration "
                f"({self.duration_s:g} s): the steady state is measured after it"
            )
        for name, value in (("--cheap-pass", self.cheap_pass), ("--heavy-pass", self.heavy_pass)):
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"{name} is a fraction of each block, 0..1; got {value!r}")
        if self.block_bytes > self.object_bytes:
            raise ConfigError(
                f"--block-bytes ({self.block_bytes}) is larger than --object-bytes "
                f"({self.object_bytes}); make the object at least one block"
            )
        parse_link_profile(self.link)
        for k in self.partial:
            if not 1 <= k < self.clients:
                raise ConfigError(
                    f"--partial {k}: a partial split puts K of the {self.clients} clients' "
                    f"cheap filters at the node, so K must be 1..{self.clients - 1} "
                    "(0 is the all-at-client placement, every one the split)"
                )
        if self.arrivals_max is not None and self.arrivals_max < 0:
            raise ConfigError(f"--arrivals-max must be ≥ 0 (0: no limit), got {self.arrivals_max}")
        if len(set(self.partial)) != len(self.partial):
            raise ConfigError(f"--partial lists a K twice: {list(self.partial)}")


def parse_partial(text: str) -> tuple[int, ...]:
    """``--partial``'s value, ``"4,8,12"``, as (4, 8, 12); :class:`ConfigError` says
    what is wrong with anything else."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            out.append(int(part))
        except ValueError:
            raise ConfigError(
                f"--partial takes the numbers of cheap filters to put at the node, "
                f"comma-separated (e.g. 4,8,12); {part!r} is not a whole number"
            ) from None
    return tuple(out)


# --- one client process ------------------------------------------------------------------


@dataclass(frozen=True)
class _Setup:
    """What every client process needs (inherited through fork)."""

    nodes: tuple[NodeAddress, ...]
    key: bytes | None
    #: The data key each client reads, by client index.
    keys: tuple[str, ...]
    settings: MixSettings


def _filter_params(settings: MixSettings, kind: str) -> dict[str, Any]:
    cheap = kind == "cheap"
    return {
        "pass_fraction": settings.cheap_pass if cheap else settings.heavy_pass,
        "cpu_s_per_mb": settings.cheap_cpu_s_per_mb if cheap else settings.heavy_cpu_s_per_mb,
        "block_bytes": settings.block_bytes,
        "memory_bytes": FILTER_MEMORY_BYTES,
        "wrap": True,
    }


def _at_node(placement: str, kind: str, index: int) -> bool:
    """Whether client ``index``'s filter of ``kind`` starts at the node in ``placement``."""
    if placement == "server":
        return True
    if kind != "cheap":
        return False
    if placement == "split":
        return True
    if placement.startswith(PARTIAL_PREFIX):
        return index < int(placement.removeprefix(PARTIAL_PREFIX))
    return False


def _one_pass(
    setup: _Setup,
    index: int,
    placement: str,
    run: int,
    barrier: multiprocessing.synchronize.Barrier,
    t_go: Any,
    gate: multiprocessing.synchronize.Semaphore,
) -> dict[str, Any]:
    """One client's pass: make the filters (a few clients at a time: ``gate``), wait
    for everyone, call them for the pass's duration, and say what got done and where
    the filters ended."""
    s = setup.settings
    config = RuntimeConfig(window_s=s.window_s, threshold_fraction=s.threshold)
    with gate:
        rt = Runtime(list(setup.nodes), key=setup.key, config=config)
    with rt:
        key = setup.keys[index]
        node = rt.node_for(key)
        with gate:
            filters = {
                kind: rt.create(
                    "filter",
                    at=node if _at_node(placement, kind, index) else None,
                    placement="auto" if placement == "adaptive" else "static",
                    storage=rt.storage(node),
                    key=key,
                    **_filter_params(s, kind),
                )
                for kind in KINDS
            }
        # Same sequence of kinds in every placement of a run, different per client.
        rng = random.Random(f"{s.seed}/{run}/{index}")
        barrier.wait(PASS_TIMEOUT_S)  # every client is ready
        barrier.wait(PASS_TIMEOUT_S)  # the parent set the start
        t0 = float(t_go.value)
        steady_from, end = t0 + s.warmup_s, t0 + s.duration_s
        seconds = max(1, int(s.duration_s + 0.999))
        timeline = {kind: [0] * seconds for kind in KINDS}
        # Where each filter was as each second of the pass ended (1: at the node),
        # read from this client's own location table as the second's first call ends.
        placed = {kind: [0] * seconds for kind in KINDS}
        second = 0
        steady = dict.fromkeys(KINDS, 0)
        total = dict.fromkeys(KINDS, 0)
        while time.monotonic() < end:
            kind = "cheap" if rng.random() < s.cheap_share else "heavy"
            with rt.console(kind):
                filters[kind].next()
            now = time.monotonic()
            if now >= end:
                break  # finished after the pass: not counted
            total[kind] += 1
            if now >= steady_from:
                steady[kind] += 1
            timeline[kind][min(seconds - 1, int(now - t0))] += 1
            while second < min(seconds, int(now - t0)):
                _mark_placed(rt, filters, placed, second)
                second += 1
        while second < seconds:
            _mark_placed(rt, filters, placed, second)
            second += 1
        where = {
            kind: "client" if rt.where(f) == rt.id else "server" for kind, f in filters.items()
        }
        moves = {
            kind: sum(1 for e in rt.events if e.ok and e.rid == str(f.rid))
            for kind, f in filters.items()
        }
        for f in filters.values():
            rt.destroy(f)
    return {
        "steady": steady,
        "total": total,
        "timeline": timeline,
        "placed": placed,
        "where": where,
        "moves": moves,
    }


def _mark_placed(
    rt: Runtime, filters: dict[str, Any], placed: dict[str, list[int]], second: int
) -> None:
    """Record in ``placed`` which of ``filters`` are at the node as ``second`` ends."""
    for kind, f in filters.items():
        placed[kind][second] = 0 if rt.where(f) == rt.id else 1


def _client_main(
    setup: _Setup,
    index: int,
    conn: multiprocessing.connection.Connection,
    barrier: multiprocessing.synchronize.Barrier,
    t_go: Any,
    gate: multiprocessing.synchronize.Semaphore,
) -> None:
    """A forked client: runs the passes the parent asks for, one at a time, and sends
    each one's result (or its error) back; ends on ``None``."""
    try:
        while True:
            order = conn.recv()
            if order is None:
                return
            placement, run = order
            try:
                conn.send(_one_pass(setup, index, placement, run, barrier, t_go, gate))
            except BaseException as exc:  # the parent reports it; a child has no console
                barrier.abort()
                conn.send({"error": f"client {index}: {type(exc).__name__}: {exc}"})
                return
    finally:
        conn.close()


# --- the benchmark -----------------------------------------------------------------------


def _data_keys(bench: Bench, settings: MixSettings) -> list[str]:
    """One data object per node (client ``i`` reads node ``i mod nodes``'s): keys tried
    in order until each node holds one (rendezvous hashing decides where a key lives)."""
    node_ids = [n.node_id for n in bench.nodes]
    chosen: dict[str, str] = {}
    data = os.urandom(settings.object_bytes)
    plain = [NodeAddress(n.node_id, n.host, n.port) for n in bench.nodes]
    with Client(plain, key=bench.key) as c:
        for i in range(64 * len(node_ids)):
            key = f"{DATA_PREFIX}{i}"
            holder = c.node_for(key).node_id
            if holder in chosen:
                continue
            c.put(key, data)
            chosen[holder] = key
            if len(chosen) == len(node_ids):
                break
    if len(chosen) < len(node_ids):
        raise ConfigError(f"could not place a data object on every one of {node_ids}")
    ordered = [chosen[n] for n in node_ids]
    return [ordered[i % len(ordered)] for i in range(settings.clients)]


@contextlib.contextmanager
def _client_processes(
    setup: _Setup,
) -> Iterator[Callable[[str, int, Callable[[float], None]], list[dict[str, Any]]]]:
    """Fork the clients; yields ``run_pass(placement, run, started)`` → every client's
    result (``started`` is called with the pass's start on the monotonic clock)."""
    n = setup.settings.clients
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(n + 1)
    t_go = ctx.Value("d", 0.0)
    gate = ctx.Semaphore(SETUP_AT_ONCE)
    pipes: list[multiprocessing.connection.Connection] = []
    procs = []
    for i in range(n):
        parent_end, child_end = ctx.Pipe()
        proc = ctx.Process(
            target=_client_main, args=(setup, i, child_end, barrier, t_go, gate), daemon=True
        )
        proc.start()
        child_end.close()
        pipes.append(parent_end)
        procs.append(proc)

    def run_pass(
        placement: str, run: int, started: Callable[[float], None]
    ) -> list[dict[str, Any]]:
        for p in pipes:
            p.send((placement, run))
        broken = False
        try:
            barrier.wait(PASS_TIMEOUT_S)  # all ready
            t_go.value = time.monotonic()
            started(t_go.value)
            barrier.wait(PASS_TIMEOUT_S)  # go
        except threading.BrokenBarrierError:
            broken = True
        timeout = setup.settings.duration_s + PASS_TIMEOUT_S if not broken else 10.0
        out = [p.recv() if p.poll(timeout) else {"error": "no answer"} for p in pipes]
        errors = [o["error"] for o in out if "error" in o]
        if errors or broken:
            first = next(
                (e for e in errors if "BrokenBarrier" not in e), errors[0] if errors else ""
            )
            raise RuntimeError(
                f"{len(errors)} of {n} mix clients failed in the {placement} pass; first: "
                f"{first or 'a client stopped without saying why'}"
            )
        return out

    try:
        yield run_pass
    finally:
        # Clients waiting at the barrier (a pass cut short: Ctrl-C, SIGTERM, a failed
        # client) leave it at once; the others read the end of the orders.
        barrier.abort()
        for p in pipes:
            with contextlib.suppress(OSError, ValueError):
                p.send(None)
        deadline = time.monotonic() + CLIENTS_STOP_S
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(5.0)


def _node_cpu_s(bench: Bench) -> float:
    return sum(process_cpu_s(e.pid) for e in bench.cluster.nodes if e.pid is not None)


class _CpuTimeline:
    """The nodes' CPU busy in each second of a pass, read from /proc by a thread that
    wakes at each second's end (the pass's clock: ``started`` gives its start)."""

    def __init__(self, bench: Bench, seconds: int) -> None:
        self._bench = bench
        self._seconds = seconds
        self._busy: list[float] = []
        self._thread: threading.Thread | None = None

    def started(self, t0: float) -> None:
        self._thread = threading.Thread(target=self._run, args=(t0,), daemon=True)
        self._thread.start()

    def _run(self, t0: float) -> None:
        last = _node_cpu_s(self._bench)
        for i in range(1, self._seconds + 1):
            time.sleep(max(0.0, t0 + i - time.monotonic()))  # to the second's end
            now = _node_cpu_s(self._bench)
            self._busy.append(now - last)  # CPU seconds in a one-second interval
            last = now

    def result(self) -> list[float]:
        """The series (the pass is over: the thread has at most one second to go)."""
        if self._thread is not None:
            self._thread.join()
        return list(self._busy)


def _decision_logs(bench: Bench) -> list[Path]:
    return [e.data_dir / ".shuttle" / "runtime" / "placement.jsonl" for e in bench.cluster.nodes]


def _log_sizes(bench: Bench) -> list[int]:
    return [p.stat().st_size if p.exists() else 0 for p in _decision_logs(bench)]


def _kind_of(stack_id: str) -> str:
    """The kind of function a stack runs, from its console's name (``…/console-cheap``)."""
    return stack_id.rsplit("-", 1)[-1]


def _decisions(
    bench: Bench, since: Sequence[int], wall_s: float, keep: Path | None
) -> dict[str, Any]:
    """What the nodes' resource managers did in a pass, from their decision logs: how
    often they evaluated, the stacks they saw, and per kind the moves they made and
    the reasons of those they did not. ``keep``: also copy the pass's records there."""
    evaluations = 0
    stacks_max = 0
    made: dict[str, dict[str, int]] = {k: {"to_server": 0, "to_client": 0} for k in KINDS}
    refused: dict[str, dict[str, int]] = {k: {} for k in KINDS}
    #: Per kind and direction, the reasons of the moves made (numbers left out).
    why: dict[str, dict[str, int]] = {k: {} for k in KINDS}
    #: Per evaluation: the node's wait per call charged to arrivals, and the stacks on
    #: their way; and the candidates held back for them, in all.
    waits: list[float] = []
    on_way: list[int] = []
    held_back = 0
    for path, offset in zip(_decision_logs(bench), since, strict=True):
        if not path.exists():
            continue
        with open(path, "rb") as f:
            f.seek(offset)
            raw = f.read()
        lines = raw.splitlines()
        if keep is not None:
            keep.parent.mkdir(parents=True, exist_ok=True)
            keep.with_name(f"{keep.name}-{path.parents[2].name}.jsonl").write_bytes(raw)
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a torn last line
            evaluations += 1
            stacks_max = max(stacks_max, len(record.get("stacks", [])))
            for note in record.get("notes", []):
                found = _QUEUE_NOTE.search(str(note))
                if found:
                    waits.append(float(found.group(1)))
                    on_way.append(int(found.group(2)))
                    held_back += int(found.group(3))
            for move in record.get("moves", []):
                kind = _kind_of(str(move.get("stack", "")))
                if kind not in made:
                    continue
                # "net benefit 0.123 s ≤ B_thresh ..." → "net benefit ≤ B_thresh".
                reason = " ".join(
                    w
                    for w in str(move.get("reason", "")).split()
                    if not any(c.isdigit() for c in w)
                )
                if move.get("execute"):
                    direction = str(move.get("direction"))
                    made[kind][direction] += 1
                    key = f"{direction}: {reason}"
                    why[kind][key] = why[kind].get(key, 0) + 1
                else:
                    refused[kind][reason] = refused[kind].get(reason, 0) + 1
    return {
        "evaluations": evaluations,
        "evaluations_per_s": round(evaluations / wall_s, 2) if wall_s > 0 else None,
        "stacks_max": stacks_max,
        "moves_made": made,
        "moves_made_reasons": why,
        "moves_refused": refused,
        # The many-clients rule's arrivals (docs/runtime.md, "Many clients").
        "queue_s_per_call": _spread(waits),
        "arriving": _spread([float(x) for x in on_way]),
        "arrivals_held_back": held_back,
    }


def _spread(values: Sequence[float]) -> dict[str, float] | None:
    """Median and maximum (None: no value)."""
    if not values:
        return None
    return {"median": round(statistics.median(values), 4), "max": round(max(values), 4)}


def _pass_report(
    results: Sequence[dict[str, Any]],
    settings: MixSettings,
    node_cpu_s: float,
    wall_s: float,
    node_cpu_timeline: Sequence[float] = (),
) -> dict[str, Any]:
    steady_s = settings.duration_s - settings.warmup_s
    steady = {k: sum(r["steady"][k] for r in results) for k in KINDS}
    total = {k: sum(r["total"][k] for r in results) for k in KINDS}
    seconds = len(results[0]["timeline"]["cheap"])
    timeline = [sum(r["timeline"][k][i] for r in results for k in KINDS) for i in range(seconds)]
    return {
        "calls_per_s": round(sum(steady.values()) / steady_s, 3),
        "calls_per_s_whole": round(sum(total.values()) / settings.duration_s, 3),
        "steady_calls": steady,
        "total_calls": total,
        "timeline_calls_per_s": timeline,
        # Per second of the pass, the filters at the node as it ended (per kind), and
        # the node's CPU busy over it: what the throughput was made with.
        "timeline_at_server": {
            k: [sum(r["placed"][k][i] for r in results) for i in range(seconds)] for k in KINDS
        },
        "timeline_node_cpu_busy": [round(x, 3) for x in node_cpu_timeline],
        "at_server": {k: sum(1 for r in results if r["where"][k] == "server") for k in KINDS},
        "moves": {k: sum(r["moves"][k] for r in results) for k in KINDS},
        "node_cpu_busy": round(node_cpu_s / wall_s, 3) if wall_s > 0 else None,
    }


def _stats(samples: Sequence[float]) -> dict[str, Any]:
    return {
        "mean": round(statistics.fmean(samples), 3),
        "ci90": round(ci90(samples), 3),
        "runs": [round(x, 3) for x in samples],
    }


def run_mix_benchmark(settings: MixSettings, progress: Progress) -> dict[str, Any]:
    """The placements ``runs`` times each, interleaved; see the module docstring."""
    settings.check()
    link = parse_link_profile(settings.link)
    # Every stack here is decided only once its calls have returned (docs/runtime.md,
    # "Many clients": a heavy filter's half-finished window showed it free).
    node_args = ["--window", str(settings.window_s), "--threshold", str(settings.threshold)]
    node_args.append("--settle-calls")
    if settings.threshold_share:
        node_args.append("--threshold-share")
    if settings.arrivals_max is not None:
        node_args += ["--arrivals-max", str(settings.arrivals_max)]
    placements = settings.placements()
    passes: dict[str, list[dict[str, Any]]] = {p: [] for p in placements}
    with bench_node(
        link,
        size_bytes=settings.block_bytes,
        nodes=settings.nodes,
        cpu_factor=settings.node_cpu_factor,
        node_args=node_args,
        client_cpu=settings.client_cpu,
        node_cpu=settings.node_cpu,
    ) as bench:
        progress(f"writing the data and starting {settings.clients} client processes")
        setup = _Setup(tuple(bench.nodes), bench.key, tuple(_data_keys(bench, settings)), settings)
        with _client_processes(setup) as run_pass:
            for run in range(settings.runs):
                # Every other run in the reverse order: on a machine whose load drifts
                # (others' runs starting), the first placement of a run is not always
                # the one that ran on the quieter machine.
                for placement in placements if run % 2 == 0 else placements[::-1]:
                    progress(f"run {run + 1}/{settings.runs}: {placement}")
                    cpu0, wall0 = _node_cpu_s(bench), time.monotonic()
                    logged = _log_sizes(bench)
                    per_second = _CpuTimeline(bench, int(settings.duration_s + 0.999))
                    results = run_pass(placement, run, per_second.started)
                    cpu1, wall1 = _node_cpu_s(bench), time.monotonic()
                    report = _pass_report(
                        results, settings, cpu1 - cpu0, wall1 - wall0, per_second.result()
                    )
                    # The machine's 1-minute load average as the pass ended: what else
                    # ran beside the benchmark (it is shared), to read the figures by.
                    report["machine_load_1min"] = round(os.getloadavg()[0], 2)
                    if placement == "adaptive":
                        keep = (
                            None
                            if settings.logs_dir is None
                            else settings.logs_dir / f"run{run + 1}-adaptive"
                        )
                        report["decisions"] = _decisions(bench, logged, wall1 - wall0, keep)
                    passes[placement].append(report)
        placement_cpus = {"client_cpu": bench.client_cpu, "node_cpu": bench.node_cpu}
    return _report(settings, passes, placement_cpus)


def _report(
    settings: MixSettings, passes: dict[str, list[dict[str, Any]]], cpus: dict[str, Any]
) -> dict[str, Any]:
    placements = tuple(passes)
    rates = {p: [x["calls_per_s"] for x in passes[p]] for p in placements}
    means = {p: statistics.fmean(rates[p]) for p in placements}
    better = "client" if means["client"] >= means["server"] else "server"
    # Per run (the passes of a run are neighbours in time): adaptive over the better
    # static of that run, so drift between runs does not enter the ratio.
    per_run = [
        rates["adaptive"][i] / max(rates["client"][i], rates["server"][i], 1e-9)
        for i in range(settings.runs)
    ]
    last = passes["adaptive"][-1]
    n = settings.clients
    out: dict[str, Any] = {
        "experiment": "abacus-mix",
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(settings).items()},
        "cpus": cpus,
        "paper": {
            "source": "Bhardwaj, Kulkarni, Stutsman, Adaptive Placement for In-memory "
            "Storage Functions, USENIX ATC 2020",
            "adaptive_over_server": 1.85,
            "adaptive_over_client": 1.10,
        },
        "throughput": {p: round(means[p], 3) for p in placements},
        "throughput_runs": {p: _stats(rates[p]) for p in placements},
        "better_static": better,
        "adaptive_over_client": round(means["adaptive"] / max(means["client"], 1e-9), 3),
        "adaptive_over_server": round(means["adaptive"] / max(means["server"], 1e-9), 3),
        "adaptive_over_better_static": round(means["adaptive"] / max(means[better], 1e-9), 3),
        "adaptive_over_better_static_per_run": [round(x, 3) for x in per_run],
        "target_met": means["adaptive"] >= 1.10 * means[better],
        # Where each kind ended in the last adaptive pass: filters at the node, of n.
        "final_placement": {
            k: {"server": last["at_server"][k], "client": n - last["at_server"][k]} for k in KINDS
        },
        "passes": passes,
    }
    if "split" in passes:
        # The oracle: what the right placement gives here, per run against the better
        # static of the same run (the ceiling), and adaptive against it.
        out["split_over_better_static_per_run"] = [
            round(rates["split"][i] / max(rates["client"][i], rates["server"][i], 1e-9), 3)
            for i in range(settings.runs)
        ]
        out["split_over_better_static"] = round(means["split"] / max(means[better], 1e-9), 3)
        out["adaptive_over_split"] = round(means["adaptive"] / max(means["split"], 1e-9), 3)
        out["adaptive_over_split_per_run"] = [
            round(rates["adaptive"][i] / max(rates["split"][i], 1e-9), 3)
            for i in range(settings.runs)
        ]
    splits = [p for p in placements if p == "split" or p.startswith(PARTIAL_PREFIX)]
    if splits:
        out["ceiling"] = _ceiling(rates, splits, settings.runs)
    return out


def _ceiling(rates: dict[str, list[float]], splits: Sequence[str], runs: int) -> dict[str, Any]:
    """The best static split of each run (``split`` or a ``split-K``): the ceiling, per
    run against the better uniform placement of the same run, and adaptive against it.
    Per run, because the passes of a run are neighbours in time."""
    best = [max(splits, key=lambda p: rates[p][i]) for i in range(runs)]
    uniform = [max(rates["client"][i], rates["server"][i], 1e-9) for i in range(runs)]
    return {
        "placement_per_run": best,
        "calls_per_s_per_run": [round(rates[p][i], 3) for i, p in enumerate(best)],
        "over_better_static_per_run": [
            round(rates[p][i] / uniform[i], 3) for i, p in enumerate(best)
        ],
        "adaptive_over_ceiling_per_run": [
            round(rates["adaptive"][i] / max(rates[p][i], 1e-9), 3) for i, p in enumerate(best)
        ],
    }
