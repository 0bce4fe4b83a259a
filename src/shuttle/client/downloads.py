"""One streamed download over one connection: the range's pieces read with a window of
requests in flight, all against the version the caller's stat saw, each handed on
only once it is checked (:mod:`shuttle.client.integrity`); and a stream written into
a local file, renamed into place when whole. The counterpart of
:mod:`shuttle.client.uploads`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO

from shuttle.client import calls
from shuttle.client.connections import NodeConnection
from shuttle.client.integrity import CheckedPieces, RangeVerifier
from shuttle.client.model import ObjectInfo
from shuttle.net.blocking import Call


def download(
    conn: NodeConnection,
    key: str,
    info: ObjectInfo,
    offset: int,
    end: int,
    *,
    piece_bytes: int,
    window: int,
    progress: Callable[[int], None],
) -> Iterator[bytes | bytearray]:
    """Bytes ``[offset, end)`` of ``key``, whose attributes are ``info``, over ``conn``
    (``end`` within ``info.size``): pieces of ``piece_bytes`` with ``window`` requests
    in flight, each asking for ``info.version`` (``VersionMismatchError`` if the object
    changed). A piece is yielded, and counted by ``progress``, once every chunk it
    touches is checked; the whole object's hash is checked as the stream ends
    (``IntegrityError``)."""
    checked = CheckedPieces(RangeVerifier.for_object(info, offset, end))
    pieces = calls.read_pieces(key, offset, end, piece_bytes, info.version)
    reads = (Call(op.op, op.args) for op in pieces)
    for res in conn.call_many(reads, window=window):
        for out in checked.add(calls.piece(res)):  # large pieces are handed on uncopied
            progress(len(out))
            yield out
    for out in checked.finish():
        progress(len(out))
        yield out


def write_to(target: str | Path | IO[bytes], pieces: Iterable[bytes | bytearray]) -> None:
    """Write ``pieces`` into ``target``. A path is written atomically: into a partial
    file beside it (``.NAME.shuttle-partial``), renamed over it once the last piece is
    in, removed if anything fails (the stream's checks included). A binary file gets
    the pieces as they come."""
    if isinstance(target, str | Path):
        path = Path(target)
        tmp = path.with_name(f".{path.name}.shuttle-partial")
        try:
            with open(tmp, "wb") as out:
                for piece in pieces:
                    out.write(piece)
            tmp.replace(path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    else:
        for piece in pieces:
            target.write(piece)
