"""Asynchronous RADOS reads that complete on the node's event loop, through librados's C API.

A read that misses the node's block cache used to go to the node's I/O thread pool,
whose thread made a blocking librados ``read``: the loop woke a pool thread, librados's
messenger thread woke it again with the answer, and it woke the loop with the result
(three thread hand-offs, each contending for the GIL with the loop). Here the loop
starts the read itself (``rados_aio_read``, which only queues it) and librados's
completion callback, on librados's own thread, hands the result back with
``loop.call_soon_threadsafe``: one hand-off each way, no pool thread (the profile is in
benchmarks/README.md, "Warm reads on a RADOS gateway").

Why the C API (``ctypes``) and not the Python binding's ``Ioctx.aio_read``: the store
must know the version of the bytes a read returned (rados_read: a read never returns
bytes of another version than the one it names), which a blocking read reports through
``get_last_version``, and an asynchronous one only through ``rados_aio_get_version``
on its completion, which Ceph 16's binding does not expose; and the binding keeps the
I/O context's handle to itself. So this module opens a librados client of its own
(with the same configuration, keyring, user and bounded waits as the store's
:class:`~shuttle.store.rados_conn.RadosConnection`), used for these reads only.

Completions, two ways (``AioClient(..., completion=...)``):

* ``"c"`` (the default when Shuttle runs its compiled modules, :mod:`shuttle.compiled`):
  the completion callback is C (``shuttle.store._aiodone``, ``_aiodone.c``). On
  librados's callback thread it reads the completion's result and version, frees it,
  appends the read to a FIFO list under a mutex and writes to an eventfd if the list
  was empty; it never takes the GIL. The loop watches the eventfd (``add_reader``) and
  :meth:`AioClient._drain` hands every finished read of the batch to its ``done``, in
  the order librados finished them. The read is started in C too (no ``ctypes`` call),
  into the ``bytes`` object it is answered with (no ``string_at`` copy).
* ``"ctypes"`` (the reference, and what runs without the compiled modules): librados
  calls :meth:`AioClient._on_complete`, a Python function behind a ``ctypes`` callback,
  on its callback thread: it takes the GIL, reads the completion's result and version,
  frees it, and passes them to the loop with ``call_soon_threadsafe`` (thread-safe by
  contract); it touches nothing else. The loop side (:meth:`AioClient._completed`)
  finds the read's buffer and calls its ``done``.

tests/store_suite/test_rados_aio_done.py runs both on the same reads. Every read ends:
librados fails an operation after ``rados_osd_op_timeout`` (which the connection always
sets, :func:`~shuttle.store.rados_conn.bound_waits`) with ``ETIMEDOUT``;
:meth:`AioClient.close` waits for the reads in flight before it shuts the client down,
so no callback comes after.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import errno
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from shuttle.errors import ConfigError, ShuttleError, StorageIOError
from shuttle.store.keys import no_object
from shuttle.store.rados_conn import CephOptions, bound_waits, timed_out_message

log = logging.getLogger(__name__)

#: ``done(rv, version, data)``, called on the loop: ``rv`` the bytes read (< 0: minus
#: the errno), ``version`` the object's version the bytes are of, ``data`` the bytes.
Done = Callable[[int, int, bytes], None]

#: librados's shared object (Debian's librados2, which python3-rados links to).
LIBRADOS_NAMES = ("librados.so.2", "rados")

_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)


class Completions(Protocol):
    """What the C completions (``shuttle.store._aiodone.Completions``, ``_aiodone.pyi``)
    offer. A protocol, not the class itself: the extension exists only where Shuttle's
    compiled modules are built, and this module, compiled with them
    (:mod:`shuttle.compiled`), must import without it."""

    def fileno(self) -> int: ...
    def read(self, ioctx: int, oid: bytes, offset: int, length: int, arg: Any, /) -> int: ...
    def drain(self) -> list[tuple[Any, int, int, bytes, int]]: ...
    def in_flight(self) -> int: ...
    def wait_idle(self, timeout_s: float, /) -> bool: ...
    def close(self, timeout_s: float, /) -> bool: ...


#: How librados hands a finished read to the loop (see the module): a C callback and an
#: eventfd, or the reference, a Python callback through ``ctypes``.
COMPLETIONS = ("c", "ctypes")

#: Seconds past the op timeout that ``close`` waits for librados's last callbacks.
CLOSE_MARGIN_S = 5.0

#: The ``conf_get`` buffer: Ceph option values are paths and numbers.
CONF_VALUE_BYTES_MAX = 4096


def load_librados() -> Any:
    """librados's C library with the signatures used here; ConfigError if absent."""
    for name in LIBRADOS_NAMES:
        path = name if name.endswith(".2") else ctypes.util.find_library(name)
        if path is None:
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        try:
            _declare(lib)
        except AttributeError as exc:  # rados_aio_create_completion2 came in Ceph 15
            raise ConfigError(
                f"{path} is too old for reads completed on the event loop ({exc}): "
                "Ceph 15 (Octopus) or newer is needed"
            ) from exc
        return lib
    raise ConfigError(
        "librados's C library (librados.so.2) is not installed: install Debian's "
        "librados2 (scripts/setup-ceph.sh does)"
    )


def native_completions() -> Callable[[int, int, int, int, int], Completions] | None:
    """``shuttle.store._aiodone.Completions`` when Shuttle runs its compiled modules
    (else None: the ``ctypes`` path)."""
    from shuttle.compiled import active

    if not active().compiled:
        return None
    try:
        from shuttle.store import _aiodone
    except ImportError:  # pragma: no cover - compiled.check() requires it
        return None
    return _aiodone.Completions


def _address(fn: Any) -> int:
    """The address of a ctypes foreign function, for the C completions."""
    address = ctypes.cast(fn, ctypes.c_void_p).value
    assert address, "a loaded librados function has an address"
    return address


def _declare(lib: Any) -> None:
    p, c_int, c_char_p = ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p
    pp = ctypes.POINTER(ctypes.c_void_p)
    table: dict[str, tuple[Any, list[Any]]] = {
        "rados_create2": (c_int, [pp, c_char_p, c_char_p, ctypes.c_uint64]),
        "rados_conf_read_file": (c_int, [p, c_char_p]),
        "rados_conf_set": (c_int, [p, c_char_p, c_char_p]),
        "rados_conf_get": (c_int, [p, c_char_p, c_char_p, ctypes.c_size_t]),
        "rados_connect": (c_int, [p]),
        "rados_shutdown": (None, [p]),
        "rados_ioctx_create": (c_int, [p, c_char_p, pp]),
        "rados_ioctx_destroy": (None, [p]),
        "rados_ioctx_set_namespace": (None, [p, c_char_p]),
        "rados_aio_create_completion2": (c_int, [p, _CALLBACK, pp]),
        "rados_aio_read": (c_int, [p, c_char_p, p, p, ctypes.c_size_t, ctypes.c_uint64]),
        "rados_aio_get_return_value": (c_int, [p]),
        "rados_aio_get_version": (ctypes.c_uint64, [p]),
        "rados_aio_release": (None, [p]),
    }
    for name, (restype, argtypes) in table.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


class _Conf:
    """A C client's configuration, with the two calls ``bound_waits`` makes."""

    def __init__(self, lib: Any, cluster: ctypes.c_void_p) -> None:
        self.lib = lib
        self.cluster = cluster

    def conf_set(self, option: str, value: str) -> None:
        rc = self.lib.rados_conf_set(self.cluster, option.encode(), value.encode())
        if rc < 0:
            raise ConfigError(f"librados refused {option}={value!r}: {os.strerror(-rc)}")

    def conf_get(self, option: str) -> str:
        buf = ctypes.create_string_buffer(CONF_VALUE_BYTES_MAX)
        rc = self.lib.rados_conf_get(self.cluster, option.encode(), buf, CONF_VALUE_BYTES_MAX)
        return buf.value.decode() if rc == 0 else ""


def _compiled_reason() -> str:
    from shuttle.compiled import active

    return active().reason


def read_error(key: str, code: int, timeout_s: float) -> ShuttleError:
    """The error a failed read of ``key`` raises (``code``: a positive errno), as the
    blocking read's: NotFoundError for a missing object, a timeout that says what to
    check, else StorageIOError naming the error."""
    if code == errno.ENOENT:
        return no_object(key)
    what = f"read of {key!r}"
    if code == errno.ETIMEDOUT:
        return StorageIOError(timed_out_message(what, timeout_s))
    return StorageIOError(f"{what} failed in RADOS: [errno {code}] {os.strerror(code)}")


class AioClient:
    """A librados client of its own, for reads started on an event loop (see the module).

    ``read`` is called on the loop; ``done`` runs on the same loop. Thread-safe
    otherwise (``close`` from any thread)."""

    def __init__(
        self, pool: str, namespace: str, options: CephOptions, completion: str | None = None
    ) -> None:
        native = native_completions()
        if completion is None:
            completion = "c" if native is not None else "ctypes"
        if completion not in COMPLETIONS:
            raise ConfigError(
                f"unknown completion {completion!r} for asynchronous RADOS reads: "
                f"use one of {', '.join(COMPLETIONS)}"
            )
        if completion == "c" and native is None:
            raise ConfigError(
                "the C completions (shuttle.store._aiodone) need Shuttle's compiled modules, "
                f"which are not in use here ({_compiled_reason()}): run scripts/setup.sh, or "
                "use completion='ctypes'"
            )
        #: ``"c"`` or ``"ctypes"``: how librados hands a finished read to the loop.
        self.completion = completion
        self.lib = lib = load_librados()
        #: The C completions (made first: they hold no librados state), and the loop
        #: that watches their eventfd.
        self._ring: Completions | None = None
        self._watched: asyncio.AbstractEventLoop | None = None
        if native is not None and completion == "c":
            self._ring = native(
                _address(lib.rados_aio_create_completion2),
                _address(lib.rados_aio_read),
                _address(lib.rados_aio_get_return_value),
                _address(lib.rados_aio_get_version),
                _address(lib.rados_aio_release),
            )
        cluster = ctypes.c_void_p()
        # The cluster's name: None, Ceph's default ("ceph"), as the Python binding's.
        rc = lib.rados_create2(ctypes.byref(cluster), None, options.user.encode(), 0)
        if rc < 0:
            raise ConfigError(f"librados could not make a client: {os.strerror(-rc)}")
        self._cluster = cluster
        self._io = ctypes.c_void_p()
        try:
            conf = _Conf(lib, cluster)
            path = str(options.conf_path).encode() if options.conf_path is not None else None
            rc = lib.rados_conf_read_file(cluster, path)
            if rc < 0:
                raise ConfigError(f"librados could not read its configuration: {os.strerror(-rc)}")
            bound_waits(conf, options)
            if options.keyring_path is not None:
                conf.conf_set("keyring", str(options.keyring_path))
            sock_dir = os.path.dirname(conf.conf_get("admin_socket"))
            if sock_dir and os.path.isdir(sock_dir):  # else none: the store's client has one
                conf.conf_set(
                    "admin_socket",
                    os.path.join(sock_dir, "shuttle-$cluster-$name.$pid.$cctid.asok"),
                )
            else:
                conf.conf_set("admin_socket", "")
            rc = lib.rados_connect(cluster)
            if rc < 0:
                raise ConfigError(
                    f"librados could not connect its read client: {os.strerror(-rc)}. Check "
                    "that the monitors run (`ceph -s`)"
                )
            self.op_timeout_s = float(conf.conf_get("rados_osd_op_timeout") or 0)
            rc = lib.rados_ioctx_create(cluster, pool.encode(), ctypes.byref(self._io))
            if rc < 0:
                raise ConfigError(f"librados could not open pool {pool!r}: {os.strerror(-rc)}")
            lib.rados_ioctx_set_namespace(self._io, namespace.encode())
            #: The I/O context's address, for the C completions.
            self._io_address: int = self._io.value or 0
        except BaseException:
            if self._io.value:
                lib.rados_ioctx_destroy(self._io)
            lib.rados_shutdown(cluster)
            raise
        # One C callback for every read (ctypes must keep it alive while librados may
        # call it: as long as this client); a read is told by its token.
        self._callback = _CALLBACK(self._on_complete)
        self._tokens = itertools.count(1)
        #: token -> (buffer, done, loop): the reads in flight.
        self._pending: dict[int, tuple[Any, Done, asyncio.AbstractEventLoop]] = {}
        self._lock = threading.Lock()
        #: Notified when librados has called back for every read it was given.
        self._quiet = threading.Condition(self._lock)
        #: Reads librados has not called back for yet (close waits for them).
        self._in_librados = 0
        self._closed = False
        #: Reads started, and reads that ended in an error.
        self.reads = 0
        self.errors = 0
        #: When librados called back for the read whose ``done`` runs now
        #: (``time.monotonic_ns``): for benchmarks that split a read's time.
        self.callback_ns = 0

    def read(
        self, key: str, offset: int, length: int, done: Done, loop: asyncio.AbstractEventLoop
    ) -> bool:
        """Start reading ``length`` bytes of ``key`` at ``offset``; ``done`` is called on
        ``loop`` (the running one) when RADOS answers. False: not started (closed, or
        librados refused it), and ``done`` will not be called."""
        ring = self._ring
        if ring is not None:
            return self._read_c(ring, key, offset, length, done, loop)
        buf = ctypes.create_string_buffer(length)
        token = next(self._tokens)
        comp = ctypes.c_void_p()
        with self._lock:
            if self._closed:
                return False
            self._pending[token] = (buf, done, loop)
            self._in_librados += 1
        lib = self.lib
        rc = lib.rados_aio_create_completion2(token, self._callback, ctypes.byref(comp))
        if rc == 0:
            rc = lib.rados_aio_read(self._io, key.encode(), comp, buf, length, offset)
            if rc < 0:
                lib.rados_aio_release(comp)
        if rc < 0:
            with self._lock:
                self._pending.pop(token, None)
                self._in_librados -= 1
                self._quiet.notify_all()
            log.warning("librados refused an asynchronous read of %r: %s", key, os.strerror(-rc))
            return False
        self.reads += 1
        return True

    def _on_complete(self, comp: int | None, token: int | None) -> None:
        """librados's thread: pass the result to the read's loop, nothing more."""
        try:
            lib = self.lib
            rv = lib.rados_aio_get_return_value(comp)
            version = lib.rados_aio_get_version(comp)
            lib.rados_aio_release(comp)
            key = token or 0
            with self._lock:  # stamped and queued in one turn: the loop sees stamp order
                found = self._pending.get(key)
                self._in_librados -= 1
                self._quiet.notify_all()
                if found is not None:
                    found[2].call_soon_threadsafe(
                        self._completed, key, rv, version, time.monotonic_ns()
                    )
        except RuntimeError:  # the loop is closed: nobody waits for this read any more
            pass
        except Exception:  # never let an error escape into librados's thread
            log.exception("asynchronous RADOS read completion failed")

    def _completed(self, token: int, rv: int, version: int, callback_ns: int) -> None:
        """On the loop: hand the read's bytes (or its error) to its ``done``."""
        with self._lock:
            found = self._pending.pop(token, None)
        if found is None:
            return
        buf, done, _loop = found
        if rv < 0:
            self.errors += 1
        self.callback_ns = callback_ns
        done(rv, version, ctypes.string_at(buf, rv) if rv > 0 else b"")

    # --- the C completions ------------------------------------------------------------

    def _read_c(
        self,
        ring: Completions,
        key: str,
        offset: int,
        length: int,
        done: Done,
        loop: asyncio.AbstractEventLoop,
    ) -> bool:
        """:meth:`read` through the C completions."""
        if loop is not self._watched:
            self._watch(ring, loop)
        rc = ring.read(self._io_address, key.encode(), offset, length, (done, loop))
        if rc < 0:
            if rc != -errno.ESHUTDOWN:  # closed: not worth a warning
                log.warning(
                    "librados refused an asynchronous read of %r: %s", key, os.strerror(-rc)
                )
            return False
        self.reads += 1
        return True

    def _watch(self, ring: Completions, loop: asyncio.AbstractEventLoop) -> None:
        """Have ``loop`` (the running one) drain the finished reads. A loop watched
        before and still open lets go of the eventfd (a node has one loop; tests run
        one after another); its reads still in flight are answered on it."""
        fd = ring.fileno()
        old = self._watched
        if old is not None and not old.is_closed():
            old.remove_reader(fd)
        loop.add_reader(fd, self._drain, ring)
        self._watched = loop

    def _drain(self, ring: Completions) -> None:
        """On the watching loop, when the eventfd is readable: every finished read of
        the batch to its ``done``, oldest first (a read started on another loop, on
        that loop if it is still open).

        Out of memory, ``drain()`` keeps what it could not hand on and wakes the loop
        again (``_aiodone.c``): a MemoryError it raises goes to the loop's exception
        handler, and the next turn drains again. An error in one read's step here (its
        ``done``, a loop closed meanwhile, no memory) is reported and the batch goes
        on: the reads after it are still answered."""
        here = self._watched
        assert here is not None, "drained only by the loop _watch registered"
        for (done, loop), rv, version, data, callback_ns in ring.drain():
            try:
                if rv < 0:
                    self.errors += 1
                if loop is not here:
                    if not loop.is_closed():
                        loop.call_soon_threadsafe(done, rv, version, data)
                    continue
                self.callback_ns = callback_ns
                done(rv, version, data)
            except Exception as exc:  # as call_soon would: reported, the batch goes on
                loop.call_exception_handler(
                    {"message": "asynchronous RADOS read completion failed", "exception": exc}
                )

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until librados has called back for every read it was given (their
        ``done`` may still wait for the loop); False at the timeout. ``math.inf`` (or
        any timeout beyond what a deadline can hold) waits without one; a negative or
        NaN one is a ValueError. The loop's thread may call it: neither path needs the
        loop to call back."""
        if self._ring is not None:
            return self._ring.wait_idle(timeout_s)
        if not timeout_s >= 0:
            raise ValueError(f"timeout_s must be >= 0, got {timeout_s:g}")
        # threading's waits refuse a timeout over TIMEOUT_MAX (OverflowError).
        bound = timeout_s if timeout_s <= threading.TIMEOUT_MAX else None
        with self._lock:
            return self._quiet.wait_for(lambda: self._in_librados == 0, bound)

    def in_flight(self) -> int:
        """Reads started whose ``done`` has not been called yet."""
        if self._ring is not None:
            return self._ring.in_flight()
        with self._lock:
            return len(self._pending)

    def close(self) -> None:
        """Wait until librados has called back for every read it was given (each is
        bounded by its op timeout), then shut the client down. Idempotent. A read whose
        callback has not come by then keeps its buffer for as long as this object lives
        (librados could still write into it); its ``done`` is not called."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        # The C path: the loop keeps watching the eventfd (safe: no read finishes now,
        # and it may be another thread's loop); the ring lives as long as this object.
        ring = self._ring
        wait_s = self.op_timeout_s + CLOSE_MARGIN_S
        if not (ring.close(wait_s) if ring is not None else self.wait_idle(wait_s)):
            left = ring.in_flight() if ring is not None else self._in_librados
            log.warning("%d asynchronous RADOS reads had no answer at close", left)
        lib = self.lib
        lib.rados_ioctx_destroy(self._io)
        lib.rados_shutdown(self._cluster)
