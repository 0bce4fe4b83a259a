"""The synchronous client: a file API over the nodes of a cluster.

Usable without asyncio: every call blocks until its answer is in. Large objects
move as many 1 MiB range requests kept in flight on one connection (pipelining), so
a stream is limited by the link, not by round trips. Keys are spread over the
nodes by rendezvous hashing (:mod:`shuttle.client.routing`). One client may be shared
by threads: each thread gets its own connection to each node
(:mod:`shuttle.client.connections`). A streamed upload's session is
:mod:`shuttle.client.uploads`'s, a streamed download's :mod:`shuttle.client.downloads`'s.
"""

from __future__ import annotations

import builtins
import io
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

from shuttle.client import calls
from shuttle.client.cache import CLIENT_BLOCK_BYTES_DEFAULT, CLIENT_CACHE_BYTES_DEFAULT, ClientCache
from shuttle.client.calls import (
    PIECE_BYTES_DEFAULT as PIECE_BYTES_DEFAULT,
)
from shuttle.client.calls import (
    SINGLE_PUT_BYTES_MAX as SINGLE_PUT_BYTES_MAX,
)
from shuttle.client.calls import (
    WINDOW_DEFAULT as WINDOW_DEFAULT,
)
from shuttle.client.calls import Op, Pieces
from shuttle.client.connections import Dial, NodeConnection, ThreadConnections
from shuttle.client.downloads import download, write_to
from shuttle.client.integrity import check_written
from shuttle.client.lookaside import LookasideReader, LookasideStore, StoreSet
from shuttle.client.model import Chunk, NodeAddress, ObjectInfo, WriteInfo
from shuttle.client.namespace import Namespace
from shuttle.client.rados_direct import CephOptions, DirectReads
from shuttle.client.routing import node_for_key, node_named, positions_by_node
from shuttle.client.uploads import upload
from shuttle.client.validation import VALIDATION_DEFAULT, ValidationMode, make_mode
from shuttle.errors import InvalidArgumentError, NotFoundError
from shuttle.net.blocking import BlockingConnection
from shuttle.net.blocking_stream import CONNECT_TIMEOUT_S, REQUEST_TIMEOUT_S
from shuttle.net.memory import tune_allocator
from shuttle.net.shaping import Link
from shuttle.net.tls import ClientTls
from shuttle.wire import Response
from shuttle.wire.events import Payload

# The streaming defaults and the single-put limit are shared with the asyncio client
# (:mod:`shuttle.client.calls`); they are re-exported here, where users found them.

Progress = Callable[[int], None]
_T = TypeVar("_T")
Source = Pieces | str | Path


def _no_progress(_: int) -> None:
    pass


class Client:
    """A client of the nodes ``nodes`` (see :func:`shuttle.connect` to build one).

    ``key`` is the cluster key (:func:`shuttle.net.auth.load_key_file`), or with
    ``principal`` that principal's key (:func:`shuttle.net.auth.load_credentials`):
    nodes started with a cluster key refuse a client without either
    (:class:`AuthenticationError`), and check each request of a principal against its
    capabilities (:class:`NotPermittedError`).
    ``tls`` (:class:`~shuttle.net.tls.ClientTls`, the cluster's CA): every connection
    is TLS and checks the node's certificate; None: plain TCP.
    ``dial`` opens a connection to a node; by default a socket
    (:class:`BlockingConnection` with this client's timeouts, link and key), and
    :class:`shuttle.testing.MemoryNode` offers one without a socket.
    ``lookaside``: local stores to take missed chunks from before the node
    (``[LookasideStore.open(dir), ...]``, or a :class:`StoreSet` for the user's added
    stores; docs/lookaside.md); None: none.
    ``rados_direct``: the user's own Ceph credentials
    (:class:`~shuttle.client.rados_direct.CephOptions`): a small range read that misses
    a RADOS node's cache is read from the OSD itself, the node naming the object
    (:mod:`shuttle.client.rados_direct`; docs/ceph.md); None (the default): every read
    goes through the nodes.
    """

    def __init__(
        self,
        nodes: Sequence[NodeAddress],
        *,
        cache_bytes: int = CLIENT_CACHE_BYTES_DEFAULT,
        cache_block_bytes: int = CLIENT_BLOCK_BYTES_DEFAULT,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        client_name: str = "shuttle-client",
        piece_bytes: int = PIECE_BYTES_DEFAULT,
        window: int = WINDOW_DEFAULT,
        key: bytes | None = None,
        principal: str | None = None,
        dial: Dial | None = None,
        validation: str = VALIDATION_DEFAULT,
        lookaside: StoreSet | Sequence[LookasideStore] | None = None,
        tls: ClientTls | None = None,
        rados_direct: CephOptions | None = None,
    ) -> None:
        if not nodes:
            raise InvalidArgumentError("a client needs at least one node address")
        calls.check_tuning(piece_bytes, window)
        self.nodes = list(nodes)
        tune_allocator()  # streamed pieces land in fresh buffers: keep them off mmap
        self.cache = ClientCache(cache_bytes, cache_block_bytes)
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self.client_name = client_name
        self.piece_bytes = piece_bytes
        self.window = window
        #: The key this client proves it holds (None: it has none): the cluster key,
        #: or principal ``principal``'s.
        self.key = key
        self.principal = principal
        #: TLS to the nodes (the cluster's CA), or None for plain connections.
        self.tls = tls
        #: One emulated link per node, shared by all threads (they share its bandwidth).
        self._links = {
            n.node_id: Link(n.link)
            for n in self.nodes
            if n.link is not None and not n.link.is_unshaped
        }
        #: This process's connections to the nodes, one per thread and node.
        self._conns = ThreadConnections(dial or self._dial_socket)
        self._lock = threading.Lock()
        #: Validation modes by name, built on first use; ``validation`` is the default.
        self._modes: dict[str, ValidationMode] = {}
        self.validation = validation
        self.validation_mode(validation)  # a bad name fails here, not at the first open
        #: Questions about names that every node answers (built on first use).
        self._namespace: Namespace | None = None
        stores = lookaside.stores() if isinstance(lookaside, StoreSet) else list(lookaside or ())
        #: The miss path through lookaside stores (None: every miss goes to the node).
        self.lookaside = LookasideReader(self, stores) if stores else None
        #: Reads of RADOS node misses from RADOS itself (None: off, the default).
        self.rados_direct = DirectReads(rados_direct) if rados_direct is not None else None

    # --- connections -----------------------------------------------------------------

    def node_for(self, key: str) -> NodeAddress:
        """The node that holds ``key``."""
        nodes = self.nodes
        return nodes[0] if len(nodes) == 1 else node_for_key(nodes, key)

    def node(self, node_id: str) -> NodeAddress:
        """The node called ``node_id`` (or addressed ``host:port``)."""
        return node_named(self.nodes, node_id)

    def connection(self, node: NodeAddress) -> NodeConnection:
        """This thread's connection to ``node`` (opened on first use)."""
        return self._conns.get(node)

    def dial(self, node: NodeAddress) -> NodeConnection:
        """A new connection to ``node`` that the caller owns (and closes): for a
        conversation of its own, such as the callback mode's long poll."""
        return self._conns.dial(node)

    def _dial_socket(self, node: NodeAddress) -> NodeConnection:
        return BlockingConnection(
            node.host,
            node.port,
            client_name=self.client_name,
            connect_timeout_s=self.connect_timeout_s,
            request_timeout_s=self.request_timeout_s,
            link=self._links.get(node.node_id),
            key=self.key,
            principal=self.principal,
            tls=self.tls,
        )

    def drop_connection(self, node: NodeAddress) -> None:
        """Close this thread's connection to ``node`` (the next call dials a fresh one).

        After an interrupt (:func:`~shuttle.client.calls.interrupted`) a request may
        have been cut in the middle of its frame, and the connection can carry nothing
        more: a request sent on it would be read as the rest of that frame, and the
        node would wait for the remainder until its frame timeout. Closing it also ends
        what the node held for the connection (its upload sessions)."""
        self._conns.drop(node)

    def call(
        self,
        node: NodeAddress,
        op: str,
        args: dict[str, Any] | None = None,
        payload: Payload = b"",
        *,
        idempotent: bool = True,
    ) -> Response:
        """Make one request of ``node`` (the escape hatch for any registered operation)."""
        return self.connection(node).call(op, args, payload, idempotent=idempotent)

    def _send(self, op: Op, node: NodeAddress | None = None) -> Response:
        """Make the request ``op`` of ``node`` (by default the node of its key)."""
        node = node or self.node_for(op.key)
        return self.connection(node).call(op.op, op.args, op.payload, idempotent=op.idempotent)

    @property
    def namespace(self) -> Namespace:
        """The cluster-wide name questions (:mod:`shuttle.client.namespace`): asked of
        every node at once, on threads of their own."""
        with self._lock:
            if self._namespace is None:
                self._namespace = Namespace(self)
            return self._namespace

    def check_new_key(self, key: str) -> None:
        """Raise :class:`KeyConflictError` if ``key`` cannot be created without being
        both an object and a directory somewhere in the cluster (one round trip to
        every node; :mod:`shuttle.client.namespace`)."""
        self.namespace.check_new_key(key)

    def validation_mode(self, name: str | None = None) -> ValidationMode:
        """This client's validation mode ``name`` (its default if None)."""
        name = name or self.validation
        with self._lock:
            mode = self._modes.get(name)
        if mode is None:
            mode = make_mode(name, self)
            with self._lock:
                mode = self._modes.setdefault(name, mode)
        return mode

    def _modes_built(self) -> dict[str, ValidationMode]:
        """The validation modes built so far (a copy, to use outside the lock)."""
        with self._lock:
            return dict(self._modes)

    def forget(self, key: str) -> None:
        """This client changed or removed ``key``: drop what it cached of it."""
        self.cache.forget(key)
        for mode in self._modes_built().values():
            mode.forget(key)

    def close(self) -> None:
        """Close every connection (the client reconnects if used again)."""
        for mode in self._modes_built().values():
            mode.close()
        with self._lock:
            namespace, self._namespace = self._namespace, None
        if namespace is not None:
            namespace.close()
        self._conns.close()
        if self.rados_direct is not None:
            self.rados_direct.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- attributes --------------------------------------------------------------------

    @property
    def chunk_lists(self) -> bool:
        """Whether stats ask for chunk lists: only a client with lookaside stores looks
        chunks up. Without, attributes count the chunks (``chunks_total``) and
        :meth:`chunks` fetches the list when someone wants it."""
        return self.lookaside is not None

    def stat(self, key: str) -> ObjectInfo:
        """Attributes of ``key`` (size, version, mtime, content hash, chunks: listed only
        with :attr:`chunk_lists`, else counted; :meth:`chunks` lists them)."""
        return calls.object_info(self._send(calls.stat(key, self.chunk_lists)))

    def chunks(self, key: str) -> builtins.list[Chunk]:
        """The whole chunk list of ``key`` (paged from the node for very large objects).

        Raises ``VersionMismatchError`` if the object changes while it is being paged."""
        info = calls.object_info(self._send(calls.stat(key)))
        out = builtins.list(info.chunks)
        while len(out) < info.chunks_total:
            out += calls.chunks(self._send(calls.chunks_page(key, len(out), info.version)))
        return out

    def exists(self, key: str) -> bool:
        try:
            self.stat(key)
        except NotFoundError:
            return False
        return True

    def by_node(self, keys: Sequence[str]) -> dict[str, builtins.list[int]]:
        """The positions in ``keys`` of the keys each node holds, by node id (what a
        many-key call sends to each node, one round trip per node)."""
        return positions_by_node(keys, self.node_for)

    def stat_many(self, keys: Sequence[str]) -> list[ObjectInfo | None]:
        """Attributes of many keys (None where missing): one round trip per node."""
        out: list[ObjectInfo | None] = [None] * len(keys)
        for node_id, idxs in self.by_node(keys).items():
            mine = [keys[i] for i in idxs]
            res = self._send(calls.stat_many(mine, self.chunk_lists), self.node(node_id))
            for i, info in zip(idxs, calls.infos(res, mine), strict=True):
                out[i] = info
        return out

    # --- reading -------------------------------------------------------------------------

    def read(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        """Bytes ``[offset, offset+length)`` of ``key`` (to its end if ``length`` is None).

        One round trip for a range up to the piece size; larger ranges are streamed
        with pipelined requests against one version of the object.
        """
        if length is not None and length <= self.piece_bytes:
            direct = self.rados_direct
            if direct is not None:
                # A key a node named lately is read from RADOS here, before any node is
                # looked up or ranked (a GatewayClient's ranking, a blake3 hash a node
                # and two locks, cost such a read 6-10 µs: the README, issue 26 item 2),
                # and with no frame more. The one place this check is made.
                got = direct.read_remembered(key, offset, length)
                if got is not None:
                    return got
            return self._read_piece(key, offset, length)
        return b"".join(self.iter_read(key, offset, length))

    def _read_piece(
        self, key: str, offset: int, length: int, node: NodeAddress | None = None
    ) -> bytes:
        """One range read of at most a piece from ``node`` (by default the key's): a
        socket connection takes it by its read lane (``BlockingConnection.read``).
        (:meth:`read` has already read a key remembered for direct reads from RADOS.)"""
        direct = self.rados_direct
        if node is None:
            node = self.node_for(key)
        conn = self._conns.mine.conns.get(node.node_id)  # connection()'s lookup, one call fewer
        if conn is None:
            conn = self.connection(node)
        if direct is not None:
            return direct.ask(conn, key, offset, length)
        if type(conn) is BlockingConnection:
            return conn.read(key, offset, length)
        op = calls.read(key, offset, length)
        return bytes(conn.call(op.op, op.args, op.payload, idempotent=op.idempotent).payload)

    def get(self, key: str) -> bytes:
        """The whole object ``key`` as bytes."""
        return self.read(key)

    def iter_read(
        self,
        key: str,
        offset: int = 0,
        length: int | None = None,
        *,
        progress: Progress = _no_progress,
        info: ObjectInfo | None = None,
    ) -> Iterator[bytes | bytearray]:
        """Stream ``key`` in pieces, keeping ``window`` range requests in flight.

        All pieces come from the version current at the start: if the object changes
        meanwhile, the stream fails with ``VersionMismatchError`` instead of mixing
        versions. A whole object is checked against its hash as the stream ends
        (``IntegrityError``: do not act on its pieces before the stream ended); where
        this client holds the chunk list (lookaside stores), every chunk wholly inside
        the range is checked before any of its bytes is handed on
        (:mod:`shuttle.client.integrity`).
        """
        info = info or self.stat(key)
        end = info.size if length is None else min(info.size, offset + length)
        if offset >= end:
            return
        if self.lookaside is not None:
            yield from self.lookaside.iter_range(info, offset, end, progress=progress)
            return
        conn = self.connection(self.node_for(key))
        yield from download(
            conn,
            key,
            info,
            offset,
            end,
            piece_bytes=self.piece_bytes,
            window=self.window,
            progress=progress,
        )

    def get_to(
        self, key: str, target: str | Path | IO[bytes], *, progress: Progress = _no_progress
    ) -> ObjectInfo:
        """Stream ``key`` into a local file (written atomically if ``target`` is a path)."""
        info = self.stat(key)
        write_to(target, self.iter_read(key, info=info, progress=progress))
        return info

    def open(self, key: str, mode: str = "rb", *, validation: str | None = None) -> io.RawIOBase:
        """A file object for ``key``: ``rb`` reads through the client cache, validated
        at open by the mode ``validation`` (the client's own if None); ``wb`` streams
        an upload made visible on close."""
        from shuttle.client.files import open_remote

        return open_remote(self, key, mode, validation=validation)

    def speculate(
        self,
        key: str,
        work: Callable[[bytes, Callable[[], None]], _T],
        *,
        mechanism: str = "auto",
        save: Callable[[], Any] | None = None,
        restore: Callable[[Any], None] | None = None,
    ) -> _T:
        """``work(data, checkpoint)`` on ``key``'s cached copy at once, while the version
        check runs alongside; ``work`` cannot pass ``checkpoint()`` (or return) until the
        check confirms, and re-runs on fresh data if the copy was stale. ``mechanism``:
        ``thread`` (give ``save``/``restore`` for what ``work`` mutates), ``fork``
        (transparent; the result comes back pickled), ``none`` (a normal read), or
        ``auto`` (speculates only when T_f < (1 - p)·T_c, all measured). See
        :mod:`shuttle.client.speculation` and docs/consistency.md."""
        from shuttle.client.validation.speculative import SpeculativeMode

        mode = self.validation_mode("speculative")
        assert isinstance(mode, SpeculativeMode), "the speculative mode owns the engine"
        return mode.engine.speculate(key, work, mechanism=mechanism, save=save, restore=restore)

    def after_fork_in_child(self) -> None:
        """In a forked child: forget (without closing: they are the parent's)
        every connection, lock and cached block, so the child dials its own and never
        waits on a lock another thread of the parent held at the fork."""
        self._lock = threading.Lock()
        self._conns.forget_after_fork()
        self._modes = {}
        self._namespace = None  # its threads are the parent's
        blocks = self.cache.blocks
        self.cache = ClientCache(blocks.capacity_bytes, blocks.block_size_bytes)
        # The lookaside reader's lock and SQLite connections are the parent's (SQLite
        # connections must not cross a fork): the child reads from the node.
        self.lookaside = None

    # --- writing -------------------------------------------------------------------------

    def put(
        self,
        key: str,
        source: Source,
        *,
        expected_version: int | None = None,
        progress: Progress = _no_progress,
        mtime_ns: int | None = None,
    ) -> ObjectInfo:
        """Create or replace ``key`` with ``source`` (bytes, a local path, a binary
        file, or an iterable of byte pieces). Atomic: readers see the old object until
        the new one is complete and durable. ``mtime_ns``: the modification time to
        record (a copy keeps its source's); None: the node's clock at the change.
        """
        if isinstance(source, bytes | bytearray | memoryview) and calls.single_put(source):
            op = calls.put(key, source, expected_version, mtime_ns)
            res = self._send(op)
            self.forget(key)
            progress(len(source))
            return calls.put_info(res, op)
        if isinstance(source, str | Path):
            with open(source, "rb") as f:
                return self.put(
                    key, f, expected_version=expected_version, progress=progress, mtime_ns=mtime_ns
                )
        pieces = calls.pieces(source, self.piece_bytes)
        return self._upload(key, pieces, expected_version, progress, mtime_ns)

    def set_mtime(
        self, key: str, mtime_ns: int, *, expected_version: int | None = None
    ) -> ObjectInfo:
        """Record ``mtime_ns`` (ns since the epoch) as the object's modification time,
        as ``utime`` does for a file: a new version, the same contents."""
        res = self._send(calls.set_mtime(key, mtime_ns, expected_version))
        self.forget(key)
        return calls.object_info(res)

    def _upload(
        self,
        key: str,
        pieces: Iterator[bytes],
        expected_version: int | None,
        progress: Progress,
        mtime_ns: int | None = None,
    ) -> ObjectInfo:
        conn = self.connection(self.node_for(key))
        info, sent = upload(
            conn,
            key,
            pieces,
            expected_version=expected_version,
            window=self.window,
            progress=progress,
            mtime_ns=mtime_ns,
        )
        self.forget(key)
        return check_written(info, key, sent.size, sent.digest())

    def write(
        self,
        key: str,
        offset: int,
        data: Payload,
        *,
        expected_version: int | None = None,
        create: bool = False,
    ) -> WriteInfo:
        """Write ``data`` at ``offset`` of ``key`` (extending it); durable when it returns."""
        res = self._send(calls.write(key, offset, data, expected_version, create))
        self.forget(key)
        return calls.write_info(res)

    def create(self, key: str, *, exclusive: bool = True) -> ObjectInfo:
        """Create an empty object (``exclusive``: fail with AlreadyExistsError if present)."""
        return calls.object_info(self._send(calls.create(key, exclusive)))

    def truncate(self, key: str, size: int, *, expected_version: int | None = None) -> WriteInfo:
        res = self._send(calls.truncate(key, size, expected_version))
        self.forget(key)
        return calls.write_info(res)

    def remove(self, key: str, *, expected_version: int | None = None) -> None:
        self._send(calls.remove(key, expected_version))
        self.forget(key)

    def remove_many(self, keys: Sequence[str]) -> list[bool]:
        """Remove many keys (one round trip per node); per key, whether it existed."""
        out = [False] * len(keys)
        for node_id, idxs in self.by_node(keys).items():
            res = self._send(calls.remove_many([keys[i] for i in idxs]), self.node(node_id))
            for i, existed in zip(idxs, calls.existed(res), strict=True):
                out[i] = existed
                self.forget(keys[i])
        return out

    # --- listing -------------------------------------------------------------------------

    def list(self, prefix: str = "") -> Iterator[str]:
        """Every key under ``prefix``, in order, across all nodes."""
        keys, _ = self._list(prefix, None)
        yield from keys

    def listdir(self, prefix: str = "") -> tuple[builtins.list[str], builtins.list[str]]:
        """``(prefixes, keys)`` directly under ``prefix`` (``/`` separates levels)."""
        keys, prefixes = self._list(prefix, "/")
        return prefixes, keys

    def _list(
        self, prefix: str, delimiter: str | None
    ) -> tuple[builtins.list[str], builtins.list[str]]:
        keys: set[str] = set()
        prefixes: set[str] = set()
        for node in self.nodes:
            start_after: str | None = None
            while True:
                page = calls.page(self._send(calls.list_page(prefix, delimiter, start_after), node))
                keys.update(page.keys)
                prefixes.update(page.prefixes)
                start_after = page.next
                if start_after is None:
                    break
        return sorted(keys), sorted(prefixes)

    # --- nodes and counters ----------------------------------------------------------------

    def ping(self, node: NodeAddress) -> dict[str, Any]:
        result: dict[str, Any] = self.call(node, "ping").result
        return result

    def node_stats(self, node: NodeAddress) -> dict[str, Any]:
        result: dict[str, Any] = self.call(node, "node.stats").result
        return result

    def drop_caches(self, keys: Sequence[str] = ()) -> None:
        """Empty every node's block cache, the OS page cache of ``keys`` on their nodes,
        and this client's cache (for cold-cache measurements)."""
        for node in self.nodes:
            mine = [k for k in keys if self.node_for(k).node_id == node.node_id]
            self._send(calls.cache_drop(mine), node)
        self.cache.clear()

    def counters(self) -> dict[str, Any]:
        """Requests, round trips, bytes and cache hits of this client so far."""
        totals = self._conns.totals()
        cache = self.cache.stats()
        modes = self._modes_built()
        return {
            **totals,
            "cache_hits": cache["hits"],
            "cache_misses": cache["misses"],
            "cache": cache,
            "validation": {name: mode.stats() for name, mode in modes.items()},
            **({"lookaside": self.lookaside.stats()} if self.lookaside is not None else {}),
        }
