"""Opening an object's path under the data directory without ever leaving it.

Keys are checked lexically by :mod:`shuttle.store.keys`; that cannot see a symlink an
operator (or an attacker with shell access) left in the tree. So every access walks the
key one component at a time from a descriptor of the root, with ``openat`` and
``O_NOFOLLOW``: a symlink anywhere on the path is refused, whether it points outside the
root or inside it (inside would make two keys name one file, which would defeat the
per-key locks and the block cache). There is no resolve-then-check window (no TOCTOU).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from shuttle.errors import InvalidKeyError, KeyConflictError, NotFoundError
from shuttle.store.keys import no_object

BytesLike = bytes | bytearray | memoryview

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR_MODE = 0o755
FILE_MODE = 0o644


def symlink_error(key: str, where: str) -> InvalidKeyError:
    return InvalidKeyError(
        f"key {key!r} passes through a symlink at {where!r} in the data directory; the store "
        "never follows symlinks there (they could lead outside it, or alias another key). "
        "Replace the symlink with a real directory or file, or use another key."
    )


def hard_link_error(key: str, links: int) -> InvalidKeyError:
    return InvalidKeyError(
        f"the file of key {key!r} has {links} hard links; the store refuses files that are "
        "also reachable from elsewhere (reading one could reveal, and writing one change, "
        "a file outside the data directory). Remove the other links or use another key."
    )


class SafeRoot:
    """A data directory opened once; every path below it is reached by ``openat``.

    Thread-safe: it holds only the root descriptor, which is never changed.
    """

    def __init__(self, root: str) -> None:
        self.root = root
        self.fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)

    def open_parent(self, key: str, *, create: bool) -> tuple[int, str]:
        """Open the directory that holds ``key``; return ``(dir_fd, leaf_name)``.

        The caller closes ``dir_fd``. With ``create`` missing directories are made.

        Raises:
            NotFoundError: a directory on the way is missing (and ``create`` is false), or
                a component is a regular file (so the key cannot exist).
            KeyConflictError: with ``create``, a component on the way is an object.
            InvalidKeyError: a component on the way is a symlink.
        """
        parts = key.split("/")
        fd = os.dup(self.fd)
        for depth, part in enumerate(parts[:-1]):
            # _step always closes the descriptor it is given, even when it raises.
            fd = self._step(fd, part, key, "/".join(parts[: depth + 1]), create)
        return fd, parts[-1]

    def open_dir(self, dir_key: str) -> int:
        """Open the directory ``dir_key`` (``""``: the data directory) read-only, for an
        fsync. The caller closes it. Raises like :meth:`open_parent` without ``create``."""
        if not dir_key:
            return os.dup(self.fd)
        fd, leaf = self.open_parent(dir_key, create=False)
        return self._step(fd, leaf, dir_key, dir_key, False)

    def _step(self, fd: int, part: str, key: str, where: str, create: bool) -> int:
        """Descend from directory ``fd`` into ``part``; closes ``fd`` and returns the child."""
        try:
            for _attempt in range(3):
                try:
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                    return child
                except FileNotFoundError:
                    if not create:
                        raise NotFoundError(
                            f"no object {key!r}: directory {where!r} does not exist. "
                            "List the parent prefix to see what is there."
                        ) from None
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, _DIR_MODE, dir_fd=fd)
                except OSError as exc:
                    if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    st = os.stat(part, dir_fd=fd, follow_symlinks=False)
                    if stat.S_ISLNK(st.st_mode):
                        raise symlink_error(key, where) from None
                    if create:
                        raise KeyConflictError(
                            f"key {key!r} cannot be stored: {where!r} is an object, so it "
                            "cannot also be a directory. Remove that object or use another key."
                        ) from None
                    raise NotFoundError(
                        f"no object {key!r}: {where!r} is an object, not a directory."
                    ) from None
            raise OSError(errno.EAGAIN, f"directory {where!r} keeps disappearing")
        finally:
            os.close(fd)

    def open_file(self, key: str, flags: int, *, create_dirs: bool = False) -> int:
        """Open the object file of ``key`` with ``flags`` (``O_NOFOLLOW`` is added).

        Raises:
            NotFoundError: no such object (or the path names a directory).
            InvalidKeyError: the path passes through or ends in a symlink.
            KeyConflictError: ``create_dirs`` and a component on the way is an object.
        """
        dir_fd, leaf = self.open_parent(key, create=create_dirs)
        try:
            try:
                fd = os.open(leaf, flags | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE, dir_fd=dir_fd)
            except FileNotFoundError:
                raise no_object(key) from None
            except IsADirectoryError:
                raise NotFoundError(
                    f"{key!r} is a directory (a prefix of other keys), not an object."
                ) from None
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise symlink_error(key, key) from None
                raise
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                os.close(fd)
                raise NotFoundError(f"{key!r} is not a regular file, so it is not an object.")
            if st.st_nlink > 1:
                os.close(fd)
                raise hard_link_error(key, st.st_nlink)
            return fd
        finally:
            os.close(dir_fd)

    def lstat_leaf(self, dir_fd: int, leaf: str) -> os.stat_result | None:
        """``lstat`` of ``leaf`` in ``dir_fd``, or None if it does not exist."""
        try:
            return os.stat(leaf, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def is_object_file(self, key: str) -> bool:
        """True if ``key`` names a regular file; False if nothing is there.

        Raises:
            InvalidKeyError: the path passes through or ends in a symlink.
            NotFoundError: the path names a directory or a special file.
        """
        try:
            dir_fd, leaf = self.open_parent(key, create=False)
        except NotFoundError:
            return False
        try:
            st = self.lstat_leaf(dir_fd, leaf)
        finally:
            os.close(dir_fd)
        if st is None:
            return False
        if stat.S_ISLNK(st.st_mode):
            raise symlink_error(key, key)
        if stat.S_ISDIR(st.st_mode):
            raise NotFoundError(
                f"{key!r} is a directory (a prefix of other keys), not an object. "
                "List it with a delimiter to see what is inside."
            )
        if not stat.S_ISREG(st.st_mode):
            raise NotFoundError(f"{key!r} is a special file, not an object.")
        if st.st_nlink > 1:
            raise hard_link_error(key, st.st_nlink)
        return True

    def prune_empty_dirs(self, dir_key: str) -> None:
        """Remove ``dir_key`` and its ancestors while they are empty (never the root)."""
        parts = dir_key.split("/")
        while parts:
            try:
                dir_fd, leaf = self.open_parent("/".join(parts), create=False)
            except (NotFoundError, InvalidKeyError, KeyConflictError):
                return
            try:
                os.rmdir(leaf, dir_fd=dir_fd)
            except OSError:
                return  # not empty, already gone, or not a directory: stop here
            finally:
                os.close(dir_fd)
            parts.pop()


def fsync_dir(path: str) -> None:
    """Make a directory's entries (creates, renames, unlinks) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pwrite_all(fd: int, data: BytesLike, offset: int) -> None:
    """``pwrite`` until every byte is written (a short write is not an error in POSIX)."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def pread_exact(fd: int, length: int, offset: int) -> bytes:
    """``pread`` ``length`` bytes, looping over short reads; fewer only at end of file."""
    data = os.pread(fd, length, offset)
    if len(data) == length or not data:
        return data
    parts = [data]
    got = len(data)
    while got < length:
        more = os.pread(fd, length - got, offset + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)
