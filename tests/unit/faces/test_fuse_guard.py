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
from shuttle.faces.fuse import OPERATIONS, ShuttleOperations
from shuttle.faces.fuse_errors import guarded


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
        trio.run(guarded(operation))
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


@pytest.mark.parametrize("attr_timeout_s", [0.0, 5.0])
def test_an_absent_name_is_kept_only_as_long_as_names_are(
    client: Client, attr_timeout_s: float
) -> None:
    ops = ShuttleOperations(client, attr_timeout_s=attr_timeout_s)

    async def look_up_a_missing_name() -> pyfuse3.EntryAttributes:
        return await ops.lookup(pyfuse3.ROOT_INODE, b"missing.py")

    try:
        if attr_timeout_s == 0:  # the default: every lookup asks, absence is ENOENT
            with pytest.raises(pyfuse3.FUSEError) as caught:
                trio.run(look_up_a_missing_name)
            assert caught.value.errno == errno.ENOENT
        else:  # a negative entry the kernel keeps for --attr-timeout
            absent = trio.run(look_up_a_missing_name)
            assert absent.st_ino == 0 and absent.entry_timeout == attr_timeout_s
    finally:
        ops.close()
