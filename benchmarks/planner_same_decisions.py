"""Same decisions before and after a refactor of the planner: random digests through
the resource manager of whichever shuttle is first on ``sys.path``, every decision
and every decision-log record (less its wall-clock stamp) printed as JSON lines.
Run once per tree and compare the files; they must be byte for byte the same.

    mkdir -p /tmp/base && cp -a src /tmp/base/       # with the compiled .so files
    for f in $(git diff --name-only BASE HEAD -- src); do   # the tree before the change
      git show BASE:$f > /tmp/base/$f 2>/dev/null || rm /tmp/base/$f; done
    PYTHONPATH=/tmp/base/src .venv/bin/python benchmarks/planner_same_decisions.py \\
        --seed 7 --scenarios 2000 > /tmp/base.jsonl
    .venv/bin/python benchmarks/planner_same_decisions.py --seed 7 --scenarios 2000 \\
        > /tmp/new.jsonl
    cmp /tmp/base.jsonl /tmp/new.jsonl

It speaks both resource-manager interfaces: the one that took a whole
``BindingManager`` and dict digests (before issue 23's "planner's input as data") and
the one that takes the node's id, its peers and its location table and a ``Digest``.
Scenarios: one to three clients, each a console calling one to three mobile objects
down to the node's storage or isolation object, split anywhere (objects past the
split hosted at the node), with random CPU, bytes, calls, stalls, links, speeds,
loads, moved and failed ages, checkpoint sizes, memory limits and thresholds, and
sometimes a fan-out to another node. Each scenario counts what it decided on stderr.
Not a timing: the decisions are exact, so there is no noise to state.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import random
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from shuttle.runtime.binding import BindingManager
from shuttle.runtime.config import RuntimeConfig
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.mobile import MobileObject
from shuttle.runtime.monitor import ResourceMonitor
from shuttle.runtime.peers import Peers
from shuttle.runtime.planner import ResourceManager
from shuttle.testing import FakeClock

#: The interface after issue 23 (a pure planner_input module beside the planner).
TYPED = importlib.util.find_spec("shuttle.runtime.planner_input") is not None


class Anchor(MobileObject):
    """Stands in for an object hosted at the node (only its id is read)."""

    anchored = True
    migratable = False


def client_side(rng: random.Random, client: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A client's digest, and the digest entries of its objects hosted at the node."""
    console = f"{client}/console-{rng.randrange(3)}"
    mids = [f"{client}/o-{i}" for i in range(rng.randint(1, 3))]
    end = rng.choice(["n1/storage", "n1/storage", "n1/isolation"])
    split = rng.randint(0, len(mids))
    span = rng.choice([0.25, 0.5, 1.0, 1.0])
    at_client: list[dict[str, Any]] = []
    at_node: list[dict[str, Any]] = []
    for i, rid in enumerate(mids):
        (at_client if i < split else at_node).append(
            {
                "rid": rid,
                "type": "t",
                "cpu_s": rng.expovariate(1 / 0.05) * span,
                "calls": rng.randint(0, 50),
                "memory_bytes": rng.choice([0, 1000, 1 << 20]),
                "movable": rng.random() < 0.9,
                "checkpoint_bytes": rng.choice([0, 200, 30_000, 1 << 20]),
                "moved_age_s": rng.choice([None, None, 1.0, 10.0]),
                "failed_age_s": rng.choice([None, None, 3.0, 20.0]),
                "failures": rng.randint(0, 3),
                "active_s": rng.choice([None, None, 0.1]),
            }
        )
    chain = [console, *mids, end]
    edges = [
        {
            "caller": a,
            "callee": b,
            "bytes": rng.expovariate(1 / 500_000) * span,
            "calls": rng.randint(1, 40),
            "stall_s": rng.random() * 0.3 * span,
            "far_s": rng.random() * 0.05 * span,
            "remote": True,
            "active_s": rng.choice([None, None, 0.2]),
        }
        for a, b in itertools.pairwise(chain)
    ]
    if rng.random() < 0.3:  # a fan-out to another node's storage
        edges.append(
            {
                "caller": mids[-1],
                "callee": "n2/storage",
                "bytes": rng.random() * 400_000,
                "calls": 5,
                "remote": True,
            }
        )
    link = {
        "name": "lan",
        "bandwidth_bytes_per_s": rng.choice([1.25e6, 1.25e5, 1.25e7, None]),
        "latency_s": rng.choice([0.0005, 0.02]),
    }
    digest = {
        "runtime": client,
        "speed": rng.choice([1.0, 0.5, 2.0]),
        "load": rng.random() * 2,
        "span_s": span,
        "objects": at_client,
        "edges": edges,
        "consoles": [console],
        "links": {"n1": link},
        "quiesce_s": rng.choice([None, 0.02]),
    }
    return digest, at_node


def manager(
    bm: BindingManager, config: RuntimeConfig, local_raw: dict[str, Any], memory: int | None
) -> Any:
    clock = FakeClock(100.0)
    if TYPED:
        from shuttle.runtime.digest import Digest

        local = Digest.parse(local_raw)
        rm: Any = ResourceManager(  # type: ignore[call-arg]
            "n1",  # type: ignore[arg-type]
            config,
            peers=bm.peers,
            locations=bm.table,
            local_digest=lambda: local,
            memory_capacity_bytes=memory,
            clock=clock.now,
        )
    else:
        from shuttle.runtime import digest as old

        parsed = old.parse_digest(local_raw)  # type: ignore[attr-defined]
        rm = ResourceManager(
            bm,  # type: ignore[arg-type]
            config,
            local_digest=lambda: parsed,
            memory_capacity_bytes=memory,
            clock=clock.now,
        )
    return rm, clock


def run(seed: int, scenarios: int) -> dict[str, int]:
    rng = random.Random(seed)
    counts = {"evaluations": 0, "decisions": 0, "local_moves": 0}
    for k in range(scenarios):
        config = RuntimeConfig(threshold_fraction=rng.choice([0.3, 0.15]))
        with ThreadPoolExecutor(1) as pool:
            bm = BindingManager(
                "n1", config=config, peers=Peers(), monitor=ResourceMonitor(1.0), executor=pool
            )
            clients = [client_side(rng, f"c{j}") for j in range(rng.randint(1, 3))]
            here = [o for _, objs in clients for o in objs]
            for o in here:
                bm.host_anchored(ObjectId.parse(o["rid"]), Anchor())
            local_raw = {
                "runtime": "n1",
                "speed": rng.choice([1.0, 0.5]),
                "load": rng.random() * 3,
                "span_s": 1.0,
                "objects": here,
            }
            rm, clock = manager(bm, config, local_raw, rng.choice([None, 1 << 20, 1 << 30]))
            for digest, _ in clients:
                decisions, moves = rm.receive(digest)
                counts["decisions"] += len(decisions)
                counts["local_moves"] += len(moves)
                line = {"k": k, "decisions": decisions, "local": [list(m) for m in moves]}
                print(json.dumps(line, sort_keys=True))
                clock.jump(0.3)
            for record in rm.log_since(0):
                counts["evaluations"] += 1
                print(json.dumps({"k": k, "record": {**record, "t": None}}, sort_keys=True))
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--scenarios", type=int, default=2000)
    args = parser.parse_args()
    counts = run(args.seed, args.scenarios)
    print(
        f"{'typed' if TYPED else 'dict'} interface, {args.scenarios} scenarios: "
        + ", ".join(f"{v} {k}" for k, v in counts.items()),
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
