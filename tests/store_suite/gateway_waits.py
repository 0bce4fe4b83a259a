"""RADOS gateways in the store suite: two on a fresh namespace, a condition polled to
a deadline, and whether a gateway trusts its cache (so warm reads need no ``stat``)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator

from shuttle.cluster.ceph import LocalCeph
from shuttle.store import StoreConfig
from shuttle.store.rados import RadosStore
from shuttle.store.rados_conn import CephOptions


def two_gateways(
    ceph: LocalCeph, config: StoreConfig, prefix: str
) -> Iterator[tuple[RadosStore, RadosStore]]:
    """Two gateways on a fresh namespace (``prefix`` + random hex), closed after use:
    the body of a module-scoped fixture."""
    info = ceph.info()
    opts = CephOptions(info.conf_path, info.keyring_path, op_timeout_s=20)
    namespace = f"{prefix}{secrets.token_hex(6)}"
    a = RadosStore(info.pool, namespace=namespace, config=config, ceph=opts)
    try:
        b = RadosStore(info.pool, namespace=namespace, config=config, ceph=opts)
    except BaseException:
        a.close()
        raise
    try:
        yield a, b
    finally:
        b.close()
        a.close()


def wait_until(cond: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """Poll ``cond`` until it holds; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {timeout_s:g} s")
        time.sleep(0.02)


def trusting(s: RadosStore) -> bool:
    """Its watch is healthy and its probation over: warm reads need no stat."""
    return s.coherence.trusted() and time.monotonic() > s.coherence.trust_from
