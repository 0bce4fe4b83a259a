"""``shuttle bench jail``: what the jail costs, and whether a built-in's worst pattern
can hold up other clients.

Three measurements, each against its anchor in the same run, interleaved (the machine
is shared, so absolute times drift; the ratios are what to read):

* **start-up**: create a shipped object and make its first call (create → first
  call), on a node that jails shipped code against one started with
  ``--unsafe-code`` (today's worker: a subprocess with rlimits);
* **the ABACUS filter, configuration 1** (high selectivity, low CPU; section 6.3):
  the synthetic filter *shipped* as a user's class, placed statically at the node,
  jailed against unjailed (target: within 5 %);
* **the worst patterns** for ``grep`` (the built-in, RE2): while a grep runs each over
  an object, another client's 1 KiB put and get to the same node, timed, against the
  same put/get on the quiet node (target: every one within 50 ms).

Figures are printed and written as JSON (docs/security.md, *The jail*, has the last).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from shuttle.bench.session import scratch_dir
from shuttle.client.client import Client
from shuttle.client.model import NodeAddress
from shuttle.cluster import local
from shuttle.net.profiles import parse_link_profile
from shuttle.objects.filter import SyntheticFilter
from shuttle.runtime.client import Runtime
from shuttle.runtime.mobile import MobileObject

Progress = Callable[[str], None]

#: Patterns that cost a backtracking engine exponential time, or RE2 its most (a DFA
#: that does not fit its cache falls back to the slower NFA simulation).
WORST_PATTERNS = ("(a+)+$", "(x+x+)+y", "(a|aa)+$", "[ab]*a[ab]{20}c", "(.*a){12}")
#: The 50 ms target for another client's put and get while a pattern runs.
SERVE_TARGET_S = 0.05


@dataclass
class JailBenchSettings:
    """Everything ``shuttle bench jail`` takes as a flag."""

    starts: int = 20
    filter_runs: int = 3
    filter_bytes: int = 16 << 20
    link: str = "lan"
    grep_bytes: int = 16 << 20
    puts: int = 200


class Ping(MobileObject):
    """The smallest shipped class: one call that does nothing."""

    def ping(self) -> str:
        return "pong"


# Shipped as a user's script ships its classes, by value: a class of Shuttle's own
# modules travels by reference, and the worker would import this module (and the
# client, the cluster code...) to load it, which is not what start-up should measure.
Ping.__module__ = "__main__"


class ShippedFilter(SyntheticFilter):
    """ABACUS's synthetic filter as a user's class: shipped, so it runs in the sandbox."""


@contextlib.contextmanager
def _node(scratch: Path, name: str, args: list[str]) -> Iterator[tuple[NodeAddress, bytes | None]]:
    cluster = local.up(scratch / name, nodes=1, name=name, node_args=args)
    try:
        (address,) = cluster.addresses()
        yield address, cluster.key()
    finally:
        local.down(cluster)


def run(settings: JailBenchSettings, progress: Progress) -> dict[str, Any]:
    """All three measurements (module docstring) on two fresh one-node clusters."""
    scratch = scratch_dir("shuttle-bench-jail-")
    report: dict[str, Any] = {"experiment": "jail", "settings": asdict(settings)}
    try:
        with (
            _node(scratch, "jailed", []) as (jailed, jailed_key),
            _node(scratch, "unsafe", ["--unsafe-code"]) as (unsafe, unsafe_key),
        ):
            sides = {"jail": (jailed, jailed_key), "unjailed": (unsafe, unsafe_key)}
            report["startup"] = _startup(sides, settings, progress)
            report["filter_config_1"] = _filter(sides, settings, progress)
            report["worst_patterns"] = _patterns(jailed, jailed_key, settings, progress)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return report


def _startup(
    sides: dict[str, tuple[NodeAddress, bytes | None]],
    settings: JailBenchSettings,
    progress: Progress,
) -> dict[str, Any]:
    times: dict[str, list[float]] = {side: [] for side in sides}
    runtimes = {side: Runtime([address], key=key) for side, (address, key) in sides.items()}
    try:
        for i in range(settings.starts):
            for side, rt in runtimes.items():  # interleaved
                progress(f"start-up {i + 1}/{settings.starts}: {side}")
                start = time.perf_counter()
                obj = rt.create(Ping, at=sides[side][0].node_id, placement="static")
                assert obj.ping() == "pong"
                times[side].append(time.perf_counter() - start)
                rt.destroy(obj)
    finally:
        for rt in runtimes.values():
            rt.close()
    out: dict[str, Any] = {side: _stats(samples) for side, samples in times.items()}
    out["ratio_median"] = round(out["jail"]["median_s"] / out["unjailed"]["median_s"], 3)
    out["extra_median_s"] = round(out["jail"]["median_s"] - out["unjailed"]["median_s"], 4)
    return out


def _filter(
    sides: dict[str, tuple[NodeAddress, bytes | None]],
    settings: JailBenchSettings,
    progress: Progress,
) -> dict[str, Any]:
    from shuttle.bench.abacus import CPU_RATIO_LOW, DATA_KEY, cpu_s_per_mb

    link = parse_link_profile(settings.link)
    per_mb = cpu_s_per_mb(CPU_RATIO_LOW, link)
    data = os.urandom(settings.filter_bytes)
    for address, key in sides.values():
        with Client([address], key=key) as client:
            client.put(DATA_KEY, data)
    times: dict[str, list[float]] = {side: [] for side in sides}
    for i in range(settings.filter_runs):
        for side, (address, key) in sides.items():
            progress(f"filter config 1, run {i + 1}/{settings.filter_runs}: {side}")
            shaped = NodeAddress(address.node_id, address.host, address.port, link)
            with Runtime([shaped], key=key) as rt:
                start = time.perf_counter()
                f = rt.create(
                    ShippedFilter,
                    at=address.node_id,
                    placement="static",
                    storage=rt.storage(address.node_id),
                    key=DATA_KEY,
                    pass_fraction=0.2,
                    cpu_s_per_mb=per_mb,
                    block_bytes=64 << 10,
                )
                with rt.console("filter"):
                    while f.next():
                        pass
                times[side].append(time.perf_counter() - start)
                rt.destroy(f)
    out: dict[str, Any] = {side: _stats(samples) for side, samples in times.items()}
    out["ratio_mean"] = round(out["jail"]["mean_s"] / out["unjailed"]["mean_s"], 4)
    out["pairs"] = [round(j / u, 4) for j, u in zip(times["jail"], times["unjailed"], strict=True)]
    out["link"] = link.name
    return out


def _patterns(
    address: NodeAddress, key: bytes | None, settings: JailBenchSettings, progress: Progress
) -> dict[str, Any]:
    # Text a backtracking engine chokes on: long runs of a, x and ab, lines of 64 KiB.
    line = (b"a" * 20000 + b"x" * 20000 + b"ab" * 12000 + b"!")[: 64 << 10]
    text = (line + b"\n") * max(1, settings.grep_bytes // (len(line) + 1))
    out: dict[str, Any] = {"text_bytes": len(text), "target_s": SERVE_TARGET_S}
    with Client([address], key=key) as client, Runtime([address], key=key) as rt:
        client.put("jail-bench/text", text)
        out["quiet"] = _stats(_put_gets(client, settings.puts, lambda: True))
        worst = 0.0
        for pattern in WORST_PATTERNS:
            progress(f"grep {pattern!r} while another client puts and gets")
            grep = rt.create(
                "grep",
                at=address.node_id,
                placement="static",
                pattern=pattern,
                storage=rt.storage(address.node_id),
                keys=["jail-bench/text"],
            )
            done = threading.Event()
            scanned = [0.0]
            searching = threading.Thread(target=_scan, args=(grep, scanned, done))
            searching.start()
            samples = _put_gets(client, settings.puts, functools.partial(_going, done))
            searching.join()
            rt.destroy(grep)
            stats = _stats(samples) if samples else {}
            stats["grep_s"] = round(scanned[0], 3)
            stats["grep_mb_per_s"] = round(len(text) / (1 << 20) / max(scanned[0], 1e-9), 1)
            out[pattern] = stats
            if samples:
                worst = max(worst, max(samples))
        out["worst_put_get_s"] = round(worst, 4)
        out["within_target"] = worst <= SERVE_TARGET_S
    return out


def _going(done: threading.Event) -> bool:
    return not done.is_set()


def _scan(grep: Any, scanned: list[float], done: threading.Event) -> None:
    start = time.perf_counter()
    while not grep.next()[0]:
        pass
    scanned[0] = time.perf_counter() - start
    done.set()


def _put_gets(client: Client, count: int, going: Callable[[], bool]) -> list[float]:
    """Up to ``count`` 1 KiB put + get pairs while ``going()``, each timed."""
    data = os.urandom(1024)
    samples = []
    for i in range(count):
        if not going():
            break
        start = time.perf_counter()
        client.put(f"jail-bench/small{i % 8}", data)
        client.get(f"jail-bench/small{i % 8}")
        samples.append(time.perf_counter() - start)
    return samples


def _stats(samples: list[float]) -> dict[str, Any]:
    ordered = sorted(samples)
    return {
        "n": len(samples),
        "median_s": round(statistics.median(ordered), 5),
        "mean_s": round(statistics.fmean(ordered), 5),
        "p99_s": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 5),
        "max_s": round(ordered[-1], 5),
        "spread": round((ordered[-1] - ordered[0]) / max(statistics.median(ordered), 1e-9), 3),
    }
