"""``shuttle://``: Shuttle objects as an fsspec filesystem (pandas, dask, ``fsspec.open``).

``shuttle://data/x.csv`` names the key ``data/x.csv`` of the cluster the client
commands use: the cluster file in ``$SHUTTLE_CLUSTER``, unless ``storage_options``
say otherwise (``node="HOST:PORT"``, ``cluster="c.toml"``, ``key_file``, ``link``,
``validation``, ``lookaside``; or ``client=`` an existing :class:`Client`)::

    pandas.read_csv("shuttle://data/x.csv")
    pandas.read_csv("shuttle://data/x.csv", storage_options={"node": "127.0.0.1:7401"})

Reads go through the client's cached read path: a file validates once, at open, by
the client's validation mode, and its ranges come through the client cache (and the
lookaside stores when the client has them). Writes stream to an upload session that
becomes the object, whole, at close (an exception inside ``with``, ``fs.open``'s or
``fsspec.open``'s, aborts it: the old object stays, and a new key is not created).
Directories are those of :mod:`shuttle.faces.tree` (``mkdir`` makes a marker, so
empty directories exist); as in other object stores, removing a directory's last
file removes the directory unless it was made with ``mkdir``.
"""

from __future__ import annotations

import builtins
import contextlib
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from types import FrameType
from typing import Any

from fsspec.core import OpenFile
from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

from shuttle.client.client import Client
from shuttle.client.connect import connect
from shuttle.client.files import RemoteReader, RemoteWriter
from shuttle.client.lookaside import StoreSet
from shuttle.client.model import ObjectInfo
from shuttle.errors import InvalidArgumentError, NotFoundError, ShuttleError, StaleDataError
from shuttle.faces.oserrors import os_error
from shuttle.faces.reading import STALE_RETRIES_MAX, close_reader, open_reader
from shuttle.faces.tree import KeyTree, is_marker, marker_key, parent, prefix_of


@contextlib.contextmanager
def _os_errors(path: str) -> Iterator[None]:
    """Shuttle errors as the ``OSError`` subclasses fsspec's callers catch."""
    try:
        yield
    except ShuttleError as exc:
        raise os_error(exc, path) from exc


class ShuttleFileSystem(AbstractFileSystem):  # type: ignore[misc]
    """A Shuttle cluster as an fsspec filesystem (protocol ``shuttle``)."""

    protocol = "shuttle"
    root_marker = ""

    def __init__(
        self,
        *,
        node: str | None = None,
        cluster: str | None = None,
        key_file: str | None = None,
        link: str | None = None,
        validation: str | None = None,
        lookaside: bool | None = None,
        client: Client | None = None,
        **storage_options: Any,
    ) -> None:
        super().__init__(**storage_options)
        if client is None:
            options: dict[str, Any] = {}
            if validation is not None:
                options["validation"] = validation
            if lookaside is not None:  # None: as $SHUTTLE_LOOKASIDE says
                options["lookaside"] = StoreSet() if lookaside else None
            client = connect(node=node, cluster=cluster, link=link, key_file=key_file, **options)
        self.client = client
        self.validation = validation
        self.tree = KeyTree(client, validation)

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        text = str(super()._strip_protocol(path))
        return text.strip("/")

    # --- attributes and listing ------------------------------------------------------------

    def _file_entry(self, info: ObjectInfo) -> dict[str, Any]:
        return {
            "name": info.key,
            "size": info.size,
            "type": "file",
            "mtime": info.mtime_ns / 1e9,
            "version": info.version,
            "blake3": info.hash.hex(),
        }

    @staticmethod
    def _dir_entry(key: str) -> dict[str, Any]:
        return {"name": key, "size": 0, "type": "directory"}

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        key = self._strip_protocol(path)
        with _os_errors(path):
            if key and not is_marker(key):
                with contextlib.suppress(NotFoundError):
                    return self._file_entry(self.client.stat(key))
            if self.tree.is_dir(key):
                return self._dir_entry(key)
        raise FileNotFoundError(path)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        key = self._strip_protocol(path)
        with _os_errors(path):
            try:
                listing = self.tree.listdir(key)
            except NotFoundError:
                entries = [self.info(key)]  # a file lists as itself
            else:
                prefix = prefix_of(key)
                entries = [self._dir_entry(prefix + d) for d in listing.dirs]
                entries += [self._file_entry(info) for info in listing.files.values()]
                entries.sort(key=lambda e: e["name"])
        return entries if detail else [e["name"] for e in entries]

    def modified(self, path: str) -> datetime:
        info = self.info(path)
        if info["type"] != "file":
            raise IsADirectoryError(path)
        return datetime.fromtimestamp(info["mtime"], UTC)

    def checksum(self, path: str) -> int:
        return int(self.info(path)["blake3"][:16], 16)

    # --- directories ----------------------------------------------------------------------

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        key = self._strip_protocol(path)
        with _os_errors(path):
            if not create_parents and parent(key) and not self.tree.is_dir(parent(key)):
                raise FileNotFoundError(f"parent of {path} does not exist")
            self.tree.mkdir(key)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        key = self._strip_protocol(path)
        with _os_errors(path):
            if self.tree.is_dir(key):
                if not exist_ok:
                    raise FileExistsError(path)
                return
            self.tree.mkdir(key)

    def rmdir(self, path: str) -> None:
        key = self._strip_protocol(path)
        with _os_errors(path):
            self.tree.rmdir(key)

    # --- files ------------------------------------------------------------------------------

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        key = self._strip_protocol(path)
        with _os_errors(path), self._reader(key) as reader:
            size = reader.info.size
            lo = 0 if start is None else (start if start >= 0 else max(0, size + start))
            hi = size if end is None else (end if end >= 0 else max(0, size + end))
            reader.seek(lo)
            return reader.read(max(0, min(hi, size) - lo))

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        key = self._strip_protocol(path)
        with _os_errors(path):
            if mode == "create":
                if self.client.exists(key):
                    raise FileExistsError(path)
                self.client.check_new_key(key)
                self.client.put(key, value, expected_version=0)
            else:
                self.client.check_new_key(key)
                self.client.put(key, value)

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        src, dst = self._strip_protocol(path1), self._strip_protocol(path2)
        with _os_errors(path1):
            if self.client.exists(src):
                self.client.check_new_key(dst)
                self.tree.copy(src, dst)
            elif self.tree.is_dir(src):
                self.makedirs(dst, exist_ok=True)
            else:
                raise FileNotFoundError(path1)

    def rm_file(self, path: str) -> None:
        key = self._strip_protocol(path)
        with _os_errors(path):
            if is_marker(key) or not key:
                raise InvalidArgumentError(f"{path!r} is not a file")
            try:
                self.client.remove(key)
            except NotFoundError:
                if not self.tree.is_dir(key):
                    raise
                self.tree.rmdir(key)  # a directory among the paths rm expanded

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> None:
        """Remove files (and with ``recursive``, directories with all they hold); one
        round trip per node for all the keys."""
        paths = path if isinstance(path, builtins.list) else [path]
        keys: builtins.list[str] = []
        for expanded in self.expand_path(paths, recursive=recursive, maxdepth=maxdepth):
            key = self._strip_protocol(expanded)
            if recursive and self.tree.is_dir(key):
                keys.append(marker_key(key))
            elif not self.isfile(key):
                raise IsADirectoryError(f"{expanded} is a directory; pass recursive=True")
            else:
                keys.append(key)
        with _os_errors(str(path)):
            self.client.remove_many(keys)

    def _reader(self, key: str) -> RemoteReader:
        """A reader of ``key`` whose open is confirmed (a speculative open's check is
        waited for: fsspec's callers cannot re-run on fresh data)."""
        for _ in range(STALE_RETRIES_MAX):
            reader = open_reader(self.client, key, self.validation)
            try:
                reader.checkpoint()
            except StaleDataError:
                reader.close()
                continue
            return reader
        raise StaleDataError(
            f"{key!r} changed under {STALE_RETRIES_MAX} opens in a row; retry when writers pause"
        )

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: int | None = None,
        autocommit: bool = True,
        cache_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> ShuttleFile:
        key = self._strip_protocol(path)
        with _os_errors(path):
            if mode == "xb" and self.client.exists(key):
                raise FileExistsError(path)
            reader = self._reader(key) if mode == "rb" else None
        return ShuttleFile(
            self,
            key,
            mode,
            block_size=block_size,
            autocommit=autocommit,
            cache_options=cache_options,
            reader=reader,
            **kwargs,
        )


class ShuttleFile(AbstractBufferedFile):  # type: ignore[misc]
    """One open object: reads through the client cache (validated once, at open);
    writes stream to an upload made visible at close."""

    def __init__(
        self,
        fs: ShuttleFileSystem,
        path: str,
        mode: str = "rb",
        *,
        reader: RemoteReader | None = None,
        **kwargs: Any,
    ) -> None:
        self.reader = reader
        self.writer: RemoteWriter | None = None
        if reader is not None:
            kwargs["size"] = reader.info.size
        super().__init__(fs, path, mode, **kwargs)

    def _fetch_range(self, start: int, end: int) -> bytes:
        assert self.reader is not None
        with _os_errors(self.path):
            self.reader.seek(start)
            return self.reader.read(max(0, end - start))

    def _initiate_upload(self) -> None:
        client = self.fs.client
        with _os_errors(self.path):
            client.check_new_key(self.path)
            writer = client.open(self.path, "wb")
            assert isinstance(writer, RemoteWriter)
            self.writer = writer
            if self.mode == "ab":
                with contextlib.suppress(NotFoundError):
                    for piece in client.iter_read(self.path):
                        writer.write(piece)

    def _upload_chunk(self, final: bool = False) -> bool:
        assert self.writer is not None
        with _os_errors(self.path):
            self.writer.write(self.buffer.getvalue())
            if final:
                self.writer.close()
        return True

    def discard(self) -> None:
        if self.writer is not None:
            self.writer.abort()

    def close(self) -> None:
        if self.mode != "rb" and not self.closed and _unwinding_openfile():
            self._abort()
            return
        super().close()
        if self.reader is not None:
            close_reader(self.reader)

    def _abort(self) -> None:
        """End a write without committing it: the old object stays (or none appears)."""
        if self.writer is not None:
            self.writer.abort()
        self.closed = True

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        if exc_type is not None and self.mode != "rb" and not getattr(self, "closed", True):
            self._abort()
            return
        self.close()


#: How far up the stack :func:`_unwinding_openfile` looks for ``OpenFile.__exit__``:
#: past the text and compression wrappers' ``close`` and ``OpenFile.close``.
_OPENFILE_FRAMES_MAX = 12


def _unwinding_openfile() -> bool:
    """True when this close comes from leaving ``with fsspec.open(...) as f`` on an
    exception. fsspec's ``OpenFile.__exit__`` calls a plain ``close()`` whatever
    happened, which would commit the partial data; the exception being handled and
    that frame on the stack are the only trace of it that reaches the file."""
    if sys.exc_info()[1] is None:
        return False
    frame: FrameType | None = sys._getframe(1)
    for _ in range(_OPENFILE_FRAMES_MAX):
        if frame is None:
            return False
        if frame.f_code is _OPENFILE_EXIT:
            return True
        frame = frame.f_back
    return False


_OPENFILE_EXIT = OpenFile.__exit__.__code__
