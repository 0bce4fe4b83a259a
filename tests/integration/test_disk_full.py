"""A real node on a small file system: it fills, refuses with a clear "disk full", is
emptied through removes, restarts while full, and loses nothing it acknowledged.
Also: an 8 GiB extending truncate and its recovery are quick, and the node's maximum
object size is refused with an error naming the limit and the flag."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import shuttle
from shuttle.errors import DiskFullError, LimitExceededError
from tests.integration.nodeproc import NodeProcess, shuttle_cli

#: The file system of the issue's report: about 10 MiB of objects fit in it before.
FS_BYTES = 20 * 1024 * 1024
OBJECT_BYTES = 64 * 1024


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 20 MiB tmpfs made for this test (needs root: mount)."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={FS_BYTES}", "tmpfs", str(mnt)],
        capture_output=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill_outside_shuttle(path: Path) -> int:
    """Take every free byte of the file system with a file Shuttle does not know,
    as a log or another program would; returns the bytes taken."""
    taken = 0
    block = b"\xff" * 4096
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        while True:
            try:
                taken += os.write(fd, block)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                return taken
    finally:
        os.close(fd)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_full_disk_refuses_clearly_empties_by_removes_and_restarts(
    small_fs: Path, tmp_path: Path
) -> None:
    node = NodeProcess(small_fs / "data", side_dir=tmp_path).start()
    acked: dict[str, str] = {}
    try:
        with shuttle.connect(node=node.address, request_timeout_s=60) as c:
            # Fill with puts until the node refuses: a typed, clear error, not a poison.
            with pytest.raises(DiskFullError, match="disk is full") as refused:
                for i in range(FS_BYTES // OBJECT_BYTES):
                    data = os.urandom(OBJECT_BYTES)
                    c.put(f"obj/{i}", data)
                    acked[f"obj/{i}"] = digest(data)
            assert "Remove objects" in str(refused.value)
            # The journal's second copy of small puts no longer halves the capacity.
            assert len(acked) * OBJECT_BYTES > 0.75 * FS_BYTES, len(acked)

            # The command line says the same, with its own exit status (a bigger object:
            # the refusal leaves less than one put's estimate free, not nothing).
            blob = tmp_path / "blob"
            blob.write_bytes(os.urandom(2 << 20))
            cli = shuttle_cli("put", str(blob), "more", "--node", node.address)
            assert cli.returncode == DiskFullError.exit_code == 9, cli.stderr
            assert b"disk_full" in cli.stderr and b"Remove objects" in cli.stderr

            # Something outside Shuttle takes the last free byte: removes still work.
            fill_outside_shuttle(small_fs / "filler")
            gone = sorted(acked)[:40]
            for key in gone:
                c.remove(key)
                del acked[key]
            data = os.urandom(OBJECT_BYTES)
            c.put("after-removes", data)
            acked["after-removes"] = digest(data)

            stats = c.node_stats(c.nodes[0])["store"]["space"]
            assert stats["free_bytes"] < FS_BYTES and stats["total_bytes"] >= FS_BYTES
            assert 0 <= stats["journal_share"] <= 1 and stats["journal_bytes"] > 0

        # Crash while the disk is full, then restart: recovery needs no free space.
        fill_outside_shuttle(small_fs / "filler")
        node.kill()
        node.start()
        with shuttle.connect(node=node.address, request_timeout_s=60) as c:
            for key, want in acked.items():
                assert digest(c.get(key)) == want, key
            for key in gone:
                assert c.stat_many([key]) == [None]
            # Space comes back: free the filler, and puts work again.
            (small_fs / "filler").unlink()
            c.put("after-restart", b"x" * 1000)
        table = shuttle_cli("stats", "--node", node.address)
        assert table.returncode == 0 and b"free MB" in table.stdout, table.stderr
        raw = json.loads(shuttle_cli("stats", "--json", "--node", node.address).stdout)
        assert "journal_share" in next(iter(raw.values()))["store"]["space"]
    finally:
        node.kill()
    assert "Traceback" not in node.log.read_text()


def test_recovery_on_a_full_disk_needing_space_exits_with_one_clear_line(
    small_fs: Path, tmp_path: Path
) -> None:
    """The worst case: the journal holds a change whose redo needs space the disk does
    not have (its object file was lost). The node says so in one line and keeps the
    journal; once space is freed it starts and the change is there."""
    node = NodeProcess(small_fs / "data", side_dir=tmp_path).start()
    data = os.urandom(256 * 1024)
    with shuttle.connect(node=node.address, request_timeout_s=60) as c:
        c.put("kept", data)
    node.kill()  # the put is in the journal only (no checkpoint yet)
    os.unlink(small_fs / "data" / "kept")  # its redo now needs 256 KiB
    os.unlink(small_fs / "data" / ".shuttle" / "reserve")
    fill_outside_shuttle(small_fs / "filler")
    with pytest.raises(RuntimeError, match="node did not start"):
        node.start()
    assert node.proc is not None and node.proc.returncode == DiskFullError.exit_code
    lines = [line for line in node.log.read_text().splitlines() if line.strip()]
    assert "Traceback" not in node.log.read_text()
    assert lines[-1].startswith("error (disk_full): cannot open data directory"), lines[-3:]
    assert "free" in lines[-1] and "space" in lines[-1]
    (small_fs / "filler").unlink()
    node.start()
    try:
        with shuttle.connect(node=node.address, request_timeout_s=60) as c:
            assert c.get("kept") == data
    finally:
        node.kill()


def test_an_8_gib_extending_truncate_and_its_recovery_are_quick(tmp_path: Path) -> None:
    node = NodeProcess(tmp_path / "data").start()
    size = 8 << 30
    try:
        with shuttle.connect(node=node.address, request_timeout_s=120) as c:
            c.put("sparse", b"head" * 1000)
            before = c.node_stats(c.nodes[0])["store"]["bytes_rechunked"]
            t0 = time.monotonic()
            c.truncate("sparse", size)
            took_s = time.monotonic() - t0
            after = c.node_stats(c.nodes[0])["store"]["bytes_rechunked"]
            # The zeros are not chunked or hashed: only the last real chunk and the
            # chunks around its end are (it was 8 GiB, and 17.5 s, before).
            assert after - before < 1 << 20, after - before
            assert took_s < 5.0, took_s
            # Meanwhile and after, a small put is not held up.
            c.put("small", b"y" * 1000)
        node.kill()
        t0 = time.monotonic()
        node.start()  # recovery redoes the truncate (13.6 s before)
        recovery_s = time.monotonic() - t0
        assert recovery_s < 10.0, recovery_s
        with shuttle.connect(node=node.address, request_timeout_s=120) as c:
            assert c.read("sparse", 0, 8) == b"headhead"
            assert c.read("sparse", size - 4096, 4096) == bytes(4096)
    finally:
        node.kill()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_path / "data" / "sparse")


def test_the_maximum_object_size_is_refused_naming_the_limit_and_the_flag(
    tmp_path: Path,
) -> None:
    limit = 1 << 20
    node = NodeProcess(tmp_path / "data", extra=["--object-bytes-max", str(limit)]).start()
    try:
        with shuttle.connect(node=node.address) as c:
            c.put("fits", bytes(limit))
            with pytest.raises(LimitExceededError, match="--object-bytes-max") as too_big:
                c.put("too-big", bytes(limit + 1))
            assert str(limit) in str(too_big.value)
            with pytest.raises(LimitExceededError, match="--object-bytes-max"):
                c.truncate("fits", 1 << 40)
            with pytest.raises(LimitExceededError, match="--object-bytes-max"):
                c.write("fits", limit, b"z")
            assert c.stat("fits").size == limit
    finally:
        node.kill()
