"""The mix benchmark's client processes: each forked client (its own run-time, link
and port) makes its two filters where the pass's placement puts them and calls them in
a closed loop, counting per second what got done and where the filters were; the
parent forks them, hands each pass to all of them behind a barrier and collects their
results (:func:`client_processes`). The benchmark itself is :mod:`shuttle.bench.mix`."""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import multiprocessing.synchronize
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from shuttle.bench.mix_settings import HEAVY_MARK, KINDS, PARTIAL_PREFIX, MixSettings
from shuttle.client.model import NodeAddress
from shuttle.runtime.client import Runtime
from shuttle.runtime.config import RuntimeConfig

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
#: Times a pass is set up before the benchmark gives up on it. Setting up is not what
#: a pass measures (every client connects and makes its filters before the start), and
#: on a machine whose other processes starve the node, a few of 64 clients' handshakes
#: time out at the client's 5 s (8 attempts of one command failed so on 2026-11-29,
#: and 2 of 2 here, all in the setup of a split pass): every client is told and the
#: pass is set up again from the start, and the report counts the attempts.
SETUP_ATTEMPTS = 3
#: Memory each filter declares: small, so the node's memory never limits placement
#: here (its CPU does).
FILTER_MEMORY_BYTES = 1 << 20


class SetupFailed(Exception):
    """A client could not set up a pass (connect, make its filters), or another
    client's failure broke the barrier they wait at before the start: the pass has not
    begun, so it can be set up again (:data:`SETUP_ATTEMPTS`)."""


@dataclass(frozen=True)
class ClientSetup:
    """What every client process needs (inherited through fork)."""

    nodes: tuple[NodeAddress, ...]
    key: bytes | None
    #: The data key each client reads, by client index.
    keys: tuple[str, ...]
    settings: MixSettings


def filter_params(settings: MixSettings, kind: str) -> dict[str, Any]:
    cheap = kind == "cheap"
    return {
        "pass_fraction": settings.cheap_pass if cheap else settings.heavy_pass,
        "cpu_s_per_mb": settings.cheap_cpu_s_per_mb if cheap else settings.heavy_cpu_s_per_mb,
        "block_bytes": settings.block_bytes,
        "memory_bytes": FILTER_MEMORY_BYTES,
        "wrap": True,
    }


def at_node(placement: str, kind: str, index: int) -> bool:
    """Whether client ``index``'s filter of ``kind`` starts at the node in ``placement``."""
    if placement == "server":
        return True
    if placement.startswith(PARTIAL_PREFIX):
        cheap, _, heavy = placement.removeprefix(PARTIAL_PREFIX).partition(HEAVY_MARK)
        return index < int(cheap if kind == "cheap" else heavy or 0)
    return kind == "cheap" and placement == "split"


def one_pass(
    setup: ClientSetup,
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
    try:
        with gate:
            rt = Runtime(list(setup.nodes), key=setup.key, config=config)
    except Exception as exc:
        raise SetupFailed(f"{type(exc).__name__}: {exc}") from exc
    filters: dict[str, Any] = {}
    try:
        key = setup.keys[index]
        node = rt.node_for(key)
        with gate:
            for kind in KINDS:
                filters[kind] = rt.create(
                    "filter",
                    at=node if at_node(placement, kind, index) else None,
                    placement="auto" if placement == "adaptive" else "static",
                    storage=rt.storage(node),
                    key=key,
                    **filter_params(s, kind),
                )
            # Connect to the node now, a few clients at a time: a filter made at the
            # client would connect on its first read, and at share 0.75 the 48 past K
            # of split-16 doing so at the start's instant met a node already saturated
            # by the 16 hosted filters' calls, and timed out at 5 s in all 3 attempts.
            with rt.console("setup"):
                rt.storage(node).read(key, 0, 1)
        barrier.wait(PASS_TIMEOUT_S)  # every client is ready
    except Exception as exc:  # this client's setup, or another's (the barrier broke)
        # Nothing of this attempt left behind (its filters at the node, its run-time);
        # what fails in tidying up is the same starved node, and the attempt has failed.
        for f in filters.values():
            with contextlib.suppress(Exception):
                rt.destroy(f)
        with contextlib.suppress(Exception):
            rt.close()
        raise SetupFailed(f"{type(exc).__name__}: {exc}") from exc
    with rt:
        # Same sequence of kinds in every placement of a run, different per client.
        rng = random.Random(f"{s.seed}/{run}/{index}")
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
                mark_placed(rt, filters, placed, second)
                second += 1
        while second < seconds:
            mark_placed(rt, filters, placed, second)
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


def mark_placed(
    rt: Runtime, filters: dict[str, Any], placed: dict[str, list[int]], second: int
) -> None:
    """Record in ``placed`` which of ``filters`` are at the node as ``second`` ends."""
    for kind, f in filters.items():
        placed[kind][second] = 0 if rt.where(f) == rt.id else 1


def client_main(
    setup: ClientSetup,
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
                conn.send(one_pass(setup, index, placement, run, barrier, t_go, gate))
            except SetupFailed as exc:  # the parent may set the pass up again: stay
                barrier.abort()
                conn.send({"error": f"client {index}: {exc}", "setup": True})
            except BaseException as exc:  # the parent reports it; a child has no console
                barrier.abort()
                conn.send({"error": f"client {index}: {type(exc).__name__}: {exc}"})
                return
    finally:
        conn.close()


#: What :func:`client_processes` yields: ``run_pass(placement, run, started)`` →
#: (every client's result, the attempts its setup took).
RunPass = Callable[[str, int, Callable[[float], None]], tuple[list[dict[str, Any]], int]]


@contextlib.contextmanager
def client_processes(setup: ClientSetup) -> Iterator[tuple[RunPass, list[int]]]:
    """Fork the clients; yields ``(run_pass, pids)``: ``run_pass(placement, run,
    started)`` → every client's result and the attempts the pass's setup took
    (``started`` is called with the pass's start on the monotonic clock; a setup that
    failed is made again, up to :data:`SETUP_ATTEMPTS` in all), and the clients'
    process ids (whose CPUs :mod:`~shuttle.bench.mix_cpus` checks). Raises
    :class:`RuntimeError` naming the first client's error if a pass fails once
    started, or its setup fails every attempt."""
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
            target=client_main, args=(setup, i, child_end, barrier, t_go, gate), daemon=True
        )
        proc.start()
        child_end.close()
        pipes.append(parent_end)
        procs.append(proc)

    def run_pass(
        placement: str, run: int, started: Callable[[float], None]
    ) -> tuple[list[dict[str, Any]], int]:
        for attempt in range(1, SETUP_ATTEMPTS + 1):
            barrier.reset()  # nobody waits at it now; a failed setup left it broken
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
            # Every client answers every order, a failed setup at once: wait for all,
            # so that an answer is never read as the next attempt's.
            timeout = setup.settings.duration_s + PASS_TIMEOUT_S
            out = [p.recv() if p.poll(timeout) else {"error": "no answer"} for p in pipes]
            errors = [o["error"] for o in out if "error" in o]
            if not errors and not broken:
                return out, attempt
            first = next(
                (e for e in errors if "BrokenBarrier" not in e), errors[0] if errors else ""
            )
            failed = f"{len(errors)} of {n} mix clients failed in the {placement} pass"
            # Retried only if every client that failed did so setting up (a failed
            # setup breaks the barrier, so then every client did).
            if not (errors and all(o.get("setup") for o in out if "error" in o)):
                raise RuntimeError(
                    f"{failed}; first: {first or 'a client stopped without saying why'}"
                )
        raise RuntimeError(
            f"{failed} while setting it up, {SETUP_ATTEMPTS} times; the last time's "
            f"first: {first}. The node or the clients got too little CPU to connect "
            "within 5 s: run on a quieter machine, or with fewer --clients"
        )

    try:
        yield run_pass, [proc.pid for proc in procs if proc.pid is not None]
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
