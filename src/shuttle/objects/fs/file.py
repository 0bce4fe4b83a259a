"""``file``: the top of a file's stack, the interface applications call (ABACUS 4.3.1).

A file object offers byte-range reads and writes (the VFS face of the file system)
and passes them to the object below it: the file's ``cache`` object, a ``raid5``
object, or straight to the node's ``isolation`` object for an uncached file. It
keeps an open file's position for sequential reads and writes, and counts what the
application asked for. Like every object between the console and the storage it can
run at the client or at a node; it does little work of its own, so the run-time
moves it only together with the object below.
"""

from __future__ import annotations

from typing import Any

from shuttle.errors import InvalidArgumentError
from shuttle.objects.fs.cache import check_range
from shuttle.runtime.mobile import MobileObject, builtin
from shuttle.runtime.refs import Ref

#: What may sit below a file object, and how it is called.
BACKINGS = ("cache", "raid5", "isolation")


@builtin("file")
class FileObject(MobileObject):
    """Byte ranges of one file over its cache, RAID or node."""

    def __init__(self, backing: Ref, key: str, *, layer: str = "cache") -> None:
        if layer not in BACKINGS:
            raise InvalidArgumentError(f"a file's backing is one of {BACKINGS}, not {layer!r}")
        if not isinstance(key, str) or not key:
            raise InvalidArgumentError(f"a file needs its key, got {key!r:.60}")
        self.backing = backing
        self.layer = layer
        self.key = key
        self.position = 0
        self.reads = 0
        self.writes = 0
        self.bytes_read = 0
        self.bytes_written = 0

    def read(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes from ``offset`` (fewer at the end of the file)."""
        check_range(offset, length, "read")
        if length == 0:
            return b""
        if self.layer == "isolation":
            data = bytes(self.backing.read(self.key, offset, length)[0])
        else:
            data = bytes(self.backing.read(offset, length))
        self.reads += 1
        self.bytes_read += len(data)
        self.position = offset + len(data)
        return data

    def write(self, offset: int, data: bytes) -> int:
        """Write ``data`` at ``offset``; returns the bytes written."""
        check_range(offset, len(data), "write")
        if data:
            if self.layer == "isolation":
                self.backing.write(self.key, offset, bytes(data))
            else:
                self.backing.write(offset, bytes(data))
        self.writes += 1
        self.bytes_written += len(data)
        self.position = offset + len(data)
        return len(data)

    def read_next(self, length: int) -> bytes:
        """Read on from the position (sequential access)."""
        return self.read(self.position, length)

    def append(self, data: bytes) -> int:
        """Write ``data`` at the end of the file; returns where it went."""
        offset = self.size()
        self.write(offset, data)
        return offset

    def size(self) -> int:
        if self.layer == "isolation":
            return int(self.backing.size(self.key))
        return int(self.backing.size())

    def stats(self) -> dict[str, Any]:
        below = self.backing.stats() if self.layer != "isolation" else {}
        return {
            "key": self.key,
            "layer": self.layer,
            "reads": self.reads,
            "writes": self.writes,
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "below": below,
        }
