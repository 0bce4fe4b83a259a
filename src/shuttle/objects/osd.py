"""``osdgrep``: ``grep`` run inside the OSD that holds the bytes, called from a node.

The third placement site (docs/ceph.md, "The OSD as a placement site"). The object
lives on a node next to a Ceph cluster and is anchored there (``migratable = False``:
only a process that reaches the Ceph cluster can call its OSDs); each :meth:`next`
sends one bounded ``cls_lua`` call (:class:`shuttle.runtime.osd.OsdSite`) to the OSD
holding ``oid`` and returns the matching lines of that slice in the ``grep`` object's
shape, ``[done, [[key, line number, line], ...]]``, so a console drains either object
with the same loop. Only fixed-string patterns run at the OSD
(:func:`shuttle.runtime.osd.literal_of`); a regular expression is refused at creation,
with the sites that can run it named.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any

from shuttle.errors import InvalidArgumentError
from shuttle.runtime.mobile import MobileObject, ObjectManager, builtin
from shuttle.runtime.osd import (
    OP_TIMEOUT_S_DEFAULT,
    SLICE_BYTES_DEFAULT,
    OsdSite,
    ScanCursor,
    literal_of,
)

#: Calls one ``next`` makes at most (each one slice): a batch the console prints.
SLICES_PER_NEXT = 4


class OsdManager(ObjectManager):
    """The node's ``osdgrep`` objects share one Ceph connection per pool (section 4.2's
    object manager): connecting costs about 100 ms, more than a whole search of a few
    MiB at the OSD, so a connection per object would decide the OSD site's time."""

    def __init__(self, cls: type[MobileObject], node_id: str) -> None:
        super().__init__(cls, node_id)
        self._lock = threading.Lock()
        self._pools: dict[tuple[str, str | None, str, str, str, float], Any] = {}
        self._exits = contextlib.ExitStack()

    def share(self, obj: MobileObject) -> None:
        obj._manager = self  # type: ignore[attr-defined]

    def ioctx(
        self,
        conf_path: str,
        keyring_path: str | None,
        pool: str,
        timeout_s: float,
        *,
        namespace: str = "",
        user: str = "client.admin",
    ) -> Any:
        """The shared ``Ioctx`` on ``pool`` and ``namespace`` (connected on first use)."""
        from shuttle.runtime.osd import open_pool

        key = (conf_path, keyring_path, pool, namespace, user, timeout_s)
        with self._lock:
            if key not in self._pools:
                keyring = Path(keyring_path) if keyring_path else None
                self._pools[key] = self._exits.enter_context(
                    open_pool(
                        Path(conf_path),
                        pool,
                        keyring_path=keyring,
                        user=user,
                        op_timeout_s=timeout_s,
                        namespace=namespace,
                    )
                )
            return self._pools[key]


@builtin("osdgrep")
class OsdGrepObject(MobileObject):
    """Search RADOS object ``oid`` of ``pool`` for the fixed string ``pattern``."""

    migratable = False
    manager_class = OsdManager
    # It reads RADOS with the node's Ceph credentials, past the storage object and its
    # checks, from a pool, conf and keyring its creator names: principals may not.
    principals_may_create = False
    _manager: OsdManager | None = None
    _site: OsdSite | None = None

    def __init__(
        self,
        pattern: str,
        conf_path: str,
        pool: str,
        oid: str,
        *,
        key: str = "",
        keyring_path: str | None = None,
        namespace: str = "",
        user: str = "client.admin",
        ignore_case: bool = False,
        slice_bytes: int = SLICE_BYTES_DEFAULT,
        op_timeout_s: float = OP_TIMEOUT_S_DEFAULT,
    ) -> None:
        literal = literal_of(pattern) if isinstance(pattern, str) else None
        if literal is None:
            raise InvalidArgumentError(
                f"osdgrep runs fixed strings only (Lua has no regular expressions), not "
                f"{pattern!r}; run a 'grep' object at the client or the node for it"
            )
        self.pattern = pattern
        self.conf_path = conf_path
        self.keyring_path = keyring_path
        self.pool = pool
        self.namespace = namespace
        self.user = user
        self.oid = oid
        self.key = key or oid
        self.ignore_case = ignore_case
        self.slice_bytes = slice_bytes
        self.op_timeout_s = op_timeout_s
        self.offset = 0
        self.lines_before = 0
        self.carry = b""
        self.done = False
        self.matches = 0
        self.calls = 0
        self.execute_s = 0.0
        self._site: OsdSite | None = None

    def _connect(self) -> OsdSite:
        if self._site is None:
            if self._manager is None:
                raise InvalidArgumentError("osdgrep objects are made by a run-time's manager")
            ioctx = self._manager.ioctx(
                self.conf_path,
                self.keyring_path,
                self.pool,
                self.op_timeout_s,
                namespace=self.namespace,
                user=self.user,
            )
            self._site = OsdSite(ioctx, slice_bytes=self.slice_bytes)
        return self._site

    def next(self) -> list[Any]:
        """``[done, matches]``: the matching lines of the next few slices."""
        site = self._connect()
        cursor = ScanCursor(self.offset, self.lines_before, self.carry, self.done)
        found: list[list[Any]] = []
        for _ in range(SLICES_PER_NEXT):
            if cursor.done:
                break
            _answer, lines = site.step(
                self.oid, self.pattern.encode(), cursor, ignore_case=self.ignore_case, collect=True
            )
            found += [[self.key, number, line] for number, line in lines]
        self.offset, self.lines_before, self.carry, self.done = (
            cursor.offset,
            cursor.lines_before,
            cursor.carry,
            cursor.done,
        )
        self.matches += len(found)
        self.calls = site.counters.calls
        self.execute_s = site.counters.execute_s
        return [cursor.done, found]

    def progress(self) -> dict[str, Any]:
        return {
            "scanned_bytes": self.offset,
            "matches": self.matches,
            "osd_calls": self.calls,
            "osd_execute_s": round(self.execute_s, 6),
        }

    def memory_bytes(self) -> int:
        return 2 * self.slice_bytes + len(self.carry)
