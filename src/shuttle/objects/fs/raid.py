"""``raid5``: one file striped with rotating parity over N storage nodes (ABACUS
4.3.1 and 6.2). docs/objectfs.md, "RAID 5", explains the design; in short:

* **Layout.** N columns (one per node), N - 1 data units and one parity unit per
  stripe, left-symmetric rotation (Linux md's default): stripe ``s`` keeps its parity
  in column ``N - 1 - s mod N`` and its data units in the columns after it, wrapping.
  Column ``c`` keeps its unit of every stripe in one key, ``KEY.raid5/c``, unit ``s``
  at ``s * unit_bytes``; ``KEY.raid5/c.record`` holds the file size and the open write
  intents of the stripes whose parity is in column ``c``.
* **Writes.** A small write is a read-modify-write: record an intent at the parity
  node, ``swap`` each data unit (the node returns the old bytes), XOR old ^ new into
  the parity and close the intent in one call. Deltas commute, so writers of the same
  stripe never wait for one another. A write of a whole stripe computes the parity
  from the new data alone and writes it if the stripe's version has not moved.
* **Degraded mode** (``mark_failed(c)``): a unit of column ``c`` is the XOR of the
  others of its stripe, read as one consistent snapshot (the stripe's version before
  and after); a write to it changes only the parity (a reconstruct-write, exclusive
  on its stripe and conditional on the version); a stripe whose parity column failed
  is just written.
* **Callbacks** (with ``callbacks``, the isolation object of the file's home node):
  a write, once its stripes are written (or cut short), tells it which bytes changed
  (``changed``), which breaks the promises of every cache holding them before the
  write returns. A cache stacked on this object reads through it and takes its
  promises there (``promise``), so clients caching one RAID file stay coherent.
* **Crashes.** An intent is durable before the data changes and closed only with the
  parity, so a write cut short leaves its stripe *dirty*: ``verify`` reports it, a
  degraded read of it refuses, ``repair`` recomputes its parity (detect and repair).

This module holds the file object: its interface, a read split into stripes (a
degraded one rebuilt), and the four ways a stripe is written (small, full stripe,
reconstruct, data only) with the parity recomputed when a write cannot tell. The
steps it takes at the columns' nodes, their retries and how their failures read are
:mod:`shuttle.objects.fs.raid_stripe_steps`; the pure layout is
:mod:`shuttle.objects.fs.raid_layout`, the nodes' half :mod:`shuttle.objects.fs.raid_node`.
"""

from __future__ import annotations

import contextlib
import itertools
import secrets
import time
from collections.abc import Callable
from typing import Any

from shuttle.errors import (
    InvalidArgumentError,
    LimitExceededError,
    ObjectFailedError,
    ShuttleError,
)
from shuttle.objects.fs.raid_layout import (
    UNIT_BYTES_DEFAULT,
    Piece,
    Raid5Layout,
    check_geometry,
    column_key,
    record_key,
)
from shuttle.objects.fs.raid_node import xor_into
from shuttle.objects.fs.raid_stripe_steps import Retry, StripeSteps, reraise
from shuttle.runtime.mobile import MobileObject, builtin
from shuttle.runtime.refs import Ref
from shuttle.store import OBJECT_SIZE_BYTES_MAX
from shuttle.store.keys import validate_key

#: Largest read or write one call takes (and holds in memory).
IO_BYTES_MAX = 16 << 20
#: Largest file: a plain object's limit (each column holds less).
FILE_BYTES_MAX = OBJECT_SIZE_BYTES_MAX
#: An intent open this long belongs to a writer that died: a live write finishes in a
#: few round trips. Degraded reads and writes wait for younger ones, refuse older.
STALE_INTENT_S = 5.0

#: What :meth:`Raid5Object.stats` counts.
COUNTERS = (
    "reads",
    "writes",
    "bytes_read",
    "bytes_written",
    "small_writes",
    "full_stripe_writes",
    "reconstruct_writes",
    "data_only_writes",
    "degraded_stripe_reads",
    "recomputes",
    "conflicts",
    "waits",
)


@builtin("raid5")
class Raid5Object(StripeSteps, MobileObject):
    """A file striped with rotating parity over ``storages`` (one per node).

    Several objects (one per client, say) may read and write the same file at once:
    each stripe's parity equals the XOR of its data whenever no write is under way.
    All objects of a file must agree on which column is failed.
    """

    def __init__(
        self,
        storages: list[Ref],
        key: str,
        unit_bytes: int = UNIT_BYTES_DEFAULT,
        *,
        stale_intent_s: float = STALE_INTENT_S,
        callbacks: Ref | None = None,
    ) -> None:
        if not isinstance(storages, list | tuple) or not all(isinstance(r, Ref) for r in storages):
            raise InvalidArgumentError(
                "storages must be a list of storage object references (Runtime.storage(node))"
            )
        check_geometry(len(storages), unit_bytes)
        seen: dict[Ref, int] = {}
        for column, ref in enumerate(storages):
            if ref in seen:
                raise InvalidArgumentError(
                    f"columns {seen[ref]} and {column} are both {ref.rid}: one node's "
                    "failure would take two columns, more than RAID 5 survives; give "
                    "each column its own node"
                )
            seen[ref] = column
        validate_key(key)
        validate_key(record_key(key, len(storages) - 1))  # the longest name we make
        if not stale_intent_s > 0:
            raise InvalidArgumentError(f"stale_intent_s must be > 0, got {stale_intent_s!r}")
        if callbacks is not None and not isinstance(callbacks, Ref):
            raise InvalidArgumentError(
                "callbacks must be an isolation object's reference "
                "(Runtime.service(node, 'isolation')) or None"
            )
        self.storages = list(storages)
        #: The isolation object told of every write (None: no cache above this one).
        self.callbacks = callbacks
        self.key = key
        self.unit_bytes = unit_bytes
        self.stale_intent_s = float(stale_intent_s)
        self.failed: int | None = None
        self.counters = dict.fromkeys(COUNTERS, 0)
        self._setup()

    def restore(self, data: bytes) -> None:
        super().restore(data)
        self._setup()

    def _setup(self) -> None:
        self._layout = Raid5Layout(len(self.storages), self.unit_bytes)
        self._writer = secrets.token_hex(6)  # names this incarnation's intents
        self._intents = itertools.count()
        #: The file size as last seen; sizes only grow, so it is a lower bound.
        self._known_size = 0
        self._sleep: Callable[[float], None] = time.sleep

    # --- the interface ---------------------------------------------------------------

    def read(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes from ``offset`` (fewer at the end of the file; holes
        read as zeros). Units of a failed column are rebuilt from their stripes.

        Raises :class:`InvalidArgumentError` (bad range), :class:`ObjectFailedError`
        (a degraded read of a stripe an unfinished write left dirty), the storage
        nodes' errors (:class:`UnreachableError`: mark that column failed)."""
        _check_io(offset, length, "read")
        if length == 0:
            return b""
        if offset + length > self._known_size:
            self._refresh_size()
        end = min(offset + length, self._known_size)
        if end <= offset:
            return b""
        out = bytearray(end - offset)
        pieces = self._layout.pieces(offset, end - offset)
        degraded = {p.stripe for p in pieces if p.column == self.failed}
        self._read_pieces([p for p in pieces if p.stripe not in degraded], out)
        for stripe, group in itertools.groupby(
            (p for p in pieces if p.stripe in degraded), key=lambda p: p.stripe
        ):
            self._read_degraded(stripe, list(group), out)
        self.counters["reads"] += 1
        self.counters["bytes_read"] += len(out)
        return bytes(out)

    def write(self, offset: int, data: bytes, holder: Ref | None = None) -> dict[str, Any]:
        """Write ``data`` at ``offset`` (extending the file; a gap reads as zeros).
        Returns ``{size, bytes, stripes}``, and with ``callbacks`` the ``timestamp``
        the change got there (``holder``, the writing cache, keeps its promise on
        the block at ``offset``; every other cache's is broken).

        On an error the stripes before the failing one are written, the failing one
        may be partly written and is left marked dirty (``verify`` lists it,
        ``repair`` fixes its parity), and the rest are untouched; the caches are
        told of the whole range all the same."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise InvalidArgumentError(f"write: data must be bytes, got {type(data).__name__}")
        _check_io(offset, len(data), "write")
        if offset + len(data) > FILE_BYTES_MAX:
            raise LimitExceededError(
                f"write: a RAID 5 file is limited to {FILE_BYTES_MAX} bytes; this write "
                f"would end at {offset + len(data)}"
            )
        data = bytes(data)
        if not data:
            return {"size": self.size(), "bytes": 0, "stripes": 0}
        stripes = 0
        try:
            for stripe, group in itertools.groupby(
                self._layout.pieces(offset, len(data)), key=lambda p: p.stripe
            ):
                pieces = list(group)
                size = offset + pieces[-1].at + pieces[-1].length
                self._write_stripe(stripe, pieces, data, size)
                self._known_size = max(self._known_size, size)
                stripes += 1
        except ShuttleError:
            if self.callbacks is not None:  # some bytes may have changed: say so
                with contextlib.suppress(ShuttleError):
                    self.callbacks.changed(self.key, offset, len(data))
            raise
        self.counters["writes"] += 1
        self.counters["bytes_written"] += len(data)
        done: dict[str, Any] = {"size": self._known_size, "bytes": len(data), "stripes": stripes}
        if self.callbacks is not None:
            try:
                done["timestamp"] = int(self.callbacks.changed(self.key, offset, len(data), holder))
            except ShuttleError as exc:
                reraise(
                    exc,
                    f"bytes {offset}..{offset + len(data) - 1} of {self.key!r} were written, "
                    f"but {self.callbacks.rid}, which keeps its caches' promises, was not "
                    "told: other caches may serve the old bytes until they miss; write "
                    "them again once its node answers",
                )
        return done

    def size(self) -> int:
        """The file's size: the largest any live column's record holds."""
        self._refresh_size()
        return self._known_size

    def mark_failed(self, column: int | None) -> dict[str, Any]:
        """Treat ``column`` as failed (None: all healthy). Reads rebuild its units
        from the other columns, writes leave it alone. Bringing a column back after
        writes made while it was failed takes :meth:`rebuild`, not ``mark_failed(None)``
        (which trusts the column's contents as they are)."""
        if column is not None and (
            isinstance(column, bool)
            or not isinstance(column, int)
            or not 0 <= column < len(self.storages)
        ):
            raise InvalidArgumentError(
                f"failed column must be None or in 0..{len(self.storages) - 1}, got {column!r:.40}"
            )
        self.failed = column
        return {"key": self.key, "failed": column}

    def verify(self) -> dict[str, Any]:
        """Check every stripe's parity against the XOR of its data (all columns must
        be healthy for that; in degraded mode only the open intents are reported).

        Returns ``{key, size, stripes, checked, bad, dirty, intents, busy, failed}``:
        ``bad`` the stripes whose parity does not match, ``dirty`` those with an
        unfinished write, ``busy`` those that kept changing while we looked."""
        records = self._records()
        size = max([self._known_size, *(r["size"] for r in records.values())])
        self._known_size = size
        intents = [i for r in records.values() for i in r["intents"]]
        dirty = sorted({i["stripe"] for i in intents})
        stripes = self._layout.stripes(size)
        bad: list[int] = []
        busy: list[int] = []
        checked = 0
        if self.failed is None:
            for stripe in range(max(stripes, dirty[-1] + 1 if dirty else 0)):
                ok = self._check_stripe(stripe)
                if ok is None:
                    busy.append(stripe)
                    continue
                checked += 1
                if not ok:
                    bad.append(stripe)
        return {
            "key": self.key,
            "size": size,
            "stripes": stripes,
            "checked": checked,
            "bad": bad,
            "dirty": dirty,
            "intents": intents,
            "busy": busy,
            "failed": self.failed,
        }

    def repair(self, scan: bool = True) -> dict[str, Any]:
        """Recompute the parity of every dirty stripe (and, with ``scan``, of every
        stripe :meth:`verify` finds bad) from its data, and close its intents.

        Needs every column: a column marked failed is an :class:`InvalidArgumentError`.
        Run it when no write to the file is under way (after a crash, before writing
        again): it closes every open intent, and a write it overlaps then recomputes
        its stripe itself, which is safe unless that writer also dies before it does.
        Returns ``{repaired, checked, bad, dirty}``."""
        if self.failed is not None:
            raise InvalidArgumentError(
                f"repair recomputes parity from every data column, and column "
                f"{self.failed} is marked failed; bring its node back, call rebuild() if "
                "the file was written while it was failed (or mark_failed(None) if not), "
                "then repair()"
            )
        if scan:
            found = self.verify()
            bad, dirty, checked = found["bad"], found["dirty"], found["checked"]
        else:
            records = self._records()
            bad, checked = [], 0
            dirty = sorted({i["stripe"] for r in records.values() for i in r["intents"]})
        todo = sorted(set(bad) | set(dirty))
        for stripe in todo:
            self._recompute(stripe, 0, self.unit_bytes, None, clear=True)
        self._spread_size()
        return {"repaired": todo, "checked": checked, "bad": bad, "dirty": dirty}

    def rebuild(self) -> dict[str, Any]:
        """Rewrite the failed column from the others (its node back, or replaced by an
        empty one at the same place), then mark it healthy. Run it when no other
        object is writing the file. Returns ``{column, stripes}``."""
        failed = self.failed
        if failed is None:
            raise InvalidArgumentError("rebuild rewrites a failed column, and none is marked")
        stripes = self._layout.stripes(self.size())
        u = self.unit_bytes
        for stripe in range(stripes):
            if self._layout.parity_column(stripe) == failed:
                self._recompute(stripe, 0, u, None, clear=True)
                continue
            retry = Retry(self, f"rebuilding stripe {stripe} of {self.key!r}")
            units, _ = self._snapshot(stripe, failed, 0, u, {}, None, retry, "rebuilt")
            key = column_key(self.key, failed)
            self._call(failed, "swap", key, stripe * u, units[failed], False)
        self.failed = None
        self._spread_size()
        return {"column": failed, "stripes": stripes}

    def stats(self) -> dict[str, Any]:
        """The layout and the counters."""
        return {
            "key": self.key,
            "columns": len(self.storages),
            "unit_bytes": self.unit_bytes,
            "layout": "left-symmetric",
            "failed": self.failed,
            "size_known": self._known_size,
            "callbacks": self.callbacks is not None,
            **self.counters,
        }

    # --- reads -----------------------------------------------------------------------

    def _read_pieces(self, pieces: list[Piece], out: bytearray) -> None:
        """Read healthy pieces, one call per run of adjacent units in a column."""
        u = self.unit_bytes
        runs: list[tuple[int, int, int, list[Piece]]] = []
        for p in sorted(pieces, key=lambda p: (p.column, p.stripe)):
            start = p.stripe * u + p.within
            if runs and runs[-1][0] == p.column and runs[-1][1] + runs[-1][2] == start:
                column, first, length, members = runs[-1]
                runs[-1] = (column, first, length + p.length, [*members, p])
            else:
                runs.append((p.column, start, p.length, [p]))
        for column, first, length, members in runs:
            data = self._read_column(column, first, length)
            for p in members:
                at = p.stripe * u + p.within - first
                out[p.at : p.at + p.length] = data[at : at + p.length]

    def _read_degraded(self, stripe: int, pieces: list[Piece], out: bytearray) -> None:
        """Pieces of a stripe one of which is on the failed column: rebuild that one
        from the others, which are read over the same call."""
        failed = self.failed
        assert failed is not None
        lost = next(p for p in pieces if p.column == failed)
        wanted = {p.column: (p.within, p.within + p.length) for p in pieces if p.column != failed}
        retry = Retry(self, f"reading stripe {stripe} of {self.key!r}")
        lo, hi = lost.within, lost.within + lost.length
        units, _ = self._snapshot(stripe, failed, lo, hi, wanted, None, retry, "read")
        for p in pieces:
            start = lo if p.column == failed else min(lo, p.within)  # where its bytes begin
            out[p.at : p.at + p.length] = units[p.column][
                p.within - start : p.within - start + p.length
            ]
        self.counters["degraded_stripe_reads"] += 1

    # --- writes ----------------------------------------------------------------------

    def _write_stripe(self, stripe: int, pieces: list[Piece], data: bytes, size: int) -> None:
        failed = self.failed
        full = len(pieces) == self._layout.data_columns and all(
            p.length == self.unit_bytes for p in pieces
        )
        # A write that grows the file leaves the size with its parity node (at the
        # intent) and with the node of its last live piece, so one failed node never
        # takes the only copy. Sizes seen at intents must not count here: they may be
        # this write's own.
        live = [p for p in pieces if p.column != failed]
        grow_at = live[-1] if live and size > self._known_size else None
        if failed == self._layout.parity_column(stripe):
            self._write_data_only(pieces, data, size, grow_at)
        elif failed is not None and (full or any(p.column == failed for p in pieces)):
            self._reconstruct_write(stripe, pieces, data, size, grow_at, full)
        elif full:
            self._full_stripe_write(stripe, pieces, data, size, grow_at)
        else:
            self._small_write(stripe, pieces, data, size, grow_at)

    def _small_write(
        self, stripe: int, pieces: list[Piece], data: bytes, size: int, grow_at: Piece | None
    ) -> None:
        """Read-modify-write: the data nodes return the old bytes as they write the
        new ones, and the parity node XORs in old ^ new."""
        parity = self._layout.parity_column(stripe)
        intent, _ = self._begin(stripe, size)
        lo = min(p.within for p in pieces)
        hi = max(p.within + p.length for p in pieces)
        delta = bytearray(hi - lo)
        with self._unfinished(stripe, intent):
            for p in pieces:
                new = data[p.at : p.at + p.length]
                old = self._swap(p, new, size if p is grow_at else 0, return_old=True)
                xor_into(delta, p.within - lo, old)
                xor_into(delta, p.within - lo, new)
            done = self._call(
                parity,
                "stripe_end",
                record_key(self.key, parity),
                stripe,
                intent,
                column_key(self.key, parity),
                stripe * self.unit_bytes + lo,
                bytes(delta),
            )
            if not done["ok"]:
                # A parity write since our intent began may count our data already, or
                # not: recompute the stripe's parity from its data instead.
                if self.failed is not None:
                    raise ObjectFailedError(
                        f"stripe {stripe} of {self.key!r} was written by an object that "
                        f"does not treat column {self.failed} as failed; every object of "
                        "a file must mark the same column failed"
                    )
                self._recompute(stripe, lo, hi, intent, clear=False)
        self.counters["small_writes"] += 1

    def _full_stripe_write(
        self, stripe: int, pieces: list[Piece], data: bytes, size: int, grow_at: Piece | None
    ) -> None:
        """A whole stripe: parity from the new data, no pre-reads; written only if no
        other write began or ended on the stripe meanwhile, else recomputed."""
        intent, begun = self._begin(stripe, size)
        version = str(begun["version"])
        new_parity = bytearray(self.unit_bytes)
        with self._unfinished(stripe, intent):
            for p in pieces:
                new = data[p.at : p.at + p.length]
                self._swap(p, new, size if p is grow_at else 0, return_old=False)
                xor_into(new_parity, 0, new)
            if not self._put_parity(stripe, version, 0, bytes(new_parity), intent):
                self._recompute(stripe, 0, self.unit_bytes, intent, clear=False)
        self.counters["full_stripe_writes"] += 1

    def _reconstruct_write(
        self,
        stripe: int,
        pieces: list[Piece],
        data: bytes,
        size: int,
        grow_at: Piece | None,
        full: bool,
    ) -> None:
        """Degraded, and the write touches the failed column: its new bytes exist only
        in the parity, computed from the other columns' data. The intent opens only
        when no other is open, and every later one moves the stripe's version, so the
        conditional parity write succeeds only if no other write overlapped it: no
        other writer's delta can be on its way to the parity it replaces."""
        failed = self.failed
        assert failed is not None
        u = self.unit_bytes
        lo = 0 if full else min(p.within for p in pieces)
        hi = u if full else max(p.within + p.length for p in pieces)
        retry = Retry(self, f"writing stripe {stripe} of {self.key!r}")
        while True:
            intent, begun = self._begin(stripe, size, exclusive=True)
            if intent:
                break
            self._wait_or_refuse(stripe, failed, begun["intents"], retry, "written")
        version = str(begun["version"])
        with self._unfinished(stripe, intent):
            if full:
                units = {p.column: bytes(u) for p in pieces}
            else:
                units, version = self._snapshot(
                    stripe, failed, lo, hi, {}, intent, retry, "written"
                )
            # The stripe's new contents over lo .. hi, the failed column's included.
            new_units = {c: bytearray(b) for c, b in units.items()}
            for p in pieces:
                new_units[p.column][p.within - lo : p.within - lo + p.length] = data[
                    p.at : p.at + p.length
                ]
            for p in pieces:
                if p.column != failed:
                    new = data[p.at : p.at + p.length]
                    self._swap(p, new, size if p is grow_at else 0, return_old=False)
            while True:
                new_parity = bytearray(hi - lo)
                for b in new_units.values():
                    xor_into(new_parity, 0, b)
                if self._put_parity(stripe, version, lo, bytes(new_parity), intent):
                    break
                retry.conflict()
                # Someone else's write came in: once none is open, read the live
                # columns again (the failed one's new bytes are ours, in new_units).
                while True:
                    st = self._state(stripe, intent)
                    if not st["intents"]:
                        break
                    self._wait_or_refuse(stripe, failed, st["intents"], retry, "written")
                version = str(st["version"])
                for column in new_units:
                    if column != failed:
                        new_units[column] = bytearray(
                            self._read_column(column, stripe * u + lo, hi - lo)
                        )
        self.counters["reconstruct_writes"] += 1

    def _write_data_only(
        self, pieces: list[Piece], data: bytes, size: int, grow_at: Piece | None
    ) -> None:
        """The stripe's parity column failed: there is no parity to keep."""
        for p in pieces:
            self._swap(p, data[p.at : p.at + p.length], size if p is grow_at else 0, False)
        self.counters["data_only_writes"] += 1

    def _recompute(self, stripe: int, lo: int, hi: int, intent: str | None, *, clear: bool) -> None:
        """Set the parity over ``lo .. hi`` to the XOR of the data as it is (all
        columns healthy), closing ``intent``; other writers' intents are marked
        superseded (they recompute in turn), or with ``clear`` closed."""
        u = self.unit_bytes
        retry = Retry(self, f"recomputing the parity of stripe {stripe} of {self.key!r}")
        while True:
            version = str(self._state(stripe, intent)["version"])
            new_parity = bytearray(hi - lo)
            for i in range(self._layout.data_columns):
                column = self._layout.data_column(stripe, i)
                xor_into(new_parity, 0, self._read_column(column, stripe * u + lo, hi - lo))
            if self._put_parity(stripe, version, lo, bytes(new_parity), intent, clear):
                break
            retry.conflict()
        self.counters["recomputes"] += 1


def _check_io(offset: Any, length: Any, what: str) -> None:
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise InvalidArgumentError(f"{what}: offset must be an integer ≥ 0, got {offset!r:.40}")
    if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= IO_BYTES_MAX:
        raise InvalidArgumentError(
            f"{what}: length must be an integer in 0..{IO_BYTES_MAX}, got {length!r:.40}"
        )
