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
(value codec), "k": key}``; a torn last record (a crash while appending) is ignored:
its read was never answered.
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


def _encode(hid: str, ref: Ref, key: str) -> bytes:
    body = msgpack.packb({"h": hid, "r": values.pack(ref), "k": key}, use_bin_type=True)
    return _HEADER.pack(len(body), zlib.crc32(body)) + body


class HolderLog:
    """The holders and keys of one isolation object's promises, on disk at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        #: What the log held when the node started: the holders to call back.
        self.before_restart: dict[str, tuple[bytes, set[str]]] = self._read()
        self._known: dict[str, set[str]] = {}
        self._records = 0
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def _read(self) -> dict[str, tuple[bytes, set[str]]]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        out: dict[str, tuple[bytes, set[str]]] = {}
        pos = 0
        while pos + _HEADER.size <= len(data):
            length, crc = _HEADER.unpack_from(data, pos)
            body = data[pos + _HEADER.size : pos + _HEADER.size + length]
            if len(body) < length or zlib.crc32(body) != crc:
                break  # torn at the end: its read was never answered
            try:
                record = msgpack.unpackb(body, raw=False)
                hid, ref, key = str(record["h"]), bytes(record["r"]), str(record["k"])
            except (ValueError, KeyError, TypeError, msgpack.UnpackException):
                break
            out.setdefault(hid, (ref, set()))[1].add(key)
            pos += _HEADER.size + length
        return out

    def holders_before_restart(self, invoker: Invoker) -> list[tuple[str, Ref, list[str]]]:
        """(holder id, reference bound to ``invoker``, keys) of every holder the log
        named when the node started."""
        out = []
        for hid, (packed, keys) in self.before_restart.items():
            try:
                ref = values.unpack(packed, invoker)
            except Exception as exc:  # a record we cannot read back names no one to call
                log.warning("promise log: holder %s unreadable (%s)", hid, exc)
                continue
            if isinstance(ref, Ref):
                out.append((hid, ref, sorted(keys)))
        return out

    def remember(self, hid: str, ref: Ref, key: str) -> None:
        """``hid`` holds a promise on a block of ``key``: on disk before this returns
        (at once if it was already)."""
        with self._lock:
            keys = self._known.get(hid)
            if keys is not None and key in keys:
                return
            try:
                os.write(self._fd, _encode(hid, ref, key))
                os.fdatasync(self._fd)
            except OSError as exc:
                raise StorageIOError(
                    f"cannot record a callback promise in {self.path}: {exc.strerror or exc}"
                ) from exc
            self._known.setdefault(hid, set()).add(key)
            self._records += 1

    def restart_from(self, current: dict[str, tuple[Ref, set[str]]]) -> None:
        """Rewrite the log with only ``current`` (holder id -> reference and keys): after
        a restart's callbacks (then empty), or when it grew past its bound."""
        with self._lock:
            tmp = self.path.with_suffix(".tmp")
            data = b"".join(
                _encode(hid, ref, key) for hid, (ref, keys) in current.items() for key in keys
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
            self._known = {hid: set(keys) for hid, (_, keys) in current.items()}
            self._records = sum(len(keys) for _, keys in current.values())
            self.before_restart = {}

    @property
    def needs_compaction(self) -> bool:
        return self._records > COMPACT_AFTER_RECORDS

    def close(self) -> None:
        with self._lock:
            os.close(self._fd)

    def stats(self) -> dict[str, Any]:
        return {"promise_log_records": self._records}
