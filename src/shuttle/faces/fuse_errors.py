"""How a failure inside the mount reaches a program: as the errno the kernel hands it.

pyfuse3 ends the whole mount when an operation raises anything but ``FUSEError``, so
every operation is wrapped (:func:`guarded`): a Shuttle error becomes its errno
(:func:`~shuttle.faces.oserrors.errno_of`, shared with the fsspec face), a local
``OSError`` (the write buffer's disk) its own, and anything else ``EIO``, logged.
:func:`fuse_errors` does the same for one client call inside an operation.
"""

from __future__ import annotations

import errno
import functools
import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pyfuse3

from shuttle.errors import ShuttleError
from shuttle.faces.oserrors import errno_of

log = logging.getLogger("shuttle.faces.fuse")

T = TypeVar("T")


def guarded(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """Any failure of an operation becomes an errno for the program: pyfuse3 ends the
    whole mount when a handler raises anything but ``FUSEError``."""

    @functools.wraps(fn)
    async def operation(*args: Any, **kwargs: Any) -> T:
        try:
            return await fn(*args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except ShuttleError as exc:
            raise pyfuse3.FUSEError(errno_of(exc)) from exc
        except OSError as exc:  # the local write buffer (a full $TMPDIR, say)
            log.warning("%s: %s", fn.__name__, exc)
            raise pyfuse3.FUSEError(exc.errno or errno.EIO) from exc
        except Exception as exc:
            log.exception("%s failed; the program sees EIO", fn.__name__)
            raise pyfuse3.FUSEError(errno.EIO) from exc

    return operation


@contextmanager
def fuse_errors() -> Iterator[None]:
    """Shuttle errors become the errno the kernel hands the program."""
    try:
        yield
    except ShuttleError as exc:
        number = errno_of(exc)
        if number not in (errno.ENOENT, errno.EEXIST, errno.ENOTEMPTY):
            log.warning("%s: %s", type(exc).__name__, exc)
        raise pyfuse3.FUSEError(number) from exc
