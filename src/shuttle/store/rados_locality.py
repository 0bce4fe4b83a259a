"""Where a key's RADOS object lives: the primary OSD of its placement group and that
OSD's CRUSH host, so that gateway nodes can prefer the keys whose primary OSD sits on
their own host (docs/ceph.md, "Nodes that are gateways").

librados's Python binding has no object-location call. The placement group of an
object is computed here, as Ceph computes it: the pool's hash (rjenkins, Ceph's
``ceph_str_hash_rjenkins``) of ``NAMESPACE + "\\x1f" + KEY`` (just ``KEY`` without a
namespace), folded onto the pool's ``pg_num`` by ``ceph_stable_mod``. The PG's acting
primary comes from the mon command ``osd map`` (asked for the first key met in each
PG, then cached), and the OSD's host from ``osd tree`` (the CRUSH ``host`` bucket
above it). So locating keys costs one mon round trip per PG per OSD map epoch, not
one per key: a pool of 128 PGs is fully known after 128 round trips (under 1 ms each
here), and every later key is a hash and a dict lookup.

The OSD map epoch is checked (``osd stat``) at most every :data:`EPOCH_CHECK_S`; when
it changed (an OSD died or came back, CRUSH changed, the pool was split) the PG and
host caches are dropped and rebuilt. Every mon command waits at most
``timeout_s`` seconds.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shuttle.errors import InvalidArgumentError, StorageIOError

#: Seconds between two checks of the OSD map epoch: a primary that moved (an OSD
#: died) is noticed within this long; a check is one small mon round trip.
EPOCH_CHECK_S = 1.0

#: Keys one ``locate`` call takes (its answer is a host name per key).
LOCATE_KEYS_MAX = 4096

#: The pool's ``object_hash`` for rjenkins (Ceph's ``CEPH_STR_HASH_RJENKINS``).
_RJENKINS = 2

_M = 0xFFFFFFFF


def default_host() -> str:
    """This machine's name as Ceph names its CRUSH host: the short host name (what an
    OSD puts itself under when it starts, ``osd crush update on start``)."""
    return socket.gethostname().split(".", 1)[0]


def _mix(a: int, b: int, c: int) -> tuple[int, int, int]:
    a = ((a - b - c) & _M) ^ (c >> 13)
    b = ((b - c - a) & _M) ^ ((a << 8) & _M)
    c = ((c - a - b) & _M) ^ (b >> 13)
    a = ((a - b - c) & _M) ^ (c >> 12)
    b = ((b - c - a) & _M) ^ ((a << 16) & _M)
    c = ((c - a - b) & _M) ^ (b >> 5)
    a = ((a - b - c) & _M) ^ (c >> 3)
    b = ((b - c - a) & _M) ^ ((a << 10) & _M)
    c = ((c - a - b) & _M) ^ (b >> 15)
    return a, b, c


def rjenkins(data: bytes) -> int:
    """Ceph's ``ceph_str_hash_rjenkins`` (Bob Jenkins' lookup2) of ``data``."""
    a = b = 0x9E3779B9
    c = 0
    i, left = 0, len(data)
    while left >= 12:
        a = (a + int.from_bytes(data[i : i + 4], "little")) & _M
        b = (b + int.from_bytes(data[i + 4 : i + 8], "little")) & _M
        c = (c + int.from_bytes(data[i + 8 : i + 12], "little")) & _M
        a, b, c = _mix(a, b, c)
        i += 12
        left -= 12
    tail = data[i:]
    c = (c + len(data)) & _M
    a = (a + int.from_bytes(tail[0:4], "little")) & _M
    b = (b + int.from_bytes(tail[4:8], "little")) & _M
    c = (c + (int.from_bytes(tail[8:11], "little") << 8)) & _M  # byte 0 of c: the length
    return _mix(a, b, c)[2]


def stable_mod(x: int, b: int) -> int:
    """Ceph's ``ceph_stable_mod``: ``x`` folded onto ``b`` buckets so that growing
    ``b`` moves few values."""
    mask = (1 << (b - 1).bit_length()) - 1
    return x & mask if (x & mask) < b else x & (mask >> 1)


def placement_seed(key: str, namespace: str, pg_num: int) -> int:
    """The PG number (``ps``) of ``key`` in a pool of ``pg_num`` PGs hashed with rjenkins."""
    name = key.encode()
    if namespace:
        name = namespace.encode() + b"\x1f" + name
    return stable_mod(rjenkins(name), pg_num)


@dataclass(frozen=True)
class Located:
    """Where keys live: per key, its PG's acting primary OSD (-1: none) and that OSD's
    CRUSH host (None: no host bucket above it, or no primary)."""

    epoch: int
    osds: list[int]
    hosts: list[str | None]


class PrimaryLocator:
    """Locates keys of one pool and namespace on a connected ``rados.Rados``
    (see the module docstring). Thread-safe."""

    def __init__(
        self,
        cluster: Any,
        pool: str,
        namespace: str = "",
        *,
        host: str | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self.cluster = cluster
        self.pool = pool
        self.namespace = namespace
        #: This node's CRUSH host (``--ceph-host``, else :func:`default_host`).
        self.host = host or default_host()
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._epoch = -1
        self._checked_s = float("-inf")
        self._pool_id = -1
        self._pg_num = 0
        self._rjenkins = True
        self._pg_primary: dict[int, int] = {}
        self._osd_host: dict[int, str] = {}
        #: Mon commands sent, and keys located (for the node's stats).
        self.mon_commands = 0
        self.keys_located = 0

    def _mon(self, prefix: str, **args: Any) -> Any:
        cmd = json.dumps({"prefix": prefix, "format": "json", **args})
        self.mon_commands += 1
        try:
            ret, out, errs = self.cluster.mon_command(
                cmd, b"", timeout=max(1, round(self.timeout_s))
            )
        except Exception as exc:  # librados raises its own error classes
            raise StorageIOError(
                f"locating keys: the Ceph monitors did not answer `ceph {prefix}` ({exc}); "
                "check `ceph -s`"
            ) from exc
        if ret != 0:
            raise StorageIOError(
                f"locating keys: `ceph {prefix}` failed ({ret}: {errs}). If it timed out "
                f"(after {self.timeout_s:g} s), check that the monitors have quorum (`ceph -s`)"
            )
        return json.loads(out)

    def _refresh(self) -> None:
        """Check the OSD map epoch (at most every EPOCH_CHECK_S); on a change, reload
        the pool's PG count and the OSDs' hosts and forget the PGs' primaries."""
        now = time.monotonic()
        if now - self._checked_s < EPOCH_CHECK_S:
            return
        epoch = int(self._mon("osd stat")["epoch"])
        self._checked_s = now
        if epoch == self._epoch:
            return
        dump = self._mon("osd dump")
        pool = next((p for p in dump["pools"] if p["pool_name"] == self.pool), None)
        if pool is None:
            raise StorageIOError(f"Ceph pool {self.pool!r} is gone; the node cannot serve it")
        tree = self._mon("osd tree")
        hosts = {}
        for node in tree["nodes"]:
            if node.get("type") == "host":
                for child in node.get("children", ()):
                    hosts[int(child)] = str(node["name"])
        self._pool_id = int(pool["pool"])
        self._pg_num = int(pool["pg_num"])
        self._rjenkins = int(pool.get("object_hash", _RJENKINS)) == _RJENKINS
        self._osd_host = hosts
        self._pg_primary = {}
        self._epoch = int(dump["epoch"])

    def _osd_map(self, key: str) -> tuple[int, int]:
        """The PG number and acting primary of ``key`` from the monitors."""
        out = self._mon("osd map", pool=self.pool, object=key, nspace=self.namespace)
        ps = int(str(out["pgid"]).split(".", 1)[1], 16)
        return ps, int(out.get("acting_primary", -1))

    def locate(self, keys: Sequence[str]) -> Located:
        """Each key's primary OSD and its host (one mon round trip per PG not yet known
        in this epoch; none for the others)."""
        if len(keys) > LOCATE_KEYS_MAX:
            raise InvalidArgumentError(
                f"locate takes at most {LOCATE_KEYS_MAX} keys, got {len(keys)}; split them"
            )
        with self._lock:
            self._refresh()
            osds: list[int] = []
            for key in keys:
                if not self._rjenkins:  # not Ceph's default hash: ask for every key
                    osds.append(self._osd_map(key)[1])
                    continue
                ps = placement_seed(key, self.namespace, self._pg_num)
                primary = self._pg_primary.get(ps)
                if primary is None:
                    mapped, primary = self._osd_map(key)
                    if mapped != ps:
                        raise StorageIOError(
                            f"key {key!r}: Ceph puts it in PG {mapped:x}, this node computed "
                            f"{ps:x}; the pool's hashing is not Ceph's default (report this)"
                        )
                    self._pg_primary[ps] = primary
                osds.append(primary)
            self.keys_located += len(keys)
            return Located(self._epoch, osds, [self._osd_host.get(o) for o in osds])

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "host": self.host,
                "epoch": self._epoch,
                "pgs_known": len(self._pg_primary),
                "pg_num": self._pg_num,
                "mon_commands": self.mon_commands,
                "keys_located": self.keys_located,
            }
