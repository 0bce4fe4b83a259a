"""RAID 5 objects against five real node processes on 127.0.0.1: a file written at the
client or at a node reads back equal, a degraded read gives the healthy bytes, a node
killed mid-write and a client killed between data and parity leave dirty stripes (never
silently wrong ones) that a degraded read refuses and repair fixes, and a migration in
the middle of a file changes nothing."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shuttle.client.model import NodeAddress
from shuttle.errors import ObjectFailedError, ShuttleError
from shuttle.objects.fs.raid_layout import Raid5Layout, column_key
from shuttle.runtime.client import Runtime
from shuttle.runtime.refs import Ref
from tests.integration.nodeproc import NodeProcess

NODES = [f"n{i}" for i in range(1, 6)]
UNIT = 4096
STRIPE = 4 * UNIT
LAYOUT = Raid5Layout(len(NODES), UNIT)


class Cluster:
    """Five nodes, started in parallel; shared by the tests of this module (each test
    uses files of its own), and restarted when a test killed one."""

    def __init__(self, tmp: Path) -> None:
        self.procs = {n: NodeProcess(tmp / n) for n in NODES}
        starters = [threading.Thread(target=p.start) for p in self.procs.values()]
        for t in starters:
            t.start()
        for t in starters:
            t.join()
        assert all(p.port for p in self.procs.values()), "a node did not start"

    def addresses(self) -> list[NodeAddress]:
        return [NodeAddress(n, "127.0.0.1", p.port, None) for n, p in self.procs.items()]

    def runtime(self) -> Runtime:
        return Runtime(self.addresses())

    def column_file(self, key: str, column: int) -> Path:
        return self.procs[NODES[column]].data_dir / column_key(key, column)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("raid"))
    yield c
    for p in c.procs.values():
        p.terminate()


def raid(rt: Runtime, key: str, at: str | None = None, **params: Any) -> Ref:
    storages = [rt.storage(n) for n in NODES]
    return rt.create(
        "raid5", at=at, placement="static", storages=storages, key=key, unit_bytes=UNIT, **params
    )


def random_writes(target: Ref, rng: random.Random, model: bytearray, n: int, span: int) -> None:
    """``n`` writes (unaligned ones, and whole stripes) within ``span`` bytes."""
    for _ in range(n):
        if rng.random() < 0.3:
            off, length = rng.randrange(0, span // STRIPE) * STRIPE, STRIPE * rng.randint(1, 2)
        else:
            off, length = rng.randrange(0, span), rng.randrange(1, 3 * UNIT)
        data = rng.randbytes(length)
        assert target.write(off, data)["size"] >= off + length
        if off > len(model):
            model.extend(bytes(off - len(model)))
        model[off : off + length] = data


@pytest.mark.timeout(60)
@pytest.mark.parametrize("at", ["client", "n1"])
def test_a_file_written_at_the_client_or_a_node_reads_back_equal(cluster: Cluster, at: str) -> None:
    rng, model = random.Random(5), bytearray()
    key = f"vol/written-at-{at}"
    with cluster.runtime() as rt:
        file = raid(rt, key, None if at == "client" else at)
        assert rt.where(file) == (rt.id if at == "client" else at)
        random_writes(file, rng, model, 40, 10 * STRIPE)
        assert file.read(0, len(model) + 100) == bytes(model)
        assert file.size() == len(model)
        found = file.verify()
        assert found["checked"] == found["stripes"] == LAYOUT.stripes(len(model))
        assert found["bad"] == found["dirty"] == []
        stats = file.stats()
        assert stats["small_writes"] > 0 and stats["full_stripe_writes"] > 0
    with cluster.runtime() as other:  # another client: the size and bytes are shared
        again = raid(other, key)
        assert again.size() == len(model)
        assert again.read(0, len(model)) == bytes(model)


@pytest.mark.timeout(60)
def test_a_degraded_read_returns_the_healthy_bytes_and_degraded_writes_survive_a_rebuild(
    cluster: Cluster,
) -> None:
    rng, model = random.Random(6), bytearray()
    with cluster.runtime() as rt:
        file = raid(rt, "vol/degraded")
        random_writes(file, rng, model, 30, 8 * STRIPE)
        healthy = file.read(0, len(model))
        assert healthy == bytes(model)
        for column in range(len(NODES)):
            file.mark_failed(column)
            assert file.read(0, len(model)) == healthy, f"column {column} failed"
            assert file.read(UNIT - 10, 3 * UNIT) == healthy[UNIT - 10 : 4 * UNIT - 10]
        file.mark_failed(2)
        random_writes(file, rng, model, 20, 9 * STRIPE)  # the column's units change unseen
        assert file.read(0, len(model)) == bytes(model)
        assert file.rebuild()["column"] == 2
        found = file.verify()
        assert found["bad"] == found["dirty"] == [] and found["failed"] is None
        for column in range(len(NODES)):
            file.mark_failed(column)
            assert file.read(0, len(model)) == bytes(model)


@pytest.mark.timeout(90)
def test_a_node_killed_mid_write_leaves_dirty_stripes_that_repair_fixes(
    cluster: Cluster,
) -> None:
    key, victim, stripes = "vol/killed-node", 3, 60
    with cluster.runtime() as rt:
        file = raid(rt, key)
        old = random.Random(1).randbytes(stripes * STRIPE)
        for off in range(0, len(old), 4 * STRIPE):
            file.write(off, old[off : off + 4 * STRIPE])
        # One small write into the victim's unit of each stripe it holds data of: every
        # call the victim gets is a swap after an intent, so wherever the kill lands,
        # the write is cut with an intent open.
        new = random.Random(2).randbytes(len(old))
        spans = []
        for s in range(stripes):
            if LAYOUT.parity_column(s) != victim:
                index = next(i for i in range(4) if LAYOUT.data_column(s, i) == victim)
                spans.append((s * STRIPE + index * UNIT + 100, UNIT - 200))
        # Kill once the parity of a stripe a quarter of the way in has changed.
        w = next(s for s in range(stripes // 4, stripes) if LAYOUT.parity_column(s) != victim)
        watched = cluster.column_file(key, LAYOUT.parity_column(w))
        before = watched.read_bytes()[w * UNIT : (w + 1) * UNIT]
        outcome: list[BaseException | str] = []

        def write() -> None:
            try:
                for off, length in spans:
                    file.write(off, new[off : off + length])
                outcome.append("the write finished before the kill")
            except ShuttleError as exc:
                outcome.append(exc)

        writer = threading.Thread(target=write)
        writer.start()
        deadline = time.monotonic() + 30
        while watched.read_bytes()[w * UNIT : (w + 1) * UNIT] == before:
            assert time.monotonic() < deadline and writer.is_alive(), "the write never began"
            time.sleep(0.002)
        cluster.procs[NODES[victim]].kill()
        writer.join(30)
        assert outcome and isinstance(outcome[0], ShuttleError), outcome
        assert "marked dirty" in str(outcome[0]) and "mark_failed(3)" in str(outcome[0])
        # The node comes back with what it had on disk; nothing is silently wrong.
        cluster.procs[NODES[victim]].start()
        found = file.verify()
        assert found["dirty"], found
        assert set(found["bad"]) <= set(found["dirty"])
        # Reading the victim's units as lost goes through the dirty stripe: refused at
        # once (the writer saw its write fail and marked its intent abandoned).
        stripe = found["dirty"][0]
        file.mark_failed(victim)
        with pytest.raises(ObjectFailedError, match=r"abandoned by its writer.*repair\(\)"):
            file.read(stripe * STRIPE, STRIPE)
        file.mark_failed(None)
        repaired = file.repair()
        assert set(repaired["repaired"]) >= set(found["dirty"])
        again = file.verify()
        assert again["bad"] == again["dirty"] == []
        # Every byte is the old one or the new one: nothing torn, nothing lost.
        got = file.read(0, len(old))
        written = bytearray(old)
        for off, length in spans:
            written[off : off + length] = new[off : off + length]
        assert all(g in (o, n) for g, o, n in zip(got, old, written, strict=True))
        file.mark_failed(victim)
        assert file.read(0, len(old)) == got


CHILD = """
import json, os, signal, sys
from shuttle.client.model import NodeAddress
from shuttle.objects.fs.raid import Raid5Object
from shuttle.runtime.client import Runtime

spec = json.loads(sys.argv[1])
real_call = Raid5Object._call

def call(self, column, method, *args, **kwargs):
    if method == "stripe_end":  # the data is written; the parity update is next
        os.kill(spec["kill"] or os.getpid(), signal.SIGKILL)
    return real_call(self, column, method, *args, **kwargs)

Raid5Object._call = call
rt = Runtime([NodeAddress(n, "127.0.0.1", p, None) for n, p in spec["nodes"]])
file = rt.create("raid5", storages=[rt.storage(n) for n, _ in spec["nodes"]],
                 key=spec["key"], unit_bytes=spec["unit"])
try:
    file.write(spec["offset"], bytes.fromhex(spec["data"]))
except Exception as exc:
    print(exc)
    sys.exit(3)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dies", ["client", "parity node"])
def test_a_death_between_data_and_parity_leaves_a_dirty_stripe_repair_fixes(
    cluster: Cluster, dies: str
) -> None:
    """The client running the RAID object, or the stripe's parity node, is killed
    (SIGKILL) after the data is written and before the parity is: the stripe is
    reported dirty (the intent is durable at the parity node), not silently wrong."""
    key = f"vol/killed-{dies.replace(' ', '-')}"
    old = random.Random(3).randbytes(2 * STRIPE)
    new = b"N" * 100
    offset = STRIPE + UNIT + 7  # stripe 1, its second data unit
    with cluster.runtime() as rt:
        file = raid(rt, key, stale_intent_s=1.0)
        file.write(0, old)
        spec = {
            "nodes": [[n, p.port] for n, p in cluster.procs.items()],
            "key": key,
            "unit": UNIT,
            "offset": offset,
            "data": new.hex(),
            "kill": 0,
        }
        parity = cluster.procs[NODES[LAYOUT.parity_column(1)]]
        if dies == "parity node":
            assert parity.proc is not None
            spec["kill"] = parity.proc.pid
        child = subprocess.run(
            [sys.executable, "-c", CHILD, json.dumps(spec)],
            capture_output=True,
            timeout=30,
            check=False,
        )
        if dies == "client":
            assert child.returncode == -9, child.stderr.decode()[-2000:]
        else:
            assert child.returncode == 3, child.stderr.decode()[-2000:]
            assert b"marked dirty" in child.stdout
            parity.kill()  # reap it
            parity.start()  # same data, same port
        found = file.verify()
        assert found["dirty"] == [1] and found["bad"] == [1]  # flagged, not silent
        # Rebuilding the stripe's first unit would use the stale parity: refused.
        file.mark_failed(LAYOUT.data_column(1, 0))
        with pytest.raises(ObjectFailedError, match=r"stripe 1 .* unfinished write"):
            file.read(STRIPE, UNIT)
        assert file.read(0, UNIT) == old[:UNIT]  # other stripes read on
        file.mark_failed(None)
        assert file.repair()["repaired"] == [1]
        expected = old[:offset] + new + old[offset + len(new) :]
        assert file.read(0, len(old)) == expected  # the data written before the death
        for column in range(len(NODES)):
            file.mark_failed(column)
            assert file.read(0, len(old)) == expected


@pytest.mark.timeout(60)
def test_a_raid_object_migrated_mid_file_writes_and_reads_the_same_file(
    cluster: Cluster,
) -> None:
    def run(key: str, moves: dict[int, str]) -> tuple[bytes, list[str]]:
        rng, model, where = random.Random(9), bytearray(), []
        with cluster.runtime() as rt:
            file = raid(rt, key)
            for step in range(12):
                if step in moves:
                    rt.migrate(file, moves[step])
                    where.append(rt.where(file))
                    assert file.stats()["failed"] == (1 if step > 6 else None)
                if step == 6:
                    file.mark_failed(1)  # the failed column travels in the checkpoint
                random_writes(file, rng, model, 4, 6 * STRIPE)
            assert file.read(0, len(model)) == bytes(model)
            file.rebuild()  # column 1 missed the writes made while it was failed
            assert file.read(0, len(model)) == bytes(model)
            return file.read(0, len(model)), where

    plain, _ = run("vol/unmoved", {})
    moved, where = run("vol/moved", {2: "n2", 5: "client", 7: "n4", 10: "n2"})
    assert moved == plain
    assert where[0] == "n2" and where[2] == "n4" and where[3] == "n2"
