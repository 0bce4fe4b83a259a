"""The RADOS store's connection to a Ceph cluster: configuration, bounded waits, one
I/O context per thread, and librados errors turned into Shuttle's.

librados (``import rados``: Debian's ``python3-rados``, linked into the venv by
``scripts/setup-ceph.sh``) is imported only when a RADOS store is opened, so a node
without Ceph installed never needs it.

Two pitfalls shape this module:

* I/O to a pool whose placement groups are not active waits forever by default.
  Every operation here is bounded: ``rados_osd_op_timeout`` and
  ``rados_mon_op_timeout`` make librados fail an operation with ETIMEDOUT after
  :data:`OP_TIMEOUT_S_DEFAULT`, and :class:`StorageIOError` then says what to check.
* Each librados client opens an admin socket; two processes (or two clients in one)
  with the same path fight over it. Unless the configuration names one, each client
  gets its own path, made unique by Ceph's ``$pid`` and ``$cctid`` metavariables.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from shuttle.cluster.cephclient import import_rados
from shuttle.errors import ConfigError, NotFoundError, StorageIOError
from shuttle.store.keys import no_object

#: Seconds an OSD or monitor operation may take before it fails. A healthy cluster
#: answers in milliseconds; 30 s rides out an OSD restart and peering (which takes a
#: few seconds) while still failing, instead of hanging, on a pool whose PGs stay down.
OP_TIMEOUT_S_DEFAULT = 30.0

#: Seconds to reach the monitors and authenticate when the store opens.
CONNECT_TIMEOUT_S_DEFAULT = 20.0

#: Reads longer than this are split into pieces read in parallel with aio (a streaming
#: read then keeps several OSDs busy instead of one round trip at a time).
PIPELINE_PIECE_BYTES = 4 << 20
#: Pieces in flight at once: 8 x 4 MiB keeps a few OSDs busy without holding much.
PIPELINE_DEPTH = 8

#: Seconds between librados's pings of a watch (rados_watch relies on it).
WATCH_PING_INTERVAL_S = 1.0

#: Where librados looks for its configuration when neither a path nor $CEPH_CONF names one.
DEFAULT_CONF_PATH = "/etc/ceph/ceph.conf"

#: The cephx user, as Ceph's own tools default to it.
CEPH_USER_DEFAULT = "client.admin"


@dataclass(frozen=True)
class CephOptions:
    """How to reach the cluster. None means Ceph's own conventions: ``$CEPH_CONF`` or
    ``/etc/ceph/ceph.conf``, and the keyring that configuration names (by default
    ``/etc/ceph/$cluster.$name.keyring`` and its siblings)."""

    conf_path: Path | None = None
    keyring_path: Path | None = None
    user: str = CEPH_USER_DEFAULT
    #: Seconds before an OSD or mon operation fails (None: the configuration's
    #: ``rados osd op timeout`` if it sets one, else :data:`OP_TIMEOUT_S_DEFAULT`).
    op_timeout_s: float | None = None
    connect_timeout_s: float = CONNECT_TIMEOUT_S_DEFAULT

    def __post_init__(self) -> None:
        if (
            self.op_timeout_s is not None and self.op_timeout_s <= 0
        ) or self.connect_timeout_s <= 0:
            raise ConfigError("Ceph timeouts must be > 0 seconds")
        for what, path in (("--ceph-conf", self.conf_path), ("--ceph-keyring", self.keyring_path)):
            if path is not None and not path.is_file():
                raise ConfigError(f"{what} {path} is not a readable file; give the right path")


class RadosConnection:
    """A connected librados client and an I/O context per thread on one pool (and
    namespace). ``ioctx()`` is per thread because ``get_last_version`` (how a RADOS
    store learns an object's version) reports the last operation of its context."""

    def __init__(self, pool: str, namespace: str, options: CephOptions) -> None:
        self.rados = import_rados()
        self.pool = pool
        self.namespace = namespace
        self.options = options
        try:
            cluster = self.rados.Rados(name=options.user)
            if options.conf_path is not None:
                cluster.conf_read_file(str(options.conf_path))
            else:
                cluster.conf_read_file()  # $CEPH_CONF, /etc/ceph/ceph.conf, ~/.ceph/config
            bound_waits(cluster, options)
            if options.keyring_path is not None:
                cluster.conf_set("keyring", str(options.keyring_path))
            # Our own admin socket, unique per process ($pid) and per client ($cctid),
            # in the directory the configuration puts sockets in if it exists.
            sock_dir = os.path.dirname(cluster.conf_get("admin_socket") or "")
            if not sock_dir or not os.path.isdir(sock_dir):
                sock_dir = tempfile.gettempdir()
            cluster.conf_set(
                "admin_socket", os.path.join(sock_dir, "shuttle-$cluster-$name.$pid.$cctid.asok")
            )
            cluster.connect(timeout=int(options.connect_timeout_s))
        except self.rados.Error as exc:
            raise ConfigError(
                f"cannot connect to the Ceph cluster as {options.user} "
                f"(conf {options.conf_path or 'from $CEPH_CONF or /etc/ceph/ceph.conf'}, "
                f"keyring {options.keyring_path or 'from the conf'}): {exc}. Check that the "
                "monitors run (`ceph -s`) and that --ceph-conf and --ceph-keyring are right"
            ) from exc
        self.cluster = cluster
        #: The bound on each operation, as librados applies it.
        self.op_timeout_s = float(cluster.conf_get("rados_osd_op_timeout"))
        if not cluster.pool_exists(pool):
            cluster.shutdown()
            raise ConfigError(
                f"Ceph pool {pool!r} does not exist. Create it (`ceph osd pool create {pool}`) "
                "or name another with --store rados:POOL"
            )
        self._local = threading.local()
        self._lock = threading.Lock()
        self._ioctxs: list[Any] = []
        self._closed = False
        #: Reads waiting on RADOS now (:meth:`reading`), and the most there have been at
        #: once: how many reads of a stream the node really keeps in flight.
        self.reads_in_flight = 0
        self.reads_in_flight_peak = 0

    def ioctx(self) -> Any:
        """This thread's I/O context on the pool and namespace."""
        ctx = getattr(self._local, "ioctx", None)
        if ctx is None:
            if self._closed:
                raise StorageIOError("the RADOS store is closed. Open it again.")
            ctx = self.cluster.open_ioctx(self.pool)
            ctx.set_namespace(self.namespace)
            self._local.ioctx = ctx
            with self._lock:
                self._ioctxs.append(ctx)
        return ctx

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Count one read in flight while the block runs (see :meth:`stats`)."""
        with self._lock:
            self.reads_in_flight += 1
            self.reads_in_flight_peak = max(self.reads_in_flight_peak, self.reads_in_flight)
        try:
            yield
        finally:
            with self._lock:
                self.reads_in_flight -= 1

    def where(self) -> dict[str, str | None]:
        """How this node reaches its cluster, for code that runs on the node and calls
        the OSDs itself (``osdgrep``): the configuration file (the one librados read:
        ``--ceph-conf``, else ``$CEPH_CONF``, else ``/etc/ceph/ceph.conf``), the keyring
        named (None: the configuration's) and the cephx user."""
        options = self.options
        conf = options.conf_path or os.environ.get("CEPH_CONF") or DEFAULT_CONF_PATH
        return {
            "ceph_conf": str(conf),
            "ceph_keyring": str(options.keyring_path) if options.keyring_path else None,
            "ceph_user": options.user,
        }

    def stats(self) -> dict[str, int]:
        """Reads in flight now, and the most there have been at once."""
        with self._lock:
            return {
                "reads_in_flight": self.reads_in_flight,
                "reads_in_flight_peak": self.reads_in_flight_peak,
            }

    def close(self, *, shutdown: bool = True) -> None:
        """Close the I/O contexts and disconnect. ``shutdown=False`` leaves librados
        connected (its threads end with the process): for a client whose watch could
        not be unregistered, which librados's shutdown would abort on."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            ctxs, self._ioctxs = self._ioctxs, []
        for ctx in ctxs:
            ctx.close()
        if shutdown:
            self.cluster.shutdown()


#: librados errors meaning "the object's version is not the one asserted" (ERANGE: it
#: is newer; EOVERFLOW: older) or "it exists" (an exclusive create).
VERSION_ERRNOS = frozenset({errno.ERANGE, errno.EOVERFLOW, errno.EEXIST})


def error_errno(exc: BaseException) -> int | None:
    """The errno of a librados error (positive), if it carries one."""
    code = getattr(exc, "errno", None)
    return abs(code) if isinstance(code, int) else None


def raise_storage_error(what: str, exc: BaseException, timeout_s: float) -> NoReturn:
    """Raise the Shuttle error for a librados failure of ``what``."""
    code = error_errno(exc)
    if code == errno.ENOENT:
        raise NotFoundError(f"{what}: no such object. Check the key, or list its prefix.") from exc
    if code == errno.ETIMEDOUT:
        raise StorageIOError(timed_out_message(what, timeout_s)) from exc
    raise StorageIOError(f"{what} failed in RADOS: {exc}") from exc


def timed_out_message(what: str, timeout_s: float) -> str:
    """What a RADOS operation that timed out tells the user."""
    return (
        f"{what}: RADOS did not answer within {timeout_s:g} s. Its placement groups may "
        "not be active (an OSD down, the pool below min_size): check `ceph -s` and "
        "`ceph health detail`. A change that timed out may or may not have been applied: stat "
        "the object before retrying it"
    )


def bound_waits(cluster: Any, options: CephOptions) -> None:
    """Bound every wait: the configuration's op timeouts if it sets them, else ours
    (an explicit ``options.op_timeout_s`` wins either way)."""
    for name in ("rados_osd_op_timeout", "rados_mon_op_timeout"):
        have = float(cluster.conf_get(name) or 0)
        if options.op_timeout_s is not None or have <= 0:
            cluster.conf_set(name, f"{options.op_timeout_s or OP_TIMEOUT_S_DEFAULT:g}")
    cluster.conf_set("client_mount_timeout", f"{options.connect_timeout_s:g}")
    # Ping watches every second (Ceph: every 5 s), so the watch timeout of the gateways'
    # cache coherence (rados_watch.WATCH_TIMEOUT_S) can be short.
    cluster.conf_set("objecter_tick_interval", f"{WATCH_PING_INTERVAL_S:g}")


def read_pieces(io: Any, key: str, offset: int, n: int, timeout_s: float) -> bytes:
    """``n`` bytes of ``key`` at ``offset`` (fewer at its end), read as aio pieces of
    :data:`PIPELINE_PIECE_BYTES`, :data:`PIPELINE_DEPTH` at a time; every wait bounded.
    The pieces may come from different versions: the caller checks the version."""
    pieces: dict[int, bytes] = {}
    errors: list[int] = []
    done = threading.Condition()
    starts = list(range(offset, offset + n, PIPELINE_PIECE_BYTES))
    # librados fails each piece after the op timeout; the margin covers the callbacks.
    deadline = time.monotonic() + timeout_s + 5
    inflight = [0]

    def on_done(start: int) -> Callable[[Any, bytes], None]:
        def cb(completion: Any, data: bytes) -> None:
            with done:
                rv = completion.get_return_value()
                if rv < 0:
                    errors.append(-rv)
                pieces[start] = bytes(data or b"")
                inflight[0] -= 1
                done.notify_all()

        return cb

    def wait(cond: Callable[[], bool]) -> None:
        if not done.wait_for(cond, max(0.0, deadline - time.monotonic())):
            raise StorageIOError(
                f"read of {key!r}: RADOS did not answer within {timeout_s:g} s; its "
                "placement groups may not be active: check `ceph health detail`"
            )

    for start in starts:
        with done:
            wait(lambda: inflight[0] < PIPELINE_DEPTH)
            inflight[0] += 1
        io.aio_read(key, min(PIPELINE_PIECE_BYTES, offset + n - start), start, on_done(start))
    with done:
        wait(lambda: inflight[0] == 0)
    if errors:
        if errno.ENOENT in errors:
            raise no_object(key)
        raise StorageIOError(f"read of {key!r} failed in RADOS: {os.strerror(errors[0])}")
    return b"".join(pieces[s] for s in starts)
