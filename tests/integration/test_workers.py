"""A node of two processes (``shuttle serve --workers 2``) keeps every guarantee of one:
a write through either process is seen through the other, breaks the callback
promises held through the other and waits for their acks, a session ends with its
connection wherever it landed, and a SIGKILL of the primary takes its worker with it
and loses nothing acknowledged."""

from __future__ import annotations

import os
import select
import signal
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import shuttle
from shuttle.errors import (
    AuthenticationError,
    InvalidArgumentError,
    NotFoundError,
    NotPermittedError,
    UnreachableError,
    VersionMismatchError,
)
from shuttle.net import certs
from shuttle.net.auth import load_key_file, write_key_file
from shuttle.net.blocking import BlockingConnection
from shuttle.net.principals import Caps, Principal, PrincipalTable, derive_key
from shuttle.net.tls import ClientTls
from shuttle.node.worker_restarts import RESTART_DELAY_S_MIN
from tests.integration.nodeproc import NodeProcess
from tests.integration.wire_helpers import Relay, keyed_tls_node

#: New connections tried before giving up on landing one on a given process (the
#: kernel picks by a hash of the client's port: each try is a coin toss).
TRIES_MAX = 200
#: How long a condition the node reaches on its own may take on a loaded machine.
DEADLINE_S = 20.0


def _two_process_node(data_dir: Path) -> Iterator[NodeProcess]:
    """A node of two processes; stopped with SIGTERM after the test, which must stop
    both (the primary's exit status 0, the worker gone)."""
    proc = NodeProcess(data_dir, extra=["--workers", "2"]).start()
    conn = BlockingConnection("127.0.0.1", proc.port)
    pids = conn.call("node.stats").result.get("workers", {}).get("pids", [])
    conn.close()
    yield proc
    if proc.proc is not None and proc.proc.poll() is not None:
        return  # the test killed it
    status = proc.terminate()
    assert status == 0, f"node exited with {status}; log:\n{proc.log.read_text()[-3000:]}"
    for pid in pids:
        _until(lambda p=pid: _gone(p), f"process {pid} of the node stopped")


def _process_of(conn: BlockingConnection) -> int:
    """0: the connection landed on the primary; i: on worker i."""
    return int(conn.call("ping").result.get("worker", 0))


def _connect_to(
    node: NodeProcess, process: int, key: bytes | None = None, tls: ClientTls | None = None
) -> BlockingConnection:
    """A connection that the kernel handed to ``process`` of the node."""
    for _ in range(TRIES_MAX):
        conn = BlockingConnection("127.0.0.1", node.port, request_timeout_s=30, key=key, tls=tls)
        if _process_of(conn) == process:
            return conn
        conn.close()
    raise AssertionError(f"no connection landed on process {process} in {TRIES_MAX} tries")


@pytest.fixture(scope="module")
def shared2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """One two-process node for the tests that leave it running (each its own keys)."""
    yield from _two_process_node(tmp_path_factory.mktemp("workers") / "node")


@pytest.fixture
def node2(tmp_path: Path) -> Iterator[NodeProcess]:
    """A two-process node of the test's own (one it kills)."""
    yield from _two_process_node(tmp_path / "node")


@pytest.fixture
def both(shared2: NodeProcess) -> Iterator[tuple[BlockingConnection, BlockingConnection]]:
    """(a connection to the primary, one to the worker)."""
    primary, worker = _connect_to(shared2, 0), _connect_to(shared2, 1)
    yield primary, worker
    primary.close()
    worker.close()


def _read(conn: BlockingConnection, key: str) -> bytes:
    return bytes(conn.call("read", {"key": key, "offset": 0, "length": 1 << 16}).payload)


def _served_by_worker(conn: BlockingConnection) -> int:
    return int(conn.call("node.stats").result["worker"]["reads"]["served"])


def _until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {DEADLINE_S:g} s: {what}")
        time.sleep(0.01)


def test_every_write_through_either_process_is_seen_through_the_other(
    both: tuple[BlockingConnection, BlockingConnection],
) -> None:
    primary, worker = both
    primary.call("put", {"key": "k"}, b"one" * 1000)
    # The worker learns the object from the primary, then answers reads itself.
    _until(
        lambda: _read(worker, "k") == b"one" * 1000 and _served_by_worker(worker) > 0,
        "the worker answers reads of k itself",
    )
    served = _served_by_worker(worker)
    primary.call("put", {"key": "k"}, b"uno" * 1000)  # as long: only the bytes differ
    assert _read(worker, "k") == b"uno" * 1000
    primary.call("put", {"key": "k"}, b"uno" * 1000 + b"!")  # a byte longer
    assert _read(worker, "k") == b"uno" * 1000 + b"!"
    primary.call("remove", {"key": "k"})
    primary.call("put", {"key": "k"}, b"eins" * 750 + b"!")  # a new file, as long
    assert _read(worker, "k") == b"eins" * 750 + b"!"
    primary.call("put", {"key": "k"}, b"two" * 10)  # shorter
    assert _read(worker, "k") == b"two" * 10
    primary.call("write", {"key": "k", "offset": 0}, b"TWO")  # in place
    assert _read(worker, "k") == b"TWOtwo" + b"two" * 8
    worker.call("put", {"key": "k"}, b"three")  # through the worker, to the primary
    assert _read(worker, "k") == b"three"
    assert _read(primary, "k") == b"three"
    _until(
        lambda: _read(worker, "k") == b"three" and _served_by_worker(worker) > served,
        "the worker answers the new contents itself",
    )
    primary.call("remove", {"key": "k"})
    with pytest.raises(NotFoundError):
        _read(worker, "k")


def _wait_breaks(conn: BlockingConnection, session: str, into: list[Any]) -> None:
    into.append(conn.call("callback.wait", {"session": session, "ack": 0, "timeout_s": 15}).result)


@pytest.mark.parametrize("holder_on", ["worker", "primary"])
def test_a_write_through_one_process_breaks_the_promises_held_through_the_other(
    both: tuple[BlockingConnection, BlockingConnection], holder_on: str
) -> None:
    primary, worker = both
    holder, writer = (worker, primary) if holder_on == "worker" else (primary, worker)
    writer.call("put", {"key": "k"}, b"v1")
    session = holder.call("callback.open").result["session"]
    grant = holder.call("callback.promise", {"key": "k", "session": session}).result
    assert grant["promise"] is not None
    done: list[Any] = []
    put = threading.Thread(
        target=lambda: done.append(writer.call("put", {"key": "k"}, b"v2").result), daemon=True
    )
    put.start()
    breaks: list[Any] = []
    _wait_breaks(holder, session, breaks)  # the long poll delivers the break
    assert [b[0] for b in breaks[0]["breaks"]] == ["k"]
    assert not done  # the write waits for the holder's ack
    holder.call("callback.wait", {"session": session, "ack": breaks[0]["seq"], "timeout_s": 0})
    put.join(DEADLINE_S)
    assert done, "the write did not complete after the ack"
    assert _read(worker, "k") == b"v2" and _read(primary, "k") == b"v2"
    assert holder.call("callback.close", {"session": session}).result == {"closed": True}


def test_a_session_opened_through_the_worker_ends_with_its_connection(
    shared2: NodeProcess, both: tuple[BlockingConnection, BlockingConnection]
) -> None:
    primary, _ = both

    def sessions_open() -> int:
        c = primary.call("node.stats").result["callbacks"]
        return int(c["sessions_opened"] - c["sessions_closed"])

    _until(lambda: sessions_open() == 0, "no session is left from an earlier test")
    primary.call("put", {"key": "k"}, b"v1")
    holder = _connect_to(shared2, 1)
    session = holder.call("callback.open").result["session"]
    holder.call("callback.promise", {"key": "k", "session": session})
    assert sessions_open() == 1
    holder.close()  # the client goes away: its session at the primary ends too
    _until(lambda: sessions_open() == 0, "the session ended with its connection")
    primary.call("put", {"key": "k"}, b"v2")  # nobody to wait for
    assert _read(primary, "k") == b"v2"


def test_when_the_primary_idles_out_an_upstream_the_client_hears_goodbye(
    tmp_path: Path,
) -> None:
    node = NodeProcess(tmp_path / "node", extra=["--workers", "2", "--idle-timeout", "1"]).start()
    try:
        conn = _connect_to(node, 1)
        conn.call("put", {"key": "k"}, b"v1")  # forwarded: the upstream opens
        assert conn.counters.connects == 1
        sock = conn._sock
        assert sock is not None
        # The client idles; the primary closes the idle upstream after a second, and
        # the worker says goodbye to the client (which owns nothing there either).
        _until(
            lambda: bool(select.select([sock], [], [], 0.05)[0]),
            "the worker said goodbye to the idle client",
        )
        # A goodbye says no request was lost: even a put is sent again, on a new
        # connection (which may land on either process).
        conn.call("put", {"key": "k"}, b"v2")
        assert conn.counters.connects == 2
        assert _read(conn, "k") == b"v2"
        conn.close()
    finally:
        assert node.terminate() == 0


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def test_a_sigkill_of_the_primary_takes_its_worker_and_loses_nothing(
    node2: NodeProcess,
) -> None:
    worker = _connect_to(node2, 1)
    pids = worker.call("node.stats").result["worker"]
    for i in range(20):  # acknowledged through the worker
        worker.call("put", {"key": f"k{i}"}, b"%d" % i * 100)
    worker.close()
    node2.kill()
    _until(lambda: _gone(pids["pid"]), "the worker died with its primary")
    node2.start()  # the same data directory: the old worker no longer holds its lock
    again = _connect_to(node2, 1)
    try:
        for i in range(20):
            assert _read(again, f"k{i}") == b"%d" % i * 100
    finally:
        again.close()


def _connect_as(node: NodeProcess, process: int, key: bytes, principal: str) -> Any:
    """A connection as ``principal`` that the kernel handed to ``process`` (``ping``,
    which any principal may call, says which process answers)."""
    for _ in range(TRIES_MAX):
        conn = BlockingConnection("127.0.0.1", node.port, key=key, principal=principal)
        if conn.call("ping").result.get("worker", 0) == process:
            return conn
        conn.close()
    raise AssertionError(f"no connection landed on process {process} in {TRIES_MAX} tries")


def test_principals_act_through_a_worker_within_their_caps_until_removed(
    tmp_path: Path,
) -> None:
    key = write_key_file(tmp_path / "cluster.key")
    node = NodeProcess(
        tmp_path / "node", extra=["--workers", "2", "--key-file", str(tmp_path / "cluster.key")]
    ).start()
    try:
        admin = BlockingConnection("127.0.0.1", node.port, key=key)
        admin.call("put", {"key": "a/x"}, b"for alice")
        admin.call("put", {"key": "b/x"}, b"not for alice")
        table = PrincipalTable.from_wire(admin.call("principals.get").result["table"], "test")
        alice = Principal("alice", Caps.of(read=["a/"]), os.urandom(16), 0)
        added = table.with_principal(alice)
        admin.call("principals.put", {"table": added.to_wire(), "expected_epoch": table.epoch})
        alice_key = derive_key(key, alice)
        conn = _connect_as(node, 1, alice_key, "alice")  # on the worker
        _until(
            lambda: _read(conn, "a/x") == b"for alice" and _worker_served(node, key) > 0,
            "the worker answers alice's reads itself",
        )
        with pytest.raises(NotPermittedError):
            _read(conn, "b/x")  # refused by the worker's own check
        with pytest.raises(NotPermittedError):
            conn.call("put", {"key": "a/y"}, b"no")  # refused by the primary, as alice
        # Removed: when the change returns, the worker has dropped alice too.
        admin.call(
            "principals.put",
            {"table": added.without("alice").to_wire(), "expected_epoch": added.epoch},
        )
        with pytest.raises((AuthenticationError, UnreachableError)):
            conn.call("read", {"key": "a/x", "offset": 0, "length": 9}, idempotent=False)
        conn.close()
        for _ in range(20):  # whichever process takes it refuses it
            again = BlockingConnection("127.0.0.1", node.port, key=alice_key, principal="alice")
            with pytest.raises(AuthenticationError, match="knows no principal 'alice'"):
                again.call("ping")
            again.close()
        admin.close()
    finally:
        assert node.terminate() == 0


def _worker_served(node: NodeProcess, key: bytes) -> int:
    for _ in range(TRIES_MAX):
        conn = BlockingConnection("127.0.0.1", node.port, key=key)
        try:
            stats = conn.call("node.stats").result
        finally:
            conn.close()
        if "worker" in stats:
            return int(stats["worker"]["reads"]["served"])
    raise AssertionError("no connection landed on the worker")


def test_a_stat_through_the_worker_is_answered_there_as_the_primary_answers_it(
    both: tuple[BlockingConnection, BlockingConnection],
) -> None:
    primary, worker = both

    def stat(conn: BlockingConnection, **args: Any) -> Any:
        return conn.call("stat", {"key": "s", **args}).result

    def stats_served() -> int:
        return int(worker.call("node.stats").result["worker"]["reads"]["stats_served"])

    primary.call("put", {"key": "s"}, b"one")
    _until(
        lambda: stat(worker) == stat(primary) and stats_served() > 0,
        "the worker answers stats of s itself",
    )
    for args in ({}, {"chunks_max": 0}, {"chunks_max": 1}):
        assert stat(worker, **args) == stat(primary, **args)
    served = stats_served()
    primary.call("put", {"key": "s"}, b"four")  # never the old answer after the change
    assert stat(worker) == stat(primary) and stat(worker)["size"] == 4
    _until(
        lambda: stat(worker) == stat(primary) and stats_served() > served,
        "the worker answers the new attributes itself",
    )
    # What the primary refuses, the worker refuses in the same words (it sends it on).
    version = stat(primary)["version"]
    with pytest.raises(VersionMismatchError):
        stat(worker, expected_version=version + 1)
    with pytest.raises(InvalidArgumentError, match="chunks_max"):
        stat(worker, chunks_max=-1)
    primary.call("remove", {"key": "s"})
    with pytest.raises(NotFoundError):
        stat(worker)


def _workers(conn: BlockingConnection) -> dict[str, Any]:
    """The primary's ``workers`` stats (``conn`` landed on the primary)."""
    out: dict[str, Any] = conn.call("node.stats").result["workers"]
    return out


def test_a_worker_killed_is_started_again_and_its_clients_are_not_left_hanging(
    node2: NodeProcess,
) -> None:
    primary = _connect_to(node2, 0)
    primary.call("put", {"key": "k"}, b"v1")
    victim = _connect_to(node2, 1)
    pid = int(victim.call("node.stats").result["worker"]["pid"])
    # What a client of the worker has at the primary: a callback session with a promise.
    session = victim.call("callback.open").result["session"]
    assert victim.call("callback.promise", {"key": "k", "session": session}).result["promise"]
    _until(
        lambda: _read(victim, "k") == b"v1" and _served_by_worker(victim) > 0,
        "the worker answers reads of k itself",
    )
    sock = victim._sock
    assert sock is not None
    os.kill(pid, signal.SIGKILL)  # an OOM kill, a crash
    # The client's connection is closed, not left open with nobody behind it...
    _until(lambda: bool(select.select([sock], [], [], 0.05)[0]), "the client sees its socket close")
    # The kernel closes a dying process's descriptors one by one: its client's socket can
    # close before its listening one, and a connection made in between lands in that
    # listener's queue and is reset with it. The primary counts the death once the
    # process is reaped, all of it closed (the reset was seen once in a clean-clone CI run).
    _until(lambda: _workers(primary)["deaths"] == 1, "the primary saw the worker die")
    # ...and a read is sent again on a new connection, as after any node restart.
    assert _read(victim, "k") == b"v1" and victim.counters.connects == 2
    # Nothing of its client stays at the primary: the session ended, and a write waits
    # for no promise of it (it would wait for the callback term, 30 s).
    callbacks = primary.call("node.stats").result["callbacks"]
    _until(
        lambda: (lambda c: c["sessions_opened"] == c["sessions_closed"])(
            primary.call("node.stats").result["callbacks"]
        ),
        f"the dead worker's client's session ended (was {callbacks})",
    )
    primary.call("put", {"key": "k"}, b"v2")
    # The primary starts it again, says so, and counts it.
    _until(
        lambda: _workers(primary)["restarts"] == 1 and _workers(primary)["alive"] == 2,
        "the worker was started again",
    )
    workers = _workers(primary)
    assert workers["deaths"] == 1 and workers["start_failures"] == 0
    assert (
        workers["last_death"] == f"worker 1 (pid {pid}) killed by SIGKILL (an OOM kill or kill -9)"
    )
    assert [(p["index"], p["state"], p["restarts"]) for p in workers["processes"]] == [
        (1, "serving", 1)
    ]
    log = node2.log.read_text()
    assert f"worker 1 (pid {pid}) killed by SIGKILL" in log and "worker 1 started again" in log
    # New connections land on the new worker too, and it reads and writes for them.
    fresh = _connect_to(node2, 1)
    assert int(fresh.call("node.stats").result["worker"]["pid"]) not in (pid, 0)
    fresh.call("put", {"key": "k2"}, b"through the new worker")
    _until(
        lambda: _read(fresh, "k2") == b"through the new worker" and _served_by_worker(fresh) > 0,
        "the new worker answers reads itself",
    )
    assert _read(fresh, "k") == b"v2"
    for conn in (primary, victim, fresh):
        conn.close()


def test_a_worker_that_cannot_start_is_tried_again_later_each_time_until_it_can(
    tmp_path: Path,
) -> None:
    key_file = tmp_path / "cluster.key"
    key = write_key_file(key_file)
    node = NodeProcess(tmp_path / "node", extra=["--workers", "2", "--key-file", str(key_file)])
    node.start()
    try:
        primary = _connect_to(node, 0, key=key)
        pid = _workers(primary)["processes"][0]["pid"]
        moved = key_file.rename(tmp_path / "moved.key")  # a new worker cannot read the key
        os.kill(pid, signal.SIGKILL)
        _until(lambda: _workers(primary)["start_failures"] >= 2, "two failed starts")
        workers = _workers(primary)
        assert workers["alive"] == 1 and workers["restarts"] == 0 and workers["deaths"] == 1
        assert workers["processes"][0]["restart_delay_s"] >= 4 * RESTART_DELAY_S_MIN  # backing off
        log = node.log.read_text()
        assert "worker 1 stopped:" in log and str(key_file) in log  # the worker's own error
        assert "before it listened (its error is above); starting it again in" in log
        for _ in range(5):  # meanwhile every new connection is served (by the primary)
            conn = BlockingConnection("127.0.0.1", node.port, key=key)
            conn.call("put", {"key": "k"}, b"served")
            conn.close()
        moved.rename(key_file)  # fixed: the next try starts it
        _until(lambda: _workers(primary)["alive"] == 2, "the worker started once it could")
        assert _workers(primary)["restarts"] == 1
        conn = _connect_to(node, 1, key=key)
        assert _read(conn, "k") == b"served"
        conn.close()
        primary.close()
    finally:
        assert node.terminate() == 0


def test_tls_clients_are_served_by_both_processes_and_each_refuses_what_the_primary_does(
    tmp_path: Path,
) -> None:
    node, pki, key_file = keyed_tls_node(tmp_path, "--workers", "2")
    try:
        key = load_key_file(key_file)
        tls = ClientTls(pki.ca.cert)
        primary, worker = _connect_to(node, 0, key, tls), _connect_to(node, 1, key, tls)
        worker.call("put", {"key": "k"}, b"over tls")  # on to the primary, over TLS too
        _until(
            lambda: _read(worker, "k") == b"over tls" and _served_by_worker(worker) > 0,
            "the worker answers TLS clients' reads itself",
        )
        server_stats = [c.call("node.stats").result["server"] for c in (primary, worker)]
        assert [s["tls"] for s in server_stats] == [True, True]

        def refused(counter: str) -> list[int]:
            return [int(c.call("node.stats").result["server"][counter]) for c in (primary, worker)]

        # A key proof relayed from another TLS channel, whichever process takes it.
        evil = certs.make_node_cert(pki.ca, tmp_path / "evil", "evil", "127.0.0.1")
        for _ in range(TRIES_MAX):
            if min(refused("auth_failures")) > 0:
                break
            relay = Relay(pki, evil, node.port)
            with (
                pytest.raises(AuthenticationError, match="relayed from another TLS channel"),
                shuttle.connect(
                    node=f"127.0.0.1:{relay.port}", key_file=key_file, tls=True, ca_file=pki.ca.cert
                ) as c,
            ):
                c.stat("anything")
            assert relay.finished.wait(10), "the relay did not see both ends close"
        assert min(refused("auth_failures")) > 0, "both processes refused a relayed proof"
        # A client that does not trust the node's certificate (another CA) refuses it
        # (OpenSSL's own client, which says so with an alert), and so does one that
        # does not speak TLS: whichever process the connection lands on counts the
        # failed handshake and serves nothing.
        stranger = ssl.create_default_context(cafile=str(certs.make_ca(tmp_path / "x").cert))
        for _ in range(TRIES_MAX):
            if min(refused("tls_failures")) > 1:
                break
            with (
                pytest.raises(ssl.SSLCertVerificationError),
                socket.create_connection(("127.0.0.1", node.port)) as raw,
            ):
                stranger.wrap_socket(raw, server_hostname="127.0.0.1")
            with socket.create_connection(("127.0.0.1", node.port)) as raw:
                raw.sendall(b"SH" + bytes(62))  # a plain client's first bytes
                raw.settimeout(DEADLINE_S)
                while raw.recv(1 << 16):  # the process closes the connection
                    pass
        assert min(refused("tls_failures")) > 1, "both processes refused both handshakes"
        primary.close()
        worker.close()
    finally:
        assert node.terminate() == 0
