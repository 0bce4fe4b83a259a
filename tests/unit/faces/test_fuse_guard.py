"""A failing operation gives the program an errno; it never ends the mount."""

from __future__ import annotations

import errno
import logging
import os

import pyfuse3
import pytest
import trio

from shuttle.client import Client
from shuttle.errors import NotFoundError
from shuttle.faces.fuse import OPERATIONS, ShuttleOperations, _guarded


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (KeyError("a bug"), errno.EIO),
        (NotFoundError("no object"), errno.ENOENT),
        (OSError(errno.ENOSPC, "the buffer's disk is full"), errno.ENOSPC),
        (pyfuse3.FUSEError(errno.EISDIR), errno.EISDIR),
    ],
)
def test_every_failure_becomes_an_errno(raised: BaseException, expected: int) -> None:
    async def operation() -> None:
        raise raised

    with pytest.raises(pyfuse3.FUSEError) as caught:
        trio.run(_guarded(operation))
    assert caught.value.errno == expected


def test_every_operation_is_guarded() -> None:
    for name in OPERATIONS:
        assert getattr(ShuttleOperations, name).__wrapped__ is not None, name


def test_unmounting_with_unflushed_writes_says_what_was_lost(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    ops = ShuttleOperations(client)

    async def write_without_closing() -> None:
        ctx = pyfuse3.RequestContext()  # unused by create
        info, _ = await ops.create(pyfuse3.ROOT_INODE, b"draft.txt", 0o644, os.O_WRONLY, ctx)
        await ops.write(info.fh, 0, b"not flushed")

    trio.run(write_without_closing)
    with caplog.at_level(logging.WARNING, logger="shuttle"):
        ops.close()
    assert "draft.txt was open for writing" in caplog.text
