"""Where objects are, as one run-time knows it (ABACUS 5.1): the location table.

One :class:`LocationTable` per run-time owns every table of where objects are:

* ``hosted``: the objects running (or staged, arriving) here, each a
  :class:`~shuttle.runtime.hosted.Hosted` behind its gate;
* ``homed``: for the objects this run-time is the home of, where each runs and the
  *epoch* of its current activation (:class:`HomeEntry`), with the bookkeeping that
  fences migrations (which move was committed, which were given up);
* ``hints``: where other objects were last heard to run, with the epoch heard;
* ``migrating``: the objects this run-time is moving away.

It changes only through methods named for what happened (:meth:`created_here`,
:meth:`moved_out`, :meth:`commit_move`, ...), each under one lock, so no other module
writes a table and no two tables disagree between two statements. There is no
forwarding table: a move takes effect at the object's home first (the home records
it before the target serves, :mod:`shuttle.runtime.migration_home`), so the source has
nothing to forward, and a caller with a stale hint asks the home (ABACUS 5.2: old
hosts are not required to forward).

Epochs: every activation of an object (its creation, each move, each
re-activation from a checkpoint) has a number, one higher than the last, recorded
by its home; a copy serves only at the current one. See docs/runtime.md, "Fencing".
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shuttle.errors import InvalidArgumentError, ObjectBusyError
from shuttle.runtime.ids import ObjectId

if TYPE_CHECKING:
    from shuttle.runtime.hosted import Hosted

#: Moves a home remembers as given up (fenced), per object: a source asks about its
#: one move in doubt; a handful covers several moves abandoned in a row.
FENCED_MAX = 16
#: Hints kept about other run-times' objects (an LRU bound: a hint is a guess, and
#: an object called once long ago costs only a locate when called again).
HINTS_MAX = 100_000
#: The first epoch of every object.
FIRST_EPOCH = 1


@dataclass
class HomeEntry:
    """What a home knows of an object it is the home of."""

    location: str
    type_label: str
    epoch: int = FIRST_EPOCH
    durable: bool = False
    #: When (monotonic, here) the entry was made: a silent application's grace starts.
    since: float = field(default_factory=time.monotonic)
    #: The migration id of the last move committed here (a source in doubt asks).
    last_commit: str = ""
    #: Migration ids given up: a commit under one of them is refused.
    fenced: deque[str] = field(default_factory=lambda: deque(maxlen=FENCED_MAX))
    #: The principal that created it (None: unrestricted; runtime/authority.py): only
    #: it (or an unrestricted caller) may move, persist, renew or end it here.
    principal: str | None = None


@dataclass(frozen=True)
class Hint:
    """Where an object was heard to run, and at which epoch (0: not said)."""

    location: str
    epoch: int = 0


@dataclass(frozen=True)
class Commit:
    """A home's answer to a move: taken (``epoch`` is the new activation's), or
    refused with what the home holds instead."""

    ok: bool
    epoch: int
    location: str
    reason: str = ""


@dataclass(frozen=True)
class Resolution:
    """A home's answer to a source in doubt about move ``mid``: ``committed`` (it took
    effect at ``epoch`` on ``location``) or not, and then never will (fenced)."""

    committed: bool
    epoch: int
    location: str
    known: bool = True


class LocationTable:
    """Run-time ``runtime_id``'s tables of where objects are."""

    def __init__(self, runtime_id: str) -> None:
        self.runtime_id = runtime_id
        self._lock = threading.Lock()
        self._hosted: dict[ObjectId, Hosted] = {}
        self._homed: dict[ObjectId, HomeEntry] = {}
        self._hints: dict[ObjectId, Hint] = {}
        self._migrating: set[ObjectId] = set()

    # --- reading --------------------------------------------------------------------

    def hosted(self, rid: ObjectId) -> Hosted | None:
        return self._hosted.get(rid)

    def hosted_items(self) -> list[tuple[ObjectId, Hosted]]:
        with self._lock:
            return list(self._hosted.items())

    def principals_hosted(self) -> Counter[str]:
        """How many objects hosted here act for each principal (the cluster key's not
        counted): what a principal's share of the node's objects is checked against."""
        with self._lock:
            return Counter(h.principal for h in self._hosted.values() if h.principal)

    def hosted_ids(self) -> list[ObjectId]:
        with self._lock:
            return list(self._hosted)

    def home_entry(self, rid: ObjectId) -> HomeEntry | None:
        return self._homed.get(rid)

    def homed_items(self) -> list[tuple[ObjectId, HomeEntry]]:
        with self._lock:
            return list(self._homed.items())

    def hint(self, rid: ObjectId) -> Hint | None:
        return self._hints.get(rid)

    def is_migrating(self, rid: ObjectId) -> bool:
        return rid in self._migrating

    def migrating_ids(self) -> list[ObjectId]:
        with self._lock:
            return list(self._migrating)

    def where(self, rid: ObjectId) -> str | None:
        """Where we think ``rid`` runs (authoritative if hosted here or homed here)."""
        return self.locate_here(rid)[0]

    def locate_here(self, rid: ObjectId) -> tuple[str | None, bool, int]:
        """(location, authoritative, epoch) as this run-time knows it."""
        with self._lock:
            hosted = self._hosted.get(rid)
            home = self._homed.get(rid)
            if hosted is not None:
                epoch = home.epoch if home is not None else hosted.epoch
                return self.runtime_id, True, epoch
            if home is not None:
                return home.location or None, True, home.epoch
            hint = self._hints.get(rid)
            return (hint.location, False, hint.epoch) if hint is not None else (None, False, 0)

    def known_epoch(self, rid: ObjectId) -> int:
        """The newest epoch of ``rid`` this run-time has heard of (0: none)."""
        home = self._homed.get(rid)
        if home is not None:
            return home.epoch
        hint = self._hints.get(rid)
        return hint.epoch if hint is not None else 0

    # --- objects made, arriving, leaving, ending here ---------------------------------

    def refuse_taken(self, rid: ObjectId) -> None:
        """An id names one object: :class:`InvalidArgumentError` if ``rid``'s is taken."""
        if rid in self._hosted or (rid.home == self.runtime_id and rid in self._homed):
            raise InvalidArgumentError(
                f"object id {rid} is taken here; every object needs an id of its own"
            )

    def _take_id(self, hosted: Hosted) -> None:
        self.refuse_taken(hosted.rid)

    def created_here(self, hosted: Hosted) -> None:
        """A new object runs here (at its first epoch); recorded at home if we are it."""
        with self._lock:
            self._take_id(hosted)
            self._hosted[hosted.rid] = hosted
            self._hints.pop(hosted.rid, None)
            if hosted.rid.home == self.runtime_id:
                self._homed[hosted.rid] = HomeEntry(
                    self.runtime_id,
                    hosted.type_label,
                    hosted.epoch,
                    hosted.durable,
                    principal=hosted.principal,
                )

    def anchored_here(self, hosted: Hosted) -> None:
        """One of this run-time's own objects (a node's storage object)."""
        self.created_here(hosted)

    def created_at(
        self,
        rid: ObjectId,
        location: str,
        type_label: str,
        durable: bool,
        principal: str | None = None,
    ) -> None:
        """We (the home) are having ``rid`` made on ``location``, for ``principal``."""
        with self._lock:
            if rid in self._homed:
                raise InvalidArgumentError(f"object id {rid} is taken here")
            self._homed[rid] = HomeEntry(
                location, type_label, FIRST_EPOCH, durable, principal=principal
            )

    def creation_failed(self, rid: ObjectId) -> None:
        with self._lock:
            self._homed.pop(rid, None)

    def restored_home(self, rid: ObjectId, entry: HomeEntry) -> None:
        """A durable object's home entry, read back from disk after a restart."""
        with self._lock:
            self._homed[rid] = entry

    def staged(self, hosted: Hosted) -> None:
        """An object migrating here is restored behind a closed gate. A stale stage of
        the same object (its source gave up on it) is replaced."""
        with self._lock:
            old = self._hosted.get(hosted.rid)
            if old is not None and not old.staged:
                raise InvalidArgumentError(f"object {hosted.rid} is already hosted here")
            self._hosted[hosted.rid] = hosted

    def stage_dropped(self, hosted: Hosted) -> bool:
        """A staged arrival was aborted or expired; False if the table holds another."""
        with self._lock:
            if self._hosted.get(hosted.rid) is not hosted:
                return False
            del self._hosted[hosted.rid]
            return True

    def activated_here(self, rid: ObjectId, epoch: int) -> None:
        """A staged arrival now serves here at ``epoch``."""
        with self._lock:
            hosted = self._hosted.get(rid)
            if hosted is not None:
                hosted.epoch = epoch
            self._hints.pop(rid, None)

    def reactivated_here(self, hosted: Hosted) -> None:
        """A durable object's home brings it back here from its last checkpoint (its
        host died or restarted); the entry already holds the new epoch."""
        with self._lock:
            old = self._hosted.get(hosted.rid)
            if old is not None and not old.staged:
                raise ObjectBusyError(f"object {hosted.rid} is already hosted here")
            self._hosted[hosted.rid] = hosted

    def moved_out(self, copy: Hosted, target: str, epoch: int) -> bool:
        """The move of ``copy`` to ``target`` took effect (at ``epoch``): it leaves.
        Only its home keeps where it went (it recorded it first). False if the table
        holds another copy by now (its home brought it back here meanwhile: that one
        stays)."""
        with self._lock:
            if self._hosted.get(copy.rid) is not copy:
                return False
            del self._hosted[copy.rid]
            if copy.rid.home != self.runtime_id:
                self._hints.pop(copy.rid, None)
            return True

    def left(self, rid: ObjectId, copy: Hosted | None = None) -> Hosted | None:
        """The object stopped running here (destroyed, lost, or a stale copy told to
        stop); its home entry, if any, is the caller's to change. With ``copy``: only
        if that copy is the one the table holds (not a newer arrival)."""
        with self._lock:
            if copy is not None and self._hosted.get(rid) is not copy:
                return None
            return self._hosted.pop(rid, None)

    def forgotten(self, rid: ObjectId) -> None:
        """We are ``rid``'s home and it ended (destroyed, or lost where it ran)."""
        with self._lock:
            self._homed.pop(rid, None)

    # --- hints ----------------------------------------------------------------------

    def heard(self, rid: ObjectId, location: str, epoch: int = 0) -> None:
        """Someone (its home, or a host it moved from) said ``rid`` runs at ``location``."""
        with self._lock:
            if rid in self._hosted or rid in self._homed:
                return  # we know better
            old = self._hints.get(rid)
            if old is not None and epoch and old.epoch > epoch:
                return  # older news
            self._hints.pop(rid, None)
            self._hints[rid] = Hint(location, epoch or (old.epoch if old else 0))
            while len(self._hints) > HINTS_MAX:
                del self._hints[next(iter(self._hints))]

    def hint_failed(self, rid: ObjectId) -> None:
        """The hint led nowhere (unreachable, or not there): forget it."""
        with self._lock:
            self._hints.pop(rid, None)

    # --- migrations driven from here ---------------------------------------------------

    def migration_started(self, rid: ObjectId) -> bool:
        """False if ``rid`` is already moving (a second move waits for the first)."""
        with self._lock:
            if rid in self._migrating:
                return False
            self._migrating.add(rid)
            return True

    def migration_ended(self, rid: ObjectId) -> None:
        with self._lock:
            self._migrating.discard(rid)

    # --- the home's side of a move ----------------------------------------------------

    def commit_move(
        self, rid: ObjectId, mid: str, source: str, from_epoch: int, target: str
    ) -> Commit:
        """At ``rid``'s home: move ``mid`` asks to make ``target`` the object's place,
        from ``source`` at ``from_epoch``. Taken only if that is where and at which
        epoch the object runs now and the move was not given up."""
        with self._lock:
            entry = self._homed.get(rid)
            if entry is None:
                return Commit(False, 0, "", f"{self.runtime_id} is not the home of {rid}")
            if entry.last_commit == mid:
                return Commit(True, entry.epoch, entry.location)  # asked twice
            if mid in entry.fenced:
                return Commit(False, entry.epoch, entry.location, "its source gave up on that move")
            if entry.location != source or entry.epoch != from_epoch:
                return Commit(
                    False,
                    entry.epoch,
                    entry.location,
                    f"the object runs on {entry.location or 'nowhere'} at epoch {entry.epoch}, "
                    f"not on {source} at epoch {from_epoch}",
                )
            entry.epoch += 1
            entry.location = target
            entry.last_commit = mid
            return Commit(True, entry.epoch, target)

    def resolve_move(self, rid: ObjectId, mid: str) -> Resolution:
        """At ``rid``'s home: did move ``mid`` take effect? If not, it never will (the
        home fences it), so the asker may act on the answer."""
        with self._lock:
            entry = self._homed.get(rid)
            if entry is None:
                return Resolution(False, 0, "", known=False)
            if entry.last_commit == mid:
                return Resolution(True, entry.epoch, entry.location)
            if mid not in entry.fenced:
                entry.fenced.append(mid)
            return Resolution(False, entry.epoch, entry.location)

    def reactivation(self, rid: ObjectId, location: str) -> int:
        """At ``rid``'s home: a new activation of a durable object at ``location`` (its
        host died): the next epoch, which makes every older copy stale."""
        with self._lock:
            entry = self._homed[rid]
            entry.epoch += 1
            entry.location = location
            entry.last_commit = ""
            return entry.epoch

    def moved_elsewhere(self, rid: ObjectId, location: str) -> None:
        """At ``rid``'s home: told by a run-time that the object went to ``location``
        (the home entry of an older peer's move, or "" for lost)."""
        with self._lock:
            if not location:
                self._homed.pop(rid, None)
                return
            entry = self._homed.get(rid)
            if entry is None:
                self._homed[rid] = HomeEntry(location, "?")
            else:
                entry.location = location
