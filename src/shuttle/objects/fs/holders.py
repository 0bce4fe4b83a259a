"""Which callback holders hold promises on which keys at a node, kept on disk: what
makes the isolation object durable.

The isolation object (:mod:`shuttle.objects.fs.isolation`) promises each holder (a
cache or directory object) to call it back before a block it read changes. Its
promises live in memory; a node that restarts would forget them, and the next write
would leave those holders serving stale blocks until their promises expired. So the
first promise a holder gets on a key is appended here, synced, before the read that
made it is answered. After a restart the isolation object calls every holder back
for every key it held (``invalidate(key, [])``: all of them), before it lets any
write through, and starts an empty log. A holder gets one record per key, so the log
is small: about a hundred bytes per (holder, key), grown only when a new one appears.

Records are ``u32 length | u32 crc32 | msgpack`` ``{"h": holder id, "r": reference
(value codec), "k": key, "p": principal}``; a torn last record (a crash while
appending) is ignored: its read was never answered. The principal is the one the
holder's promise was made for (None: unrestricted): a callback acts for it
(:mod:`shuttle.runtime.authority`), after a restart as before, so it reaches a
principal's own run-time, which serves no one else.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import zlib
from pathlib import Path
from typing import Any

import msgpack

from shuttle.errors import StorageIOError
from shuttle.runtime import values
from shuttle.runtime.refs import Invoker, Ref

log = logging.getLogger("shuttle.objects.fs")

#: Records past which the log is rewritten from the holders that still hold promises
#: (holders that ended leave records behind; the rewrite bounds the file).
COMPACT_AFTER_RECORDS = 10_000

_HEADER = struct.Struct("<II")


def _encode(hid: str, ref: Ref, key: str, principal: str | None) -> bytes:
    body = msgpack.packb(
        {"h": hid, "r": values.pack(ref), "k": key, "p": principal}, use_bin_type=True
    )
    return _HEADER.pack(len(body), zlib.crc32(body)) + body


class HolderLog:
    """The holders and keys of one isolation object's promises, on disk at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        #: What the log held when the node started: the holders to call back (their
        #: reference, keys and principal).
        self.before_restart: dict[str, tuple[bytes, set[str], str | None]] = self._read()
        self._known: dict[str, set[str]] = {}
        self._records = 0
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def _read(self) -> dict[str, tuple[bytes, set[str], str | None]]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        out: dict[str, tuple[bytes, set[str], str | None]] = {}
        pos = 0
        while pos + _HEADER.size <= len(data):
            length, crc = _HEADER.unpack_from(data, pos)
            body = data[pos + _HEADER.size : pos + _HEADER.size + length]
            if len(body) < length or zlib.crc32(body) != crc:
                break  # torn at the end: its read was never answered
            try:
                record = msgpack.unpackb(body, raw=False)
                hid, ref, key = str(record["h"]), bytes(record["r"]), str(record["k"])
                principal = record.get("p")
                if principal is not None and not isinstance(principal, str):
                    raise TypeError("principal")
            except (ValueError, KeyError, TypeError, msgpack.UnpackException):
                break
            out.setdefault(hid, (ref, set(), principal))[1].add(key)
            pos += _HEADER.size + length
        return out

    def holders_before_restart(
        self, invoker: Invoker
    ) -> list[tuple[str, Ref, list[str], str | None]]:
        """(holder id, reference bound to ``invoker``, keys, principal) of every holder
        the log named when the node started."""
        out = []
        for hid, (packed, keys, principal) in self.before_restart.items():
            try:
                ref = values.unpack(packed, invoker)
            except Exception as exc:  # a record we cannot read back names no one to call
                log.warning("promise log: holder %s unreadable (%s)", hid, exc)
                continue
            if isinstance(ref, Ref):
                out.append((hid, ref, sorted(keys), principal))
        return out

    def remember(self, hid: str, ref: Ref, key: str, principal: str | None = None) -> None:
        """``hid`` holds a promise on a block of ``key``, made for ``principal``: on
        disk before this returns (at once if it was already)."""
        with self._lock:
            keys = self._known.get(hid)
            if keys is not None and key in keys:
                return
            try:
                os.write(self._fd, _encode(hid, ref, key, principal))
                os.fdatasync(self._fd)
            except OSError as exc:
                raise StorageIOError(
                    f"cannot record a callback promise in {self.path}: {exc.strerror or exc}"
                ) from exc
            self._known.setdefault(hid, set()).add(key)
            self._records += 1

    def restart_from(self, current: dict[str, tuple[Ref, set[str], str | None]]) -> None:
        """Rewrite the log with only ``current`` (holder id -> reference, keys and
        principal): after a restart's callbacks (then empty), or when it grew past its
        bound."""
        with self._lock:
            tmp = self.path.with_suffix(".tmp")
            data = b"".join(
                _encode(hid, ref, key, principal)
                for hid, (ref, keys, principal) in current.items()
                for key in keys
            )
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fdatasync(f.fileno())
                os.replace(tmp, self.path)
                dfd = os.open(self.path.parent, os.O_RDONLY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
                os.close(self._fd)
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            except OSError as exc:
                raise StorageIOError(
                    f"cannot rewrite the promise log {self.path}: {exc.strerror or exc}"
                ) from exc
            self._known = {hid: set(keys) for hid, (_, keys, _) in current.items()}
            self._records = sum(len(keys) for _, keys, _ in current.values())
            self.before_restart = {}

    @property
    def needs_compaction(self) -> bool:
        return self._records > COMPACT_AFTER_RECORDS

    def close(self) -> None:
        with self._lock:
            os.close(self._fd)

    def stats(self) -> dict[str, Any]:
        return {"promise_log_records": self._records}
