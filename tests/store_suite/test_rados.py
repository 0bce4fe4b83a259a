"""What only the RADOS store has to get right: its ``--store`` spec, its own admin
socket per client, and bounded waits on a pool whose placement groups are not active."""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import pytest

from shuttle.cluster.ceph import LocalCeph
from shuttle.errors import ConfigError, StorageIOError
from shuttle.store.rados import RadosStore
from shuttle.store.rados_conn import CephOptions
from shuttle.store.registry import StoreSpec, parse_store_spec


def test_store_specs() -> None:
    assert parse_store_spec("local") == StoreSpec("local")
    assert parse_store_spec("rados:shuttle") == StoreSpec("rados", "shuttle", "")
    assert parse_store_spec("rados:p/ns") == StoreSpec("rados", "p", "ns")
    assert str(parse_store_spec("rados:p/ns")) == "rados:p/ns"
    assert parse_store_spec("rados:p").shared and not parse_store_spec("local").shared
    for bad in ["rados:", "rados", "s3:bucket", "rados:a/b/c", "rados:p q"]:
        with pytest.raises(ConfigError, match="rados:POOL"):
            parse_store_spec(bad)


def _options(ceph: LocalCeph, op_timeout_s: float | None = None) -> CephOptions:
    info = ceph.info()
    return CephOptions(info.conf_path, info.keyring_path, op_timeout_s=op_timeout_s)


def test_missing_pool_and_bad_paths_are_config_errors(ceph: LocalCeph, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        RadosStore("no-such-pool", ceph=_options(ceph))
    with pytest.raises(ConfigError, match="--ceph-conf"):
        CephOptions(tmp_path / "missing.conf")


def test_each_client_has_its_own_admin_socket(ceph: LocalCeph) -> None:
    a = RadosStore(ceph.info().pool, ceph=_options(ceph))
    b = RadosStore(ceph.info().pool, ceph=_options(ceph))
    try:
        sa = a.conn.cluster.conf_get("admin_socket")
        sb = b.conn.cluster.conf_get("admin_socket")
        assert sa != sb and "shuttle-" in sa
    finally:
        a.close()
        b.close()


def test_io_to_a_pool_with_inactive_pgs_fails_in_bounded_time(ceph: LocalCeph) -> None:
    """min_size 3 of 3 OSDs: with one down, no PG of the pool is active."""
    pool = f"inactive-{secrets.token_hex(3)}"
    ceph.create_pool(pool, size=3, min_size=3, pg_num=8)
    store = RadosStore(pool, ceph=_options(ceph, op_timeout_s=3))
    try:
        store.put("k", b"before")
        ceph.stop_osd(2)
        t0 = time.monotonic()
        with pytest.raises(StorageIOError, match="did not answer within 3 s"):
            store.put("k", b"during")
        assert time.monotonic() - t0 < 15
        # Whether the put's first step is a stat or the announcement to the other
        # gateways depends on whether its cache was trusted: the announcement, too,
        # says RADOS did not answer (not that a watcher was late) and gives up at once.
        t0 = time.monotonic()
        with pytest.raises(StorageIOError, match="did not answer within 3 s"):
            store.coherence.announce("k", 2)
        assert time.monotonic() - t0 < 15
    finally:
        ceph.start_osd(2)
        store.close()
        ceph.delete_pool(pool)


def test_a_record_of_the_old_chunking_is_rechunked_in_memory(ceph: LocalCeph) -> None:
    """A pool written before chunks came in size classes: a format-1 record's chunk
    list is recomputed from the object (and kept by version), never served as it is."""
    import msgpack

    from shuttle.store.chunking import chunk_buffer

    store = RadosStore(ceph.info().pool, namespace=f"t{secrets.token_hex(6)}", ceph=_options(ceph))
    try:
        data = secrets.token_bytes(20_000)
        put = store.put("old.py", data)
        io = store.conn.ioctx()
        rec = msgpack.unpackb(dict(io.get_xattrs("old.py"))["shuttle.attrs"], raw=False)
        rec["fmt"] = 1
        rec["chunk_lengths"] = len(data).to_bytes(4, "little")  # one chunk, as before
        rec["chunk_hashes"] = rec["hash"]
        io.set_xattr("old.py", "shuttle.attrs", msgpack.packb(rec, use_bin_type=True))
        got = store.stat("old.py")
        assert list(got.chunks) == chunk_buffer(data) and len(got.chunks) > 5
        assert (got.hash, got.mtime_ns) == (put.hash, put.mtime_ns)
        assert store.stat("old.py").chunks == got.chunks
        assert store.stats()["objects_rechunked"] == 1  # the second stat: from memory
    finally:
        store.close()
