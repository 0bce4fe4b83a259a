"""File objects over remote objects: ``client.open(key, "rb" | "wb")``.

* ``rb``: opening validates the client cache by the chosen mode
  (:mod:`shuttle.client.validation`; ``check`` stats the object and keeps cached
  blocks only if the version still matches), then reads go through the cache, each
  miss fetching whole cache blocks pinned to that version.
* ``wb``: bytes are streamed to an upload session piece by piece; ``close()`` commits
  it, making the new object visible atomically. Leaving a ``with`` block on an
  exception aborts the upload instead, so a failed writer never replaces the object.
"""

from __future__ import annotations

import io
import os
import sys
from types import TracebackType
from typing import TYPE_CHECKING, Any

from shuttle.client import calls
from shuttle.client.calls import interrupted
from shuttle.client.integrity import UploadHasher, check_written
from shuttle.client.model import ObjectInfo
from shuttle.errors import ClosedFileError, InvalidArgumentError, ShuttleError

if TYPE_CHECKING:
    from shuttle.client.client import Client


def open_remote(
    client: Client, key: str, mode: str, *, validation: str | None = None
) -> io.RawIOBase:
    if mode in ("rb", "r"):
        return RemoteReader(client, key, validation=validation)
    if mode in ("wb", "w"):
        return RemoteWriter(client, key)
    raise InvalidArgumentError(f"mode must be 'rb' or 'wb', got {mode!r}")


class RemoteReader(io.RawIOBase):
    """A seekable, read-only file over one version of a remote object."""

    def __init__(self, client: Client, key: str, *, validation: str | None = None) -> None:
        super().__init__()
        self.client = client
        self.key = key
        validated = client.validation_mode(validation).open(key)
        self.info: ObjectInfo = validated.info
        self.cache_was_valid = validated.cache_was_valid
        #: The check still out (the ``speculative`` mode), confirmed by checkpoint().
        self._pending = validated.pending
        self._pos = 0

    def checkpoint(self) -> None:
        """Wait until the open's validation is in: returns at once in modes that check
        before ``open`` returns; in ``speculative`` waits for the check that opening on
        the cached copy sent, and raises ``StaleDataError`` if that copy was stale (what
        was read must not be used). ``close()`` does this too."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.confirm()

    def close(self) -> None:
        """Close, then confirm the open's validation (see :meth:`checkpoint`)."""
        try:
            super().close()
        finally:
            self.checkpoint()

    def __del__(self) -> None:
        self._pending = None  # an unclosed file's check is not waited for when collected
        super().__del__()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self.info.size}[whence]
        if base + offset < 0:
            raise InvalidArgumentError(f"cannot seek to {base + offset}, before the start")
        self._pos = base + offset
        return self._pos

    def _fetch(self, start: int, stop: int) -> bytes:
        if self.client.lookaside is not None:  # chunks from local stores, the rest in one batch
            return self.client.lookaside.fetch(self.info, start, stop)
        node = self.client.node_for(self.key)
        args = {
            "key": self.key,
            "offset": start,
            "length": stop - start,
            "expected_version": self.info.version,
        }
        return bytes(self.client.call(node, "read", args).payload)

    def read(self, size: int | None = -1) -> bytes:
        if self.closed:
            raise ClosedFileError(f"read of {self.key!r} after its file was closed; open it again")
        if size is None or size < 0:
            size = self.info.size - self._pos
        if self.client.cache.enabled:
            data = self.client.cache.read(self.info, self._pos, size, self._fetch)
        else:
            data = (
                b"".join(self.client.iter_read(self.key, self._pos, size, info=self.info))
                if size
                else b""
            )
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)


class RemoteWriter(io.RawIOBase):
    """A write-only file that becomes the object ``key`` when closed."""

    def __init__(self, client: Client, key: str) -> None:
        super().__init__()
        self.client = client
        self.key = key
        self.node = client.node_for(key)
        self._upload: str = client.call(
            self.node, "upload.begin", {"key": key}, idempotent=False
        ).result["upload"]
        self._buf = bytearray()
        self._offset = 0
        self._sent = UploadHasher()  # checked against the object the commit reports
        self.info: ObjectInfo | None = None

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        if self.closed:
            raise ClosedFileError(
                f"write to {self.key!r} after its file was closed (committed or aborted)"
            )
        view = memoryview(data).cast("B")
        self._buf += view
        while len(self._buf) >= self.client.piece_bytes:
            self._send(self.client.piece_bytes)
        return len(view)

    def _send(self, n: int) -> None:
        piece = bytes(self._buf[:n])
        del self._buf[:n]
        op = calls.upload_write(self._upload, self._offset, piece, key=self.key)
        self.client.call(self.node, op.op, op.args, op.payload, idempotent=op.idempotent)
        self._sent.update(piece)
        self._offset += len(piece)

    def close(self) -> None:
        """Send what is buffered and commit: the object appears, whole, now."""
        if self.closed:
            return
        try:
            if self._buf:
                self._send(len(self._buf))
            res = self.client.call(
                self.node, "upload.commit", {"upload": self._upload}, idempotent=False
            )
            self.client.forget(self.key)
            info = ObjectInfo.from_wire(res.result)
            self.info = check_written(info, self.key, self._sent.size, self._sent.digest())
        finally:
            super().close()

    def abort(self) -> None:
        """Drop the upload: the object keeps its old contents (or stays absent).

        While an interrupt is being handled (Ctrl-C: it may have cut a write in the
        middle of its frame), the connection is closed instead of asked to abort: the
        node ends the session with it, and nothing waits for an answer that the cut
        frame would hold back for the node's whole frame timeout."""
        if self.closed:
            return
        try:
            handling = sys.exc_info()[1]
            if handling is not None and interrupted(handling):
                self.client.drop_connection(self.node)
            else:
                self.client.call(self.node, "upload.abort", {"upload": self._upload})
        except ShuttleError:
            pass  # the node expires abandoned uploads
        finally:
            super().close()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()
