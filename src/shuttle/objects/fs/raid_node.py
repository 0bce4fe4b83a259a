"""The node half of RAID 5 parity: the primitives a ``raid5`` object calls on each
column's node, atomic with respect to one another (docs/objectfs.md, "RAID 5").

RAID 5 is in three modules: where a file's bytes and parity live
(:mod:`~shuttle.objects.fs.raid_layout`, pure), the object that reads and writes a
file through its columns (:mod:`~shuttle.objects.fs.raid`, it moves), and this, what
a column's node does for it, reached through the node's storage object (anchored;
:class:`~shuttle.objects.storage.StorageObject` hands each primitive to
:class:`ParityNode`):

* ``swap`` (read the old bytes of a range and write new ones) for data units;
* for the stripes whose parity this node holds, durable *write intents* ("stripe s
  is being written": ``stripe_begin``, ``stripe_end``, ``stripe_abandon``), a version
  per stripe that changes with every intent and parity change, and parity writes
  conditional on that version (``stripe_read``, ``stripe_put``).

A *record* (the key ``record``) holds a RAID file's size as this node last heard it
and the open write intents of the stripes whose parity is on this node. It is
rewritten (durably) at every change. Versions live in memory only: they order
concurrent writers that are alive, and carry this node's incarnation, so a version
from before a restart never matches one after it.
"""

from __future__ import annotations

import builtins
import secrets
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import msgpack
import numpy as np

from shuttle.errors import InvalidArgumentError, LimitExceededError, NotFoundError
from shuttle.runtime.authority import Needs, needs
from shuttle.store.interface import Store

#: Locks that make the parity primitives atomic: a key hashes to one of these. A lock
#: per key would grow without bound; 64 keep two writers of different files apart
#: with a small chance of waiting behind each other.
PARITY_LOCK_STRIPES = 64
#: Stripe versions kept in memory (an LRU; about 150 bytes each in Python, about
#: 10 MiB). A stripe whose version was evicted reads the highest evicted version, so a
#: version never repeats, at worst a conditional write retries.
STRIPE_VERSIONS_MAX = 1 << 16
#: Parity records (a file's size and open intents on this node) kept decoded in memory.
PARITY_RECORDS_CACHED_MAX = 1024
#: Open intents one record may hold. Every change rewrites the record, so it stays
#: small; a live file has a few (writes in flight), more means writers keep dying.
INTENTS_MAX = 4096


def xor_into(buf: bytearray, offset: int, data: bytes | bytearray) -> None:
    """``buf[offset : offset + len(data)] ^= data``, in place, in numpy: about 4 µs for
    32 KiB, where Python integers take 115 µs."""
    view = np.frombuffer(buf, np.uint8)
    view[offset : offset + len(data)] ^= np.frombuffer(data, np.uint8)


#: What a principal's objects need to call each primitive (runtime/authority.py): a
#: RAID file's columns and records are keys of their own (``KEY.raid5/N``), under the
#: file's prefix. The storage object's ``access`` table includes these.
ACCESS: Mapping[str, Needs] = {
    "swap": needs(read=["key"], write=["key", "record"]),
    "record_size": needs(write=["record"]),
    "stripe_begin": needs(write=["record"]),
    "stripe_end": needs(read=["key"], write=["record", "key"]),
    "stripe_abandon": needs(write=["record"]),
    "stripe_read": needs(read=["record", "key"]),
    "stripe_put": needs(write=["record", "key"]),
    "stripe_record": needs(read=["record"]),
}


class ParityNode:
    """One node's parity primitives over its store (the storage object's)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._book = ParityBook(store)

    def swap(
        self,
        key: str,
        offset: int,
        data: bytes,
        return_old: bool = True,
        record: str | None = None,
        size: int = 0,
    ) -> bytes:
        """Write ``data`` at ``offset`` of ``key`` and return the bytes it replaced
        (zeros past the end; ``b""`` if not ``return_old``), atomically against other
        swaps of ``key``. With ``record``, also raise the file size kept there to at
        least ``size``. Keys written through ``swap`` must not be written otherwise."""
        _check_offset(offset, "offset")
        _check_bytes(data, "data")
        with self._book.data_lock(key):
            old = self._read_padded(key, offset, len(data)) if return_old else b""
            self._store.write(key, offset, data, create=True)
        if record is not None:
            self.record_size(record, size)
        return old

    def record_size(self, record: str, size: int) -> int:
        """Raise the file size kept in ``record`` to at least ``size``; returns it."""
        _check_offset(size, "size")
        with self._book.record_lock(record):
            rec = self._book.load(record)
            if size > rec.size:
                rec.size = size
                self._book.save(record, rec)
            return rec.size

    def stripe_begin(
        self, record: str, stripe: int, intent: str, size: int = 0, exclusive: bool = False
    ) -> dict[str, Any]:
        """Record intent ``intent`` on ``stripe`` durably (before its data changes) and
        raise the file size in ``record`` to at least ``size``.

        With ``exclusive``, only if no other intent is open on the stripe. Returns
        ``{ok, version, intents, size}``: ``intents`` are the *other* open intents."""
        _check_offset(stripe, "stripe")
        with self._book.record_lock(record):
            rec = self._book.load(record)
            others = rec.open_on(stripe, besides=intent)
            if exclusive and others:
                return self._stripe_answer(record, stripe, rec, others, ok=False)
            if intent not in rec.intents and len(rec.intents) >= INTENTS_MAX:
                raise LimitExceededError(
                    f"{record} holds {INTENTS_MAX} unfinished writes; run the RAID "
                    "object's repair() with every node up to clear them"
                )
            rec.intents[intent] = [stripe, time.time_ns(), 0]
            rec.size = max(rec.size, size)
            self._book.save(record, rec)
            self._book.bump(record, stripe)
            return self._stripe_answer(record, stripe, rec, others, ok=True)

    def stripe_end(
        self, record: str, stripe: int, intent: str, key: str, offset: int, delta: bytes
    ) -> dict[str, Any]:
        """Finish a read-modify-write: XOR ``delta`` into ``key`` (the parity) at
        ``offset`` and close ``intent``, atomically.

        Refused (``ok`` false, nothing applied) when a parity write since the intent
        began may already count this write's data (it *superseded* the intent) or a
        repair closed it: the writer must recompute the stripe's parity instead. The
        intent then stays open (reopened if a repair closed it) until it does."""
        _check_offset(stripe, "stripe")
        _check_offset(offset, "offset")
        _check_bytes(delta, "delta")
        with self._book.record_lock(record):
            rec = self._book.load(record)
            entry = rec.intents.get(intent)
            if entry is None or entry[2] & SUPERSEDED:
                if entry is None:
                    rec.intents[intent] = [stripe, time.time_ns(), SUPERSEDED]
                    self._book.save(record, rec)
                return self._stripe_answer(record, stripe, rec, [], ok=False)
            parity = bytearray(self._read_padded(key, offset, len(delta)))
            xor_into(parity, 0, delta)
            self._store.write(key, offset, parity, create=True)
            # Parity first, then the intent: a crash between leaves a stripe reported
            # dirty whose parity is right, never the other way round.
            del rec.intents[intent]
            self._book.save(record, rec)
            self._book.bump(record, stripe)
            return self._stripe_answer(record, stripe, rec, [], ok=True)

    def stripe_abandon(self, record: str, stripe: int, intent: str) -> dict[str, Any]:
        """Mark ``intent`` abandoned: its writer failed and will not finish it, so
        nobody need wait for it (the stripe stays dirty until a repair)."""
        _check_offset(stripe, "stripe")
        with self._book.record_lock(record):
            rec = self._book.load(record)
            entry = rec.intents.setdefault(intent, [stripe, time.time_ns(), 0])
            entry[2] |= ABANDONED
            self._book.save(record, rec)
            self._book.bump(record, stripe)
            return self._stripe_answer(record, stripe, rec, rec.open_on(stripe), ok=True)

    def stripe_read(
        self,
        record: str,
        stripe: int,
        key: str = "",
        offset: int = 0,
        length: int = 0,
        intent: str | None = None,
    ) -> dict[str, Any]:
        """The stripe's version and open intents (but the caller's own ``intent``), and
        ``length`` bytes of ``key`` (the parity) at ``offset`` (zeros past the end), all
        as of one instant: ``{version, intents, size, data}``."""
        _check_offset(stripe, "stripe")
        _check_offset(offset, "offset")
        _check_offset(length, "length")
        with self._book.record_lock(record):
            rec = self._book.load(record)
            others = rec.open_on(stripe, besides=intent)
            out = self._stripe_answer(record, stripe, rec, others, ok=True)
            out["data"] = self._read_padded(key, offset, length) if length else b""
            return out

    def stripe_put(
        self,
        record: str,
        stripe: int,
        version: str,
        key: str,
        offset: int,
        parity: bytes,
        intent: str | None = None,
        clear: bool = False,
    ) -> dict[str, Any]:
        """Write ``parity`` at ``offset`` of ``key`` if the stripe's version is still
        ``version``, and close ``intent``. Other open intents are marked superseded
        (their writers will recompute), or with ``clear`` (a repair) closed.
        ``{ok, version, intents, size}``."""
        _check_offset(stripe, "stripe")
        _check_offset(offset, "offset")
        _check_bytes(parity, "parity")
        with self._book.record_lock(record):
            rec = self._book.load(record)
            others = rec.open_on(stripe, besides=intent)
            if self._book.version(record, stripe) != version:
                return self._stripe_answer(record, stripe, rec, others, ok=False)
            self._store.write(key, offset, parity, create=True)
            if intent is not None:
                rec.intents.pop(intent, None)
            for name in [i["id"] for i in others]:
                if clear:
                    del rec.intents[name]
                else:
                    rec.intents[name][2] |= SUPERSEDED
            self._book.save(record, rec)
            self._book.bump(record, stripe)
            return self._stripe_answer(record, stripe, rec, [], ok=True)

    def forget(self, keys: builtins.list[str]) -> None:
        """``keys`` were removed from the store: forget any of them held as a record."""
        for record in keys:
            with self._book.record_lock(record):
                self._book.forget(record)

    def stripe_record(self, record: str) -> dict[str, Any]:
        """The file size kept in ``record`` and every open intent: ``{size, intents}``."""
        with self._book.record_lock(record):
            rec = self._book.load(record)
            return {"size": rec.size, "intents": rec.open_on(None)}

    def _stripe_answer(
        self,
        record: str,
        stripe: int,
        rec: ParityRecord,
        intents: builtins.list[dict[str, Any]],
        ok: bool,
    ) -> dict[str, Any]:
        return {
            "ok": ok,
            "version": self._book.version(record, stripe),
            "intents": intents,
            "size": rec.size,
        }

    def _read_padded(self, key: str, offset: int, length: int) -> bytes:
        """``length`` bytes of ``key`` at ``offset``, zeros where it has none."""
        try:
            data = self._store.read(key, offset, length)
        except NotFoundError:
            data = b""
        return data if len(data) == length else data + bytes(length - len(data))


def _check_bytes(value: Any, what: str) -> None:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise InvalidArgumentError(f"{what} must be bytes, got {type(value).__name__}")


def _check_offset(value: Any, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgumentError(f"{what} must be an integer ≥ 0, got {value!r:.40}")


#: Intent flags: a parity write since it began may count its data; its writer failed.
SUPERSEDED = 1
ABANDONED = 2


class ParityRecord:
    """A RAID file's record on one node: its size, and open intents by id as
    ``[stripe, began (wall clock ns), flags]``."""

    __slots__ = ("intents", "size")

    def __init__(self, size: int = 0, intents: dict[str, list[int]] | None = None) -> None:
        self.size = size
        self.intents: dict[str, list[int]] = intents or {}

    def open_on(self, stripe: int | None, besides: str | None = None) -> list[dict[str, Any]]:
        """The open intents of ``stripe`` (all with None), but ``besides``, described."""
        now = time.time_ns()
        return [
            {
                "id": name,
                "stripe": s,
                "age_s": max(0.0, (now - began) / 1e9),
                "superseded": bool(flags & SUPERSEDED),
                "abandoned": bool(flags & ABANDONED),
            }
            for name, (s, began, flags) in self.intents.items()
            if (stripe is None or s == stripe) and name != besides
        ]


class ParityBook:
    """The node-side state behind the parity primitives: locks, stripe versions, and
    the records (durable in the store, cached decoded)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._data_locks = [threading.Lock() for _ in range(PARITY_LOCK_STRIPES)]
        # Separate from the data locks: swap takes a data lock, then a record lock.
        self._record_locks = [threading.Lock() for _ in range(PARITY_LOCK_STRIPES)]
        self._incarnation = secrets.token_hex(4)
        self._versions: OrderedDict[tuple[str, int], int] = OrderedDict()
        self._versions_floor = 0
        self._counter = 0
        self._versions_lock = threading.Lock()
        self._records: OrderedDict[str, ParityRecord] = OrderedDict()
        self._records_lock = threading.Lock()

    def data_lock(self, key: str) -> threading.Lock:
        return self._data_locks[zlib.crc32(key.encode()) % PARITY_LOCK_STRIPES]

    def record_lock(self, record: str) -> threading.Lock:
        return self._record_locks[zlib.crc32(record.encode()) % PARITY_LOCK_STRIPES]

    def version(self, record: str, stripe: int) -> str:
        with self._versions_lock:
            n = self._versions.get((record, stripe), self._versions_floor)
        return f"{self._incarnation}:{n}"

    def bump(self, record: str, stripe: int) -> None:
        with self._versions_lock:
            self._counter += 1
            self._versions[(record, stripe)] = self._counter
            self._versions.move_to_end((record, stripe))
            while len(self._versions) > STRIPE_VERSIONS_MAX:
                _, n = self._versions.popitem(last=False)
                self._versions_floor = max(self._versions_floor, n)

    def load(self, record: str) -> ParityRecord:
        """The record (an empty one if none is stored); call with its lock held."""
        with self._records_lock:
            rec = self._records.get(record)
            if rec is not None:
                self._records.move_to_end(record)
                return rec
        try:
            raw = msgpack.unpackb(self._store.read(record), raw=False, strict_map_key=False)
            rec = ParityRecord(int(raw["size"]), {k: list(v) for k, v in raw["intents"].items()})
        except NotFoundError:
            rec = ParityRecord()
        self._remember(record, rec)
        return rec

    def save(self, record: str, rec: ParityRecord) -> None:
        """Store the record durably; call with its lock held."""
        try:
            self._store.put(record, msgpack.packb({"size": rec.size, "intents": rec.intents}))
        except BaseException:
            with self._records_lock:  # the cached copy was changed in place: drop it
                self._records.pop(record, None)
            raise
        self._remember(record, rec)

    def forget(self, record: str) -> None:
        """The record's key was removed (call with its lock held): drop the cached copy,
        so a record made again under the name starts empty. Stripe versions stay: they
        only ever grow, so a version never repeats."""
        with self._records_lock:
            self._records.pop(record, None)

    def _remember(self, record: str, rec: ParityRecord) -> None:
        # Dropping a cached record is always safe: it is stored, and loading it again
        # takes its lock, so it waits for a change under way to be saved.
        with self._records_lock:
            self._records[record] = rec
            self._records.move_to_end(record)
            while len(self._records) > PARITY_RECORDS_CACHED_MAX:
                self._records.popitem(last=False)
