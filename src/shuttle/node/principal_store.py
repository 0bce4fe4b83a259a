"""Where a node keeps its principals, and the operations that change them.

A node stores its :class:`~shuttle.net.principals.PrincipalTable` durably (it holds
names, caps and salts, no secret: keys are derived from the cluster key):

* a node on local files in ``DATA/.shuttle/principals.json`` (written to a temporary
  file, fsync'd, renamed over the old one, the directory fsync'd: a crash leaves the
  old table or the new one);
* a node on a RADOS pool in the pool, as the object ``.shuttle/principals`` (an
  invalid key, so no Shuttle object clashes with it), changed by a compare-and-set on
  its RADOS version: every gateway of the pool shares one table, and each reloads it
  every :data:`RADOS_REFRESH_S` in case a change reached another gateway only.

Operations (cluster operations: the cluster key's holder or an ``admin`` principal):

* ``principals.get``: the table (``{table, digest}``);
* ``principals.put``: install a table of a later epoch, if the node's is still at
  ``expected_epoch`` (else ``version_mismatch``); a table the node already has (the
  same epoch and digest: another gateway of the pool stored it) is taken as done.
  Connections of principals the new table removed are closed at once;
* ``principal.key``: principal ``name``'s key, wrapped for the caller
  (:func:`~shuttle.net.principals.wrap_key`): what ``shuttle cluster user add`` writes
  to the new principal's key file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final, Protocol

from shuttle.errors import (
    ConfigError,
    InvalidArgumentError,
    NotFoundError,
    StorageIOError,
    VersionMismatchError,
)
from shuttle.net.principals import PrincipalBook, PrincipalTable, wrap_key
from shuttle.net.registry import Mode, OperationRegistry, arg, principal_of

log = logging.getLogger("shuttle.node")

#: The file of a local node's table, under its data directory.
TABLE_FILE: Final = Path(".shuttle") / "principals.json"
#: The RADOS object of a pool's table (an invalid key, as ``.shuttle/watch`` is).
TABLE_OBJECT: Final = ".shuttle/principals"
#: Bytes a stored table may take (10,000 principals of a few prefixes fit).
TABLE_BYTES_MAX: Final = 16 << 20
#: How often a RADOS node reloads the pool's table: a change made through another
#: gateway (or one the CLI could not tell this node of) applies here within this time.
RADOS_REFRESH_S: Final = 5.0


class TableBackend(Protocol):
    """Where a node's table lives."""

    #: Where it lives, for messages.
    where: str

    def load(self) -> PrincipalTable:
        """The stored table (an empty one at epoch 0 if none was stored)."""
        ...

    def save(self, table: PrincipalTable) -> None:
        """Store ``table`` in place of the one :meth:`load` last returned, unless that
        one changed meanwhile (:class:`VersionMismatchError`)."""
        ...


class FileBackend:
    """The table in a file of a node's data directory (one process writes it)."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / TABLE_FILE
        self.where = str(self.path)

    def load(self) -> PrincipalTable:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return PrincipalTable()
        except OSError as exc:
            raise ConfigError(
                f"cannot read the node's principals {self.path} ({exc.strerror or exc})"
            ) from None
        return PrincipalTable.decode(data, self.where)

    def save(self, table: PrincipalTable) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW
        try:
            fd = os.open(tmp, flags, 0o600)
            try:
                os.write(fd, table.encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            dir_fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise StorageIOError(
                f"cannot store the node's principals in {self.path} ({exc.strerror or exc}); "
                "nothing was changed"
            ) from exc


class RadosBackend:
    """The table as one object of a RADOS pool, shared by the pool's gateways."""

    def __init__(self, store: Any) -> None:
        from shuttle.store.rados import RadosStore

        assert isinstance(store, RadosStore)
        self._conn = store.conn
        self.where = f"RADOS object {TABLE_OBJECT} of pool {store.conn.pool}"
        #: The RADOS version of what load() read (None: there was no object).
        self._version: int | None = None

    def load(self) -> PrincipalTable:
        rados = self._conn.rados
        io = self._conn.ioctx()
        try:
            for _attempt in range(3):
                size, _mtime = io.stat(TABLE_OBJECT)
                if size > TABLE_BYTES_MAX:
                    raise StorageIOError(
                        f"the principals ({self.where}) take {size} bytes, over the "
                        f"{TABLE_BYTES_MAX} a table may: was the object written by hand?"
                    )
                # One byte more than its size: more arriving means it grew meanwhile.
                data = bytes(io.read(TABLE_OBJECT, size + 1, 0))
                self._version = int(io.get_last_version())
                if len(data) <= size:
                    break
        except rados.ObjectNotFound:
            self._version = None
            return PrincipalTable()
        except rados.Error as exc:
            raise StorageIOError(f"cannot read the principals ({self.where}): {exc}") from exc
        return PrincipalTable.decode(data, self.where)

    def save(self, table: PrincipalTable) -> None:
        from shuttle.store.rados_conn import VERSION_ERRNOS, error_errno

        rados = self._conn.rados
        io = self._conn.ioctx()
        with rados.WriteOpCtx() as op:
            if self._version is None:
                op.new(rados.LIBRADOS_CREATE_EXCLUSIVE)
            else:
                op.assert_version(self._version)
            op.write_full(table.encode())
            try:
                io.operate_write_op(op, TABLE_OBJECT)
            except rados.Error as exc:
                if error_errno(exc) in VERSION_ERRNOS:
                    raise VersionMismatchError(
                        f"the principals changed in the pool meanwhile ({self.where}); "
                        "nothing was changed: run the command again"
                    ) from exc
                raise StorageIOError(f"cannot store the principals ({self.where}): {exc}") from exc
        self._version = int(io.get_last_version())


def backend_for(store: Any, data_dir: Path, rados: bool) -> TableBackend:
    return RadosBackend(store) if rados else FileBackend(data_dir)


class PrincipalStore:
    """A node's book and where it is stored, with the changes made one at a time."""

    def __init__(self, book: PrincipalBook, backend: TableBackend) -> None:
        self.book = book
        self.backend = backend
        self._lock = threading.Lock()

    def load(self) -> PrincipalTable:
        """Read the stored table (at start and on refresh; blocking)."""
        with self._lock:
            return self.backend.load()

    def put(self, table: PrincipalTable, expected_epoch: int) -> PrincipalTable:
        """Store ``table`` if the stored one is at ``expected_epoch`` (blocking);
        returns it (to install in the book on the event loop)."""
        with self._lock:
            current = self.backend.load()  # a pool's table may have moved on meanwhile
            if current.epoch == table.epoch and current.digest() == table.digest():
                return current  # stored already (through another gateway of the pool)
            if current.epoch != expected_epoch:
                raise VersionMismatchError(
                    f"the principals changed meanwhile: {self.backend.where} is at epoch "
                    f"{current.epoch}, not {expected_epoch}; nothing was changed: run the "
                    "command again"
                )
            if table.epoch <= current.epoch:
                raise InvalidArgumentError(
                    f"a new principal table must have an epoch over {current.epoch}, "
                    f"got {table.epoch}"
                )
            self.backend.save(table)
            return table


def register_principal_ops(
    registry: OperationRegistry,
    principals: PrincipalStore,
    cluster_key: bytes,
    *,
    after_install: Callable[[PrincipalTable], Awaitable[None]] | None = None,
) -> None:
    """Add ``principals.get``, ``principals.put`` and ``principal.key`` (cluster
    operations, see the module docstring) to ``registry``. ``after_install``: awaited
    after a new table is installed, before ``principals.put`` answers (a node with
    workers: until every worker installed it too)."""
    book = principals.book

    def get(args: dict[str, Any], payload: bytes) -> Any:
        """The node's principal table: ``{table, digest}``."""
        table = book.table
        return {"table": table.to_wire(), "digest": table.digest()}

    async def put(args: dict[str, Any], payload: bytes) -> Any:
        """Install a principal table of a later epoch (see the module docstring)."""
        try:
            table = PrincipalTable.from_wire(args.get("table"), "principals.put")
        except ConfigError as exc:
            raise InvalidArgumentError(str(exc)) from None
        expected = arg(args, "expected_epoch", int)
        loop = asyncio.get_running_loop()
        stored = await loop.run_in_executor(None, principals.put, table, expected)
        if stored.digest() != book.table.digest():
            book.replace(stored)  # on the loop: it closes connections of removed ones
            log.info("principals: epoch %d (%d principals)", stored.epoch, len(stored.names()))
            if after_install is not None:
                await after_install(stored)
        return {"epoch": stored.epoch, "digest": stored.digest()}

    def key(args: dict[str, Any], payload: bytes) -> Any:
        """Principal ``name``'s key, wrapped under the caller's own key."""
        name = arg(args, "name", str)
        found = book.get(name)
        if found is None:
            raise NotFoundError(f"no principal {name!r} on this node")
        caller = principal_of(args)
        wrapping = cluster_key if caller is None else book.key_for(caller)
        return wrap_key(wrapping, name, book.key_for(found))

    registry.add("principals.get", get)
    registry.add("principals.put", put, Mode.ASYNC)
    registry.add("principal.key", key, wants_principal=True)


async def refresh_forever(principals: PrincipalStore) -> None:
    """Reload a shared (RADOS) table now and then, and install it if it changed."""
    loop = asyncio.get_running_loop()
    book = principals.book
    while True:
        await asyncio.sleep(RADOS_REFRESH_S)
        try:
            table = await loop.run_in_executor(None, principals.load)
        except Exception as exc:  # a slow or failing pool: keep the table we have
            log.warning(
                "principals: could not reload (%s); keeping epoch %d", exc, book.table.epoch
            )
            continue
        if table.epoch > book.table.epoch or (
            table.epoch == book.table.epoch and table.digest() != book.table.digest()
        ):
            book.replace(table)
            log.info("principals: epoch %d from the pool", table.epoch)
