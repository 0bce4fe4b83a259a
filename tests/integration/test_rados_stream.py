"""Streaming from a node on the RADOS store (docs/ceph.md, "Streaming"): the node keeps
a stream's reads in flight together (``EXECUTING_MAX_RADOS`` per connection, in a
pool of ``EXECUTOR_THREADS_RADOS``), every piece of the version the client streams; an
OSD killed mid-stream costs the stream nothing, and reads of a pool whose placement
groups are not active fail with a clear error within the node's op timeout.

The blocked reads come from a real pool made inactive: ``min_size`` 3 of 3 OSDs with
one stopped; setting ``min_size`` back to 2 lets them finish."""

from __future__ import annotations

import json
import os
import re
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import shuttle
from shuttle.cluster.ceph import LocalCeph
from shuttle.cluster.cephclient import mon_command
from shuttle.errors import StorageIOError, VersionMismatchError
from shuttle.net.admission import EXECUTING_MAX_RADOS
from tests.integration.nodeproc import NodeProcess

PIECE_BYTES = 1 << 20
WINDOW = 8
#: The short op timeout of the node whose reads must fail in bounded time.
HASTY_OP_TIMEOUT_S = 3


@pytest.fixture(scope="module")
def pool(ceph: LocalCeph) -> Iterator[str]:
    """A pool of its own (size 3, min_size 2), so making it inactive touches no other test."""
    name = f"stream-{secrets.token_hex(3)}"
    ceph.create_pool(name, size=3, min_size=2, pg_num=8)
    ceph.wait_active(name)
    try:
        yield name
    finally:
        ceph.delete_pool(name)


def _node(ceph: LocalCeph, pool: str, root: Path, op_timeout_s: int | None) -> NodeProcess:
    info = ceph.info()
    conf = info.conf_path
    if op_timeout_s is not None:  # the same conf with a shorter `rados osd op timeout`
        conf = root / "ceph.conf"
        text, n = re.subn(
            r"(?m)^rados osd op timeout = .*$",
            f"rados osd op timeout = {op_timeout_s}",
            info.conf_path.read_text(),
        )
        assert n == 1, "the local Ceph's conf no longer sets rados osd op timeout"
        conf.write_text(text)
    extra = ["--store", f"rados:{pool}", "--ceph-conf", str(conf)]
    extra += ["--ceph-keyring", str(info.keyring_path), "--cache-bytes", "0"]
    return NodeProcess(root / "node", extra=extra).start()


@pytest.fixture(scope="module")
def patient(
    ceph: LocalCeph, pool: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NodeProcess]:
    """A node on ``pool`` with the local Ceph's op timeout (30 s)."""
    proc = _node(ceph, pool, tmp_path_factory.mktemp("patient"), None)
    try:
        yield proc
    finally:
        proc.terminate()


@pytest.fixture(scope="module")
def hasty(
    ceph: LocalCeph, pool: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NodeProcess]:
    """A node on ``pool`` whose RADOS operations time out after 3 s."""
    proc = _node(ceph, pool, tmp_path_factory.mktemp("hasty"), HASTY_OP_TIMEOUT_S)
    try:
        yield proc
    finally:
        proc.terminate()


def _client(node: NodeProcess) -> shuttle.Client:
    return shuttle.connect(
        node=node.address,
        cache_bytes=0,
        piece_bytes=PIECE_BYTES,
        window=WINDOW,
        request_timeout_s=60,
    )


def _min_size(ceph: LocalCeph, pool: str, n: int) -> None:
    mon_command(ceph.admin(), prefix="osd pool set", pool=pool, var="min_size", val=str(n))


def _rados_stats(c: shuttle.Client) -> dict[str, int]:
    stats: dict[str, int] = c.node_stats(c.nodes[0])["store"]["rados"]
    return stats


def _primary_osd(ceph: LocalCeph, pool: str, key: str) -> int:
    out = json.loads(mon_command(ceph.admin(), prefix="osd map", pool=pool, object=key))
    return int(out["acting_primary"])


def test_a_rados_node_keeps_a_whole_window_of_reads_in_flight(
    ceph: LocalCeph, pool: str, patient: NodeProcess
) -> None:
    """The client's 8 reads wait on RADOS at once (a file node would run 2): the
    pool is made inactive so they stay there long enough to count them."""
    data = os.urandom(WINDOW * PIECE_BYTES)
    with _client(patient) as c, _client(patient) as watcher:
        c.put("window/obj", data)
        info = c.stat("window/obj")
        got: list[bytes] = []
        failed: list[BaseException] = []

        def stream() -> None:
            try:
                got.append(b"".join(bytes(p) for p in c.iter_read("window/obj", info=info)))
            except BaseException as exc:  # reported by the test below
                failed.append(exc)

        reader = threading.Thread(target=stream)
        _min_size(ceph, pool, 3)
        ceph.stop_osd(2)
        try:
            reader.start()
            deadline = time.monotonic() + 15
            seen = 0
            while time.monotonic() < deadline and seen < EXECUTING_MAX_RADOS:
                seen = _rados_stats(watcher)["reads_in_flight"]
                time.sleep(0.05)
            assert seen == EXECUTING_MAX_RADOS == WINDOW, (
                f"{seen} reads in flight on the node, expected {EXECUTING_MAX_RADOS}"
            )
        finally:
            _min_size(ceph, pool, 2)  # the PGs go active on two OSDs: the reads finish
            reader.join(60)
            ceph.start_osd(2)
        assert not failed, failed
        assert got == [data]
        assert _rados_stats(watcher)["reads_in_flight"] == 0


def test_an_osd_killed_mid_stream_costs_the_stream_nothing(
    ceph: LocalCeph, pool: str, patient: NodeProcess
) -> None:
    """Kill the object's primary OSD after a few pieces: librados resends the reads in
    flight to the new primary, and the stream ends with every byte, well inside the
    op timeout."""
    data = os.urandom(32 * PIECE_BYTES)
    with _client(patient) as c:
        c.put("kill/obj", data)
        primary = _primary_osd(ceph, pool, "kill/obj")
        got = bytearray()
        t0 = time.monotonic()
        try:
            for piece in c.iter_read("kill/obj"):
                got += piece
                if len(got) == 4 * PIECE_BYTES:
                    ceph.stop_osd(primary)
        finally:
            if primary not in ceph.pids:
                ceph.start_osd(primary)
        assert bytes(got) == data
        assert time.monotonic() - t0 < 30


def test_reads_of_a_pool_with_inactive_pgs_fail_within_the_op_timeout(
    ceph: LocalCeph, pool: str, hasty: NodeProcess
) -> None:
    data = os.urandom(4 * PIECE_BYTES)
    with _client(hasty) as c:
        c.put("inactive/obj", data)
        _min_size(ceph, pool, 3)
        ceph.stop_osd(2)
        try:
            # The mon has osd.2 down, but the primary may serve reads until it has the
            # new map itself (under CI's load a whole stream once did): read until the
            # pool refuses, each attempt timed on its own.
            deadline = time.monotonic() + 60
            while True:
                t0 = time.monotonic()
                try:
                    for _piece in c.iter_read("inactive/obj"):
                        pass
                except StorageIOError as exc:
                    caught = exc
                    elapsed = time.monotonic() - t0
                    break
                assert time.monotonic() < deadline, "reads still served 60 s after osd.2 down"
                time.sleep(0.2)  # polls Ceph's state, as wait_osds_up does
        finally:
            _min_size(ceph, pool, 2)
            ceph.start_osd(2)
        message = str(caught)
        assert f"did not answer within {HASTY_OP_TIMEOUT_S} s" in message
        assert "ceph health detail" in message  # says what to check
        assert HASTY_OP_TIMEOUT_S - 0.5 < elapsed < HASTY_OP_TIMEOUT_S + 10
        assert bytes(b"".join(bytes(p) for p in c.iter_read("inactive/obj"))) == data


def test_a_stream_that_races_writes_is_of_one_version_or_fails(
    patient: NodeProcess,
) -> None:
    """Pieces read 8 at a time while another client rewrites the object: each stream
    is one version's bytes, whole, or fails with VersionMismatchError."""
    versions = [bytes([i]) * (16 * PIECE_BYTES) for i in range(1, 4)]
    with _client(patient) as c, _client(patient) as writer_client:
        c.put("race/obj", versions[0])
        stop = threading.Event()
        writes = [0]

        def writer() -> None:
            i = 0
            while not stop.is_set():
                i += 1
                writer_client.put("race/obj", versions[i % len(versions)])
                writes[0] += 1

        t = threading.Thread(target=writer)
        t.start()
        outcomes = {"whole": 0, "mismatch": 0}
        try:
            deadline = time.monotonic() + 60
            while (writes[0] < 5 or sum(outcomes.values()) < 10) and time.monotonic() < deadline:
                try:
                    got = b"".join(bytes(p) for p in c.iter_read("race/obj"))
                except VersionMismatchError as exc:
                    assert "race/obj" in str(exc) and "is at version" in str(exc)
                    outcomes["mismatch"] += 1
                    continue
                if got not in versions:
                    pytest.fail(f"a stream mixed versions: it holds bytes {sorted(set(got))}")
                outcomes["whole"] += 1
        finally:
            stop.set()
            t.join(60)
        assert writes[0] >= 5 and sum(outcomes.values()) >= 10, (writes, outcomes)


def test_a_stream_of_a_version_already_replaced_fails_naming_the_new_one(
    patient: NodeProcess,
) -> None:
    with _client(patient) as c:
        c.put("stale/obj", b"a" * (3 * PIECE_BYTES))
        old = c.stat("stale/obj")
        new = c.put("stale/obj", b"b" * (3 * PIECE_BYTES))
        with pytest.raises(VersionMismatchError, match=f"is at version {new.version}"):
            list(c.iter_read("stale/obj", info=old))
