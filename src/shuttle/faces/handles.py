"""Open files of the mount: a reader per handle, a write buffer per inode.

A file open for reading keeps its own :class:`RemoteReader` (pinned to the version
its open validated). A file open for writing shares one local buffer with every
other handle on its inode, so the mount's own readers see writes at once; the buffer
is put as the whole object at flush.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import trio

from shuttle.client.files import RemoteReader


@dataclass
class WriteBuffer:
    """The local copy of a file open for writing, shared by every handle on its inode."""

    file: Any  # a tempfile.TemporaryFile, read and written with pread/pwrite
    dirty: bool = False
    mtime_ns: int = field(default_factory=time.time_ns)
    #: ``mtime_ns`` was set by the program (utime) since its last write: the put at
    #: flush records it, instead of the node's clock.
    mtime_set: bool = False
    handles: int = 0
    lock: trio.Lock = field(default_factory=trio.Lock)

    @property
    def fd(self) -> int:
        return int(self.file.fileno())

    def size(self) -> int:
        return os.fstat(self.fd).st_size


@dataclass
class Handle:
    """One open file: its inode, and a reader (read-only) or the inode's write buffer."""

    ino: int
    reader: RemoteReader | None = None
    writable: bool = False
    #: Nothing read from ``reader`` has been handed to the program yet.
    fresh: bool = True
    lock: trio.Lock = field(default_factory=trio.Lock)
