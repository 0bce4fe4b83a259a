"""A node killed with SIGKILL during a stream of writes loses no acknowledged write
and leaves no torn object (each object is whole: some generation that was written)."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import blake3
import pytest

import shuttle
from shuttle.errors import NotFoundError, ShuttleError
from tests.integration.nodeproc import NodeProcess

KEYS_PER_WRITER = 8


def content(key: str, gen: int) -> bytes:
    """A reproducible body for (key, generation): its size and bytes depend on both,
    so a torn mix of two generations can never pass for either."""
    seed = blake3.blake3(f"{key}:{gen}".encode()).digest()
    size = 20_000 + int.from_bytes(seed[:3], "big") % 600_000
    return blake3.blake3(seed).digest(length=size)


@dataclass
class Ledger:
    """What a writer sent (attempted) and what the node acknowledged, per key."""

    attempted: dict[str, int] = field(default_factory=dict)
    acked: dict[str, int] = field(default_factory=dict)
    #: Keys whose last attempt was truncate-then-write: empty is a state it passes through.
    truncating: set[str] = field(default_factory=set)


def writer(
    address: str, name: str, ledger: Ledger, stop: threading.Event, rng: random.Random
) -> None:
    client = shuttle.connect(node=address, request_timeout_s=10)
    keys = [f"{name}/obj{i}" for i in range(KEYS_PER_WRITER)]
    gen = 0
    try:
        while not stop.is_set():
            key = rng.choice(keys)
            gen += 1
            body = content(key, gen)
            ledger.attempted[key] = gen
            ledger.truncating.discard(key)
            how = rng.random()
            if how < 0.5 or key not in ledger.acked:
                client.put(key, body)  # whole-object replace (journalled or staged)
            elif how < 0.8:
                ledger.truncating.add(key)
                client.truncate(key, 0)  # two steps, each atomic: track both
                ledger.acked[key] = -gen
                client.write(key, 0, body)  # one atomic range write of the whole body
            else:
                client.put(key, iter([body[:200_000], body[200_000:]]))  # upload session
            ledger.acked[key] = gen
    except ShuttleError:
        pass  # the node died under us: expected
    finally:
        client.close()


def check_no_loss_no_tear(address: str, ledgers: list[Ledger]) -> int:
    checked = 0
    with shuttle.connect(node=address, request_timeout_s=30) as client:
        for ledger in ledgers:
            for key, last in ledger.attempted.items():
                acked = ledger.acked.get(key)
                try:
                    got = client.get(key)
                    info = client.stat(key)
                except NotFoundError:
                    assert acked is None, f"{key}: acknowledged generation {acked} lost"
                    continue
                assert info.size == len(got) and info.hash == blake3.blake3(got).digest(), (
                    f"{key}: attributes do not match contents"
                )
                if acked is not None and acked < 0:  # truncated, write in flight
                    ok = got == b"" or got == content(key, -acked)
                    assert ok, f"{key}: torn after truncate+write of generation {-acked}"
                    continue
                if got == b"" and key in ledger.truncating and acked != last:
                    continue  # the truncate landed, the crash came before its answer
                lowest = acked if acked is not None else 1
                assert any(got == content(key, g) for g in range(lowest, last + 1)), (
                    f"{key}: contents are no generation in {lowest}..{last} (torn or lost)"
                )
                checked += 1
    return checked


def kill_during_writes(tmp_path: Path, rounds: int, seed: int) -> None:
    rng = random.Random(seed)
    node = NodeProcess(tmp_path / "node").start()
    ledgers: list[Ledger] = []
    try:
        for r in range(rounds):
            stop = threading.Event()
            round_ledgers = [Ledger(), Ledger()]
            threads = [
                threading.Thread(
                    target=writer,
                    args=(node.address, f"w{r}-{i}", led, stop, random.Random(rng.random())),
                )
                for i, led in enumerate(round_ledgers)
            ]
            for t in threads:
                t.start()
            time.sleep(rng.uniform(0.2, 1.2))
            node.kill()  # SIGKILL in the middle of the stream
            stop.set()
            for t in threads:
                t.join(30)
            ledgers += round_ledgers
            node.start()  # recovery runs on open
            assert check_no_loss_no_tear(node.address, ledgers) > 0
    finally:
        node.terminate()


def test_sigkill_during_writes_loses_nothing_acknowledged(tmp_path: Path) -> None:
    kill_during_writes(tmp_path, rounds=3, seed=1)


@pytest.mark.slow
def test_sigkill_during_writes_many_rounds(tmp_path: Path) -> None:
    kill_during_writes(tmp_path, rounds=25, seed=2)
