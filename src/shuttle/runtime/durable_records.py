"""A durable object's record at its home, on disk (:mod:`shuttle.runtime.durable`).

A :class:`Record` says how to make the object, where it runs, at which epoch, which
move was the last committed, and its last durable checkpoint. :class:`RecordFiles`
keeps one object's record in two alternating slots (``LOCAL.0``, ``LOCAL.1``), each
``u32 length | u32 crc32 | msgpack``: a write truncates and rewrites the older slot
and syncs it (one ``fdatasync``, no rename), so a crash mid-write leaves the other
slot whole, and the newer whole slot wins when the records are read back.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import msgpack

from shuttle.errors import StorageIOError
from shuttle.runtime.ids import ObjectId

log = logging.getLogger("shuttle.runtime")

_HEADER = struct.Struct("<II")


@dataclass
class Record:
    """A durable object as its home keeps it on disk."""

    rid: str
    type_name: str
    type_label: str
    code: bytes | None
    policy: str
    home_address: str
    app: str
    location: str
    epoch: int
    last_commit: str
    checkpoint: bytes
    seq: int = 0
    #: The principal that created it (None: unrestricted): brought back, it acts for
    #: the same one (runtime/authority.py). Records written before principals: None.
    principal: str | None = None

    def pack(self) -> bytes:
        body = msgpack.packb(asdict(self), use_bin_type=True)
        return _HEADER.pack(len(body), zlib.crc32(body)) + body

    @classmethod
    def unpack(cls, data: bytes) -> Record | None:
        """The record in ``data``, or None if it is torn (cut short, bad checksum)."""
        if len(data) < _HEADER.size:
            return None
        length, crc = _HEADER.unpack_from(data)
        body = data[_HEADER.size : _HEADER.size + length]
        if len(body) != length or zlib.crc32(body) != crc:
            return None
        try:
            return cls(**msgpack.unpackb(body, raw=False))
        except (ValueError, TypeError, msgpack.UnpackException):
            return None


class RecordFiles:
    """The records of one home, two slots per object (``LOCAL.0``, ``LOCAL.1``)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def _slots(self, rid: str) -> tuple[Path, Path]:
        local = ObjectId.parse(rid).local
        return self.directory / f"{local}.0", self.directory / f"{local}.1"

    def write(self, record: Record) -> None:
        """Durable when it returns (the other slot keeps the previous record)."""
        path = self._slots(record.rid)[record.seq % 2]
        new = not path.exists()
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, record.pack())
                os.fdatasync(fd)
            finally:
                os.close(fd)
            if new:  # the file's name must survive a crash too
                dfd = os.open(self.directory, os.O_RDONLY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
        except OSError as exc:
            raise StorageIOError(
                f"cannot write durable object {record.rid}'s record in {self.directory}: "
                f"{exc.strerror or exc}"
            ) from exc

    def delete(self, rid: str) -> None:
        for path in self._slots(rid):
            path.unlink(missing_ok=True)

    def load_all(self) -> list[Record]:
        """The newest whole record of every object (torn slots are skipped)."""
        best: dict[str, Record] = {}
        for path in sorted(self.directory.glob("*.[01]")):
            record = Record.unpack(path.read_bytes())
            if record is None:
                log.warning("durable record %s is torn; the other slot is used", path)
                continue
            old = best.get(record.rid)
            if old is None or record.seq > old.seq:
                best[record.rid] = record
        return list(best.values())
