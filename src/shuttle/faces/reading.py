"""Reads for programs that cannot be rolled back.

The ``speculative`` validation mode lets an open return before its version check is
in; a program that uses the client directly confirms at its ``checkpoint()`` and
re-runs from there if the cached copy was stale. An unmodified program behind a face
cannot re-run, so the faces confirm before handing it anything: attributes are
confirmed before they are returned, and a file's bytes before the read returns. A
stale copy is never shown; the face opens again and reads the fresh version. With
``check`` and ``callback`` there is nothing pending and these are plain calls.
"""

from __future__ import annotations

import contextlib

from shuttle.client.client import Client
from shuttle.client.files import RemoteReader
from shuttle.client.model import ObjectInfo
from shuttle.client.validation import ValidationMode
from shuttle.errors import StaleDataError, VersionMismatchError

#: Opens of one object in a row that may each find the copy stale before the face
#: gives up and lets the change reach the program as an error (each stale find
#: refreshes the cache, so a second one needs a writer racing this reader).
STALE_RETRIES_MAX = 3


def confirmed_info(mode: ValidationMode, client: Client, key: str) -> ObjectInfo:
    """``key``'s attributes as ``mode`` validates them, confirmed."""
    for _ in range(STALE_RETRIES_MAX):
        validated = mode.open(key)
        if validated.pending is None:
            return validated.info
        try:
            validated.pending.confirm()
        except StaleDataError:
            continue
        return validated.info
    return client.stat(key)


def close_reader(reader: RemoteReader) -> None:
    """Close ``reader``; a copy found stale now is no matter (every byte handed out
    was confirmed when it was read)."""
    with contextlib.suppress(StaleDataError):
        reader.close()


def open_reader(client: Client, key: str, validation: str | None) -> RemoteReader:
    """A reader of ``key`` through the client cache, validated by ``validation``."""
    reader = client.open(key, "rb", validation=validation)
    assert isinstance(reader, RemoteReader)
    return reader


def read_confirmed(
    reader: RemoteReader, offset: int, size: int, validation: str | None, *, first: bool
) -> tuple[RemoteReader, bytes]:
    """``size`` bytes at ``offset``, confirmed fresh by the reader's validation.

    ``first``: nothing has been handed out from this reader yet. Then a stale copy
    (the speculative check said so, or the object changed before the bytes came) is
    no matter: the reader is replaced by a fresh open (returned, for the next reads)
    and the bytes come from that. Later, a change is an error (``VersionMismatchError``,
    ESTALE to a program), never a silent mix of two versions in one open file. So is a
    change under each of :data:`STALE_RETRIES_MAX` opens in a row (a writer racing
    every one): the bytes always come from the version the returned reader is pinned to.
    """
    for _ in range(STALE_RETRIES_MAX):
        try:
            if reader.closed:  # a reopen after a stale find failed (the object went away)
                if not first:
                    raise StaleDataError(
                        f"{reader.key!r} changed under this open file; open it again"
                    )
                reader = open_reader(reader.client, reader.key, validation)
            reader.seek(offset)
            data = reader.read(size)
            reader.checkpoint()
        except VersionMismatchError:  # StaleDataError is one
            if not first:
                raise
            close_reader(reader)
            reader = open_reader(reader.client, reader.key, validation)
            continue
        return reader, data
    # Not the node's newest bytes (client.read): they may be of a later version than the
    # one ``reader`` is pinned to, and its next reads would then mix two versions.
    return read_confirmed(reader, offset, size, validation, first=False)
