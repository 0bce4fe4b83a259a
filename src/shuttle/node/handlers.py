"""The storage operations a node serves, registered as handlers.

Each handler checks its arguments (``InvalidArgumentError`` names the bad one), calls
:class:`~shuttle.store.interface.Store`, and returns plain msgpack types. Data travels
in the frame payload, never inside the header. The operations and their arguments
are listed in docs/protocol.md.

Each operation has a guard (:mod:`shuttle.net.principals`): what a principal needs to
call it. Reads, stats and listings need the read capability on their keys, changes
the write capability; ``list`` shows a principal only the keys it may read
(:func:`~shuttle.store.listing.list_within`); ``cache.drop`` is a cluster operation.
"""

from __future__ import annotations

import asyncio
from typing import Any

import blake3

from shuttle.blockcache import BytesSpans, SpanReader
from shuttle.errors import IntegrityError, InvalidArgumentError, NotFoundError
from shuttle.net.attr_rows import encode_rows, wants_rows
from shuttle.net.principals import Guard, Principal, anyone, reads, reads_each, writes, writes_each
from shuttle.net.registry import (
    CONNECTION_ARG,
    Mode,
    OperationRegistry,
    ReadMiss,
    Reply,
    arg,
    non_negative,
    principal_of,
)
from shuttle.store import ObjectAttrs, WriteResult
from shuttle.store.fastread import CachedReads
from shuttle.store.interface import Store
from shuttle.store.listing import LIST_PAGE_ENTRIES_MAX, Listing, list_within
from shuttle.store.missread import MissReads
from shuttle.store.rados_locality import PrimaryLocator
from shuttle.store.rados_miss import LoopReads

#: Chunks listed inline in a stat result. A chunk costs about 45 bytes of header, so
#: 8,192 (a ~512 MiB object) stay well inside the 1 MiB header limit; larger objects
#: say ``chunks_total`` and the client pages the list with the ``chunks`` operation.
STAT_CHUNKS_MAX = 8192

#: Reads up to this size are tried on the event loop: a block-cache hit is served
#: faster than a hop to the thread pool takes, and so is a miss the kernel's page cache
#: can answer (read there with RWF_NOWAIT, :mod:`shuttle.store.nowait`). A read that
#: would wait for the disk goes to a thread, so that it never stalls the node's other
#: connections, as do larger reads (streaming).
INLINE_READ_BYTES_MAX = 64 << 10


def _payload_reply(data: bytes) -> Reply:
    return Reply(None, data)


def _direct(args: dict[str, Any]) -> bool:
    """A read's ``direct`` flag: the client reads a miss from RADOS itself."""
    value = args.get("direct", False)
    if type(value) is not bool:
        raise InvalidArgumentError(
            f"direct must be true or false, got {value!r:.40}; leave it out for a plain read"
        )
    return value


def _version(args: dict[str, Any]) -> int | None:
    value = args.get("expected_version")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidArgumentError(f"expected_version must be an integer ≥ 0, got {value!r}")
    return value


def _mtime(args: dict[str, Any]) -> int | None:
    """The optional ``mtime_ns`` of a put or a commit (None: now)."""
    return non_negative(args, "mtime_ns") if args.get("mtime_ns") is not None else None


def _keys(args: dict[str, Any]) -> list[str]:
    keys = arg(args, "keys", list)
    if not all(isinstance(k, str) for k in keys):
        raise InvalidArgumentError("keys must be a list of strings")
    return keys


def attrs_reply(a: ObjectAttrs, chunks_max: int = STAT_CHUNKS_MAX) -> dict[str, Any]:
    """An object's attributes as a stat answers them: a long chunk list cut to its first
    page, or to ``chunks_max`` chunks (``chunks_total`` says how many there are)."""
    out = a.as_dict()
    out["chunks_total"] = len(a.chunks)
    if len(a.chunks) > chunks_max:
        out["chunks"] = out["chunks"][:chunks_max]
    return out


def chunks_max(args: dict[str, Any]) -> int:
    """How many chunks a stat-like reply lists: ``chunks_max`` (a client with no use for
    chunk lists, no lookaside stores, sends 0: the small files' lists are most of a
    listing's bytes), never more than a page."""
    return min(non_negative(args, "chunks_max", STAT_CHUNKS_MAX), STAT_CHUNKS_MAX)


def rows_asked(args: dict[str, Any]) -> bool:
    """Whether a many-key stat asks for the compact rows form (``form: "rows1"``,
    :mod:`shuttle.net.attr_rows`); InvalidArgumentError for a form this node lacks."""
    try:
        return wants_rows(args)
    except ValueError as exc:
        raise InvalidArgumentError(f"{exc} (or leave it out for the map list)") from None


#: Bytes of the payload hash a client may send with a put, a range write or an upload
#: piece (``hash``: blake3, as the node hashes objects and chunks).
PAYLOAD_HASH_BYTES = 32


def check_payload(args: dict[str, Any], payload: bytes, what: str) -> None:
    """Refuse ``payload`` if the client sent its hash (``hash``) and it does not match:
    the bytes changed on the way, and nothing may be stored. Old clients send none."""
    expected = args.get("hash")
    if expected is None:
        return
    if not isinstance(expected, bytes) or len(expected) != PAYLOAD_HASH_BYTES:
        raise InvalidArgumentError(
            f"{what}: hash must be the {PAYLOAD_HASH_BYTES}-byte blake3 of the payload"
        )
    if blake3.blake3(payload).digest() != expected:
        raise IntegrityError(
            f"{what}: the {len(payload)} bytes that arrived do not match the hash the client "
            "sent with them: they were changed on the way. Nothing was stored; send it again "
            "(over TLS, which refuses changed bytes)"
        )


def _written(w: WriteResult) -> dict[str, Any]:
    return {"key": w.key, "size": w.size, "version": w.version, "mtime_ns": w.mtime_ns}


def list_for(
    store: Store,
    principal: Principal | None,
    prefix: str,
    delimiter: str | None,
    start_after: str | None,
    limit: int = LIST_PAGE_ENTRIES_MAX,
) -> Listing:
    """A page of ``store``'s listing of ``prefix`` as ``principal`` may see it (all of
    it when unrestricted): only keys it may read, and the prefixes that lead to them."""
    roots = None if principal is None else principal.caps.list_roots(prefix)
    if roots is None:
        return store.list(prefix, delimiter=delimiter, start_after=start_after, limit=limit)

    def list_fn(p: str, d: str | None, after: str | None, n: int) -> Listing:
        return store.list(p, delimiter=d, start_after=after, limit=n)

    return list_within(list_fn, prefix, roots, delimiter, start_after, limit)


def upload_guard(store: Store) -> Guard:
    """The write capability on the key an open upload session will replace."""

    def guard(principal: Principal, args: dict[str, Any]) -> None:
        upload = args.get("upload")
        if isinstance(upload, str):
            try:
                key = store.uploads.get(upload).key
            except NotFoundError:
                return  # the operation answers that there is no such session
            principal.require_write(key, "upload to")

    return guard


def register_storage_ops(registry: OperationRegistry, store: Store) -> None:
    """Add the storage operations over ``store`` to ``registry``."""

    def stat(args: dict[str, Any], payload: bytes) -> Any:
        """Attributes of one object: size, version, mtime_ns, hash, chunks."""
        key = arg(args, "key", str)
        return attrs_reply(store.stat(key, expected_version=_version(args)), chunks_max(args))

    def chunks(args: dict[str, Any], payload: bytes) -> Any:
        """A page of an object's chunk list: ``[offset, length, blake3]`` from ``start``."""
        start = non_negative(args, "start", 0)
        limit = min(non_negative(args, "limit", STAT_CHUNKS_MAX), STAT_CHUNKS_MAX)
        a = store.stat(arg(args, "key", str), expected_version=_version(args))
        page = a.chunks[start : start + limit]
        return {
            "version": a.version,
            "chunks": [[c.offset, c.length, c.hash] for c in page],
            "next": start + len(page) if start + len(page) < len(a.chunks) else None,
        }

    def stat_many(args: dict[str, Any], payload: bytes) -> Any:
        """Attributes of many objects (None for a missing one), in one round trip; with
        ``form: "rows1"`` as compact rows (docs/protocol.md)."""
        rows = rows_asked(args)
        limit = chunks_max(args)
        out = [None if a is None else attrs_reply(a, limit) for a in store.stat_many(_keys(args))]
        return encode_rows(out) if rows else out

    def read(args: dict[str, Any], payload: bytes) -> Reply:
        """Bytes [offset, offset+length) of an object (fewer at its end) as the payload."""
        # The arguments of nearly every read, checked in one go (exact types: msgpack
        # never gives a bool or int subclass for an int); any other shape takes the
        # checks below, which name what is wrong.
        key, offset, length = args.get("key"), args.get("offset", 0), args.get("length")
        version = args.get("expected_version")
        if (
            type(key) is str
            and type(offset) is int
            and offset >= 0
            and type(length) is int
            and length >= 0
            and (version is None or (type(version) is int and version >= 0))
        ):
            return Reply(None, store.read(key, offset, length, expected_version=version))
        return _checked_read(args)

    def read_hit(key: str, offset: int, length: int, version: int | None) -> bytes | None:
        """``read`` answered from the block cache on the event loop, or None when any
        of it is not resident (or anything is unusual): the thread pool answers then.
        The read lane calls it with the request's arguments, checked."""
        if length <= INLINE_READ_BYTES_MAX:
            return store.read_cached(key, offset, length, version)
        return None

    # A local store's compiled cache-hit read takes the lane's calls itself, natively (a
    # SpanReader): no interpreted frame or Python-level call between the node's protocol
    # and the block cache, and the lane gets the cached block and the range (its reply
    # copies the page once).
    cached_reads = getattr(store, "cached_reads", None)
    # A RADOS store's reads on the loop are compiled too: the hit, and the miss it starts.
    loop_reads = getattr(store, "loop_reads", None)
    rados_inline = (
        loop_reads.limited(INLINE_READ_BYTES_MAX) if isinstance(loop_reads, LoopReads) else None
    )
    hit: ReadMiss
    lane: SpanReader
    if isinstance(cached_reads, CachedReads):
        limited = cached_reads.limited(INLINE_READ_BYTES_MAX)
        hit, lane = limited.read, limited
    elif rados_inline is not None:
        hit, lane = rados_inline.read, rados_inline
    else:
        hit, lane = read_hit, BytesSpans(read_hit)

    # A miss of the block cache that the page cache can answer (a local store's files,
    # where the platform can tell): read on the loop too, never waiting for the disk.
    read_nowait = getattr(store, "read_nowait", None)

    def read_nowait_within(key: str, offset: int, length: int, version: int | None) -> bytes | None:
        """The read lane's call when ``lane`` missed: the page cache's answer, or None
        (the thread pool reads it)."""
        if read_nowait is not None and length <= INLINE_READ_BYTES_MAX:
            data: bytes | None = read_nowait(key, offset, length, version)
            return data
        return None

    # A local store's compiled miss read takes those calls itself, as the hit's does; a
    # store with no page cache to ask (RADOS) has no such call.
    miss_reads = getattr(store, "miss_reads", None)
    read_miss: ReadMiss | None = (
        miss_reads.limited(INLINE_READ_BYTES_MAX).read
        if isinstance(miss_reads, MissReads)
        else read_nowait_within
        if read_nowait is not None
        else None
    )

    def read_cached(args: dict[str, Any], payload: bytes) -> Reply | None:
        """``read`` on the event loop: a block-cache hit (the read lane's, as bytes), else a
        miss the page cache holds; None sends it to the thread pool."""
        key, offset, length = args.get("key"), args.get("offset", 0), args.get("length")
        version = args.get("expected_version")
        direct = "direct" in args and _direct(args)  # a bad flag is refused, not ignored
        if (
            type(key) is str
            and type(offset) is int
            and type(length) is int
            and (version is None or type(version) is int)
        ):
            data = hit(key, offset, length, version)
            if data is None and read_miss is not None:
                data = read_miss(key, offset, length, version)
            if data is not None:
                return Reply(None, data)
            if direct and rados_inline is not None:
                # A client that reads with its own Ceph credentials may be told where the
                # bytes are instead (LoopReads.located). Only after the guard: a principal
                # that may not read the key is never told its object's name.
                where = rados_inline.located(key, offset, length, version)
                if where is not None:
                    return Reply({"rados": where}, b"")
        return None

    # A miss that can complete on the loop without a thread (a RADOS store's
    # asynchronous read, shuttle.store.rados_aio): started there, else the pool reads it.
    read_async = (
        rados_inline.read_async if rados_inline is not None else getattr(store, "read_async", None)
    )

    def read_start(args: dict[str, Any], payload: bytes) -> asyncio.Future[Reply] | None:
        key, offset, length = args.get("key"), args.get("offset", 0), args.get("length")
        version = args.get("expected_version")
        if (
            read_async is not None
            and type(key) is str
            and type(offset) is int
            and type(length) is int
            and length <= INLINE_READ_BYTES_MAX
            and (version is None or type(version) is int)
        ):
            started: asyncio.Future[Reply] | None = read_async(
                key, offset, length, version, _payload_reply
            )
            return started
        return None

    def _checked_read(args: dict[str, Any]) -> Reply:
        length = args.get("length")
        if length is not None and (not isinstance(length, int) or length < 0):
            raise InvalidArgumentError(f"length must be an integer ≥ 0, got {length!r}")
        data = store.read(
            arg(args, "key", str),
            non_negative(args, "offset", 0),
            length,
            expected_version=_version(args),
        )
        return Reply(None, data)

    def write(args: dict[str, Any], payload: bytes) -> Any:
        """Write the payload at offset (extending the object); durable when answered.
        With ``hash``, only if the payload matches it."""
        check_payload(args, payload, f"write of {args.get('key')!r:.200}")
        return _written(
            store.write(
                arg(args, "key", str),
                non_negative(args, "offset", 0),
                payload,
                expected_version=_version(args),
                create=arg(args, "create", bool, False),
            )
        )

    def put(args: dict[str, Any], payload: bytes) -> Any:
        """Create or replace an object with the payload, atomically (``mtime_ns``: the
        modification time to record, as a copy keeps its source's; default now). With
        ``hash``, only if the payload matches it."""
        check_payload(args, payload, f"put of {args.get('key')!r:.200}")
        return attrs_reply(
            store.put(
                arg(args, "key", str),
                payload,
                expected_version=_version(args),
                mtime_ns=_mtime(args),
            )
        )

    def set_mtime(args: dict[str, Any], payload: bytes) -> Any:
        """Record the modification time a program set (utime, touch -d, rsync -t)."""
        return attrs_reply(
            store.set_mtime(
                arg(args, "key", str),
                non_negative(args, "mtime_ns"),
                expected_version=_version(args),
            )
        )

    def create(args: dict[str, Any], payload: bytes) -> Any:
        """Create an empty object (``exclusive``: fail if it exists)."""
        return attrs_reply(
            store.create(arg(args, "key", str), exclusive=arg(args, "exclusive", bool, True))
        )

    def truncate(args: dict[str, Any], payload: bytes) -> Any:
        """Cut or extend (with zeros) an object to ``size`` bytes."""
        return _written(
            store.truncate(
                arg(args, "key", str), non_negative(args, "size"), expected_version=_version(args)
            )
        )

    def remove(args: dict[str, Any], payload: bytes) -> Any:
        """Remove an object."""
        store.remove(arg(args, "key", str), expected_version=_version(args))
        return None

    def remove_many(args: dict[str, Any], payload: bytes) -> Any:
        """Remove many objects; answers, per key, whether it existed."""
        return store.remove_many(_keys(args))

    def list_(args: dict[str, Any], payload: bytes) -> Any:
        """A page of keys under ``prefix`` (with ``delimiter='/'``: and sub-prefixes)."""
        page = list_for(
            store,
            principal_of(args),
            arg(args, "prefix", str, ""),
            arg(args, "delimiter", str, None),  # type: ignore[arg-type]
            arg(args, "start_after", str, None),  # type: ignore[arg-type]
            arg(args, "limit", int, LIST_PAGE_ENTRIES_MAX),
        )
        return {"keys": page.keys, "prefixes": page.prefixes, "next": page.next_start_after}

    def upload_begin(args: dict[str, Any], payload: bytes) -> Any:
        """Start an upload session for a large object; nothing is visible until commit."""
        upload = store.begin_upload(
            arg(args, "key", str), expected_version=_version(args), owner=args.get(CONNECTION_ARG)
        )
        return {"upload": upload}

    def upload_write(args: dict[str, Any], payload: bytes) -> Any:
        """Write the payload at ``offset`` of an open upload (with ``hash``, only if the
        payload matches it)."""
        check_payload(args, payload, f"upload piece at {args.get('offset')!r:.40}")
        return {
            "size": store.upload_write(
                arg(args, "upload", str), non_negative(args, "offset"), payload
            )
        }

    def upload_commit(args: dict[str, Any], payload: bytes) -> Any:
        """Make an upload's object visible, atomically and durably."""
        return attrs_reply(store.commit_upload(arg(args, "upload", str), mtime_ns=_mtime(args)))

    def upload_abort(args: dict[str, Any], payload: bytes) -> Any:
        """Drop an upload session and its staged bytes."""
        store.abort_upload(arg(args, "upload", str))
        return None

    def cache_drop(args: dict[str, Any], payload: bytes) -> Any:
        """Empty the block cache and drop ``keys`` from the OS page cache (cold runs)."""
        return store.drop_caches(_keys(args) if "keys" in args else [])

    add = registry.add
    # A stat is answered from memory unless the attributes must be read from disk or
    # the whole-object hash recomputed after range writes: only then take a thread.
    add(
        "stat",
        stat,
        Mode.THREAD,
        inline_when=lambda a: store.stat_is_cached(str(a.get("key", ""))),
        guard=reads("key", "stat"),
    )
    add("chunks", chunks, Mode.THREAD, guard=reads("key", "list the chunks of"))
    add("stat_many", stat_many, Mode.THREAD, guard=reads_each("keys", "stat"))
    add(
        "read",
        read,
        Mode.THREAD,
        inline_try=read_cached,
        read_lane=lane,
        read_miss=read_miss,
        read_located=rados_inline.located if rados_inline is not None else None,
        start=read_start if read_async is not None else None,
        guard=reads(),
    )
    add("write", write, Mode.THREAD, guard=writes())
    add("put", put, Mode.THREAD, guard=writes("key", "put"))
    add("create", create, Mode.THREAD, guard=writes("key", "create"))
    add("truncate", truncate, Mode.THREAD, guard=writes("key", "truncate"))
    add("set_mtime", set_mtime, Mode.THREAD, guard=writes("key", "set the mtime of"))
    add("remove", remove, Mode.THREAD, guard=writes("key", "remove"))
    add("remove_many", remove_many, Mode.THREAD, guard=writes_each("keys", "remove"))
    add("list", list_, Mode.THREAD, guard=anyone, wants_principal=True)
    # Sessions belong to the connection that opened them, and end when it closes.
    add(
        "upload.begin",
        upload_begin,
        Mode.THREAD,
        per_connection=True,
        guard=writes("key", "upload to"),
    )
    registry.on_disconnect(store.release_uploads, owned=store.uploads_owned_by)
    add("upload.write", upload_write, Mode.THREAD, guard=upload_guard(store))
    add("upload.commit", upload_commit, Mode.THREAD, guard=upload_guard(store))
    add("upload.abort", upload_abort, Mode.THREAD, guard=upload_guard(store))
    add("cache.drop", cache_drop, Mode.THREAD)  # a cluster operation: admins only


def register_locality_ops(registry: OperationRegistry, locator: PrimaryLocator) -> None:
    """Add ``rados.locate`` (a RADOS store's nodes only): where keys' primary OSDs are."""

    def locate(args: dict[str, Any], payload: bytes) -> Any:
        """Per key, the CRUSH host of its primary OSD (None: unknown), with this node's
        own host: ``{"host", "epoch", "hosts": [...], "osds": [...]}``. ``keys`` may be
        empty (the node's host only)."""
        where = locator.locate(_keys(args) if "keys" in args else [])
        return {
            "host": locator.host,
            "epoch": where.epoch,
            "hosts": where.hosts,
            "osds": where.osds,
        }

    # Where CRUSH puts a name is a function of the name: it tells nothing of objects.
    registry.add("rados.locate", locate, Mode.THREAD, guard=anyone)
