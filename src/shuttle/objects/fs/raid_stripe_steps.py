"""The steps of one RAID 5 stripe at its columns' nodes, as a ``raid5`` object takes them.

Concepts: every call a RAID object makes to a column's storage object, one per step
of the stripe protocol whose node half is :mod:`shuttle.objects.fs.raid_node`: open
an intent at the parity node (:meth:`StripeSteps._begin`), read a stripe's version
and open intents (``_state``), put its parity if the version has not moved
(``_put_parity``), swap a data unit (``_swap``), read a column with holes as zeros
(``_read_column``), read the records and spread the file size they hold; built of
those, a consistent snapshot of a stripe with a failed column's bytes rebuilt
(``_snapshot``) and a parity check (``_check_stripe``); how long to wait between
them (:class:`Retry`: back-off, a bound on conflicts; an abandoned or stale intent
refused) and how a failure reads (the column that did not answer, the stripe left
dirty). The file object itself (its interface, how a read or a write is split into
stripes, which write each stripe takes) is :mod:`shuttle.objects.fs.raid`, whose
class takes these steps as a base: they share its columns, its failed column, its
known size and its counters, and every call goes through its one ``_call``.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from shuttle.errors import (
    NotFoundError,
    ObjectBusyError,
    ObjectFailedError,
    ObjectInDoubtError,
    ObjectNotFoundError,
    RequestTimeoutError,
    ShuttleError,
    UnreachableError,
)
from shuttle.objects.fs.raid_layout import Piece, Raid5Layout, column_key, record_key
from shuttle.objects.fs.raid_node import xor_into
from shuttle.runtime.refs import Ref

#: Times one stripe operation retries when other writers keep changing the stripe.
CONFLICTS_MAX = 64
#: Waits between retries grow from the first to the last, with jitter.
BACKOFF_S_MIN = 0.001
BACKOFF_S_MAX = 0.05


class Retry:
    """Retries of one stripe operation: waits with back-off, a bound on conflicts."""

    def __init__(self, owner: StripeSteps, what: str) -> None:
        self.owner = owner
        self.what = what
        self.conflicts = 0
        self.waits = 0

    def wait(self) -> None:
        """Others' writes are open on the stripe: give them a moment."""
        self.owner.counters["waits"] += 1
        self._pause(self.waits)
        self.waits += 1

    def conflict(self) -> None:
        """The stripe changed under us: try again, a bounded number of times."""
        self.owner.counters["conflicts"] += 1
        self.conflicts += 1
        if self.conflicts > CONFLICTS_MAX:
            raise ObjectBusyError(
                f"{self.what}: other writers kept changing the stripe through "
                f"{CONFLICTS_MAX} attempts; try again"
            )
        self._pause(self.conflicts - 1)

    def _pause(self, n: int) -> None:
        delay = min(BACKOFF_S_MAX, BACKOFF_S_MIN * 2 ** min(n, 10))
        self.owner._sleep(delay * random.uniform(0.5, 1.0))  # jitter: two retriers part


class StripeSteps:
    """The stripe steps of :class:`~shuttle.objects.fs.raid.Raid5Object`, over the
    state it keeps (declared here, set by it)."""

    #: One storage object per column, and the file's key, unit and failed column.
    storages: list[Ref]
    key: str
    unit_bytes: int
    failed: int | None
    #: An intent open this long belongs to a writer that died.
    stale_intent_s: float
    counters: dict[str, int]
    _layout: Raid5Layout
    #: The file size as last seen (a lower bound: sizes only grow).
    _known_size: int
    #: Names this incarnation's intents, numbered by ``_intents``.
    _writer: str
    _intents: Iterator[int]
    _sleep: Callable[[float], None]

    def _snapshot(
        self,
        stripe: int,
        failed: int,
        lo: int,
        hi: int,
        wanted: dict[int, tuple[int, int]],
        intent: str | None,
        retry: Retry,
        doing: str,
    ) -> tuple[dict[int, bytes], str]:
        """Column ``failed``'s bytes ``lo .. hi`` of ``stripe`` rebuilt from the other
        columns, read as of one instant, and the stripe's version then.

        Returns each live data column's bytes over ``lo .. hi`` joined with its
        ``wanted`` range (from the smaller start), the rebuilt bytes under ``failed``.
        Every data change is preceded by an intent, which moves the version: equal
        versions before and after the reads, with no intent open but ours, mean no
        write overlapped them."""
        u = self.unit_bytes
        parity = self._layout.parity_column(stripe)
        live = [
            self._layout.data_column(stripe, i)
            for i in range(self._layout.data_columns)
            if self._layout.data_column(stripe, i) != failed
        ]
        spans = {}
        for column in live:
            a, b = wanted.get(column, (lo, hi))
            spans[column] = (min(a, lo), max(b, hi))
        while True:
            before = self._state(stripe, intent)
            if before["intents"]:
                self._wait_or_refuse(stripe, failed, before["intents"], retry, doing)
                continue
            units = {c: self._read_column(c, stripe * u + a, b - a) for c, (a, b) in spans.items()}
            after = self._call(
                parity,
                "stripe_read",
                record_key(self.key, parity),
                stripe,
                column_key(self.key, parity),
                stripe * u + lo,
                hi - lo,
                intent,
            )
            if after["version"] == before["version"] and not after["intents"]:
                break
            retry.conflict()
        rebuilt = bytearray(after["data"])
        for column, (a, _) in spans.items():
            xor_into(rebuilt, 0, units[column][lo - a : hi - a])
        units[failed] = bytes(rebuilt)
        return units, str(after["version"])

    def _new_intent(self) -> str:
        return f"{self._writer}.{next(self._intents)}"

    def _begin(self, stripe: int, size: int, exclusive: bool = False) -> tuple[str, dict[str, Any]]:
        """Open an intent on ``stripe`` at its parity node (recording ``size`` there):
        ``(intent, answer)``, the answer with the stripe's version and the other open
        intents. ``exclusive``: only if no other intent is open (else the intent is "")."""
        parity = self._layout.parity_column(stripe)
        intent = self._new_intent()
        answer: dict[str, Any] = self._call(
            parity, "stripe_begin", record_key(self.key, parity), stripe, intent, size, exclusive
        )
        if not answer["ok"]:
            return "", answer
        self._known_size = max(self._known_size, int(answer["size"]))
        return intent, answer

    def _state(self, stripe: int, intent: str | None) -> dict[str, Any]:
        parity = self._layout.parity_column(stripe)
        answer: dict[str, Any] = self._call(
            parity, "stripe_read", record_key(self.key, parity), stripe, "", 0, 0, intent
        )
        return answer

    def _put_parity(
        self,
        stripe: int,
        version: str,
        lo: int,
        parity_bytes: bytes,
        intent: str | None,
        clear: bool = False,
    ) -> bool:
        parity = self._layout.parity_column(stripe)
        answer = self._call(
            parity,
            "stripe_put",
            record_key(self.key, parity),
            stripe,
            version,
            column_key(self.key, parity),
            stripe * self.unit_bytes + lo,
            parity_bytes,
            intent,
            clear,
        )
        return bool(answer["ok"])

    def _swap(self, piece: Piece, new: bytes, size: int, return_old: bool) -> bytes:
        """Write a piece; with ``size``, its node records the file size too."""
        column = piece.column
        extra: dict[str, Any] = {}
        if size:
            extra = {"record": record_key(self.key, column), "size": size}
        old: bytes = self._call(
            column,
            "swap",
            column_key(self.key, column),
            piece.stripe * self.unit_bytes + piece.within,
            new,
            return_old,
            **extra,
        )
        return old

    def _read_column(self, column: int, offset: int, length: int) -> bytes:
        """``length`` bytes of a column, zeros where it has none (holes, a column never
        written, a new empty node)."""
        try:
            data: bytes = self._call(column, "read", column_key(self.key, column), offset, length)
        except ObjectNotFoundError:
            raise
        except NotFoundError:
            data = b""
        return data if len(data) == length else data + bytes(length - len(data))

    def _records(self) -> dict[int, dict[str, Any]]:
        """Each live column's record: ``{size, intents}``."""
        return {
            c: self._call(c, "stripe_record", record_key(self.key, c))
            for c in range(len(self.storages))
            if c != self.failed
        }

    def _spread_size(self) -> None:
        """Record the size in every column: a write cut short, or made while a column
        was failed, may have left it with one node only."""
        self._refresh_size()
        for column in range(len(self.storages)):
            self._call(column, "record_size", record_key(self.key, column), self._known_size)

    def _refresh_size(self) -> None:
        for record in self._records().values():
            self._known_size = max(self._known_size, int(record["size"]))

    def _check_stripe(self, stripe: int) -> bool | None:
        """Parity == XOR of the data, from a snapshot of one instant (None: the stripe
        kept changing)."""
        u = self.unit_bytes
        parity = self._layout.parity_column(stripe)
        for _ in range(3):
            before = self._state(stripe, None)
            xor = bytearray(u)
            for i in range(self._layout.data_columns):
                column = self._layout.data_column(stripe, i)
                xor_into(xor, 0, self._read_column(column, stripe * u, u))
            after = self._call(
                parity,
                "stripe_read",
                record_key(self.key, parity),
                stripe,
                column_key(self.key, parity),
                stripe * u,
                u,
            )
            if after["version"] == before["version"]:
                return bool(bytes(xor) == after["data"])
        return None

    def _wait_or_refuse(
        self, stripe: int, failed: int, intents: list[dict[str, Any]], retry: Retry, doing: str
    ) -> None:
        """Other writes are open on a stripe we need whole while ``failed`` is down:
        wait if they may still finish, refuse if their writers are gone."""
        for i in intents:
            if i["abandoned"] or i["age_s"] >= self.stale_intent_s:
                how = (
                    "abandoned by its writer"
                    if i["abandoned"]
                    else f"begun {i['age_s']:.1f} s ago and never finished"
                )
                first = stripe * self._layout.stripe_bytes
                raise ObjectFailedError(
                    f"stripe {stripe} of {self.key!r} (bytes {first}.."
                    f"{first + self._layout.stripe_bytes - 1}) has an unfinished write "
                    f"({how}): its parity may not match its data, so column {failed}'s "
                    f"unit cannot be rebuilt from it and the stripe cannot be {doing} "
                    f"while column {failed} is failed. Bring column {failed}'s node back, "
                    "call mark_failed(None), then repair() (it recomputes the parity "
                    "from the data)"
                )
        retry.wait()

    @contextlib.contextmanager
    def _unfinished(self, stripe: int, intent: str) -> Iterator[None]:
        """A write step failed: leave the intent open, marked abandoned (best effort:
        its node may be the one that failed), and say what state the stripe is in."""
        try:
            yield
        except ShuttleError as exc:
            parity = self._layout.parity_column(stripe)
            with contextlib.suppress(ShuttleError):
                self._call(parity, "stripe_abandon", record_key(self.key, parity), stripe, intent)
            reraise(
                exc,
                f"writing stripe {stripe} of {self.key!r} failed, and the stripe is left "
                "marked dirty (its data may be partly written); once every node is up, "
                "repair() recomputes its parity",
            )

    def _call(self, column: int, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.storages[column].call(method, *args, **kwargs)
        # A call whose node died with it in flight is in doubt (it may have taken
        # effect): for the file it is the same column that did not answer.
        except (UnreachableError, RequestTimeoutError, ObjectInDoubtError) as exc:
            reraise(
                exc,
                f"column {column} of {self.key!r} ({self.storages[column].rid}) did not "
                f"answer; if its node is down, mark_failed({column}) reads and writes "
                "the file without it",
            )


def reraise(exc: ShuttleError, context: str) -> NoReturn:
    """Raise ``exc``'s class again with ``context`` before its message."""
    raise type(exc)(f"{context}: {exc}") from exc
