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

Threads: librados calls :meth:`AioClient._on_complete` on its finisher thread; it reads
the completion's result and version, frees the completion, and passes them to the loop
with ``call_soon_threadsafe`` (thread-safe by contract); it touches nothing else. The
loop side (:meth:`AioClient._completed`) finds the read's buffer and calls its
``done``. Every read ends: librados fails an operation after ``rados_osd_op_timeout``
(which the connection always sets, :func:`~shuttle.store.rados_conn.bound_waits`) with
``ETIMEDOUT``; :meth:`AioClient.close` waits for the reads in flight before it shuts
the client down, so no callback comes after.
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
from collections.abc import Callable
from typing import Any

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

    def __init__(self, pool: str, namespace: str, options: CephOptions) -> None:
        self.lib = lib = load_librados()
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

    def read(
        self, key: str, offset: int, length: int, done: Done, loop: asyncio.AbstractEventLoop
    ) -> bool:
        """Start reading ``length`` bytes of ``key`` at ``offset``; ``done`` is called on
        ``loop`` (the running one) when RADOS answers. False: not started (closed, or
        librados refused it), and ``done`` will not be called."""
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
            with self._lock:
                found = self._pending.get(key)
                self._in_librados -= 1
                self._quiet.notify_all()
            if found is not None:
                found[2].call_soon_threadsafe(self._completed, key, rv, version)
        except RuntimeError:  # the loop is closed: nobody waits for this read any more
            pass
        except Exception:  # never let an error escape into librados's thread
            log.exception("asynchronous RADOS read completion failed")

    def _completed(self, token: int, rv: int, version: int) -> None:
        """On the loop: hand the read's bytes (or its error) to its ``done``."""
        with self._lock:
            found = self._pending.pop(token, None)
        if found is None:
            return
        buf, done, _loop = found
        if rv < 0:
            self.errors += 1
        done(rv, version, ctypes.string_at(buf, rv) if rv > 0 else b"")

    def in_flight(self) -> int:
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
            if not self._quiet.wait_for(
                lambda: self._in_librados == 0, self.op_timeout_s + CLOSE_MARGIN_S
            ):
                log.warning("%d asynchronous RADOS reads had no answer at close", self._in_librados)
        lib = self.lib
        lib.rados_ioctx_destroy(self._io)
        lib.rados_shutdown(self._cluster)
