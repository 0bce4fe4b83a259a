"""Crash tests: a real child process changes objects through the store in a loop and is
killed with SIGKILL at random moments; after each kill the store is reopened and checked.

The child runs a few threads, each on its own keys, doing a deterministic sequence of
operations (range writes, puts small and large, uploads, truncates, removes) and
acknowledging each one on a pipe once the call has returned. The parent replays the same
sequence on a model. After a kill, for every thread, each of its objects must equal the
model after the acknowledged operations, or after one more (the operation in flight),
with one cut point for all of the thread's keys; attributes must match contents (size,
blake3 hash, chunk list); versions must not go back. Then the next round starts from the
recovered state.

Run this file as a script to get the child: ``python test_store_crash.py ROOT SEED ...``.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from shuttle.store import ObjectStore, chunk_buffer, object_hash

THREADS = 2
KEYS_PER_THREAD = ("k0", "dir/k1", "dir/sub/k2")


def thread_keys(t: int) -> list[str]:
    return [f"t{t}/{k}" for k in KEYS_PER_THREAD]


@dataclass(frozen=True)
class Op:
    kind: str  # put | write | truncate | upload | remove
    key: str
    offset: int = 0
    size: int = 0
    data: bytes = b""
    parts: tuple[tuple[int, bytes], ...] = ()


def operations(seed: int, t: int, existing: set[str]) -> Iterator[Op]:
    """The deterministic, endless operation sequence of thread ``t`` (valid given which of
    its keys exist at the start)."""
    rng = random.Random(seed * 1000 + t)
    alive = {k for k in thread_keys(t) if k in existing}
    while True:
        key = rng.choice(thread_keys(t))
        roll = rng.random()
        if roll < 0.35:
            n = rng.choice([0, 100, 5000, 200_000])
            yield Op("write", key, offset=rng.randrange(0, 600_000), data=rng.randbytes(n))
            alive.add(key)  # with create=True even an empty write makes the object
        elif roll < 0.55:
            size = rng.choice([0, 10, 70_000, 1_500_000])  # 1.5 MB goes through staging
            yield Op("put", key, data=rng.randbytes(size))
            alive.add(key)
        elif roll < 0.65:
            piece = 700_000
            blob = rng.randbytes(piece * 3)
            parts = [(i * piece, blob[i * piece : (i + 1) * piece]) for i in range(3)]
            rng.shuffle(parts)
            yield Op("upload", key, parts=tuple(parts))
            alive.add(key)
        elif roll < 0.85:
            if key in alive:
                yield Op("truncate", key, size=rng.randrange(0, 800_000))
        elif key in alive:
            yield Op("remove", key)
            alive.discard(key)


def apply_model(model: dict[str, bytes], op: Op) -> None:
    if op.kind == "put":
        model[op.key] = op.data
    elif op.kind == "upload":
        size = max(off + len(d) for off, d in op.parts)
        buf = bytearray(size)
        for off, d in op.parts:
            buf[off : off + len(d)] = d
        model[op.key] = bytes(buf)
    elif op.kind == "write":
        buf = bytearray(model.get(op.key, b""))
        if op.data and op.offset > len(buf):
            buf.extend(bytes(op.offset - len(buf)))
        buf[op.offset : op.offset + len(op.data)] = op.data
        model[op.key] = bytes(buf)
    elif op.kind == "truncate":
        buf = bytearray(model[op.key])
        if op.size < len(buf):
            del buf[op.size :]
        else:
            buf.extend(bytes(op.size - len(buf)))
        model[op.key] = bytes(buf)
    elif op.kind == "remove":
        del model[op.key]


def apply_store(store: ObjectStore, op: Op) -> int:
    """Do ``op`` through the store; return the version it produced (0 for remove)."""
    if op.kind == "put":
        return store.put(op.key, op.data).version
    if op.kind == "upload":
        up = store.begin_upload(op.key)
        for off, d in op.parts:
            store.upload_write(up, off, d)
        return store.commit_upload(up).version
    if op.kind == "write":
        return store.write(op.key, op.offset, op.data, create=True).version
    if op.kind == "truncate":
        return store.truncate(op.key, op.size).version
    store.remove(op.key)
    return 0


def child_main(root: str, seed: int, existing: set[str]) -> None:
    """Open the store, run every thread's operations forever, acknowledge each on stdout."""
    store = ObjectStore(root)
    out_fd = sys.stdout.fileno()
    print_lock = threading.Lock()

    def run(t: int) -> None:
        for n, op in enumerate(operations(seed, t, existing), start=1):
            version = apply_store(store, op)
            with print_lock:
                os.write(out_fd, f"ack {t} {n} {version}\n".encode())

    os.write(out_fd, b"ready\n")
    threads = [threading.Thread(target=run, args=(t,), daemon=True) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()


# --- the parent ----------------------------------------------------------------------


def _run_child_and_kill(root: Path, seed: int, existing: set[str], rng: random.Random) -> list[str]:
    cmd = [sys.executable, __file__, str(root), str(seed), ",".join(sorted(existing))]
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout is not None
    lines: list[str] = []
    first = child.stdout.readline().decode()
    assert first == "ready\n", child.stderr.read().decode() if child.stderr else first
    reader = threading.Thread(target=lambda: lines.extend(_lines(child.stdout)), daemon=True)
    reader.start()
    # Kill at a random moment in the stream of changes, counted from the first
    # acknowledgement so that even a slow disk gives every round something to check.
    deadline = time.monotonic() + 30
    while not lines and time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.005)
    time.sleep(rng.uniform(0.0, 0.5))
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    reader.join(timeout=30)
    err = child.stderr.read().decode() if child.stderr else ""
    assert child.returncode == -signal.SIGKILL, err
    return lines


def _lines(stream: object) -> Iterator[str]:
    for raw in stream:  # type: ignore[attr-defined]
        text = raw.decode()
        if text.endswith("\n"):  # a line cut by the kill was never acknowledged
            yield text


def _check_attrs(store: ObjectStore, key: str, content: bytes) -> None:
    attrs = store.stat(key)
    assert attrs.size == len(content), key
    assert attrs.hash == object_hash(content), key
    assert list(attrs.chunks) == chunk_buffer(content), key


def crash_rounds(root: Path, rounds: int, seed0: int) -> dict[str, int]:
    rng = random.Random(seed0)
    model: dict[str, bytes] = {}
    versions: dict[str, int] = {}
    totals = {"acked": 0, "in_flight_applied": 0}
    for r in range(rounds):
        seed = seed0 + r
        lines = _run_child_and_kill(root, seed, set(model), rng)
        acked = {t: 0 for t in range(THREADS)}
        acked_version: dict[str, int] = {}
        gens = {t: operations(seed, t, set(model)) for t in range(THREADS)}
        ops_by_thread: dict[int, list[Op]] = {t: [] for t in range(THREADS)}
        for line in lines:
            _, t_s, n_s, v_s = line.split()
            t, n = int(t_s), int(n_s)
            assert n == acked[t] + 1
            acked[t] = n
            op = next(gens[t])
            ops_by_thread[t].append(op)
            acked_version[op.key] = int(v_s)
        totals["acked"] += sum(acked.values())
        with ObjectStore(root) as store:
            listed = set(store.list().keys)
            for t in range(THREADS):
                after_acked = {k: v for k, v in model.items() if k in thread_keys(t)}
                for op in ops_by_thread[t]:
                    apply_model(after_acked, op)
                after_next = dict(after_acked)
                apply_model(after_next, next(gens[t]))
                actual = {}
                for k in thread_keys(t):
                    got = store.stat_many([k])[0]
                    if got is not None:
                        actual[k] = store.read(k, 0, None)
                        _check_attrs(store, k, actual[k])
                assert actual in (after_acked, after_next), (
                    f"round {r} thread {t}: state matches neither the {acked[t]} acknowledged "
                    "operations nor one more"
                )
                if actual != after_acked:
                    totals["in_flight_applied"] += 1
                for k in thread_keys(t):
                    model.pop(k, None)
                model.update(actual)
            assert listed == set(model)
            for k in model:
                v = store.stat(k).version
                assert v >= max(versions.get(k, 0), acked_version.get(k, 0))
                versions[k] = v
    return totals


def test_sigkill_during_writes_never_loses_or_tears_an_object(tmp_path: Path) -> None:
    totals = crash_rounds(tmp_path / "data", rounds=4, seed0=1)
    assert totals["acked"] > 0


@pytest.mark.slow
def test_sigkill_many_times(tmp_path: Path) -> None:
    totals = crash_rounds(tmp_path / "data", rounds=60, seed0=100)
    assert totals["acked"] > 0


if __name__ == "__main__":
    child_main(sys.argv[1], int(sys.argv[2]), set(filter(None, sys.argv[3].split(","))))
