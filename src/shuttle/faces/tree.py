"""Directories over flat keys: what the FUSE mount and the fsspec filesystem both show.

Keys are flat strings with ``/`` between levels. A *directory* ``d`` exists when some
key starts with ``d/`` (an implicit directory, as in S3) or when its marker object
``d/.shuttle-dir`` exists (an explicit, possibly empty directory: what ``mkdir``
makes). Markers are empty objects, hidden from every listing of the faces. The root
(``""``) always exists.

Rename is copy then remove: objects are spread over the nodes by a hash of the key,
so a new name usually lives on another node and no node can move it in one step.
Each object appears at its new name whole (a put is atomic), but the rename as a
whole is not atomic: for a moment both names exist, and a crash in between leaves
both. A directory is renamed key by key.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

from shuttle.client.client import Client
from shuttle.client.files import RemoteReader
from shuttle.client.model import ObjectInfo
from shuttle.errors import (
    AlreadyExistsError,
    DirectoryNotEmptyError,
    InvalidArgumentError,
    NotFoundError,
)

log = logging.getLogger(__name__)

#: The marker object of an explicit directory (``d/.shuttle-dir``). Its name is
#: reserved in the faces: a file of that name is never listed.
DIR_MARKER = ".shuttle-dir"


def join(dir_key: str, name: str) -> str:
    """The key of ``name`` inside directory ``dir_key`` (``""`` is the root)."""
    return f"{dir_key}/{name}" if dir_key else name


def parent(key: str) -> str:
    """The directory that holds ``key`` (``""`` for a top-level key)."""
    return key.rpartition("/")[0]


def prefix_of(dir_key: str) -> str:
    """The listing prefix of everything inside ``dir_key``."""
    return f"{dir_key}/" if dir_key else ""


def marker_key(dir_key: str) -> str:
    return join(dir_key, DIR_MARKER)


def is_marker(key: str) -> bool:
    return key == DIR_MARKER or key.endswith("/" + DIR_MARKER)


@dataclass(frozen=True, slots=True)
class Listing:
    """What one directory holds: subdirectory names and files with their attributes."""

    dirs: list[str]
    files: dict[str, ObjectInfo]


class KeyTree:
    """The directory operations of the faces, over one :class:`Client`.

    "Is anything under this prefix?" asks every node (keys are spread by hash); the
    questions go out together, one thread per node, so the answer costs one round
    trip however many nodes there are.
    """

    def __init__(self, client: Client, validation: str | None = None) -> None:
        self.client = client
        #: Listings take their attributes through the face's validation mode, which may
        #: prepare the opens that follow (``callback``: a promise on every file).
        self.mode = client.validation_mode(validation)

    def close(self) -> None:
        """Stop the threads that ask the nodes (the client stays open)."""
        self.client.namespace.close()

    def _first_keys(self, prefix: str, limit: int) -> list[list[str]]:
        """Up to ``limit`` keys under ``prefix`` from each node, asked all at once."""
        return self.client.namespace.first_keys(prefix, limit)

    def listdir(self, dir_key: str) -> Listing:
        """The entries of ``dir_key``, with each file's attributes (one stat round trip
        per node, through the validation mode: under ``callback`` the files' promises
        come with it, so opening them costs no round trip). Raises NotFoundError if it
        is not a directory."""
        prefix = prefix_of(dir_key)
        listed = self.mode.listdir(prefix)
        if listed is not None:  # the listing and the attributes in one round trip
            prefixes, all_keys, all_infos = listed
            shown = [(k, i) for k, i in zip(all_keys, all_infos, strict=True) if not is_marker(k)]
            keys, infos = [k for k, _ in shown], [i for _, i in shown]
        else:
            prefixes, all_keys = self.client.listdir(prefix)
            keys = [k for k in all_keys if not is_marker(k)]
        dirs = [p[len(prefix) : -1] for p in prefixes]
        if not dirs and not all_keys and not self.is_dir(dir_key):
            raise NotFoundError(f"no directory {dir_key!r}: nothing is stored under it")
        if listed is None:
            infos = self.mode.stat_many(keys) if keys else []
        files = {
            k[len(prefix) :]: info for k, info in zip(keys, infos, strict=True) if info is not None
        }
        clashes = [d for d in dirs if d in files]
        if clashes:
            # Both an object and a directory (namespace.py: two nodes, no check): show
            # the object, as a lookup does, and say how to end it.
            log.warning(
                "%s is both an object and a directory (its keys are on different nodes); "
                "showing the object. Move it away (shuttle get, then rm) to see the directory.",
                ", ".join(repr(prefix + d) for d in clashes),
            )
            dirs = [d for d in dirs if d not in files]
        return Listing(dirs, files)

    def is_dir(self, dir_key: str) -> bool:
        """True if ``dir_key`` is the root or some key (or its marker) lies under it."""
        return dir_key == "" or self._first_key(prefix_of(dir_key)) is not None

    def is_empty(self, dir_key: str) -> bool:
        """True if nothing but the directory's own marker lies under ``dir_key``."""
        pages = self._first_keys(prefix_of(dir_key), 2)
        return all(_is_own_marker(k, dir_key) for keys in pages for k in keys)

    def _first_key(self, prefix: str) -> str | None:
        return next((keys[0] for keys in self._first_keys(prefix, 1) if keys), None)

    def keys_under(self, dir_key: str) -> Iterator[str]:
        """Every key under ``dir_key``, markers included, in order."""
        return self.client.list(prefix_of(dir_key))

    def mkdir(self, dir_key: str, *, exist_ok: bool = False) -> None:
        """Make ``dir_key`` an explicit directory (its marker); parents are implicit."""
        if dir_key == "" or self.is_dir(dir_key):
            if exist_ok:
                return
            raise AlreadyExistsError(f"directory {dir_key!r} already exists")
        if self.exists_file(dir_key):
            raise AlreadyExistsError(f"{dir_key!r} is a file; remove it to make a directory")
        self.client.check_new_key(marker_key(dir_key))  # no parent may be an object
        self.client.put(marker_key(dir_key), b"")

    def keep(self, dir_key: str) -> None:
        """Keep ``dir_key`` as an (empty) directory after its last entry went away."""
        if dir_key and self.is_empty(dir_key):
            self.client.put(marker_key(dir_key), b"")

    def rmdir(self, dir_key: str) -> None:
        """Remove the empty directory ``dir_key`` (its marker)."""
        if dir_key == "":
            raise InvalidArgumentError("the root directory cannot be removed")
        if not self.is_dir(dir_key):
            raise NotFoundError(f"no directory {dir_key!r}")
        if not self.is_empty(dir_key):
            raise DirectoryNotEmptyError(f"directory {dir_key!r} is not empty; remove its entries")
        self.client.remove_many([marker_key(dir_key)])

    def exists_file(self, key: str) -> bool:
        return key != "" and not is_marker(key) and self.client.exists(key)

    def copy(self, src: str, dst: str, *, keep_mtime: bool = False) -> ObjectInfo:
        """Copy the object ``src`` to ``dst`` (streamed; ``dst`` appears whole), with
        ``src``'s modification time if ``keep_mtime`` (as ``cp -p`` does)."""
        with self.client.open(src, "rb") as reader:
            assert isinstance(reader, RemoteReader)
            mtime_ns = reader.info.mtime_ns if keep_mtime else None
            return self.client.put(dst, reader, mtime_ns=mtime_ns)

    def rename_file(self, src: str, dst: str) -> None:
        """Copy ``src`` to ``dst`` (replacing it atomically, its mtime kept, as a
        rename keeps it), then remove ``src``."""
        if src == dst:
            return
        self.copy(src, dst, keep_mtime=True)
        self.client.remove(src)

    def rename_dir(self, src: str, dst: str) -> int:
        """Rename every key under ``src`` to the same place under ``dst``; returns how
        many. ``dst`` must not be ``src`` or inside it."""
        if dst == src or dst.startswith(prefix_of(src)):
            raise InvalidArgumentError(f"cannot move directory {src!r} into itself ({dst!r})")
        moved = 0
        old = prefix_of(src)
        for key in list(self.keys_under(src)):
            self.rename_file(key, prefix_of(dst) + key[len(old) :])
            moved += 1
        return moved


def _is_own_marker(key: str, dir_key: str) -> bool:
    return key == marker_key(dir_key)
