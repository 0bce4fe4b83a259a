"""What the client hands back: object attributes and write results (and, re-exported
from :mod:`shuttle.net.addresses`, the :class:`NodeAddress` it is built from)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shuttle.errors import RemoteProtocolError

# NodeAddress is re-exported: it is part of the client's API.
from shuttle.net.addresses import NodeAddress as NodeAddress


@dataclass(frozen=True, slots=True)
class Chunk:
    """One content-defined chunk of an object: where it is and its blake3 hash."""

    offset: int
    length: int
    hash: bytes


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """An object's attributes as its node reported them."""

    key: str
    size: int
    version: int
    mtime_ns: int
    hash: bytes
    #: The chunk list, or its first page for very large objects (see ``chunks_total``
    #: and :meth:`shuttle.Client.chunks`).
    chunks: tuple[Chunk, ...] = field(default=(), repr=False)
    chunks_total: int = 0

    @property
    def chunks_complete(self) -> bool:
        return len(self.chunks) == self.chunks_total

    @classmethod
    def from_wire(cls, raw: Any) -> ObjectInfo:
        try:
            chunks = tuple(Chunk(o, n, h) for o, n, h in raw.get("chunks", ()))
            return cls(
                key=raw["key"],
                size=raw["size"],
                version=raw["version"],
                mtime_ns=raw["mtime_ns"],
                hash=raw["hash"],
                chunks=chunks,
                chunks_total=raw.get("chunks_total", len(chunks)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RemoteProtocolError(
                f"malformed object attributes from node: {raw!r:.200}"
            ) from exc


@dataclass(frozen=True, slots=True)
class WriteInfo:
    """The result of a range write or truncate: the object's new size and version."""

    key: str
    size: int
    version: int
    mtime_ns: int

    @classmethod
    def from_wire(cls, raw: Any) -> WriteInfo:
        try:
            return cls(raw["key"], raw["size"], raw["version"], raw["mtime_ns"])
        except (KeyError, TypeError) as exc:
            raise RemoteProtocolError(f"malformed write result from node: {raw!r:.200}") from exc
