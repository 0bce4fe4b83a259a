"""Readers for block I/O traces: binary vSCSI (``vscsi``) and its CSV form (``blockcsv``).

Both come from CloudPhysics (``../shared/traces/cloudphysics/README.md``). A block
request becomes a ``read`` or ``write`` of the one file ``disk`` (:data:`DISK_FILE`)
at byte offset ``lbn × 512`` with the request's length; the client is 0. SCSI
commands other than READ/WRITE (6, 10, 12 and 16-byte forms) become ``other``.

vSCSI v1 records are 32 bytes, little-endian (``<IIIHHQQ``: serial, length, scatter-
gather count, command, version, lbn, timestamp in µs); v2 records are 40 bytes
(``<HHIIIQQQ``: command, version, serial, length, sg count, lbn, timestamp, response
time). The version is read from the ``version`` field (``0x0100``/``0x0200``) of the
first records, as libCacheSim does. The CSV form has the header
``version,time,op,size,lbn`` with whole seconds and the command in hex.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from shuttle.errors import TraceFormatError, UsageError
from shuttle.traces import io
from shuttle.traces.formats import TraceReader, register
from shuttle.traces.record import Op, TraceRecord

#: The file name block traces use: a disk is one big file to a block cache.
DISK_FILE = "disk"
#: Bytes per logical block number (SCSI sector).
SECTOR_BYTES = 512

READ_COMMANDS = frozenset({0x08, 0x28, 0xA8, 0x88})
WRITE_COMMANDS = frozenset({0x0A, 0x2A, 0xAA, 0x8A})

VSCSI_V1 = np.dtype(
    [
        ("sn", "<u4"),
        ("len", "<u4"),
        ("nsg", "<u4"),
        ("cmd", "<u2"),
        ("ver", "<u2"),
        ("lbn", "<u8"),
        ("ts", "<u8"),
    ]
)
VSCSI_V2 = np.dtype(
    [
        ("cmd", "<u2"),
        ("ver", "<u2"),
        ("sn", "<u4"),
        ("len", "<u4"),
        ("nsg", "<u4"),
        ("lbn", "<u8"),
        ("ts", "<u8"),
        ("rt", "<u8"),
    ]
)
#: Records read per chunk (bounded memory for large traces).
_CHUNK_RECORDS = 1 << 16
_BLOCKCSV_HEADER = "version,time,op,size,lbn"


def command_op(cmd: int) -> Op:
    """The operation a SCSI command is."""
    if cmd in READ_COMMANDS:
        return Op.READ
    if cmd in WRITE_COMMANDS:
        return Op.WRITE
    return Op.OTHER


def vscsi_version(head: bytes) -> int:
    """1 or 2 if the first two records agree on a vSCSI version, else 0."""
    if len(head) >= 2 * VSCSI_V2.itemsize:
        v2 = np.frombuffer(head[: 2 * VSCSI_V2.itemsize], VSCSI_V2)
        if all(int(v) >> 8 == 2 for v in v2["ver"]):
            return 2
    if len(head) >= 2 * VSCSI_V1.itemsize:
        v1 = np.frombuffer(head[: 2 * VSCSI_V1.itemsize], VSCSI_V1)
        if all(int(v) >> 8 == 1 for v in v1["ver"]):
            return 1
    return 0


@register
class VscsiReader(TraceReader):
    """Binary vSCSI v1/v2 block traces."""

    name = "vscsi"
    description = "binary vSCSI block trace (CloudPhysics; v1 32-byte or v2 40-byte records)"

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        return vscsi_version(head) != 0

    def records(self, path: str | Path) -> Iterator[TraceRecord]:
        # Times are taken relative to the first record in integer microseconds, so
        # the seconds come out as exact as a float allows (no epoch-sized rounding).
        ts0: int | None = None
        for chunk in self.chunks(path):
            if ts0 is None:
                ts0 = int(chunk["ts"][0])
            ops = [command_op(int(c)) for c in chunk["cmd"]]
            micros = chunk["ts"].astype(np.int64) - ts0
            for t, op, lbn, size in zip(
                (micros / 1e6).tolist(),
                ops,
                chunk["lbn"].tolist(),
                chunk["len"].tolist(),
                strict=True,
            ):
                yield TraceRecord(t, 0, op, DISK_FILE, lbn * SECTOR_BYTES, size)

    def chunks(self, path: str | Path) -> Iterator[np.ndarray]:
        """The raw records as structured numpy arrays (fields of :data:`VSCSI_V1`)."""
        try:
            with open(path, "rb") as f:
                head = f.read(2 * VSCSI_V2.itemsize)
                version = vscsi_version(head)
                if version == 0:
                    raise TraceFormatError(
                        f"{path}: not a vSCSI trace: the version field of the first two "
                        "records is neither 0x01xx (v1) nor 0x02xx (v2)"
                    )
                dtype = VSCSI_V1 if version == 1 else VSCSI_V2
                f.seek(0)
                done = 0
                while True:
                    data = f.read(_CHUNK_RECORDS * dtype.itemsize)
                    if not data:
                        return
                    whole = len(data) - len(data) % dtype.itemsize
                    if whole != len(data):
                        raise TraceFormatError(
                            f"{path}: truncated record at byte {done + whole}: the file "
                            f"ends {len(data) - whole} bytes into a {dtype.itemsize}-byte "
                            f"vSCSI v{version} record"
                        )
                    chunk = np.frombuffer(data, dtype)
                    bad = np.nonzero((chunk["ver"] >> 8) != version)[0]
                    if bad.size:
                        at = done + int(bad[0]) * dtype.itemsize
                        raise TraceFormatError(
                            f"{path}: record at byte {at} has version field "
                            f"{int(chunk['ver'][bad[0]]):#06x}; expected v{version} like "
                            "the first records"
                        )
                    self.position = f"byte {done}"
                    done += len(data)
                    yield chunk
        except OSError as exc:
            raise UsageError(f"cannot read trace {str(path)!r}: {exc.strerror or exc}") from exc


@register
class BlockCsvReader(TraceReader):
    """CloudPhysics CSV: ``version,time,op,size,lbn`` (op = SCSI command in hex)."""

    name = "blockcsv"
    description = "block trace CSV version,time,op,size,lbn (CloudPhysics)"

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        return head.startswith(_BLOCKCSV_HEADER.encode())

    def records(self, path: str | Path) -> Iterator[TraceRecord]:
        with io.open_text(path, "r") as stream:
            rows = csv.reader(stream)
            header = next(rows, None)
            if header is None or ",".join(header) != _BLOCKCSV_HEADER:
                raise TraceFormatError(
                    f"{path}:1: expected the header {_BLOCKCSV_HEADER}, got {header!r}"
                )
            for line, row in enumerate(rows, start=2):
                self.position = f"line {line}"
                try:
                    _version, time_s, cmd, size, lbn = row
                    record = TraceRecord(
                        float(time_s),
                        0,
                        command_op(int(cmd, 16)),
                        DISK_FILE,
                        int(lbn) * SECTOR_BYTES,
                        int(size),
                    )
                except ValueError as exc:
                    raise TraceFormatError(
                        f"{path}:{line}: expected version,time,op,size,lbn with a hex op and "
                        f"integer size and lbn, got {row!r}"
                    ) from exc
                if record.size < 0 or record.offset < 0:
                    raise TraceFormatError(f"{path}:{line}: negative size or lbn in {row!r}")
                yield record
