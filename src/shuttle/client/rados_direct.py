"""A client that reads a RADOS node's misses from the OSD itself, with the user's own
Ceph credentials (docs/ceph.md, "A client that reads a miss from the OSD itself").

Opt-in (``Client(..., rados_direct=CephOptions(conf, keyring, user))``, the same on
``AsyncClient``, ``shuttle cat --rados-direct``), off by default: Shuttle hands out
no Ceph keys. A small range read (one piece) asks the node with ``direct: true``.
The node checks the principal's caps first, as for every read, and answers a hit with
its bytes, as always; a miss of a key whose version it trusts and whose blocks its
cache would not keep, it answers with where the bytes are instead of reading them:
``{"rados": {"pool", "namespace", "object", "version"}}`` (docs/protocol.md). The
client then reads the object itself, with one librados read that reports the version
of the bytes it returned (``get_last_version`` after a blocking read on this thread's
I/O context), and checks it as the node's own miss does (``LoopReads._answer``):

* the version named → the bytes are answered;
* a newer one (a change written meanwhile) → the caller's ``expected_version``, if it
  gave one, is checked against the version RADOS reported
  (:class:`VersionMismatchError` naming it), else the bytes are answered: they are of
  one version, the current one when RADOS read them;
* an older one, or any librados error (EPERM from a cephx user without the caps,
  ENOENT, a timeout, no connection) → the read is sent to the node again without
  ``direct``, which answers it its usual way and words any error as it does.

So a read never returns bytes of a version other than the one it names, exactly as
through the node.

**By the node's read lane.** A ``direct`` read goes both ways by the read lane
(:mod:`shuttle.wire.readlane` carries the flag): the node answers a hit from its cache
as it answers any, and names a miss without its general path; so every small read asks
with ``direct``, and the node names the object as soon as it would not keep its blocks.

**Skipping the node's hop.** A key the node named (its pages do not fit the node's
cache) is remembered for ``remember_s`` (default :data:`REMEMBER_S_DEFAULT`), and its
small reads (up to :data:`DIRECT_BYTES_MAX`) are read from RADOS at once meanwhile,
with the same checks against the version the node named: no coherence is lost (a
RADOS read is of the current version); what is lost is only the node's hits for that
key until it is forgotten (with a working set larger than the node's cache, the
share of it the cache holds). A remembered key skips the node's cap check too: a
client with Ceph credentials reads what Ceph lets it read whatever Shuttle's caps say
(docs/security.md, "Clients that read RADOS themselves").

Counters (:meth:`DirectReads.stats`): ``direct`` (reads answered with bytes librados
read), ``remembered`` (of those, reads that skipped the node), ``node_bytes`` (direct
reads the node answered with bytes: hits, untrusted keys, misses it caches),
``fallbacks`` (by reason: the librados error's name, ``older``, ``connect``).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from threading import get_ident
from time import monotonic
from typing import Any

from shuttle.client.connections import NodeConnection
from shuttle.cluster.cephclient import connect as ceph_connect
from shuttle.cluster.cephclient import import_rados
from shuttle.errors import ConfigError, ShuttleError, VersionMismatchError
from shuttle.net.blocking import BlockingConnection
from shuttle.wire import Response

log = logging.getLogger(__name__)

#: How long a key the node named is read from RADOS without asking the node again.
#: Short: a key whose pages the node would now answer from its cache (another client's read
#: filled it) is missed for at most this long.
REMEMBER_S_DEFAULT = 1.0
#: At most this many remembered keys (the oldest go first): a key, a float and a
#: location each, about 300 bytes.
REMEMBERED_MAX = 4096
#: The largest read a node names (``node/handlers.py``'s ``INLINE_READ_BYTES_MAX``):
#: larger reads of a remembered key go through the node, as it would answer them.
DIRECT_BYTES_MAX = 64 << 10
#: After a failed connection to Ceph, every read goes through the node for this long
#: before the client tries again (a connection attempt waits up to its timeout).
RECONNECT_AFTER_S = 10.0
#: The client's bounds on librados's waits: connecting, and each OSD or mon operation
#: (an OSD that does not answer costs a read this long before it falls back).
CONNECT_TIMEOUT_S = 10.0
OP_TIMEOUT_S_DEFAULT = 10


@dataclass(frozen=True)
class CephOptions:
    """The user's own way into Ceph: a ceph.conf naming the monitors, the keyring with
    ``user``'s key (None: the one the conf names), and the cephx user (best one that
    may only read the pool's namespace: ``osd 'allow r pool=POOL namespace=NS'``)."""

    conf_path: Path
    keyring_path: Path | None = None
    user: str = "client.admin"
    #: Seconds before a librados read fails (and the read goes through the node).
    op_timeout_s: int = OP_TIMEOUT_S_DEFAULT
    #: Seconds a key the node named is read from RADOS without asking the node.
    remember_s: float = REMEMBER_S_DEFAULT

    def __post_init__(self) -> None:
        for what, path in (("--ceph-conf", self.conf_path), ("--ceph-keyring", self.keyring_path)):
            if path is not None and not Path(path).is_file():
                raise ConfigError(
                    f"{what} {path} is not a readable file; give the ceph.conf and keyring "
                    "a `rados` client of the cluster uses"
                )
        if not self.user.startswith("client.") or self.user == "client.":
            raise ConfigError(
                f"--ceph-user {self.user!r}: a cephx client name is client.NAME "
                "(client.admin, client.reader)"
            )
        if self.op_timeout_s < 1:
            raise ConfigError(f"the Ceph op timeout must be ≥ 1 s, got {self.op_timeout_s}")
        if self.remember_s < 0:
            raise ConfigError(f"remember_s must be ≥ 0 (0: never), got {self.remember_s}")


@dataclass(frozen=True, slots=True)
class Location:
    """Where a node said a key's bytes are: RADOS object ``object`` of ``pool``
    (``namespace``), at ``version`` at least."""

    pool: str
    namespace: str
    object: str
    version: int


def location_of(result: Any) -> Location | None:
    """The location in a ``direct`` read's answer, or None (the answer has the bytes)."""
    if type(result) is not dict:
        return None
    where = result.get("rados")
    if type(where) is not dict:
        return None
    pool, ns, obj, version = [where.get(f) for f in ("pool", "namespace", "object", "version")]
    if type(pool) is str and type(ns) is str and type(obj) is str and type(version) is int:
        return Location(pool, ns, obj, version)
    return None


def _read_args(key: str, offset: int, length: int, expected: int | None) -> dict[str, Any]:
    """A plain ``read``'s arguments (``expected_version`` only when given)."""
    args: dict[str, Any] = {"key": key, "offset": offset, "length": length}
    if expected is not None:
        args["expected_version"] = expected
    return args


def _plain(conn: NodeConnection, key: str, offset: int, length: int, expected: int | None) -> bytes:
    """The read through the node without ``direct`` (by its read lane when it can)."""
    if type(conn) is BlockingConnection:
        return conn.read(key, offset, length, expected)
    return bytes(conn.call("read", _read_args(key, offset, length, expected)).payload)


def _ask(
    conn: NodeConnection, key: str, offset: int, length: int, expected: int | None
) -> bytes | Response:
    """The read through the node with ``direct: true``: the bytes the read lane brought
    back, or the node's Response (where the bytes are, or the bytes)."""
    if type(conn) is BlockingConnection:
        return conn.read_direct(key, offset, length, expected)
    return conn.call("read", {**_read_args(key, offset, length, expected), "direct": True})


def _errno_name(exc: Exception) -> str:
    code = getattr(exc, "errno", None)
    if isinstance(code, int):
        return errno.errorcode.get(abs(code), f"errno {code}")
    return type(exc).__name__


class DirectReads:
    """A client's reads of RADOS node misses from RADOS itself (see the module). Shared
    by the client's threads: one librados client, an I/O context per thread and pool."""

    def __init__(self, options: CephOptions) -> None:
        self.options = options
        self.rados = import_rados()  # no binding: ConfigError now, not at the first read
        self._cluster: Any = None
        self._lock = threading.Lock()
        #: Each thread's I/O contexts by pool and namespace, by thread id: a thread
        #: uses only its own (``get_last_version`` is its context's last operation's);
        #: one that ended leaves them to the next thread given its id. (Not a
        #: ``threading.local`` subclass: mypyc cannot compile one. Two string-keyed
        #: levels, not a ``(pool, namespace)`` key: no tuple made and hashed a read.)
        self._by_thread: dict[int, dict[str, dict[str, Any]]] = {}
        #: Every thread's I/O contexts, closed before librados shuts down.
        self._ctxs: list[Any] = []
        self._failed_until = 0.0
        self._remembered: OrderedDict[str, tuple[Location, float]] = OrderedDict()
        self.direct = 0
        self.remembered = 0
        self.node_bytes = 0
        self.fallbacks: defaultdict[str, int] = defaultdict(int)

    # --- the read --------------------------------------------------------------------

    def read(
        self,
        conn: NodeConnection,
        key: str,
        offset: int,
        length: int,
        expected_version: int | None = None,
    ) -> bytes:
        """Bytes ``[offset, offset+length)`` of ``key``: from RADOS where the node (or a
        recent answer of it) names the object, else from the node (see the module)."""
        got = self.read_remembered(key, offset, length, expected_version)
        if got is not None:
            return got
        return self.ask(conn, key, offset, length, expected_version)

    def read_remembered(
        self, key: str, offset: int, length: int, expected_version: int | None = None
    ) -> bytes | None:
        """The read from RADOS if the node named ``key`` within ``remember_s`` (no
        connection needed: :class:`~shuttle.client.client.Client` tries this before it
        looks the key's node up); None: ask the node (:meth:`ask`). The hot path of a
        working set larger than the node's cache, kept short: one dict look-up without
        the lock (atomic under the GIL; the lock guards only changes), the clock, the
        librados read."""
        found = self._remembered.get(key)
        if found is None or length > DIRECT_BYTES_MAX:
            return None
        if monotonic() >= found[1]:
            self._forget(key)
            return None
        got = self.read_at(found[0], key, offset, length, expected_version)
        if got is None:
            self._forget(key)
            return None
        self.remembered += 1
        self.direct += 1
        return got

    def ask(
        self,
        conn: NodeConnection,
        key: str,
        offset: int,
        length: int,
        expected_version: int | None = None,
    ) -> bytes:
        """The read asked of the node on ``conn`` with ``direct: true``: its bytes, or
        those librados reads where it names the object (remembered for ``remember_s``)."""
        res = _ask(conn, key, offset, length, expected_version)
        if type(res) is bytes:  # by the read lane: the node's bytes
            self.node_bytes += 1
            return res
        where = location_of(res.result)  # type: ignore[union-attr]
        if where is None:
            self.node_bytes += 1
            return bytes(res.payload)  # type: ignore[union-attr]
        got = self.read_at(where, key, offset, length, expected_version)
        if got is not None:
            self.direct += 1
            self._remember(key, where)
            return got
        # The node answers it its usual way, and words any error as it does.
        return _plain(conn, key, offset, length, expected_version)

    async def read_async(
        self,
        call: Callable[[dict[str, Any]], Awaitable[Response]],
        key: str,
        offset: int,
        length: int,
        expected_version: int | None = None,
    ) -> bytes:
        """:meth:`read` for the asyncio client: ``call(args)`` sends a ``read`` with
        ``args`` to the key's node; the librados reads run in the loop's default
        executor (librados blocks)."""
        loop = asyncio.get_running_loop()
        where = self._recall(key) if length <= DIRECT_BYTES_MAX else None
        if where is not None:
            got = await loop.run_in_executor(
                None, self.read_at, where, key, offset, length, expected_version
            )
            if got is not None:
                self.remembered += 1
                self.direct += 1
                return got
            self._forget(key)
        args = _read_args(key, offset, length, expected_version)
        res = await call({**args, "direct": True})
        where = location_of(res.result)
        if where is None:
            self.node_bytes += 1
            return bytes(res.payload)
        got = await loop.run_in_executor(
            None, self.read_at, where, key, offset, length, expected_version
        )
        if got is not None:
            self.direct += 1
            self._remember(key, where)
            return got
        return bytes((await call(args)).payload)  # the node's usual way

    def read_at(
        self, where: Location, key: str, offset: int, length: int, expected: int | None
    ) -> bytes | None:
        """``length`` bytes at ``offset`` of the object at ``where``, at the version the
        node named or newer; None where the read must go through the node (a librados
        error, an older version than the node named: counted in ``fallbacks``). Raises
        :class:`VersionMismatchError` where the version is newer and not ``expected``.
        (The bytes alone: no tuple with the version made and taken apart a read.)"""
        ctxs = self._by_thread.get(get_ident())
        pool_ctxs = None if ctxs is None else ctxs.get(where.pool)
        io = None if pool_ctxs is None else pool_ctxs.get(where.namespace)
        if io is None:
            io = self._ioctx(where.pool, where.namespace)
            if io is None:
                self._fell_back("connect")
                return None
        try:
            data: bytes = io.read(where.object, length, offset)
            version = io.get_last_version()  # an int: this context's last operation's
        except self.rados.Error as exc:  # EPERM, ENOENT, a timeout: the node words it
            self._fell_back(_errno_name(exc))
            return None
        if version < where.version:
            # Older than the node's trusted version: another replica's view or a
            # re-created object; the node reads it its own way.
            self._fell_back("older")
            return None
        if expected is not None and version != expected:
            raise VersionMismatchError(
                f"{key!r} is at version {version}, but the caller expected version "
                f"{expected}. Stat it and retry with the current version."
            )
        return data

    def _fell_back(self, why: str) -> None:
        with self._lock:
            self.fallbacks[why] += 1

    # --- remembered keys -------------------------------------------------------------

    def _recall(self, key: str) -> Location | None:
        found = self._remembered.get(key)  # as in read_remembered: no lock
        if found is None:
            return None
        if monotonic() >= found[1]:
            self._forget(key)
            return None
        return found[0]

    def _remember(self, key: str, where: Location) -> None:
        if self.options.remember_s <= 0:
            return
        with self._lock:
            self._remembered[key] = (where, monotonic() + self.options.remember_s)
            self._remembered.move_to_end(key)
            while len(self._remembered) > REMEMBERED_MAX:
                self._remembered.popitem(last=False)

    def _forget(self, key: str) -> None:
        with self._lock:
            self._remembered.pop(key, None)

    # --- librados ----------------------------------------------------------------------

    def _ioctx(self, pool: str, namespace: str) -> Any:
        """This thread's I/O context on ``pool`` (``namespace``), or None: no
        connection to Ceph (it failed within :data:`RECONNECT_AFTER_S`). One per thread:
        ``get_last_version`` is the last operation's on that context."""
        ctxs = self._by_thread.setdefault(get_ident(), {})  # atomic under the GIL
        pool_ctxs = ctxs.setdefault(pool, {})
        ctx = pool_ctxs.get(namespace)
        if ctx is not None:
            return ctx
        cluster = self._connected()
        if cluster is None:
            return None
        try:
            ctx = cluster.open_ioctx(pool)
        except self.rados.Error as exc:  # no such pool, or no caps on it
            log.warning("direct RADOS reads of pool %s go through the node: %s", pool, exc)
            return None
        ctx.set_namespace(namespace)
        pool_ctxs[namespace] = ctx
        with self._lock:
            self._ctxs.append(ctx)
        return ctx

    def _connected(self) -> Any:
        with self._lock:
            if self._cluster is not None:
                return self._cluster
            if monotonic() < self._failed_until:
                return None
            o = self.options
            try:
                self._cluster = ceph_connect(
                    Path(o.conf_path),
                    None if o.keyring_path is None else Path(o.keyring_path),
                    user=o.user,
                    timeout_s=CONNECT_TIMEOUT_S,
                    op_timeout_s=o.op_timeout_s,
                )
            except ShuttleError as exc:
                self._failed_until = monotonic() + RECONNECT_AFTER_S
                log.warning("direct RADOS reads go through the node: %s", exc)
                return None
            return self._cluster

    def close(self) -> None:
        """Shut librados down (a later read connects again)."""
        with self._lock:
            cluster, self._cluster = self._cluster, None
            ctxs, self._ctxs = self._ctxs, []
            self._by_thread = {}
            self._remembered.clear()
        for ctx in ctxs:  # before the shutdown: a context freed after it is a use after free
            ctx.close()
        if cluster is not None:
            cluster.shutdown()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "direct": self.direct,
                "remembered": self.remembered,
                "node_bytes": self.node_bytes,
                "fallbacks": dict(self.fallbacks),
                "connected": self._cluster is not None,
            }
