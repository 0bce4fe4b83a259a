"""One streamed upload over one connection: the session begun at the key's node, its
pieces written with a window of requests in flight, then committed; when anything
fails, aborted at the node (or, after an interrupt, its connection closed, which ends
the session there). The sent bytes are hashed on the way, so the caller can check
the committed object against them (:func:`~shuttle.client.integrity.check_written`).
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterator

from shuttle.client import calls
from shuttle.client.calls import Op, interrupted
from shuttle.client.connections import NodeConnection
from shuttle.client.integrity import UploadHasher
from shuttle.client.model import ObjectInfo
from shuttle.errors import ShuttleError
from shuttle.net.blocking import Call
from shuttle.wire import Response


def upload(
    conn: NodeConnection,
    key: str,
    pieces: Iterator[bytes],
    *,
    expected_version: int | None,
    window: int,
    progress: Callable[[int], None],
    mtime_ns: int | None = None,
) -> tuple[ObjectInfo, UploadHasher]:
    """Upload ``pieces`` as ``key`` over ``conn`` (every request of the session goes
    over this one connection, to the session's node); the committed object's
    attributes and what was sent (its size and hash)."""
    begun = calls.upload_id(_on(conn, calls.upload_begin(key, expected_version)))
    sizes: deque[int] = deque()
    sent = UploadHasher()  # the object's hash, to check the commit's answer against

    def writes() -> Iterator[Call]:
        offset = 0
        for piece in pieces:
            sizes.append(len(piece))
            sent.update(piece)
            op = calls.upload_write(begun, offset, piece, key=key)
            yield Call(op.op, op.args, op.payload)
            offset += len(piece)

    try:
        for _ in conn.call_many(writes(), window=window, idempotent=False):
            progress(sizes.popleft())
        info = calls.object_info(_on(conn, calls.upload_commit(begun, mtime_ns)))
    except BaseException as exc:
        if interrupted(exc):
            conn.close()  # the node ends the session with its connection
        else:
            with contextlib.suppress(ShuttleError):  # else the node expires it itself
                _on(conn, calls.upload_abort(begun))
        raise
    return info, sent


def _on(conn: NodeConnection, op: Op) -> Response:
    """Make the request ``op`` over ``conn``."""
    return conn.call(op.op, op.args, op.payload, idempotent=op.idempotent)
