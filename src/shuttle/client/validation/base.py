"""The interface every validation mode implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from shuttle.client.model import ObjectInfo
from shuttle.errors import NotFoundError

if TYPE_CHECKING:
    from shuttle.client.client import Client


#: A directory as :meth:`ValidationMode.listdir` gives it: sub-prefixes (each ending in
#: ``/``), keys (sorted), and the keys' attributes in the same order (None: gone).
Listed = tuple[list[str], list[str], list[ObjectInfo | None]]


class DirectoryKeyError(NotFoundError):
    """``open`` of a key that names a directory (a prefix of other keys), as its node
    said in the same round trip (``callback.promise`` with ``dirs``). A NotFoundError
    like any other miss, so callers that only want objects need not know it; the faces
    take it as "a directory" without asking every node. Local: never on the wire (the
    node answers ``{"dir": true}``)."""


class PendingCheck(Protocol):
    """A check still out when ``open`` returned (the ``speculative`` mode)."""

    def confirm(self) -> None:
        """Wait for the check; raise ``StaleDataError`` if the copy opened was stale."""


@dataclass(frozen=True, slots=True)
class Validated:
    """The outcome of validating one open: the attributes the cached blocks may be
    read against, and whether blocks cached before were kept. ``pending``: a check
    that was still out when the open returned; the file confirms it at its
    ``checkpoint()`` and at ``close()``."""

    info: ObjectInfo
    cache_was_valid: bool
    pending: PendingCheck | None = None


class ValidationMode(ABC):
    """How one client decides, at open, that its cached copy of an object may be used.

    A mode returns the attributes (above all the version) that reads after the open
    are pinned to; the client cache drops blocks of any other version.
    """

    #: The name the mode is registered and chosen by.
    name: ClassVar[str]
    #: The mode's freshness statement (docs/consistency.md), which the shared test
    #: suite checks against concurrent writers: an open returns a version no older than
    #: the node's version ``staleness_s`` seconds before the open began (0: the node's
    #: version at the moment the open began, or a newer one).
    staleness_s: ClassVar[float] = 0.0

    def __init__(self, client: Client) -> None:
        self.client = client

    @abstractmethod
    def open(self, key: str) -> Validated:
        """Validate the cached copy of ``key`` for one open."""

    def stat_many(self, keys: Sequence[str]) -> list[ObjectInfo | None]:
        """Attributes of many keys (None where missing), as a listing needs them. A mode
        may use the round trip to prepare later opens (``callback`` takes a promise on
        each object, so opening any of them costs no round trip)."""
        return self.client.stat_many(keys)

    def listdir(self, prefix: str) -> Listed | None:
        """The keys and sub-prefixes directly under ``prefix`` with the keys'
        attributes, if the mode can have them in one round trip per node (``callback``:
        with a promise on each); None: the caller lists, then calls :meth:`stat_many`."""
        return None

    def forget(self, key: str) -> None:  # noqa: B027 (optional hook)
        """This client changed or removed ``key``: drop any state the mode keeps on it."""

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Release what the mode holds (threads, connections, promises)."""

    def stats(self) -> dict[str, Any]:
        """The mode's counters (for ``client.counters()``)."""
        return {}
