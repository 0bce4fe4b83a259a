"""Shuttle errors as the errno values and ``OSError``s that unmodified programs expect.

The FUSE mount answers the kernel with an errno; the fsspec filesystem raises the
built-in ``OSError`` subclasses (``FileNotFoundError``...) that pandas and dask
catch. Both take the number from :func:`errno_of`, so the two faces agree.
"""

from __future__ import annotations

import errno

from shuttle.errors import (
    AlreadyExistsError,
    AuthenticationError,
    DirectoryNotEmptyError,
    DiskFullError,
    InvalidArgumentError,
    InvalidKeyError,
    KeyConflictError,
    LimitExceededError,
    NodeBusyError,
    NotFoundError,
    NotPermittedError,
    RequestTimeoutError,
    ShuttleError,
    UnreachableError,
    VersionMismatchError,
)

#: Most specific first: the first class the error is an instance of gives its errno.
_ERRNOS: tuple[tuple[type[ShuttleError], int], ...] = (
    (DirectoryNotEmptyError, errno.ENOTEMPTY),
    (NotFoundError, errno.ENOENT),
    (AlreadyExistsError, errno.EEXIST),
    # "a" is an object, so "a/b" cannot be: a component of the path is not a directory.
    (KeyConflictError, errno.ENOTDIR),
    (InvalidKeyError, errno.EINVAL),
    (InvalidArgumentError, errno.EINVAL),
    # A read pinned to a version found the object changed since the open (check mode):
    # NFS's "stale file handle". Open the file again.
    (VersionMismatchError, errno.ESTALE),
    (DiskFullError, errno.ENOSPC),
    (LimitExceededError, errno.EFBIG),
    (AuthenticationError, errno.EACCES),
    # A capability the principal lacks (or a node refusing shipped code): what a
    # program sees for a file its user may not touch.
    (NotPermittedError, errno.EACCES),
    (NodeBusyError, errno.EAGAIN),
    (RequestTimeoutError, errno.ETIMEDOUT),
    (UnreachableError, errno.EHOSTUNREACH),
)


def errno_of(exc: ShuttleError) -> int:
    """The errno a program should see for ``exc`` (EIO for anything unforeseen)."""
    for cls, number in _ERRNOS:
        if isinstance(exc, cls):
            return number
    return errno.EIO


def os_error(exc: ShuttleError, path: str) -> OSError:
    """``exc`` as the built-in ``OSError`` subclass for its errno (``FileNotFoundError``
    for ENOENT...), naming ``path`` and keeping Shuttle's message."""
    number = errno_of(exc)
    return OSError(number, f"{exc} ({errno.errorcode.get(number, number)})", path)
