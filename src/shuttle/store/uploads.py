"""Upload sessions: a large object streamed into a private staging file, in ranges and in
any order, and made visible only by an atomic commit.

Sessions live in memory and in ``.shuttle/uploads``; they do not survive a restart of
the node (recovery deletes their files), so a client whose session vanished starts it
again. Sessions nobody touches are reclaimed by :meth:`UploadTable.expire`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
from dataclasses import dataclass, field

from shuttle.errors import LimitExceededError, NotFoundError

#: Open sessions per node. Each holds a file descriptor and a staging file; 256 is far
#: above what a handful of clients streaming in parallel need and far below fd limits.
UPLOADS_OPEN_MAX = 256


@dataclass
class Upload:
    """One open upload session."""

    upload_id: str
    key: str
    expected_version: int | None
    path: str
    fd: int
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


class UploadTable:
    """The open sessions of one store. Thread-safe."""

    def __init__(self, uploads_dir: str) -> None:
        self.uploads_dir = uploads_dir
        self._lock = threading.Lock()
        self._open: dict[str, Upload] = {}

    def begin(self, key: str, expected_version: int | None) -> Upload:
        with self._lock:
            if len(self._open) >= UPLOADS_OPEN_MAX:
                raise LimitExceededError(
                    f"{UPLOADS_OPEN_MAX} upload sessions are already open on this node; "
                    "commit or abort some, or wait for idle ones to expire."
                )
            upload_id = secrets.token_hex(16)
            path = os.path.join(self.uploads_dir, upload_id)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            upload = Upload(upload_id, key, expected_version, path, fd)
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

    def close_all(self) -> None:
        with self._lock:
            uploads = list(self._open.values())
            self._open.clear()
        for u in uploads:
            with u.lock:
                u.discard()

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)
