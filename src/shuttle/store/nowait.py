"""Reads the kernel can answer from its page cache, made without ever waiting for the disk.

A node answers a block-cache hit on its event loop and used to send every miss to its
thread pool, so that a slow disk never stalls the loop. But most misses are served by
the kernel's page cache in a few microseconds, and the hand-off to a pool thread and
back costs tens (``shuttle bench netrand``'s ``remote_miss``; the profile is in
benchmarks/README.md). ``preadv2(..., RWF_NOWAIT)`` (Linux 4.14+, ``os.preadv`` with
``os.RWF_NOWAIT``) reads only what is resident: it fails with ``EAGAIN`` when the
read would wait for the device, and may return fewer bytes than asked when only some
of the range is resident. So the node tries the miss on its loop with that flag and
goes to the pool only when the kernel says it would block.

:class:`NowaitReads` is that try, per store (one data directory, one file system):

* the bytes, when the kernel had all of them;
* None when it would block (``EAGAIN``) or had only some (a short read): the caller
  then reads the usual way, in a thread, which also tells a short read at the end of
  the file (a file changed behind the store) from a partly resident one;
* None, from then on, when the file system does not support the flag (``EOPNOTSUPP``,
  or ``EINVAL`` from a kernel older than the flag): remembered, so an unsupported file
  system costs one failed call, not one per read.

The ``pread`` it calls is injectable, so tests can play a file system that would block
or has no support for the flag. The platform's reads into a new ``bytes`` object: in C
where Shuttle runs its compiled modules (``shuttle.store._nowait``, ``_nowait.c``: no
copy), else through a reused ``bytearray`` and one copy (:class:`ReusedBufferPread`,
the reference). Nothing here decides what a read returns: the store
(:meth:`ObjectStore.read_nowait <shuttle.store.reads.ReadOps.read_nowait>`)
hands the bytes to the block cache exactly as its thread path does.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

#: ``(fd, length, offset) -> bytes`` without waiting for the device: what the page cache
#: holds of the range (shorter when only its start is resident, or at the end of the
#: file); raises BlockingIOError when none of it is, OSError(EOPNOTSUPP) when it cannot say.
PreadNowait = Callable[[int, int, int], bytes]

#: The errors that mean "this file system (or kernel) cannot read without waiting".
_UNSUPPORTED = frozenset((errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS))


class ReusedBufferPread:
    """``preadv2(fd, [buffer], offset, RWF_NOWAIT)`` into a reused ``bytearray``, then
    one copy into ``bytes``: the reference for ``_nowait.c``, and what runs without the
    compiled modules. A fresh 64 KiB bytearray is zeroed first (about 1.4 µs), so the
    buffer is kept while it has the size asked for (a block, nearly always); it is
    taken out of the attribute while in use, so a second thread never shares it."""

    def __init__(self) -> None:
        self._spare: bytearray | None = None

    def __call__(self, fd: int, length: int, offset: int) -> bytes:
        buffer = self._spare
        if buffer is None or len(buffer) != length:
            buffer = bytearray(length)
        else:
            self._spare = None
        try:
            got = os.preadv(fd, [buffer], offset, os.RWF_NOWAIT)
            return bytes(buffer) if got == length else bytes(buffer[:got])
        finally:
            self._spare = buffer


def _native() -> PreadNowait | None:
    """The C read, when Shuttle runs its compiled modules (else None)."""
    from shuttle.compiled import active

    if not active().compiled:
        return None
    try:
        from shuttle.store import _nowait
    except ImportError:  # pragma: no cover - compiled.check() requires it
        return None
    native: PreadNowait = _nowait.pread_nowait
    return native


def platform_pread() -> PreadNowait | None:
    """A read with ``RWF_NOWAIT`` where Python and the OS have it (Linux), else None:
    the C one with the compiled modules, else a :class:`ReusedBufferPread`."""
    if not (hasattr(os, "preadv") and hasattr(os, "RWF_NOWAIT")):
        return None
    native = _native()
    return native if native is not None else ReusedBufferPread()


class NowaitReads:
    """Reads of one store's files that never wait for the device (see the module).

    Counters (the node's ``stats()["store"]["nowait"]``): ``served`` reads the page
    cache answered, ``would_block`` ones it could not (all or part not resident),
    ``unsupported``: why the file system cannot, or None.
    """

    def __init__(self, pread: PreadNowait | None = None) -> None:
        self._pread = pread if pread is not None else platform_pread()
        self.served = 0
        self.would_block = 0
        self.unsupported: str | None = (
            None if self._pread is not None else "os.preadv with RWF_NOWAIT is not available"
        )

    @property
    def enabled(self) -> bool:
        """False once the platform or the file system has said it cannot."""
        return self.unsupported is None

    def read(self, fd: int, start: int, stop: int) -> bytes | None:
        """Bytes ``[start, stop)`` of ``fd`` if the page cache holds every one of them,
        else None (read them the usual way). Raises nothing for a read that would block
        or an unsupported file system; any other OSError propagates (the caller then
        goes the usual way too, which reports it)."""
        pread = self._pread
        if pread is None or self.unsupported is not None:
            return None
        want = stop - start
        try:
            data = pread(fd, want, start)
        except BlockingIOError:
            self.would_block += 1
            return None
        except OSError as exc:
            if exc.errno not in _UNSUPPORTED:
                raise
            self.unsupported = f"{os.strerror(exc.errno or 0)} (errno {exc.errno})"
            log.info(
                "reads that would block cannot be told apart here (%s): every block-cache "
                "miss goes to the thread pool",
                self.unsupported,
            )
            return None
        if len(data) != want:  # only part resident (or the end of a changed file)
            self.would_block += 1
            return None
        self.served += 1
        return data

    def stats(self) -> dict[str, Any]:
        return {
            "served": self.served,
            "would_block": self.would_block,
            "unsupported": self.unsupported,
        }
