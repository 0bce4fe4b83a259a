"""The calibration's phases against a live node: the objects it reads, the timed
reads and console calls, the header bytes, the disk, opening a connection.

Each phase measures one thing the model needs and returns plain figures; the fit of
the hosted costs is :mod:`~shuttle.bench.calibrate.hosted`, the reads timed in fresh
processes :mod:`~shuttle.bench.calibrate.fresh`, the order of the phases
:mod:`~shuttle.bench.calibrate.run`.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import secrets
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from shuttle.bench.calibrate.timing import Timed, timed_calls
from shuttle.bench.corpus import CorpusSpec, generate_corpus
from shuttle.client.client import Client
from shuttle.errors import ConfigError
from shuttle.net.profiles import LinkProfile
from shuttle.runtime.client import Runtime
from shuttle.runtime.refs import Ref

#: Reads of these sizes time the node's cost per request and per byte: one block,
#: and a grep's default read (``objects.lines.BLOCK_BYTES_DEFAULT``).
SMALL_BYTES = 512
LARGE_BYTES = 64 << 10
#: On a shaped link a call may take most of a second (64 KiB at 1 Mbit/s); the
#: message measurements there stop after this much wall time per size.
LINK_BUDGET_S = 4.0
#: ... and the larger read there moves at most this much of the link's time.
LINK_READ_S = 0.05
#: The corpus of the ``think`` reference workload (below).
RATIO_CORPUS = CorpusSpec(files=48, median_bytes=16384, sigma=0.5, seed=7)
#: Fresh run-times whose first call times opening a connection.
CONNECT_SAMPLES = 3
#: Bytes of the object read cold for the disk figures (64 KiB reads).
DISK_BYTES = 4 << 20
#: A link profile that shapes nothing measurable but counts bytes.
COUNTING_LINK = "bw=1000Gbit,lat=0ms"


def key_on(client: Client, node: str, prefix: str, name: str) -> str:
    """A key under ``prefix`` that the cluster places on ``node``."""
    for i in range(10_000):
        key = f"{prefix}{name}-{i}"
        if client.node_for(key).node_id == node:
            return key
    raise ConfigError(f"found no key that lands on node {node}")  # pragma: no cover


@contextlib.contextmanager
def calibration_objects(
    client: Client, node: str, sizes: dict[str, int]
) -> Iterator[dict[str, str]]:
    """Calibration objects of the given sizes on ``node``, removed afterwards."""
    prefix = f".shuttle-calibrate/{secrets.token_hex(4)}/"
    keys = {name: key_on(client, node, prefix, name) for name in sizes}
    try:
        for name, size in sizes.items():
            client.put(keys[name], (b"shuttle calibrates a node.\n" * (size // 27 + 1))[:size])
        yield keys
    finally:
        for key in keys.values():
            with contextlib.suppress(Exception):
                client.remove(key)


def drain(ref: Ref) -> None:
    done = False
    while not done:
        done, _ = ref.next()


#: The reference workloads: each makes one of the hosted costs dominate, so the three
#: are well told apart. ``think``: count of the lines matching a vowel over small files
#: (its Python work per line dominates); ``requests``: a grep over many tiny objects
#: (a local read each); ``bytes``: a grep over one large object (64 KiB reads). The
#: greps' pattern never matches generated text (no word repeats a letter ten times).
REFERENCE_PATTERN = "qqqqqqqqqq"
THINK_PATTERN = "[aeiou]"
TINY_OBJECTS = 400
TINY_BYTES = 64


@contextlib.contextmanager
def workloads(client: Client, node: str) -> Iterator[dict[str, list[str]]]:
    """The reference workloads' objects on ``node`` (``bytes`` is added by the caller),
    removed afterwards."""
    prefix = f".shuttle-calibrate/{secrets.token_hex(4)}/"
    made: list[str] = []
    work: dict[str, list[str]] = {"think": [], "requests": []}
    try:
        for i, (_name, data) in enumerate(generate_corpus(RATIO_CORPUS)):
            key = key_on(client, node, prefix + "think/", f"{i:04d}")
            client.put(key, data)
            made.append(key)
            work["think"].append(key)
        tiny = b"calibrate\n" * (TINY_BYTES // 10)
        for i in range(TINY_OBJECTS):
            key = key_on(client, node, prefix + "tiny/", f"{i:04d}")
            client.put(key, tiny)
            made.append(key)
            work["requests"].append(key)
        yield work
    finally:
        with contextlib.suppress(Exception):
            client.remove_many(made)


#: Where the timed reads read: ``(keys, bytes of each object, bytes per read)``. The
#: reads go round the keys, and through each key's bytes, so each touches other data
#: as a program's do (one key read again and again is faster than a program's reads:
#: hot in every cache).
ReadSources = dict[str, tuple[list[str], int, int]]


def read_sources(work: dict[str, list[str]], keys: dict[str, str], large: int) -> ReadSources:
    return {
        "small": (work["requests"], TINY_BYTES, TINY_BYTES),
        "large": ([keys["blocks"]], DISK_BYTES, large),
    }


def timed_reads(
    rt: Runtime,
    node: str,
    sources: ReadSources,
    node_cpu: Callable[[], float],
    *,
    link: LinkProfile | None,
    calls: int,
) -> dict[str, Timed]:
    """Timed reads of each source, round its keys and through their bytes."""
    storage = rt.storage(node)
    out = {}
    budget = LINK_BUDGET_S if link is not None and not link.is_unshaped else None
    with rt.console("calibrate"):
        for name, (names, object_bytes, size) in sources.items():
            spots = [(k, offset) for k in names for offset in range(0, object_bytes, size)]

            read = round_robin(storage, spots, size)
            out[name] = timed_calls(read, node_cpu, calls=calls, budget_s=budget)
    return out


def round_robin(storage: Ref, spots: list[tuple[str, int]], size: int) -> Callable[[], Any]:
    """A read of ``size`` bytes at the next of ``spots`` (key, offset), round and round."""
    turn = itertools.count()

    def read() -> Any:
        key, offset = spots[next(turn) % len(spots)]
        return storage.read(key, offset, size)

    return read


def link_large_bytes(link: LinkProfile) -> int:
    """The larger read timed on a link: 64 KiB, or what the link moves in
    :data:`LINK_READ_S` if less (a 1 Mbit/s link takes half a second for 64 KiB)."""
    rate = link.bandwidth_bytes_per_s
    if rate is None:
        return LARGE_BYTES
    return max(2 * SMALL_BYTES, min(LARGE_BYTES, int(rate * LINK_READ_S)))


def timed_console_calls(
    rt: Runtime,
    node: str,
    node_cpu: Callable[[], float],
    *,
    link: LinkProfile | None,
    calls: int,
) -> Timed:
    grep = rt.create(
        "grep", at=node, placement="static", pattern="x", storage=rt.storage(node), keys=[]
    )
    budget = LINK_BUDGET_S if link is not None and not link.is_unshaped else None
    try:
        with rt.console("calibrate"):
            return timed_calls(grep.progress, node_cpu, calls=calls, budget_s=budget)
    finally:
        rt.destroy(grep)


def header_bytes(rt: Runtime, node: str, keys: dict[str, str]) -> dict[str, float]:
    """Bytes a read's request and reply carry besides the data, and a console call's,
    from the shaped connection's counters."""
    from shuttle.runtime import values

    storage = rt.storage(node)
    n = 20
    with rt.console("calibrate"):
        storage.read(keys["small"], 0, LARGE_BYTES)  # the connection exists from here
        link = rt.peers.connection(node).link
        if link is None:  # pragma: no cover - the counting profile always shapes
            raise ConfigError("the counting link was not shaped")
        up0, down0 = link.up.counters.bytes, link.down.counters.bytes
        for _ in range(n):
            storage.read(keys["small"], 0, LARGE_BYTES)
        up, down = link.up.counters.bytes - up0, link.down.counters.bytes - down0
        grep = rt.create("grep", at=node, placement="static", pattern="x", storage=storage, keys=[])
        try:
            result = grep.progress()
            up1, down1 = link.up.counters.bytes, link.down.counters.bytes
            for _ in range(n):
                grep.progress()
            call_up = link.up.counters.bytes - up1
            call_down = link.down.counters.bytes - down1
        finally:
            rt.destroy(grep)
    request = up / n
    reply = down / n - SMALL_BYTES
    args = len(values.pack([[], {}]))
    answer = len(values.pack(result))
    call_request = call_up / n - args
    call_reply = call_down / n - answer
    return {
        "read_request_header_bytes": request,
        "read_reply_header_bytes": reply,
        "call_request_header_bytes": call_request,
        "call_reply_header_bytes": call_reply,
        "request_header_bytes": (request + call_request) / 2,
        "reply_header_bytes": (reply + call_reply) / 2,
        "call_request_bytes": float(args),
        "call_reply_bytes": float(answer),
    }


def disk_figures(client: Client, key: str) -> dict[str, Any]:
    """Reads of ``key`` 64 KiB at a time through the node, cold (the node's block cache
    and the page cache of its file dropped: ``Client.drop_caches``) against warm: the
    disk's time per read."""
    reads = DISK_BYTES // LARGE_BYTES

    def read_all() -> float:
        started = time.perf_counter()
        for offset in range(0, DISK_BYTES, LARGE_BYTES):
            client.read(key, offset, LARGE_BYTES)
        return time.perf_counter() - started

    warm = min(read_all() for _ in range(2))
    client.drop_caches([key])
    cold = read_all()
    per_read = max(0.0, (cold - warm) / reads)
    return {
        "reads": reads,
        "warm_s": warm,
        "cold_s": cold,
        "per_read_s": per_read,
        "seek_s": 0.0,
        "bandwidth_bytes_per_s": LARGE_BYTES / per_read if per_read > 0 else math.inf,
    }


def connect_s(cluster: Path, link: str | None, node: str, key: str) -> float:
    """What a program's first call to the node costs beyond a later one: dialling,
    the challenge and the proof (median of a few fresh run-times)."""
    firsts, laters = [], []
    for _ in range(CONNECT_SAMPLES):
        with Runtime.connect(cluster, link=link) as rt:
            storage = rt.storage(node)
            with rt.console("calibrate"):
                t = time.perf_counter()
                storage.read(key, 0, SMALL_BYTES)
                firsts.append(time.perf_counter() - t)
                for _ in range(3):
                    t = time.perf_counter()
                    storage.read(key, 0, SMALL_BYTES)
                    laters.append(time.perf_counter() - t)
    return max(0.0, statistics.median(firsts) - statistics.median(laters))
