"""The stores a node can serve, by name: ``local`` (objects as files under the node's
data directory) and ``rados:POOL[/NAMESPACE]`` (objects in a Ceph RADOS pool, shared
by every node opened on it). ``shuttle serve --store SPEC`` takes these specs; the
storage test suite runs over every entry of :data:`STORES`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from shuttle.errors import ConfigError
from shuttle.store.config import StoreConfig
from shuttle.store.interface import Store
from shuttle.store.objects import ObjectStore
from shuttle.store.rados_conn import CephOptions

#: RADOS pool names: what ``ceph osd pool create`` accepts in practice (no '/', which
#: separates the namespace here).
_POOL = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


@dataclass(frozen=True)
class StoreSpec:
    """A parsed ``--store`` value."""

    kind: str
    pool: str = ""
    namespace: str = ""

    def __str__(self) -> str:
        if self.kind == "local":
            return "local"
        return f"rados:{self.pool}" + (f"/{self.namespace}" if self.namespace else "")

    @property
    def shared(self) -> bool:
        """Several nodes may serve this store at once (any node serves any key)."""
        return self.kind == "rados"


def parse_store_spec(text: str) -> StoreSpec:
    """``local`` or ``rados:POOL[/NAMESPACE]``; ConfigError naming the forms otherwise."""
    if text in ("", "local"):
        return StoreSpec("local")
    kind, sep, rest = text.partition(":")
    if kind == "rados" and sep:
        pool, _, namespace = rest.partition("/")
        if _POOL.match(pool) and "/" not in namespace:
            return StoreSpec("rados", pool, namespace)
    raise ConfigError(
        f"--store {text!r} is not a store; use 'local' (files under --data) or "
        "'rados:POOL' (a Ceph pool; optionally 'rados:POOL/NAMESPACE')"
    )


#: ``open(spec, data_dir, config, ceph)`` for each kind of store.
Opener = Callable[[StoreSpec, Path, StoreConfig, CephOptions], Store]


def _open_local(spec: StoreSpec, data_dir: Path, config: StoreConfig, ceph: CephOptions) -> Store:
    return ObjectStore(data_dir, config)


def _open_rados(spec: StoreSpec, data_dir: Path, config: StoreConfig, ceph: CephOptions) -> Store:
    from shuttle.store.rados import RadosStore  # librados is loaded only when asked

    return RadosStore(spec.pool, namespace=spec.namespace, config=config, ceph=ceph)


STORES: dict[str, Opener] = {"local": _open_local, "rados": _open_rados}


def open_store(
    spec: StoreSpec | str,
    data_dir: Path,
    config: StoreConfig | None = None,
    ceph: CephOptions | None = None,
) -> Store:
    """Open the store ``spec`` names. ``data_dir`` holds a local store's objects; with
    RADOS it is only the node's local state (its run-time's logs)."""
    s = parse_store_spec(spec) if isinstance(spec, str) else spec
    return STORES[s.kind](s, data_dir, config or StoreConfig(), ceph or CephOptions())
