"""What durability costs a call (``shuttle bench durable``).

A durable object's changing call is answered only once its state is on its home's
disk (docs/runtime.md, "Durable objects"). This measures that price against the same
object made without ``durable``, call for call, in three places:

* **at its home** (a node): the run-time writes the record itself, one ``fdatasync``;
* **at another node**: one ``object.persist`` to the home over the nodes' network,
  which writes it;
* **at the client**: the same message over the client's link.

Each case makes a durable and a plain counter side by side and times the two in
interleaved rounds (so the machine's load falls on both alike), reporting the median
per-call time of each and the ratio durable / plain. A read (``readonly``) is timed
too: it writes nothing, so it should cost what the plain read does.
"""

from __future__ import annotations

import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shuttle.bench.session import scratch_dir
from shuttle.cluster import local
from shuttle.runtime.client import Runtime
from shuttle.runtime.mobile import MobileObject

#: Calls per round, and rounds per case (each round times both objects).
CALLS_PER_ROUND = 50
ROUNDS = 6


class BenchCounter(MobileObject):
    """A counter: ``add`` changes it (a write at a durable object's home), ``get``
    does not (``readonly``)."""

    readonly = frozenset({"get"})

    def __init__(self) -> None:
        self.n = 0

    def add(self) -> int:
        self.n += 1
        return self.n

    def get(self) -> int:
        return self.n


def _per_call_s(call: Callable[[], Any], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls


def run(
    *,
    calls: int = CALLS_PER_ROUND,
    rounds: int = ROUNDS,
    link: str | None = None,
    workdir: Path | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Two local nodes, and the cases above; returns the report."""
    scratch = scratch_dir("shuttle-bench-durable-", workdir)  # gone however the run ends
    report: dict[str, Any] = {"calls_per_round": calls, "rounds": rounds, "link": link}
    try:
        cluster = local.up(scratch / "cluster", nodes=2)
        try:
            assert cluster.path is not None
            with Runtime.connect(cluster=cluster.path, link=link) as rt:
                names = [n.node_id for n in rt.nodes]
                home, other = names[0], names[1]
                cases = {
                    "at_its_home": home,
                    "at_another_node": other,
                    "at_the_client": None,
                }
                out = {}
                for case, at in cases.items():
                    progress(case)
                    durable = rt.create(BenchCounter, at=at, home=home, durable=True)
                    plain = rt.create(BenchCounter, at=at, durable=False)
                    for ref in (durable, plain):  # warm: connections, workers
                        ref.add()
                        ref.get()
                    add_d, add_p, get_d, get_p = [], [], [], []
                    for _ in range(rounds):
                        add_d.append(_per_call_s(durable.add, calls))
                        add_p.append(_per_call_s(plain.add, calls))
                        get_d.append(_per_call_s(durable.get, calls))
                        get_p.append(_per_call_s(plain.get, calls))
                    med = statistics.median
                    out[case] = {
                        "changing_call_durable_us": round(med(add_d) * 1e6, 1),
                        "changing_call_plain_us": round(med(add_p) * 1e6, 1),
                        "changing_ratio": round(med(add_d) / med(add_p), 3),
                        "read_durable_us": round(med(get_d) * 1e6, 1),
                        "read_plain_us": round(med(get_p) * 1e6, 1),
                        "read_ratio": round(med(get_d) / med(get_p), 3),
                        "rounds_changing_ratio": [
                            round(d / p, 3) for d, p in zip(add_d, add_p, strict=True)
                        ],
                    }
                    rt.destroy(durable)
                    rt.destroy(plain)
                report["cases"] = out
        finally:
            local.down(cluster)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return report
