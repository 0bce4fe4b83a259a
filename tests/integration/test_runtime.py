"""The run-time against real node processes on 127.0.0.1: placements give grep's
answers, migration keeps state, failures leave objects where they were, stale hints
are corrected through the home, and shipped code is contained."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shuttle.apps.grep import run_grep
from shuttle.client.client import Client
from shuttle.client.model import NodeAddress
from shuttle.errors import (
    MigrationError,
    NotPermittedError,
    ObjectFailedError,
    ObjectLimitError,
)
from shuttle.net.auth import write_key_file
from shuttle.net.profiles import parse_link_profile
from shuttle.runtime.client import Runtime
from shuttle.runtime.config import RuntimeConfig
from shuttle.runtime.mobile import MobileObject
from tests.integration.nodeproc import NodeProcess, shuttle_cli

#: Limits of shipped objects on the test nodes: small, so that a runaway is stopped fast.
SANDBOX = ["--sandbox-cpu", "1", "--sandbox-memory", str(256 << 20), "--sandbox-wall", "30"]


class Nodes:
    """Two keyed nodes and what a client needs to reach them."""

    def __init__(self, tmp: Path) -> None:
        self.key_file = tmp / "cluster.key"
        self.key = write_key_file(self.key_file)
        self.procs = [
            NodeProcess(tmp / f"n{i}", extra=["--key-file", str(self.key_file), *SANDBOX]).start()
            for i in (1, 2)
        ]

    def addresses(self, link: str | None = None) -> list[NodeAddress]:
        profile = parse_link_profile(link) if link else None
        return [NodeAddress(p.data_dir.name, "127.0.0.1", p.port, profile) for p in self.procs]

    def client(self) -> Client:
        return Client(self.addresses(), key=self.key)

    def runtime(self, link: str | None = None, **config: Any) -> Runtime:
        return Runtime(self.addresses(link), key=self.key, config=RuntimeConfig(**config))


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Nodes]:
    n = Nodes(tmp_path)
    yield n
    for p in n.procs:
        p.terminate()


def corpus(tmp: Path) -> dict[str, bytes]:
    """Text files with matches spread over blocks and a final line without newline."""
    files = {}
    for i in range(6):
        lines = [
            (
                f"ERROR {i}.{n} disk full"
                if n % 37 == 0
                else f"line {n} of file {i} " + "z" * (n % 50)
            )
            for n in range(1, 900 + 300 * i)
        ]
        files[f"logs/f{i}.txt"] = ("\n".join(lines) + ("\n" if i % 2 else "")).encode()
    for key, data in files.items():
        path = tmp / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def grep_n(tmp: Path, pattern: str, keys: list[str]) -> list[tuple[str, int, bytes]]:
    """What GNU grep prints for the same bytes (``-H -n``), parsed."""
    out = subprocess.run(
        ["grep", "-H", "-n", "-E", pattern, *keys], cwd=tmp, capture_output=True, check=False
    ).stdout
    parsed = []
    for line in out.splitlines():
        key, n, text = line.split(b":", 2)
        parsed.append((key.decode(), int(n), text))
    return sorted(parsed)


@pytest.mark.parametrize("placement", ["client", "server", "auto"])
def test_grep_gives_grep_s_matches_in_every_placement(
    nodes: Nodes, tmp_path: Path, placement: str
) -> None:
    files = corpus(tmp_path)
    with nodes.client() as client:
        for key, data in files.items():
            client.put(key, data)
    got: list[tuple[str, int, bytes]] = []
    with nodes.runtime(link="lan" if placement == "auto" else None) as rt:
        result = run_grep(
            rt,
            "ERROR [0-9.]+ disk",
            sorted(files),
            placement=placement,
            block_bytes=4096,
            batch_bytes=8192,
            on_matches=lambda ms: got.extend((k, n, t) for k, n, t in ms),
        )
    assert sorted(got) == grep_n(tmp_path, "ERROR [0-9.]+ disk", sorted(files))
    assert result.matches == len(got)
    where = set(result.initial.values())
    assert where == (
        {"client"} if placement != "server" else {f"server ({n})" for n in result.initial}
    )


def test_a_grep_migrated_mid_stream_gives_the_same_output(nodes: Nodes, tmp_path: Path) -> None:
    files = corpus(tmp_path)
    keys = sorted(files)
    with nodes.client() as client:
        for key, data in files.items():
            client.put(key, data)
        node = client.node_for(keys[0]).node_id
        mine = [k for k in keys if client.node_for(k).node_id == node]

    def scan(rt: Runtime, moves: dict[int, str]) -> list[Any]:
        grep = rt.create(
            "grep",
            pattern="ERROR|1[0-9]",
            storage=rt.storage(node),
            keys=mine,
            block_bytes=1000,
            batch_bytes=1000,
            placement="static",
        )
        out: list[Any] = []
        with rt.console("t"):
            done, call = False, 0
            while not done:
                if call in moves:
                    rt.migrate(grep, moves[call])
                done, matches = grep.next()
                out += matches
                call += 1
        return out

    with nodes.runtime() as rt:
        plain = scan(rt, {})
        moved = scan(rt, {3: node, 4: "client", 9: node, 30: "client", 31: node})
    assert moved == plain and len(plain) > 100


class Counter(MobileObject):
    """A shipped class: a counter whose restore can be made slow or failing."""

    def __init__(self, marker: str = "", fail_restore: bool = False) -> None:
        self.n = 0
        self.marker = marker
        self.fail_restore = fail_restore

    def add(self, k: int) -> int:
        self.n += k
        return self.n

    def restore(self, data: bytes) -> None:
        super().restore(data)
        if self.fail_restore:
            raise RuntimeError("cannot restore here")
        if self.marker:
            # Say so where the test can see it from outside the jail: the process's name.
            ctypes.CDLL(None).prctl(PR_SET_NAME, self.marker.encode())
            time.sleep(60)  # long enough for the test to kill the node meanwhile


#: ``prctl`` option: set the calling thread's name (``/proc/PID/comm``).
PR_SET_NAME = 15


def wait_for_process_named(name: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        for comm in Path("/proc").glob("[0-9]*/comm"):
            try:
                if comm.read_text().strip() == name:
                    return
            except OSError:
                continue
        assert time.monotonic() < deadline, f"no process named {name} appeared"
        time.sleep(0.01)


def test_target_killed_mid_migration_leaves_the_object_running_with_its_state(
    nodes: Nodes, tmp_path: Path
) -> None:
    marker = f"restoring{os.getpid() % 100000}"  # a jailed object cannot touch our files
    with nodes.runtime() as rt:
        counter = rt.create(Counter, marker=marker)
        assert counter.add(5) == 5
        outcome: list[BaseException] = []

        def move() -> None:
            try:
                rt.migrate(counter, "n1")
            except BaseException as exc:
                outcome.append(exc)

        mover = threading.Thread(target=move)
        mover.start()
        wait_for_process_named(marker)  # the target is restoring the checkpoint
        nodes.procs[0].kill()
        mover.join(60)
        assert len(outcome) == 1 and isinstance(outcome[0], MigrationError)
        assert "keeps running" in str(outcome[0])
        assert rt.where(counter) == rt.id
        assert counter.add(1) == 6  # state intact, still serving here


def test_a_restore_that_raises_leaves_the_object_at_the_source(nodes: Nodes) -> None:
    with nodes.runtime() as rt:
        counter = rt.create(Counter, fail_restore=True)
        counter.add(2)
        with pytest.raises(MigrationError, match="cannot restore here"):
            rt.migrate(counter, "n2")
        assert rt.where(counter) == rt.id
        assert counter.add(1) == 3


def test_a_stale_location_hint_is_corrected_through_the_home(nodes: Nodes) -> None:
    with nodes.runtime() as home, nodes.runtime() as other:
        counter = home.create(Counter, at="n1")
        stranger = other.bm.ref(counter.rid, counter.home_address)
        assert stranger.add(1) == 1  # `other` learns the hint n1 from the home
        assert other.bm.table.where(counter.rid) == "n1"
        home.migrate(counter, "n2")  # n1 moves it and tells the home; no forwarding kept
        locates = home._server.counters.by_op["object.locate"]
        assert stranger.add(1) == 2  # n1: not here, ask home; home: n2
        assert other.bm.table.where(counter.rid) == "n2"
        assert home._server.counters.by_op["object.locate"] == locates + 1


def test_a_node_without_a_key_refuses_shipped_code(tmp_path: Path) -> None:
    proc = NodeProcess(tmp_path / "open").start()
    try:
        address = NodeAddress("open", "127.0.0.1", proc.port)
        with Runtime([address]) as rt:
            with pytest.raises(NotPermittedError, match=r"without a cluster key.*--key-file"):
                rt.create(Counter, at="open")
            grep = rt.create("grep", at="open", pattern="x", storage=rt.storage("open"), keys=[])
            assert grep.next() == [True, []]  # built-in objects still run there
    finally:
        proc.terminate()


class Runaway(MobileObject):
    def spin(self) -> None:
        while True:
            pass

    def hog(self) -> int:
        blocks = [bytearray(64 << 20) for _ in range(64)]  # 4 GiB
        return len(blocks)

    def fail(self) -> None:
        raise ValueError("bad input")

    def ping(self) -> str:
        return "pong"


def test_shipped_code_over_its_limits_is_stopped_while_the_node_serves_others(
    nodes: Nodes,
) -> None:
    with nodes.runtime() as rt, nodes.client() as client:
        failing = rt.create(Runaway, at="n1")
        with pytest.raises(ObjectFailedError, match=r"\.fail raised ValueError: bad input"):
            failing.fail()
        assert failing.ping() == "pong"  # an exception does not stop the object
        hog = rt.create(Runaway, at="n1")
        with pytest.raises(ObjectLimitError, match="memory limit"):
            hog.hog()
        spinner = rt.create(Runaway, at="n1")
        errors: list[BaseException] = []
        spinning = threading.Thread(target=lambda: _capture(errors, spinner.spin))
        spinning.start()
        key = next(k for k in (f"k{i}" for i in range(100)) if client.node_for(k).node_id == "n1")
        for i in range(20):  # the node keeps serving while the object spins
            client.put(key, b"%d" % i)
            assert client.get(key) == b"%d" % i
        spinning.join(30)
        assert len(errors) == 1 and isinstance(errors[0], ObjectLimitError)
        assert "CPU limit of 1 s" in str(errors[0])
        with pytest.raises(ObjectLimitError, match="stopped earlier"):
            spinner.ping()


def _capture(errors: list[BaseException], fn: Any) -> None:
    try:
        fn()
    except BaseException as exc:
        errors.append(exc)


def test_auto_placement_moves_a_selective_grep_and_the_tools_show_it(
    nodes: Nodes, tmp_path: Path
) -> None:
    """Over a 10 Mbit/s link a grep that passes almost nothing belongs at the node:
    the node's resource manager moves it, logs why, and the commands show it."""
    big = b"".join(b"line %d %s\n" % (i, b"q" * 60) for i in range(40_000))  # 2.7 MB
    with nodes.client() as client:
        client.put("big.txt", big)
        node = client.node_for("big.txt").node_id
    with nodes.runtime(link="lan") as rt:
        result = run_grep(rt, "line 12345 ", ["big.txt"], placement="auto")
    assert result.matches == 1
    assert [m["direction"] for m in result.migrations] == ["to_server"]
    assert result.final == {node: f"server ({node})"}
    env = {"SHUTTLE_KEY_FILE": str(nodes.key_file)}
    address = next(p.address for p in nodes.procs if p.data_dir.name == node)
    log = shuttle_cli("placement", "log", "--node", address, env=env)
    assert log.returncode == 0, log.stderr
    assert b"MOVE" in log.stdout and b"to_server" in log.stdout
    logged = (tmp_path / node / ".shuttle" / "runtime" / "placement.jsonl").read_text()
    assert logged
    # The client's digests carry the share of its CPUs busy: the node weighs whether
    # its clients' CPUs are full (docs/runtime.md, "The clients' saturation").
    seen = [v for line in logged.splitlines() for v in json.loads(line)["nodes"].values()]
    clients = [v["cpus_busy"] for v in seen if "cpus_busy" in v]
    assert clients and all(0 <= busy <= 1 for busy in clients)
    objects = shuttle_cli("objects", "--node", address, env=env)
    assert objects.returncode == 0, objects.stderr
    assert b"moved" in objects.stdout


def test_shuttle_grep_command_prints_key_line_text_and_writes_its_report(
    nodes: Nodes, tmp_path: Path
) -> None:
    files = corpus(tmp_path)
    with nodes.client() as client:
        for key, data in files.items():
            client.put(key, data)
    address = nodes.procs[0].address
    only = [k for k in sorted(files) if nodes.client().node_for(k).node_id == "n1"]
    env = {"SHUTTLE_KEY_FILE": str(nodes.key_file)}
    report = tmp_path / "grep.json"
    before = time.monotonic()
    done = shuttle_cli(
        "grep",
        "disk full",
        *only,
        "--node",
        address,
        "--placement",
        "server",
        "--json-out",
        str(report),
        env=env,
    )
    assert done.returncode == 0, done.stderr
    expected = b"".join(
        b"%s:%d:%s\n" % (k.encode(), n, t) for k, n, t in grep_n(tmp_path, "disk full", only)
    )
    assert sorted(done.stdout.splitlines()) == sorted(expected.splitlines())
    import json

    data = json.loads(report.read_text())
    assert data["initial_placement"] == {"n1": "server (n1)"}
    # What the timer held: the object made (the dial in it), then each console call:
    # ``next`` until done and ``progress``, all within the elapsed time.
    phases = data["phases"]["n1"]
    assert len(phases["calls_s"]) >= 2 and phases["made_s"] > 0
    assert phases["made_s"] + sum(phases["calls_s"]) <= data["elapsed_s"]
    # The timer's start on the machine's monotonic clock (a node's CPU trace is on it
    # too), and the client's own CPU over the timer.
    assert before < data["started_monotonic_s"] < time.monotonic() - data["elapsed_s"]
    assert data["process_cpu_s"] > 0.0
    none = shuttle_cli("grep", "no such text", only[0], "--node", address, env=env)
    assert none.returncode == 1 and none.stdout == b""
