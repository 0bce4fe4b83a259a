"""The FUSE operations of ``shuttle mount``: a POSIX view of a cluster's keys.

What a program sees (docs/mount.md has the whole story):

* **Reads** go through ``client.open(key, "rb")``: the client cache, the client's
  validation mode and (when the client has them) its lookaside stores. Each open
  file keeps its own reader, pinned to the version the open validated; the kernel's
  page cache is dropped at every open (``keep_cache`` off), so an open sees what the
  mode lets it see and nothing older.
* **Attributes** come from the same validation mode (``size`` and ``mtime`` of the
  object's :class:`ObjectInfo`); files are ``0644``, directories ``0755``, owned by
  the user who mounted. A file's mtime set by a program (utime, ``touch -d``,
  ``rsync -t``) is stored on its object, and a rename keeps it; mode, owner, access
  times and directories' times are accepted and not stored.
* **Writes** go to a local buffer file per inode (shared by every handle open on it,
  so the mount's own readers see them at once) and are put as one whole object when
  a handle is flushed (``close``) or fsynced: other clients see the old object or the
  new one, never a mix. A file opened for writing without ``O_TRUNC`` is fetched
  into the buffer first.
* **Directories**, **rename**: see :mod:`shuttle.faces.tree` (markers for empty
  directories; rename is copy then remove, not atomic as a whole). Removing a
  directory's last entry leaves the directory (its marker), as POSIX programs expect.

The client blocks, so every client call runs on a small fixed pool of threads (each
keeps its connections to the nodes) while the trio loop stays free to serve the
kernel. How a failure becomes an errno is :mod:`shuttle.faces.fuse_errors`'s; what
``statfs`` reports, :mod:`shuttle.faces.space`'s.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pyfuse3
import trio

from shuttle.client.client import SINGLE_PUT_BYTES_MAX, Client
from shuttle.client.files import RemoteReader
from shuttle.client.model import ObjectInfo
from shuttle.client.validation.base import DirectoryKeyError
from shuttle.errors import NotFoundError
from shuttle.faces.fuse_errors import fuse_errors, guarded
from shuttle.faces.handles import Handle, WriteBuffer
from shuttle.faces.inodes import ROOT_INODE, InodeTable
from shuttle.faces.reading import close_reader, confirmed_info, open_reader, read_confirmed
from shuttle.faces.space import STATFS_TTL_S, cluster_space
from shuttle.faces.tree import DIR_MARKER, KeyTree, join, parent

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Client calls in flight at once: enough for make -j and parallel readers, few
#: enough that each thread's connections (one per node) stay few.
WORKERS_DEFAULT = 16
#: How long the kernel may keep attributes and names without asking again. Zero by
#: default: every stat asks the validation mode, so the mount adds no staleness of
#: its own (raise it to trade consistency for fewer round trips).
ATTR_TIMEOUT_S_DEFAULT = 0.0
#: How long the kernel may keep a directory's name and attributes. Directories have
#: no contents of their own to go stale, only their existence: one second spares a
#: lookup round trip per path component per file opened, and a directory removed
#: elsewhere may still be seen for that long.
DIR_TIMEOUT_S_DEFAULT = 1.0
#: Reported as the file system's block size (st_blksize, statfs): the client reads
#: the node in 64 KiB cache blocks.
BLOCK_BYTES = 64 << 10
#: Names longer than this cannot be keys (a key component is at most 255 bytes).
NAME_BYTES_MAX = 255
_FILE_MODE = stat.S_IFREG | 0o644
_DIR_MODE = stat.S_IFDIR | 0o755


class ShuttleOperations(pyfuse3.Operations):
    """pyfuse3 operations over one :class:`Client` (which stays the caller's)."""

    enable_writeback_cache = False

    def __init__(
        self,
        client: Client,
        *,
        validation: str | None = None,
        attr_timeout_s: float = ATTR_TIMEOUT_S_DEFAULT,
        dir_timeout_s: float = DIR_TIMEOUT_S_DEFAULT,
        workers: int = WORKERS_DEFAULT,
        spool_dir: Path | None = None,
    ) -> None:
        super().__init__()
        self.client = client
        self.validation = validation
        self.mode = client.validation_mode(validation)
        self.tree = KeyTree(client, validation)
        self.attr_timeout_s = attr_timeout_s
        self.dir_timeout_s = dir_timeout_s
        self.spool_dir = spool_dir
        self.inodes = InodeTable()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="shuttle-fuse")
        self._handles: dict[int, Handle] = {}
        self._buffers: dict[int, WriteBuffer] = {}
        #: Inodes open for reading: how many handles, and what the newest open validated.
        self._reading: dict[int, tuple[int, ObjectInfo]] = {}
        self._listings: dict[int, list[tuple[str, ObjectInfo | None]]] = {}
        self._next_fh = 1
        self._uid = os.getuid()
        self._gid = os.getgid()
        self._started_ns = time.time_ns()
        #: (when asked, (total, free) bytes) of the nodes' disks, for statfs.
        self._space: tuple[float, tuple[int, int]] | None = None

    def close(self) -> None:
        """Stop the worker threads and drop the write buffers (after unmounting)."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.tree.close()
        for ino, buf in self._buffers.items():
            if buf.dirty:  # a program still had it open: its close never flushed
                log.warning(
                    "unmounted while %s was open for writing: its changes since the last "
                    "flush are lost; close (or fsync) files before unmounting",
                    self.inodes.path(ino),
                )
            buf.file.close()
        self._buffers.clear()

    # --- plumbing ------------------------------------------------------------------------

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the worker pool, mapping Shuttle errors to FUSE errors."""
        token = trio.lowlevel.current_trio_token()
        send, receive = trio.open_memory_channel[Future[T]](1)
        future = self._pool.submit(fn, *args)
        future.add_done_callback(lambda f: token.run_sync_soon(send.send_nowait, f))
        done = await receive.receive()
        with fuse_errors():
            return done.result()

    def _path(self, ino: int) -> str:
        path = self.inodes.path(ino)
        if path is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return path

    def _child(self, parent_ino: int, name: bytes) -> str:
        text = os.fsdecode(name)
        if len(name) > NAME_BYTES_MAX:
            raise pyfuse3.FUSEError(errno.ENAMETOOLONG)
        if text == DIR_MARKER:  # reserved: the faces never show a marker as a file
            raise pyfuse3.FUSEError(errno.EINVAL)
        return join(self._path(parent_ino), text)

    def _attrs(self, ino: int, info: ObjectInfo | None) -> pyfuse3.EntryAttributes:
        """Attributes of ``ino``: a file described by ``info`` (or its write buffer),
        or a directory when ``info`` is None."""
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = ino
        attr.generation = 0
        attr.entry_timeout = self.attr_timeout_s
        attr.attr_timeout = self.attr_timeout_s
        attr.st_uid = self._uid
        attr.st_gid = self._gid
        attr.st_blksize = BLOCK_BYTES
        buf = self._buffers.get(ino)
        if info is None and buf is None:
            attr.entry_timeout = attr.attr_timeout = self.dir_timeout_s
            attr.st_mode = _DIR_MODE
            attr.st_nlink = 2
            attr.st_size = 0
            mtime_ns = self._started_ns
        else:
            attr.st_mode = _FILE_MODE
            attr.st_nlink = 1
            if buf is not None:
                attr.st_size, mtime_ns = buf.size(), buf.mtime_ns
            else:
                assert info is not None
                attr.st_size, mtime_ns = info.size, info.mtime_ns
        attr.st_blocks = (attr.st_size + 511) // 512
        attr.st_atime_ns = attr.st_mtime_ns = attr.st_ctime_ns = mtime_ns
        return attr

    def _stat_file(self, key: str) -> ObjectInfo:
        """The object's attributes as the validation mode sees them (confirmed)."""
        return confirmed_info(self.mode, self.client, key)

    def _probe(self, key: str) -> ObjectInfo | None:
        """``key``'s attributes if it is a file, None if it is a directory; NotFoundError
        if it is neither."""
        try:
            return self._stat_file(key)
        except DirectoryKeyError:
            return None  # the key's node said so in the same round trip
        except NotFoundError:
            if self.tree.is_dir(key):
                return None
            raise

    async def _entry(self, key: str) -> pyfuse3.EntryAttributes:
        """Look ``key`` up and give the kernel a reference to its inode."""
        ino = self.inodes.ino(key)
        if ino is not None and ino in self._buffers:
            info = None  # a file open for writing here: its buffer has the truth
        else:
            info = await self._run(self._probe, key)
        is_dir = info is None and (ino is None or ino not in self._buffers)
        ino = self.inodes.bind(key, is_dir)
        self.inodes.looked_up(ino)
        return self._attrs(ino, info)

    # --- names -----------------------------------------------------------------------------

    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext | None = None
    ) -> pyfuse3.EntryAttributes:
        if name == b".":
            return await self.getattr(parent_inode)
        if name == b"..":
            return await self.getattr(self._parent_ino(parent_inode))
        try:
            return await self._entry(self._child(parent_inode, name))
        except pyfuse3.FUSEError as exc:
            if exc.errno != errno.ENOENT or self.attr_timeout_s <= 0:
                raise
            # A name that is not there is a name too: with --attr-timeout the kernel may
            # keep its absence that long (a negative entry: inode 0), as it keeps the
            # names that are. Builds probe many absent names (imports, includes).
            absent = pyfuse3.EntryAttributes()
            absent.st_ino = 0
            absent.entry_timeout = self.attr_timeout_s
            return absent

    def _parent_ino(self, ino: int) -> int:
        if ino == ROOT_INODE:
            return ROOT_INODE
        path = parent(self._path(ino))
        found = self.inodes.ino(path)
        return found if found is not None else self.inodes.bind(path, True)

    async def forget(self, inode_list: Any) -> None:
        for ino, count in inode_list:
            self.inodes.forget(ino, count)

    async def getattr(
        self, inode: int, ctx: pyfuse3.RequestContext | None = None
    ) -> pyfuse3.EntryAttributes:
        entry = self.inodes.entry(inode)
        if entry is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        if entry.is_dir or inode in self._buffers:
            return self._attrs(inode, None)
        if inode in self._reading:
            # While a file is open, the kernel asks before each read: answer with what
            # its newest open validated (reads are pinned to that version anyway).
            return self._attrs(inode, self._reading[inode][1])
        if not entry.attached:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attrs(inode, await self._run(self._stat_file, entry.path))

    async def setattr(
        self,
        inode: int,
        attr: pyfuse3.EntryAttributes,
        fields: pyfuse3.SetattrFields,
        fh: int | None,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        if fields.update_size:
            buf = self._buffers.get(inode)
            if buf is not None:
                async with buf.lock:
                    os.ftruncate(buf.fd, attr.st_size)
                    buf.dirty, buf.mtime_ns, buf.mtime_set = True, time.time_ns(), False
            else:
                await self._run(self.client.truncate, self._path(inode), attr.st_size)
        if fields.update_mtime:
            await self._set_mtime(inode, attr.st_mtime_ns)
        # Mode, owner and access times are not stored (objects have none of their own),
        # nor are directories' times (a directory is no object).
        return await self.getattr(inode)

    async def _set_mtime(self, inode: int, mtime_ns: int) -> None:
        """Store the mtime a program set (utime, touch, rsync -t): on the object, or on
        the write buffer of a file open for writing, whose put at flush records it."""
        entry = self.inodes.entry(inode)
        if entry is None or entry.is_dir:
            return
        buf = self._buffers.get(inode)
        if buf is not None:
            async with buf.lock:
                buf.mtime_ns, buf.mtime_set = mtime_ns, True
                if buf.dirty:
                    return  # the put at flush carries it
        await self._run(self.client.set_mtime, self._path(inode), mtime_ns)

    async def mkdir(
        self, parent_inode: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        key = self._child(parent_inode, name)
        await self._run(self.tree.mkdir, key)
        ino = self.inodes.bind(key, True)
        self.inodes.looked_up(ino)
        return self._attrs(ino, None)

    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        key = self._child(parent_inode, name)
        await self._run(self.tree.rmdir, key)
        self.inodes.detach(key)
        await self._run(self.tree.keep, parent(key))

    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        key = self._child(parent_inode, name)
        await self._run(self.client.remove, key)
        self.inodes.detach(key)
        await self._run(self.tree.keep, parent(key))

    async def rename(
        self,
        parent_inode_old: int,
        name_old: bytes,
        parent_inode_new: int,
        name_new: bytes,
        flags: int,
        ctx: pyfuse3.RequestContext,
    ) -> None:
        if flags & pyfuse3.RENAME_EXCHANGE:
            raise pyfuse3.FUSEError(errno.EINVAL)  # two copies cannot swap atomically
        src = self._child(parent_inode_old, name_old)
        dst = self._child(parent_inode_new, name_new)
        src_ino = self.inodes.ino(src)
        if src_ino is not None and src_ino in self._buffers:
            await self._flush_buffer(src_ino)
        # The kernel looked both names up just before (and holds them meanwhile), so
        # the inode table knows what each is: no round trips to find out.
        kinds = [self._kind(src), self._kind(dst)]
        await self._run(self._rename, src, dst, *kinds, bool(flags & pyfuse3.RENAME_NOREPLACE))
        self.inodes.rename(src, dst)

    def _kind(self, path: str) -> bool | None:
        """Whether ``path`` is a directory (None: no inode, so the kernel found nothing
        at its lookup, or never asked: then the nodes are asked)."""
        ino = self.inodes.ino(path)
        entry = None if ino is None else self.inodes.entry(ino)
        return None if entry is None else entry.is_dir

    def _rename(
        self, src: str, dst: str, src_dir: bool | None, dst_dir: bool | None, noreplace: bool
    ) -> None:
        if src_dir is None:
            src_dir = self._probe(src) is None
        if dst_dir is not None and noreplace:
            raise pyfuse3.FUSEError(errno.EEXIST)
        if not src_dir:
            if dst_dir:
                raise pyfuse3.FUSEError(errno.EISDIR)
            self.tree.rename_file(src, dst)
        else:
            if dst_dir is False:
                raise pyfuse3.FUSEError(errno.ENOTDIR)
            if dst_dir:
                if not self.tree.is_empty(dst):
                    raise pyfuse3.FUSEError(errno.ENOTEMPTY)
                self.tree.rmdir(dst)
            self.tree.rename_dir(src, dst)
        if parent(src) != parent(dst):
            self.tree.keep(parent(src))

    # --- directories -------------------------------------------------------------------------

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        entry = self.inodes.entry(inode)
        if entry is None or not entry.attached:
            raise pyfuse3.FUSEError(errno.ENOENT)
        if not entry.is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return self._new_fh(Handle(inode))

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        handle = self._handles[fh]
        if start_id == 0 or fh not in self._listings:
            listing = await self._run(self.tree.listdir, self._path(handle.ino))
            entries: list[tuple[str, ObjectInfo | None]] = [(d, None) for d in listing.dirs]
            entries += list(listing.files.items())
            entries.sort(key=lambda entry: entry[0])  # by name: the infos do not compare
            self._listings[fh] = entries
        dir_path = self._path(handle.ino)
        entries = self._listings[fh]
        for i in range(start_id, len(entries)):
            name, info = entries[i]
            ino = self.inodes.bind(join(dir_path, name), info is None)
            if not pyfuse3.readdir_reply(token, os.fsencode(name), self._attrs(ino, info), i + 1):
                return
            self.inodes.looked_up(ino)

    async def releasedir(self, fh: int) -> None:
        self._handles.pop(fh, None)
        self._listings.pop(fh, None)

    # --- files -----------------------------------------------------------------------------

    def _new_fh(self, handle: Handle) -> int:
        fh = self._next_fh
        self._next_fh += 1
        self._handles[fh] = handle
        return fh

    def _file_info(self, fh: int) -> pyfuse3.FileInfo:
        # keep_cache off: the kernel drops its cached pages at each open, so every open
        # reads through the client cache as validated by the mode.
        return pyfuse3.FileInfo(fh=fh, keep_cache=False)

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        entry = self.inodes.entry(inode)
        if entry is None or not entry.attached:
            raise pyfuse3.FUSEError(errno.ENOENT)
        if entry.is_dir:
            raise pyfuse3.FUSEError(errno.EISDIR)
        writable = flags & os.O_ACCMODE != os.O_RDONLY
        truncate = bool(flags & os.O_TRUNC)
        if writable or truncate or inode in self._buffers:
            await self._attach_buffer(inode, entry.path, load=not truncate)
            buf = self._buffers[inode]
            if truncate:
                async with buf.lock:
                    os.ftruncate(buf.fd, 0)
                    buf.dirty, buf.mtime_ns, buf.mtime_set = True, time.time_ns(), False
            return self._file_info(self._new_fh(Handle(inode, writable=True)))
        reader = await self._run(self._open_reader, entry.path)
        count = self._reading.get(inode, (0, reader.info))[0]
        self._reading[inode] = (count + 1, reader.info)
        return self._file_info(self._new_fh(Handle(inode, reader=reader)))

    def _open_reader(self, key: str) -> RemoteReader:
        return open_reader(self.client, key, self.validation)

    async def _attach_buffer(self, ino: int, key: str, *, load: bool) -> None:
        """Give ``ino`` a write buffer (one more handle on it), filled from the object
        unless ``load`` is false."""
        buf = self._buffers.get(ino)
        if buf is None:
            fresh = WriteBuffer(tempfile.TemporaryFile(dir=self.spool_dir))  # noqa: SIM115
            if load:
                try:
                    info = await self._run(self.client.get_to, key, fresh.file)
                except BaseException:
                    fresh.file.close()
                    raise
                fresh.file.flush()
                fresh.mtime_ns = info.mtime_ns
            buf = self._buffers.setdefault(ino, fresh)
            if buf is not fresh:  # another open raced us to it
                fresh.file.close()
        buf.handles += 1

    async def create(
        self,
        parent_inode: int,
        name: bytes,
        mode: int,
        flags: int,
        ctx: pyfuse3.RequestContext,
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        key = self._child(parent_inode, name)
        # The object exists (empty) at once, so other clients and lookups see it.
        await self._run(lambda: self.client.create(key, exclusive=bool(flags & os.O_EXCL)))
        ino = self.inodes.bind(key, False)
        await self._attach_buffer(ino, key, load=False)
        self.inodes.looked_up(ino)
        fh = self._new_fh(Handle(ino, writable=True))
        return self._file_info(fh), self._attrs(ino, None)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        handle = self._handles[fh]
        buf = self._buffers.get(handle.ino)
        if buf is not None:
            async with buf.lock:
                return os.pread(buf.fd, size, off)
        async with handle.lock:  # one reader, one position: reads of a handle in turn
            assert handle.reader is not None
            reader = handle.reader
            now, data = await self._run(
                lambda: read_confirmed(reader, off, size, self.validation, first=handle.fresh)
            )
            handle.reader, handle.fresh = now, False
            if now is not reader and handle.ino in self._reading:  # reopened: fresher
                self._reading[handle.ino] = (self._reading[handle.ino][0], now.info)
            return data

    async def write(self, fh: int, off: int, data: bytes) -> int:
        handle = self._handles[fh]
        buf = self._buffers.get(handle.ino)
        if buf is None or not handle.writable:
            raise pyfuse3.FUSEError(errno.EBADF)
        async with buf.lock:
            written = os.pwrite(buf.fd, data, off)
            buf.dirty, buf.mtime_ns, buf.mtime_set = True, time.time_ns(), False
        return written

    async def flush(self, fh: int) -> None:
        handle = self._handles[fh]
        if handle.writable:
            await self._flush_buffer(handle.ino)

    async def fsync(self, fh: int, datasync: bool) -> None:
        await self.flush(fh)

    async def _flush_buffer(self, ino: int) -> None:
        """Put the inode's buffer as the whole object, if it changed since the last put."""
        buf = self._buffers.get(ino)
        if buf is None:
            return
        async with buf.lock:
            if not buf.dirty:
                return
            key = self._path(ino)
            info = await self._run(self._put_buffer, key, buf)
            buf.dirty, buf.mtime_ns, buf.mtime_set = False, info.mtime_ns, False

    def _put_buffer(self, key: str, buf: WriteBuffer) -> ObjectInfo:
        size = buf.size()
        mtime_ns = buf.mtime_ns if buf.mtime_set else None
        if size <= SINGLE_PUT_BYTES_MAX:
            return self.client.put(key, os.pread(buf.fd, size, 0), mtime_ns=mtime_ns)
        with open(buf.fd, "rb", closefd=False) as source:
            source.seek(0)
            return self.client.put(key, source, mtime_ns=mtime_ns)

    async def release(self, fh: int) -> None:
        handle = self._handles.pop(fh)
        if handle.reader is not None:
            close_reader(handle.reader)
            count, info = self._reading.pop(handle.ino, (1, handle.reader.info))
            if count > 1:
                self._reading[handle.ino] = (count - 1, info)
        buf = self._buffers.get(handle.ino)
        if buf is None or not handle.writable:
            return
        buf.handles -= 1
        if buf.handles > 0:
            return
        try:
            await self._flush_buffer(handle.ino)  # close() flushed already, unless it failed
        except pyfuse3.FUSEError as exc:
            log.warning("changes to %s lost at release: %s", self.inodes.path(handle.ino), exc)
        finally:
            if buf.handles == 0 and self._buffers.get(handle.ino) is buf:
                del self._buffers[handle.ino]
                buf.file.close()

    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        now = time.monotonic()
        if self._space is None or now - self._space[0] > STATFS_TTL_S:
            self._space = (now, await self._run(cluster_space, self.client))
        total, free = self._space[1]
        out = pyfuse3.StatvfsData()
        out.f_bsize = out.f_frsize = BLOCK_BYTES
        out.f_blocks = total // BLOCK_BYTES
        out.f_bfree = out.f_bavail = free // BLOCK_BYTES
        # Objects are not counted against a table of inodes: report plenty.
        out.f_files = out.f_ffree = out.f_favail = 1 << 30
        out.f_namemax = NAME_BYTES_MAX
        return out


#: The operations the mount implements (each guarded by :func:`guarded`).
OPERATIONS = (
    "lookup", "forget", "getattr", "setattr", "mkdir", "rmdir", "unlink", "rename",
    "opendir", "readdir", "releasedir", "open", "create", "read", "write", "flush",
    "fsync", "release", "statfs",
)  # fmt: skip
for _name in OPERATIONS:
    setattr(ShuttleOperations, _name, guarded(getattr(ShuttleOperations, _name)))
