"""What each client call sends and how its answer reads: no sockets, no event loop.

:class:`~shuttle.client.client.Client` (blocking) and
:class:`~shuttle.client.aio.AsyncClient` (asyncio) build every request here and parse
every answer here, so the two cannot drift apart: the same arguments, the same
conditional writes (``expected_version``), the same retry policy (:attr:`Op.idempotent`)
and the same limits, checked before anything is sent, with the same messages.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

from shuttle.client.integrity import HASH_ARG, check_written, payload_hash
from shuttle.client.model import Chunk, ObjectInfo, WriteInfo
from shuttle.errors import InvalidArgumentError, LimitExceededError, RemoteProtocolError
from shuttle.net.attr_rows import ROWS_FORM, decode_rows
from shuttle.wire import PAYLOAD_BYTES_MAX, Response
from shuttle.wire.events import Payload
from shuttle.wire.readlane import read_args

#: Bytes per range request when streaming: big enough that per-request overhead is
#: small next to the transfer, small enough to keep many in flight within the
#: node's 16 MiB frame limit.
PIECE_BYTES_DEFAULT = 1 << 20
#: Range requests kept in flight while streaming (8 MiB: fills a loopback or LAN
#: pipe; raise it for long fat links).
WINDOW_DEFAULT = 8
#: Objects up to this size are put with one request; larger ones through an upload
#: session (streamed in pieces, made visible atomically at commit). 4 MiB: a quarter
#: of the 16 MiB frame limit (:data:`~shuttle.wire.PAYLOAD_BYTES_MAX`), so one put
#: never holds a connection for long, while small files still cost one round trip.
SINGLE_PUT_BYTES_MAX = 4 << 20
#: The most bytes one request may carry (a range write, an upload piece): the wire's
#: frame limit, which every node announces unless configured lower.
REQUEST_PAYLOAD_BYTES_MAX = PAYLOAD_BYTES_MAX

Pieces = bytes | bytearray | memoryview | IO[bytes] | Iterable[bytes]


@dataclass(frozen=True, slots=True)
class Op:
    """One request to make: operation, msgpack arguments, raw payload, and whether it
    may be sent again on a fresh connection if the first one dropped before the answer
    came (``idempotent``: doing it twice is the same as doing it once)."""

    op: str
    args: dict[str, Any]
    payload: Payload = b""
    idempotent: bool = True

    @property
    def key(self) -> str:
        """The key that routes this request to its node."""
        key: str = self.args["key"]
        return key


@dataclass(frozen=True, slots=True)
class ListPage:
    """One page of a listing from one node; ``next`` is None on the last page."""

    keys: list[str]
    prefixes: list[str]
    next: str | None


# --- checks ---------------------------------------------------------------------------


def check_tuning(piece_bytes: int, window: int) -> None:
    """Reject streaming parameters no client can work with."""
    if piece_bytes <= 0 or window <= 0:
        raise InvalidArgumentError("piece_bytes and window must be positive")


def _cond(expected_version: int | None) -> dict[str, Any]:
    return {} if expected_version is None else {"expected_version": expected_version}


def _check_payload(what: str, key: str, data: Payload) -> None:
    n = memoryview(data).nbytes
    if n > REQUEST_PAYLOAD_BYTES_MAX:
        raise LimitExceededError(
            f"{what} of {n} bytes to {key!r} is over the {REQUEST_PAYLOAD_BYTES_MAX} bytes "
            "one request may carry; split it into several range writes, or put the whole "
            "object (put streams any size through an upload)"
        )


def single_put(source: object) -> bool:
    """Whether ``put(key, source)`` goes as one request (else through an upload)."""
    return (
        isinstance(source, bytes | bytearray | memoryview)
        and memoryview(source).nbytes <= SINGLE_PUT_BYTES_MAX
    )


# --- requests -------------------------------------------------------------------------


def stat(key: str, chunk_lists: bool = True) -> Op:
    """Attributes of ``key``; without ``chunk_lists``, its chunks only counted."""
    return Op("stat", {"key": key, **no_chunks(chunk_lists)})


def stat_many(keys: Sequence[str], chunk_lists: bool = True) -> Op:
    """Attributes of many keys, asked in the compact rows form (a node that lacks it
    answers the map list, which :func:`infos` takes too)."""
    return Op("stat_many", {"keys": list(keys), "form": ROWS_FORM, **no_chunks(chunk_lists)})


def no_chunks(chunk_lists: bool) -> dict[str, Any]:
    """The argument that asks a node to count an object's chunks, not list them: what a
    client without lookaside stores sends (it never looks a chunk up, and the chunk lists
    of small files are most of the bytes of their attributes). A node that does not know
    it lists them anyway."""
    return {} if chunk_lists else {"chunks_max": 0}


def chunks_page(key: str, start: int, version: int) -> Op:
    return Op("chunks", {"key": key, "start": start, "expected_version": version})


def read(key: str, offset: int, length: int, expected_version: int | None = None) -> Op:
    return Op("read", read_args(key, offset, length, expected_version))


def read_pieces(key: str, offset: int, end: int, piece_bytes: int, version: int) -> Iterator[Op]:
    """The range reads that stream ``[offset, end)`` of one version of ``key``."""
    for start in range(offset, end, piece_bytes):
        yield read(key, start, min(piece_bytes, end - start), version)


def put(
    key: str, data: Payload, expected_version: int | None = None, mtime_ns: int | None = None
) -> Op:
    """A put in one request (see :func:`single_put`); a conditional one is not
    retried: the first may have taken effect, and the second would then fail.
    ``mtime_ns``: the modification time to record (None: the node's now). It carries
    its payload's hash: the node refuses bytes changed on the way, and :func:`put_info`
    checks the object the node reports against it."""
    if memoryview(data).nbytes > SINGLE_PUT_BYTES_MAX:
        raise LimitExceededError(
            f"a single-request put carries at most {SINGLE_PUT_BYTES_MAX} bytes, "
            f"{key!r} has {memoryview(data).nbytes}; larger objects go through an upload"
        )
    args = {
        "key": key,
        HASH_ARG: payload_hash(data),
        **_cond(expected_version),
        **_mtime(mtime_ns),
    }
    return Op("put", args, data, expected_version is None)


def upload_begin(key: str, expected_version: int | None = None) -> Op:
    return Op("upload.begin", {"key": key, **_cond(expected_version)}, idempotent=False)


def upload_write(upload: str, offset: int, piece: Payload, *, key: str = "") -> Op:
    _check_payload("an upload piece", key or upload, piece)
    args = {"upload": upload, "offset": offset, HASH_ARG: payload_hash(piece)}
    return Op("upload.write", args, piece, idempotent=False)


def upload_commit(upload: str, mtime_ns: int | None = None) -> Op:
    return Op("upload.commit", {"upload": upload, **_mtime(mtime_ns)}, idempotent=False)


def set_mtime(key: str, mtime_ns: int, expected_version: int | None = None) -> Op:
    """Record a modification time (idempotent: the same time set twice is the same)."""
    return Op("set_mtime", {"key": key, "mtime_ns": mtime_ns, **_cond(expected_version)})


def _mtime(mtime_ns: int | None) -> dict[str, Any]:
    return {} if mtime_ns is None else {"mtime_ns": mtime_ns}


def upload_abort(upload: str) -> Op:
    return Op("upload.abort", {"upload": upload})


def write(
    key: str, offset: int, data: Payload, expected_version: int | None = None, create: bool = False
) -> Op:
    _check_payload("a write", key, data)
    args: dict[str, Any] = {
        "key": key,
        "offset": offset,
        "create": create,
        HASH_ARG: payload_hash(data),
    }
    return Op("write", {**args, **_cond(expected_version)}, data, idempotent=False)


def create(key: str, exclusive: bool = True) -> Op:
    return Op("create", {"key": key, "exclusive": exclusive}, idempotent=False)


def truncate(key: str, size: int, expected_version: int | None = None) -> Op:
    return Op("truncate", {"key": key, "size": size, **_cond(expected_version)}, idempotent=False)


def remove(key: str, expected_version: int | None = None) -> Op:
    return Op("remove", {"key": key, **_cond(expected_version)}, idempotent=False)


def remove_many(keys: Sequence[str]) -> Op:
    return Op("remove_many", {"keys": list(keys)})


def list_page(prefix: str, delimiter: str | None = None, start_after: str | None = None) -> Op:
    args: dict[str, Any] = {"prefix": prefix}
    if delimiter is not None:
        args["delimiter"] = delimiter
    if start_after is not None:
        args["start_after"] = start_after
    return Op("list", args)


def cache_drop(keys: Sequence[str]) -> Op:
    return Op("cache.drop", {"keys": list(keys)})


# --- answers --------------------------------------------------------------------------


def object_info(res: Response) -> ObjectInfo:
    return ObjectInfo.from_wire(res.result)


def put_info(res: Response, op: Op) -> ObjectInfo:
    """A put's answer, checked: the object the node stored is the one ``op`` sent (its
    key, size and hash), else :class:`~shuttle.errors.IntegrityError`."""
    size = memoryview(op.payload).nbytes
    return check_written(object_info(res), op.key, size, op.args[HASH_ARG])


def write_info(res: Response) -> WriteInfo:
    return WriteInfo.from_wire(res.result)


def infos(res: Response, keys: Sequence[str]) -> list[ObjectInfo | None]:
    """A ``stat_many`` answer for ``keys``: attributes in the order asked, None where
    missing (either form: :func:`entries`)."""
    return [None if raw is None else ObjectInfo.from_wire(raw) for raw in entries(res, keys)]


def entries(res: Response, keys: Sequence[str]) -> list[dict[str, Any] | None]:
    """The per-key attribute maps of a many-key stat answer (``stat_many``,
    ``callback.promise_many``) in the rows form or the map list."""
    try:
        return decode_rows(res.result, keys)
    except (ValueError, TypeError, KeyError) as exc:
        raise RemoteProtocolError(f"malformed attributes from node: {exc}") from exc


def existed(res: Response) -> list[bool]:
    """A ``remove_many`` answer: per key, whether it existed."""
    return [bool(e) for e in res.result]


def chunks(res: Response) -> list[Chunk]:
    return [Chunk(o, n, h) for o, n, h in res.result["chunks"]]


def upload_id(res: Response) -> str:
    upload: str = res.result["upload"]
    return upload


def page(res: Response) -> ListPage:
    raw = res.result
    try:
        return ListPage(list(raw["keys"]), list(raw.get("prefixes", ())), raw["next"])
    except (KeyError, TypeError) as exc:
        raise RemoteProtocolError(f"malformed listing page from node: {raw!r:.200}") from exc


def piece(res: Response) -> bytes | bytearray:
    """A read's bytes: a large piece arrives as a bytearray received in place, handed
    on uncopied; anything else becomes bytes."""
    data = res.payload
    return data if isinstance(data, bytes | bytearray) else bytes(data)


def pieces(source: Pieces, piece_bytes: int) -> Iterator[bytes]:
    """Cut any source into pieces of at most ``piece_bytes``."""
    if isinstance(source, bytes | bytearray | memoryview):
        view = memoryview(source)
        for start in range(0, len(view), piece_bytes):
            yield bytes(view[start : start + piece_bytes])
        return
    if hasattr(source, "read"):
        reader: IO[bytes] = source  # type: ignore[assignment]
        while part := reader.read(piece_bytes):
            yield part
        return
    buf = bytearray()
    for part in source:  # type: ignore[union-attr]
        buf += part
        while len(buf) >= piece_bytes:
            yield bytes(buf[:piece_bytes])
            del buf[:piece_bytes]
    if buf:
        yield bytes(buf)


def interrupted(exc: BaseException) -> bool:
    """True for an exception that can land anywhere, even between two bytes of a frame
    being sent (Ctrl-C's KeyboardInterrupt, SystemExit from a signal handler): the
    connection in use must then be closed, not used to tidy up."""
    return not isinstance(exc, Exception)
