"""Upload sessions: a large object streamed into a private staging file, in ranges and in
any order, and made visible only by an atomic commit.

Sessions live in memory and in ``.shuttle/uploads``; they do not survive a restart of
the node (recovery deletes their files), so a client whose session vanished starts it
again. Sessions nobody touches are reclaimed by :meth:`UploadTable.expire`; a session
opened over a connection is owned by it (``owner``), and released as soon as that
connection closes (:meth:`UploadTable.release`), so a client that went away cannot
keep the node's sessions from others.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
from dataclasses import dataclass, field

from shuttle.errors import LimitExceededError, NodeBusyError, NotFoundError

#: Open sessions per node. Each holds a file descriptor and a staging file; 256 is far
#: above what a handful of clients streaming in parallel need and far below fd limits.
UPLOADS_OPEN_MAX = 256

#: Open sessions per owner (one client connection). A client streams one object at a
#: time per connection; 16 leaves room for a pipelined few, and one connection can
#: take no more than 1/16 of the node's sessions.
UPLOADS_PER_OWNER_MAX = 16


@dataclass
class Upload:
    """One open upload session."""

    upload_id: str
    key: str
    expected_version: int | None
    path: str
    fd: int
    #: The connection that opened it (None: an in-process caller).
    owner: int | None = None
    size: int = 0
    bytes_written: int = 0
    touched_s: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def close(self) -> None:
        """Close the descriptor once (a second close could hit a reused descriptor
        number belonging to another thread)."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)

    def discard(self) -> None:
        self.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def discard_all(uploads: list[Upload]) -> None:
    """Close and delete sessions already taken out of their table."""
    for upload in uploads:
        with upload.lock:
            upload.discard()


#: Owners (connections) whose sessions were released, remembered so that a begin
#: racing the release (still running when its connection closed) is refused.
RELEASED_OWNERS_KEPT = 4096


class UploadTable:
    """The open sessions of one store. Thread-safe."""

    def __init__(self, uploads_dir: str) -> None:
        self.uploads_dir = uploads_dir
        self._lock = threading.Lock()
        self._open: dict[str, Upload] = {}
        self._released: dict[int, None] = {}  # insertion-ordered: the oldest go first

    def begin(self, key: str, expected_version: int | None, owner: int | None = None) -> Upload:
        with self._lock:
            if owner is not None and owner in self._released:
                raise NotFoundError("the connection that began this upload has closed")
            if owner is not None:
                mine = self._owned(owner)
                if mine >= UPLOADS_PER_OWNER_MAX:
                    raise LimitExceededError(
                        f"this connection already has {mine} upload sessions open (the "
                        f"limit is {UPLOADS_PER_OWNER_MAX}); commit or abort one first"
                    )
            if len(self._open) >= UPLOADS_OPEN_MAX:
                raise NodeBusyError(
                    f"all {UPLOADS_OPEN_MAX} upload sessions of this node are in use by other "
                    "clients; nothing was changed: retry shortly"
                )
            upload_id = secrets.token_hex(16)
            path = os.path.join(self.uploads_dir, upload_id)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            upload = Upload(upload_id, key, expected_version, path, fd, owner)
            self._open[upload_id] = upload
            return upload

    def get(self, upload_id: str) -> Upload:
        with self._lock:
            upload = self._open.get(upload_id)
        if upload is None:
            raise NotFoundError(
                f"no open upload session {upload_id!r}: it was committed, aborted, expired, "
                "or the node restarted. Begin a new upload."
            )
        upload.touched_s = time.monotonic()
        return upload

    def pop(self, upload_id: str) -> Upload:
        upload = self.get(upload_id)
        with self._lock:
            if self._open.pop(upload_id, None) is None:
                raise NotFoundError(
                    f"upload session {upload_id!r} was just closed by another call."
                )
        return upload

    def expire(self, idle_s: float) -> list[Upload]:
        """Remove and return the sessions idle for more than ``idle_s`` seconds."""
        cutoff = time.monotonic() - idle_s
        with self._lock:
            stale = [u for u in self._open.values() if u.touched_s < cutoff]
            for u in stale:
                del self._open[u.upload_id]
        return stale

    def release(self, owner: int) -> list[Upload]:
        """Remove and return the sessions ``owner`` opened (its connection closed)."""
        with self._lock:
            theirs = [u for u in self._open.values() if u.owner == owner]
            for u in theirs:
                del self._open[u.upload_id]
            self._released[owner] = None
            while len(self._released) > RELEASED_OWNERS_KEPT:
                del self._released[next(iter(self._released))]
        return theirs

    def owned_by(self, owner: int) -> int:
        """How many open sessions ``owner`` has."""
        with self._lock:
            return self._owned(owner)

    def _owned(self, owner: int) -> int:
        return sum(1 for u in self._open.values() if u.owner == owner)

    def close_all(self) -> None:
        with self._lock:
            uploads = list(self._open.values())
            self._open.clear()
        discard_all(uploads)

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)
