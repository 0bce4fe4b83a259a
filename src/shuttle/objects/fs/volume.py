"""The object-based file system as an application uses it: a *volume* of directories
and files over a cluster, each a stack of mobile objects.

    with Volume.connect("/tmp/shuttle/cluster.toml") as fs:
        fs.mkdir("/logs")
        fs.put("/logs/a.txt", b"hello\\n")
        fs.put("/logs/parity.bin", data, raid=True)    # striped with parity over 5 nodes
        print(fs.ls("/logs"), fs.cat("/logs/a.txt"))
        with fs.open("/logs/a.txt") as f:              # a file stack of its own
            f.write(0, b"HELLO")

Names live in directory objects (one per volume per application, over the nodes'
isolation objects); a file's entry names its data: one object on the node that
rendezvous hashing picks for its key (``plain``), or a RAID 5 set of columns over
several nodes (``raid5``). A file opened is a ``file`` object over a ``cache``
object, over a ``raid5`` object for a striped file (the cache then keeps its
callback promises at the file's home node, which the RAID object tells of every
write); all of them start at the client and, with ``placement="auto"``, the run-time
may move them.

Order of updates, so that a crash never leaves a name without its data: ``put``
writes the data first and then inserts the name; ``rm`` removes the name first and
then the data. A crash between the two leaves unnamed data (garbage), never a name
that points at nothing.

Every operation goes through the application's run-time, as the objects' own calls
do: names through the directory object, data through file stacks, and a removal
through the storage objects of the file's nodes and the isolation object of its home
(which calls back every cache of the file before ``rm`` returns). So the monitor sees
it, the principal's capabilities are checked on it at the node, and no cache keeps
serving a removed file.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shuttle.errors import InvalidArgumentError, NotFoundError
from shuttle.objects.fs.cache import BLOCK_BYTES_DEFAULT
from shuttle.objects.fs.raid_layout import column_key, record_key
from shuttle.rendezvous import ranked
from shuttle.runtime.client import Runtime
from shuttle.runtime.refs import Ref

#: Bytes per call when a whole file is written or read through its stack.
TRANSFER_BYTES = 1 << 20
#: Columns of a RAID 5 file (4 data + 1 parity, as ABACUS 6.2).
RAID_COLUMNS = 5
#: Stripe unit of a RAID 5 file (ABACUS 6.2: 32 KB).
RAID_UNIT_BYTES = 32 << 10


@dataclass(frozen=True)
class Entry:
    """One name in a directory."""

    name: str
    type: str
    key: str = ""
    layout: str = ""
    size: int | None = None

    @classmethod
    def from_wire(cls, name: str, raw: dict[str, Any]) -> Entry:
        return cls(
            name,
            str(raw.get("type", "?")),
            str(raw.get("key", "")),
            str(raw.get("layout", "")),
            raw.get("size"),
        )


class OpenFile:
    """A file's stack, open: byte-range reads and writes through its ``file`` object."""

    def __init__(self, volume: Volume, path: str, entry: dict[str, Any], refs: list[Ref]) -> None:
        self.volume = volume
        self.path = path
        self.entry = entry
        #: The stack, top first: the file object, the cache, and a RAID object if any.
        self.refs = refs

    @property
    def file(self) -> Ref:
        return self.refs[0]

    def read(self, offset: int, length: int) -> bytes:
        return bytes(self.file.read(offset, length))

    def write(self, offset: int, data: bytes) -> int:
        return int(self.file.write(offset, data))

    def size(self) -> int:
        return int(self.file.size())

    def read_all(self) -> bytes:
        out, offset = [], 0
        while True:
            piece = self.read(offset, TRANSFER_BYTES)
            out.append(piece)
            offset += len(piece)
            if len(piece) < TRANSFER_BYTES:
                return b"".join(out)

    def where(self) -> dict[str, str]:
        """Where each object of the stack runs now (rid: client or node id)."""
        rt = self.volume.rt
        return {str(r.rid): ("client" if rt.where(r) == rt.id else rt.where(r)) for r in self.refs}

    def close(self) -> None:
        for ref in self.refs:
            self.volume.rt.destroy(ref)
        self.refs = []

    def __enter__(self) -> OpenFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Volume:
    """A volume of the object-based file system, through one application's run-time."""

    def __init__(
        self,
        rt: Runtime,
        name: str = "default",
        *,
        placement: str = "auto",
        block_bytes: int = BLOCK_BYTES_DEFAULT,
        owns_runtime: bool = False,
    ) -> None:
        if not name or "/" in name or name.startswith("."):
            raise InvalidArgumentError(
                f"a volume name is one path component not starting with '.', got {name!r}"
            )
        self.rt = rt
        self.name = name
        self.placement = placement
        self.block_bytes = block_bytes
        self._owns_runtime = owns_runtime
        self._directory: Ref | None = None

    @classmethod
    def connect(
        cls,
        target: str | Path | None = None,
        *,
        node: str | None = None,
        cluster: str | Path | None = None,
        link: str | None = None,
        key_file: str | Path | None = None,
        volume: str = "default",
        placement: str = "auto",
        **runtime_options: Any,
    ) -> Volume:
        """A volume over a cluster file (or ``$SHUTTLE_CLUSTER``) or one node, with a
        run-time of its own (closed with the volume)."""
        rt = Runtime.connect(
            target, node=node, cluster=cluster, link=link, key_file=key_file, **runtime_options
        )
        return cls(rt, volume, placement=placement, owns_runtime=True)

    # --- the stacks ---------------------------------------------------------------------

    @property
    def directory(self) -> Ref:
        """This application's directory object for the volume (made on first use)."""
        if self._directory is None:
            self._directory = self.rt.create(
                "directory",
                placement=self.placement,
                isolations={
                    n.node_id: self.rt.service(n.node_id, "isolation") for n in self.rt.nodes
                },
                volume=self.name,
            )
        return self._directory

    def open(self, path: str) -> OpenFile:
        """The file at ``path`` as a stack of its own (close it, or use ``with``)."""
        entry = self._file_entry(path)
        return self._stack(path, entry)

    def _stack(self, path: str, entry: dict[str, Any]) -> OpenFile:
        """``file -> cache -> storage`` for a plain file, ``file -> cache -> raid5 ->
        storage`` for a striped one; the isolation object of the key's node keeps
        the cache's callback promises in both."""
        rt, key = self.rt, str(entry["key"])
        home = rt.service(self._home(entry), "isolation")
        made: list[Ref] = []  # bottom first
        try:
            raid: Ref | None = None
            if entry.get("layout") == "raid5":
                raid = rt.create(
                    "raid5",
                    placement=self.placement,
                    storages=[rt.storage(n) for n in entry["columns"]],
                    key=key,
                    unit_bytes=int(entry.get("unit_bytes", RAID_UNIT_BYTES)),
                    callbacks=home,
                )
                made.append(raid)
            cache = rt.create(
                "cache",
                placement=self.placement,
                isolation=home,
                key=key,
                block_bytes=int(entry.get("block_bytes", self.block_bytes)),
                data=raid,
            )
            made.append(cache)
            made.append(
                rt.create("file", placement=self.placement, backing=cache, key=key, layer="cache")
            )
        except BaseException:
            for ref in reversed(made):
                rt.destroy(ref)
            raise
        return OpenFile(self, path, entry, made[::-1])

    def _home(self, entry: dict[str, Any]) -> str:
        """The node whose isolation object keeps the promises of a file's caches. A
        striped file's entry names it, as it names its columns: a cluster that grows
        or shrinks must not give its caches two homes."""
        return str(entry.get("home") or self.rt.node_for(str(entry["key"])))

    def _file_entry(self, path: str) -> dict[str, Any]:
        entry = self.directory.lookup(path)
        if entry is None:
            raise NotFoundError(f"no such file: {path} (shuttle fs ls shows what there is)")
        if entry.get("type") != "file":
            raise InvalidArgumentError(f"{path} is a directory, not a file")
        return dict(entry)

    # --- the commands -------------------------------------------------------------------

    def mkdir(self, path: str) -> None:
        self.directory.mkdir(path)

    def ls(self, path: str = "/") -> list[Entry]:
        return [Entry.from_wire(name, raw) for name, raw in self.directory.listdir(path)]

    def stat(self, path: str) -> Entry:
        entry = self.directory.lookup(path)
        if entry is None:
            raise NotFoundError(f"no such file or directory: {path}")
        name = path.rstrip("/").rsplit("/", 1)[-1] or "/"
        if entry.get("type") == "file":
            with self._stack(path, dict(entry)) as f:
                return Entry.from_wire(name, {**entry, "size": f.size()})
        return Entry.from_wire(name, dict(entry))

    def put(self, path: str, data: bytes, *, raid: bool = False) -> Entry:
        """Make file ``path`` with ``data`` (the data first, then the name)."""
        if self.directory.lookup(path) is not None:
            raise InvalidArgumentError(f"{path} exists; remove it first (shuttle fs rm)")
        key = f"{self.name}/.files/{secrets.token_hex(8)}"
        entry: dict[str, Any] = {"type": "file", "key": key}
        if raid:
            nodes = [n.node_id for n in self.rt.nodes]
            if len(nodes) < 3:
                raise InvalidArgumentError(
                    f"a RAID 5 file needs at least 3 nodes; this cluster has {len(nodes)}"
                )
            entry |= {
                "layout": "raid5",
                "columns": _columns(nodes, key, RAID_COLUMNS),
                "unit_bytes": RAID_UNIT_BYTES,
                "home": self.rt.node_for(key),
            }
        else:
            entry |= {"layout": "plain", "block_bytes": self.block_bytes}
        with self._stack(path, entry) as f:
            for offset in range(0, len(data), TRANSFER_BYTES):
                f.write(offset, data[offset : offset + TRANSFER_BYTES])
        self.directory.create(path, entry)
        return Entry.from_wire(path.rsplit("/", 1)[-1], {**entry, "size": len(data)})

    def cat(self, path: str) -> bytes:
        with self.open(path) as f:
            return f.read_all()

    def rm(self, path: str) -> None:
        """Remove a file (the name first, then its data) or an empty directory."""
        entry = self.directory.lookup(path)
        if entry is None:
            raise NotFoundError(f"no such file or directory: {path}")
        self.directory.remove(path)
        if entry.get("type") == "file":
            self._remove_data(dict(entry))

    def _remove_data(self, entry: dict[str, Any]) -> None:
        """A file's data, once its name is gone: a striped file's columns (and their
        records) through each column node's storage object, then the file at its home's
        isolation object, which removes a plain file's object and calls back every
        cache of the file before it returns."""
        key = str(entry["key"])
        if entry.get("layout") == "raid5":
            for column, node_id in enumerate(entry["columns"]):
                keys = [column_key(key, column), record_key(key, column)]
                self.rt.storage(str(node_id)).remove_many(keys)
        self.rt.service(self._home(entry), "isolation").remove(key)

    def walk(self, path: str = "/") -> Iterator[tuple[str, Entry]]:
        for entry in self.ls(path):
            full = f"{path.rstrip('/')}/{entry.name}"
            yield full, entry
            if entry.type == "dir":
                yield from self.walk(full)

    # --- lifetime -----------------------------------------------------------------------

    def close(self) -> None:
        if self._directory is not None:
            try:
                self.rt.destroy(self._directory)
            finally:
                self._directory = None
        if self._owns_runtime:
            self.rt.close()

    def __enter__(self) -> Volume:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _columns(nodes: list[str], key: str, count: int) -> list[str]:
    """The nodes of a RAID file's columns: ``count`` of them (or every node, if
    fewer), in rendezvous order for the key (:mod:`shuttle.rendezvous`, the hash that
    places every key) so files spread over a larger cluster. The order is recorded in
    the file's entry and read from there, never recomputed: files made when this was
    another hash (blake2b over ``node/key``, before 2026-11-28) read as they were
    written (docs/objectfs.md, "Volumes")."""
    return ranked(nodes, key)[:count]
