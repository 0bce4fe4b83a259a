"""Upload sessions of the RADOS store: a large object streamed into a private staging
object (``.shuttle/uploads/<id>``, an invalid key, so it never clashes with an object),
made visible by the commit, which writes the whole object in one guarded operation.

Sessions live in the memory of the node that opened them, with the local store's
limits (:mod:`shuttle.store.uploads`); a client whose node died begins again on
another. A node killed with sessions open leaves their staging objects behind:
``rados -p POOL -N NAMESPACE ls | grep ^.shuttle/uploads/`` finds them.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from shuttle.errors import LimitExceededError, NodeBusyError, NotFoundError
from shuttle.store.uploads import UPLOADS_OPEN_MAX, UPLOADS_PER_OWNER_MAX

#: Upload sessions stage their bytes in RADOS objects under this (invalid key) prefix.
UPLOAD_OBJECT_PREFIX = ".shuttle/uploads/"


@dataclass
class RadosUpload:
    """One open upload session, staged in the RADOS object ``staging``."""

    upload_id: str
    key: str
    expected_version: int | None
    staging: str
    owner: int | None = None
    size: int = 0
    touched_s: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    closed: bool = False


class RadosUploads:
    """The open sessions of one RADOS store (the same limits as the local store's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, RadosUpload] = {}

    def begin(self, key: str, expected_version: int | None, owner: int | None) -> RadosUpload:
        with self._lock:
            if owner is not None and self._owned(owner) >= UPLOADS_PER_OWNER_MAX:
                raise LimitExceededError(
                    f"this connection already has {UPLOADS_PER_OWNER_MAX} upload sessions "
                    "open (the limit); commit or abort one first"
                )
            if len(self._open) >= UPLOADS_OPEN_MAX:
                raise NodeBusyError(
                    f"all {UPLOADS_OPEN_MAX} upload sessions of this node are in use; "
                    "nothing was changed: retry shortly"
                )
            uid = secrets.token_hex(16)
            up = RadosUpload(uid, key, expected_version, UPLOAD_OBJECT_PREFIX + uid, owner)
            self._open[uid] = up
            return up

    def get(self, upload_id: str) -> RadosUpload:
        with self._lock:
            up = self._open.get(upload_id)
        if up is None:
            raise NotFoundError(
                f"no open upload session {upload_id!r}: it was committed, aborted, expired, "
                "or its node restarted. Begin a new upload."
            )
        up.touched_s = time.monotonic()
        return up

    def pop(self, upload_id: str) -> RadosUpload:
        up = self.get(upload_id)
        with self._lock:
            if self._open.pop(upload_id, None) is None:
                raise NotFoundError(
                    f"upload session {upload_id!r} was just closed by another call."
                )
        return up

    def take(self, pred: Callable[[RadosUpload], bool]) -> list[RadosUpload]:
        with self._lock:
            out = [u for u in self._open.values() if pred(u)]
            for u in out:
                del self._open[u.upload_id]
        return out

    def owned_by(self, owner: int) -> int:
        with self._lock:
            return self._owned(owner)

    def _owned(self, owner: int) -> int:
        return sum(1 for u in self._open.values() if u.owner == owner)

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)
