"""Network-wide object ids (ABACUS's ``rid``): the home run-time plus a local id.

The home is the run-time (a storage node, or a client's run-time) where the object
was created; it always knows where the object is now, so any stale location hint can
be corrected by asking it. The id never changes when the object moves.
"""

from __future__ import annotations

from dataclasses import dataclass

from shuttle.errors import InvalidArgumentError

#: Separates the home from the local part in the text form (``n1/17``). Node ids may
#: contain ``:`` (``127.0.0.1:7400``) but a local id never contains ``/``.
SEPARATOR = "/"
#: Local id of a node's anchored storage object.
STORAGE_LOCAL_ID = "storage"
#: Local ids of the objects every node hosts, anchored, next to its storage: the
#: storage object and the file system's node services (isolation, atomicity).
ANCHORED_LOCAL_IDS = frozenset({STORAGE_LOCAL_ID, "isolation", "atomicity"})


#: An application's run-time id begins with this (``c-HOST-PID-XXXX``); a node's
#: run-time id is its node id. Over TLS a node checks another node's certificate
#: against the cluster's CA, and an application's run-time (which has no certificate
#: from the CA) by its key proof instead (:mod:`shuttle.net.tls`).
APPLICATION_PREFIX = "c-"


def is_application(runtime_id: str) -> bool:
    """Whether ``runtime_id`` names an application's run-time (not a node's)."""
    return runtime_id.startswith(APPLICATION_PREFIX)


@dataclass(frozen=True, slots=True, order=True)
class ObjectId:
    """``home`` run-time id and ``local`` id unique within that home."""

    home: str
    local: str

    def __post_init__(self) -> None:
        if not self.home or not self.local or SEPARATOR in self.local:
            raise InvalidArgumentError(
                f"an object id needs a home and a local part without {SEPARATOR!r}, "
                f"got home={self.home!r} local={self.local!r}"
            )

    def __str__(self) -> str:
        return f"{self.home}{SEPARATOR}{self.local}"

    @classmethod
    def parse(cls, text: str) -> ObjectId:
        """``"n1/17"`` → ``ObjectId("n1", "17")``; :class:`InvalidArgumentError` if malformed."""
        if not isinstance(text, str):
            raise InvalidArgumentError(f"an object id is a string like 'n1/17', got {text!r:.80}")
        home, sep, local = text.rpartition(SEPARATOR)
        if not sep:
            raise InvalidArgumentError(f"object id {text!r:.80} has no home part (like 'n1/17')")
        return cls(home, local)

    @classmethod
    def storage(cls, node_id: str) -> ObjectId:
        """The id of node ``node_id``'s anchored storage object."""
        return cls(node_id, STORAGE_LOCAL_ID)

    @classmethod
    def service(cls, node_id: str, name: str) -> ObjectId:
        """The id of node ``node_id``'s anchored object ``name`` (``storage``,
        ``isolation``, ``atomicity``)."""
        if name not in ANCHORED_LOCAL_IDS:
            known = ", ".join(sorted(ANCHORED_LOCAL_IDS))
            raise InvalidArgumentError(f"no anchored node object {name!r}; nodes host {known}")
        return cls(node_id, name)

    @property
    def is_storage(self) -> bool:
        return self.local == STORAGE_LOCAL_ID

    @property
    def is_anchored(self) -> bool:
        """One of the objects a node hosts anchored (it never moves, is never made)."""
        return self.local in ANCHORED_LOCAL_IDS
