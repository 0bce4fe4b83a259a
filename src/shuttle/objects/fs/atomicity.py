"""``atomicity``: all-or-nothing multi-block updates through a node's shared log
(ABACUS 4.3.1).

Every node hosts one, anchored, under the id ``NODE/atomicity``; the node's isolation
object calls it for every update it lets through, so all of a node's file-system
writes share one log. An update is a list of block writes ``(key, offset, bytes)``.
:meth:`AtomicityObject.apply` appends the whole list to the log as one record and
syncs it, then writes the blocks to the store (each write durable when it returns),
then empties the log. A crash before the record is synced leaves a torn record that
recovery ignores (nothing happened); a crash after it leaves a whole record that
recovery, when the node starts, applies again (everything happens). Block writes are
absolute (bytes at an offset), so applying a record twice is the same as once.

One block needs no log: the store's range write is atomic and durable on its
own, so an update of one block goes straight to the store. The emptying of the log
is synced before the lock is let go, so no later write can be overtaken by a replay.

Records are ``u32 length | u32 crc32 | msgpack`` (``{"seq": n, "writes": [...]}``).

For crash tests, the environment variable :data:`CRASH_POINT_ENV` makes the node's
process exit at a named point of an update (``after-log``: the record is durable,
no block written; ``after-first-write``: one block written of several).
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import msgpack

from shuttle.errors import InvalidArgumentError, StorageIOError
from shuttle.runtime.authority import Needs, each, needs
from shuttle.runtime.mobile import MobileObject, builtin
from shuttle.store.interface import Store

log = logging.getLogger("shuttle.objects.fs")

#: Test hook: exit the process at this point of an update (see the module doc).
CRASH_POINT_ENV = "SHUTTLE_TEST_CRASH_POINT"
CRASH_POINTS = ("after-log", "after-first-write")
#: Exit status of a crash at a test point (as a SIGKILL would leave).
CRASH_EXIT_STATUS = 137
#: Most blocks one update may write, and most bytes (a directory update is a few blocks).
UPDATE_BLOCKS_MAX = 64
UPDATE_BYTES_MAX = 4 << 20

_HEADER = struct.Struct("<II")


def encode_record(seq: int, writes: list[tuple[str, int, bytes]]) -> bytes:
    body = msgpack.packb({"seq": seq, "writes": [list(w) for w in writes]}, use_bin_type=True)
    return _HEADER.pack(len(body), zlib.crc32(body)) + body


def decode_records(data: bytes) -> tuple[list[dict[str, Any]], int]:
    """The whole records at the start of ``data``, and where the first torn one begins
    (a record cut short or failing its checksum ends the log: it was never synced)."""
    records, pos = [], 0
    while pos + _HEADER.size <= len(data):
        length, crc = _HEADER.unpack_from(data, pos)
        body = data[pos + _HEADER.size : pos + _HEADER.size + length]
        if len(body) < length or zlib.crc32(body) != crc:
            break
        try:
            record = msgpack.unpackb(body, raw=False)
        except (ValueError, msgpack.UnpackException):
            break
        if not isinstance(record, dict) or not isinstance(record.get("writes"), list):
            break
        records.append(record)
        pos += _HEADER.size + length
    return records, pos


def check_writes(writes: Any) -> list[tuple[str, int, bytes]]:
    """``writes`` as ``[(key, offset, bytes)]``, or :class:`InvalidArgumentError`."""
    if not isinstance(writes, list | tuple) or not writes:
        raise InvalidArgumentError("an update is a non-empty list of [key, offset, bytes] writes")
    if len(writes) > UPDATE_BLOCKS_MAX:
        raise InvalidArgumentError(
            f"an update writes at most {UPDATE_BLOCKS_MAX} blocks, got {len(writes)}"
        )
    out, total = [], 0
    for i, w in enumerate(writes):
        if (
            not isinstance(w, list | tuple)
            or len(w) != 3
            or not isinstance(w[0], str)
            or isinstance(w[1], bool)
            or not isinstance(w[1], int)
            or w[1] < 0
            or not isinstance(w[2], bytes | bytearray | memoryview)
        ):
            raise InvalidArgumentError(
                f"write {i} of an update must be [key, offset ≥ 0, bytes], got {w!r:.80}"
            )
        total += len(w[2])
        out.append((w[0], int(w[1]), bytes(w[2])))
    if total > UPDATE_BYTES_MAX:
        raise InvalidArgumentError(
            f"an update writes at most {UPDATE_BYTES_MAX} bytes, got {total}; split it"
        )
    return out


def _sync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@builtin("atomicity")
class AtomicityObject(MobileObject):
    """A node's shared log: updates of several blocks happen entirely or not at all."""

    anchored = True
    migratable = False
    concurrent = True  # one lock inside orders the updates
    # What a principal's objects need to call each method (runtime/authority.py).
    access: ClassVar[Mapping[str, Needs]] = {"apply": needs(write=[each("writes")])}

    def __init__(self, store: Store, log_path: Path) -> None:
        self._store = store
        self._path = log_path
        self._lock = threading.Lock()
        self._seq = 0
        self._crash_point = os.environ.get(CRASH_POINT_ENV, "")
        self.recovered = 0
        self.applied = 0
        #: Why updates are refused: a block write failed after its record was synced,
        #: so only a restart (recovery) can finish that update before any other.
        self._broken: str | None = None
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._recover()
        self._fd = os.open(log_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        _sync_directory(log_path.parent)  # the log's name survives a power loss

    def _recover(self) -> None:
        """Apply again the whole records a crash left in the log, then empty it."""
        try:
            data = self._path.read_bytes()
        except FileNotFoundError:
            return
        records, end = decode_records(data)
        if end < len(data):
            log.warning(
                "atomicity log %s: %d torn bytes at its end (an update cut by a crash "
                "before it was durable) dropped: that update did not happen",
                self._path,
                len(data) - end,
            )
        for record in records:
            for key, offset, block in record["writes"]:
                self._store.write(key, offset, block, create=True)
            self._seq = max(self._seq, int(record.get("seq", 0)))
        if records:
            log.warning(
                "atomicity log %s: %d update(s) cut by a crash applied again in full",
                self._path,
                len(records),
            )
        self.recovered = len(records)
        with open(self._path, "r+b") as f:
            f.truncate(0)
            os.fsync(f.fileno())

    def apply(self, writes: list[Any]) -> dict[str, int]:
        """Write every block of ``writes`` (``[[key, offset, bytes], ...]``), all or none
        across a crash. Returns the update's sequence number."""
        blocks = check_writes(writes)
        with self._lock:
            if self._broken is not None:
                raise StorageIOError(self._broken)
            self._seq += 1
            if len(blocks) == 1:  # one range write is atomic by itself
                key, offset, block = blocks[0]
                self._store.write(key, offset, block, create=True)
                self.applied += 1
                return {"seq": self._seq, "blocks": 1}
            record = encode_record(self._seq, blocks)
            try:
                os.write(self._fd, record)
                os.fsync(self._fd)
            except OSError as exc:
                raise StorageIOError(
                    f"cannot append to the atomicity log {self._path}: {exc.strerror or exc}"
                ) from exc
            self._maybe_crash("after-log")
            try:
                for i, (key, offset, block) in enumerate(blocks):
                    self._store.write(key, offset, block, create=True)
                    if i == 0:
                        self._maybe_crash("after-first-write")
            except Exception as exc:
                # Part of a logged update is on disk. Any later write could be
                # overtaken when recovery replays the record, so refuse them all: the
                # update is finished by recovery when the node restarts.
                self._broken = (
                    f"the node's store failed in the middle of an update ({exc}); the "
                    "update is in the atomicity log and is completed when the node "
                    "restarts: fix the disk and restart the node"
                )
                log.error("atomicity: %s", self._broken)
                raise StorageIOError(self._broken) from exc
            # Every block is durable: the record is no longer needed. The emptying is
            # synced so that a replay can never overtake a later write.
            os.ftruncate(self._fd, 0)
            os.fsync(self._fd)
            self.applied += 1
            return {"seq": self._seq, "blocks": len(blocks)}

    def _maybe_crash(self, point: str) -> None:
        if self._crash_point == point:
            log.error("test crash point %r reached: exiting as a crash would", point)
            os._exit(CRASH_EXIT_STATUS)

    def stats(self) -> dict[str, int]:
        return {"applied": self.applied, "recovered": self.recovered, "seq": self._seq}
