"""``shuttle mount`` with real programs over it: a two-node cluster on 127.0.0.1, the
mount in a child process (``shuttle mount --foreground``), and ``grep -r``,
``python -m compileall``, ``ls``, ``mv`` and Python's own file calls on top."""

from __future__ import annotations

import errno
import itertools
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shuttle.client.client import Client
from shuttle.client.validation import MODES
from shuttle.faces.mount import MountProcess, fuse_unavailable_reason, is_mounted
from tests.integration.faces_cluster import FacesCluster

_REASON = fuse_unavailable_reason()
if os.geteuid() != 0 and _REASON is None:
    _REASON = "mounting in tests needs root (fusermount3 is setuid, but keep CI simple)"
pytestmark = pytest.mark.skipif(_REASON is not None, reason=f"no FUSE here: {_REASON}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FacesCluster]:
    c = FacesCluster(tmp_path_factory.mktemp("mount"))
    yield c
    c.stop()


@pytest.fixture(scope="module")
def client(cluster: FacesCluster) -> Iterator[Client]:
    c = Client(cluster.addresses(), request_timeout_s=30)
    yield c
    c.close()


@pytest.fixture(scope="module")
def mnt(cluster: FacesCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The cluster mounted (unmounted after the module, whatever happened)."""
    tmp = tmp_path_factory.mktemp("mnt")
    cluster_file = cluster.write_cluster_file(tmp / "cluster.toml")
    with MountProcess(tmp / "m", ["--cluster", str(cluster_file), "--validation", "check"]) as m:
        yield m.mountpoint
    assert not is_mounted(m.mountpoint)


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=30, check=False)


def test_grep_and_compileall_work_on_a_tree_written_through_the_mount(
    mnt: Path, client: Client
) -> None:
    pkg = mnt / "proj" / "src" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .util import answer\n")
    (pkg / "util.py").write_text("def answer() -> int:\n    return 42\n")
    (mnt / "proj" / "README").write_text("answer: see src/pkg/util.py\n")

    grep = run("grep", "-rn", "return 42", ".", cwd=mnt / "proj")
    assert grep.returncode == 0, grep.stderr
    assert grep.stdout == "./src/pkg/util.py:2:    return 42\n"

    compiled = run(sys.executable, "-m", "compileall", "-q", "src", cwd=mnt / "proj")
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
    pyc = sorted(p.name for p in (pkg / "__pycache__").iterdir())
    assert pyc == [
        f"__init__.{sys.implementation.cache_tag}.pyc",
        f"util.{sys.implementation.cache_tag}.pyc",
    ]
    # The bytecode is a real object of the cluster, and Python imports from it.
    assert client.stat(f"proj/src/pkg/__pycache__/{pyc[1]}").size > 0
    imported = run(
        sys.executable, "-c", "import pkg; print(pkg.answer())", cwd=mnt / "proj" / "src"
    )
    assert imported.stdout == "42\n", imported.stderr


def test_reads_see_other_clients_writes_at_open(mnt: Path, client: Client) -> None:
    client.put("shared/note.txt", b"version one\n")
    assert (mnt / "shared" / "note.txt").read_bytes() == b"version one\n"
    client.put("shared/note.txt", b"version two, longer\n")
    st = os.stat(mnt / "shared" / "note.txt")
    info = client.stat("shared/note.txt")
    assert (st.st_size, st.st_mtime_ns) == (info.size, info.mtime_ns)
    assert (mnt / "shared" / "note.txt").read_bytes() == b"version two, longer\n"


def test_listing_and_attributes_match_the_keys(mnt: Path, client: Client) -> None:
    client.put("ls/a.txt", b"aaa")
    client.put("ls/sub/b.txt", b"bb")
    (mnt / "ls" / "empty").mkdir()
    assert sorted(os.listdir(mnt / "ls")) == ["a.txt", "empty", "sub"]
    assert os.listdir(mnt / "ls" / "empty") == []  # its marker never shows
    assert (mnt / "ls" / "sub").is_dir() and (mnt / "ls" / "a.txt").is_file()
    assert os.stat(mnt / "ls" / "a.txt").st_size == 3
    with pytest.raises(FileNotFoundError):
        os.stat(mnt / "ls" / "missing")
    ls = run("ls", "-l", "ls", cwd=mnt)
    assert ls.returncode == 0 and "a.txt" in ls.stdout


def test_writes_become_the_whole_object_at_close(mnt: Path, client: Client) -> None:
    path = mnt / "w" / "data.bin"
    path.parent.mkdir()
    with open(path, "wb") as f:
        f.write(b"0123456789")
        f.flush()
        # Not yet closed: other clients still see the object as created (empty).
        assert client.get("w/data.bin") == b""
    assert client.get("w/data.bin") == b"0123456789"
    with open(path, "r+b") as f:  # a write in the middle of the existing object
        f.seek(3)
        f.write(b"abc")
    with open(path, "ab") as f:
        f.write(b"!")
    assert client.get("w/data.bin") == b"012abc6789!"
    os.truncate(path, 4)
    assert client.get("w/data.bin") == b"012a"
    big = os.urandom(5 << 20)  # past a single put: an upload session
    (mnt / "w" / "big.bin").write_bytes(big)
    assert client.get("w/big.bin") == big


def test_rename_files_and_directories(mnt: Path, client: Client) -> None:
    client.put("mv/src/d/one", b"1")
    client.put("mv/src/two", b"2")
    client.put("mv/target", b"old")
    os.rename(mnt / "mv" / "src" / "two", mnt / "mv" / "target")  # replaces it
    assert client.get("mv/target") == b"2" and not client.exists("mv/src/two")
    os.rename(mnt / "mv" / "src", mnt / "mv" / "dst")
    assert sorted(client.list("mv/")) == ["mv/dst/d/one", "mv/target"]
    assert (mnt / "mv" / "dst" / "d" / "one").read_bytes() == b"1"
    assert not (mnt / "mv" / "src").exists()
    mv = run("mv", "dst/d/one", "moved", cwd=mnt / "mv")
    assert mv.returncode == 0, mv.stderr
    assert client.get("mv/moved") == b"1"
    assert (mnt / "mv" / "dst" / "d").is_dir()  # emptied, but still there


def test_rm_rmdir_and_mkdir(mnt: Path, client: Client) -> None:
    (mnt / "rm" / "d").mkdir(parents=True)
    (mnt / "rm" / "d" / "f").write_bytes(b"x")
    with pytest.raises(OSError) as refused:
        os.rmdir(mnt / "rm" / "d")
    assert refused.value.errno == errno.ENOTEMPTY
    with pytest.raises(FileExistsError):
        os.mkdir(mnt / "rm" / "d")
    os.unlink(mnt / "rm" / "d" / "f")
    assert not client.exists("rm/d/f")
    assert os.listdir(mnt / "rm" / "d") == []  # the last file went, the directory stays
    os.rmdir(mnt / "rm" / "d")
    assert not (mnt / "rm" / "d").exists()
    assert os.listdir(mnt / "rm") == []
    client.put("rm/implicit/f", b"y")  # a directory only because a key lies under it
    os.unlink(mnt / "rm" / "implicit" / "f")
    assert os.listdir(mnt / "rm" / "implicit") == []


def test_sigterm_unmounts_cleanly(cluster: FacesCluster, tmp_path: Path) -> None:
    proc = MountProcess(tmp_path / "m", ["--node", cluster.procs[0].address]).start()
    assert is_mounted(proc.mountpoint)
    assert proc.proc is not None
    proc.proc.send_signal(signal.SIGTERM)
    assert proc.proc.wait(10) == 0
    assert not is_mounted(proc.mountpoint)
    proc.stop()


@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_validation_mode_shows_another_clients_write_at_the_next_open(
    cluster: FacesCluster, client: Client, tmp_path: Path, mode: str
) -> None:
    key = f"modes/{mode}.txt"
    args = ["--node", cluster.procs[0].address, "--validation", mode]
    # One node is enough here: the mount and the writer must agree on where keys live.
    single = Client(cluster.addresses()[:1])
    try:
        single.put(key, b"first\n")
        with MountProcess(tmp_path / "m", args) as m:
            path = m.mountpoint / key
            assert path.read_bytes() == b"first\n"
            assert path.read_bytes() == b"first\n"  # from the mount's client cache
            single.put(key, b"second, longer\n")
            assert path.read_bytes() == b"second, longer\n"
            assert path.stat().st_size == len(b"second, longer\n")
    finally:
        single.close()


def test_a_name_that_cannot_be_a_key_is_refused_and_the_mount_lives_on(mnt: Path) -> None:
    with pytest.raises(OSError) as refused:
        (mnt / "bad\\name").write_bytes(b"x")  # a backslash is never part of a key
    assert refused.value.errno == errno.EINVAL
    (mnt / "fine").write_bytes(b"ok")
    assert (mnt / "fine").read_bytes() == b"ok"


def test_a_name_that_is_both_an_object_and_a_directory_lists_as_the_object(
    mnt: Path, client: Client
) -> None:
    """`csv` and `csv/part1.csv` on two nodes (two clients raced; no node saw both):
    listing their directory works (it gave EIO) and shows the object, as a lookup does."""
    for i in itertools.count():
        name = f"race/csv{i}"
        if client.node_for(name) != client.node_for(f"{name}/part1.csv"):
            break
    client.put(f"{name}/part1.csv", b"inside")
    client.put(name, b"the object")
    leaf = name.rpartition("/")[2]
    assert os.listdir(mnt / "race") == [leaf]
    ls = run("ls", "-l", ".", cwd=mnt / "race")
    assert ls.returncode == 0, ls.stderr
    assert (mnt / name).is_file() and (mnt / name).read_bytes() == b"the object"
    # Through the mount a name is never both: creating inside a file is refused.
    with pytest.raises(NotADirectoryError):
        (mnt / name / "part2.csv").write_bytes(b"x")


def test_mtimes_programs_set_are_kept_so_rsync_copies_nothing_the_second_time(
    mnt: Path, client: Client, tmp_path: Path
) -> None:
    src = tmp_path / "tree"
    (src / "sub").mkdir(parents=True)
    for i, rel in enumerate(["a.txt", "b.bin", "sub/c.py"]):
        (src / rel).write_bytes(f"file {i}\n".encode() * (i + 1))
        # Old times with nanoseconds, as a checkout or an unpacked tarball has.
        os.utime(src / rel, ns=(1_600_000_000_123_456_789 + i, 1_500_000_000_987_654_321 + i))
    first = run("rsync", "-a", "--stats", f"{src}/", "rs/", cwd=mnt)
    assert first.returncode == 0, first.stderr
    assert "Number of regular files transferred: 3" in first.stdout
    for i, rel in enumerate(["a.txt", "b.bin", "sub/c.py"]):
        assert os.stat(mnt / "rs" / rel).st_mtime_ns == 1_500_000_000_987_654_321 + i
        assert client.stat(f"rs/{rel}").mtime_ns == 1_500_000_000_987_654_321 + i
    again = run("rsync", "-a", "--stats", f"{src}/", "rs/", cwd=mnt)
    assert again.returncode == 0, again.stderr
    assert "Number of regular files transferred: 0" in again.stdout, again.stdout
    # touch -d, utime on a file open for writing, and a rename keeps the time.
    touched = run("touch", "-d", "2001-02-03 04:05:06 UTC", "rs/a.txt", cwd=mnt)
    assert touched.returncode == 0, touched.stderr
    assert client.stat("rs/a.txt").mtime_ns == 981173106 * 10**9
    with open(mnt / "rs" / "new.txt", "wb") as f:
        f.write(b"written, then dated")
        f.flush()
        os.utime(f.fileno(), ns=(10**18, 10**18))
    assert client.stat("rs/new.txt").mtime_ns == 10**18
    os.rename(mnt / "rs" / "new.txt", mnt / "rs" / "sub" / "moved.txt")
    assert os.stat(mnt / "rs" / "sub" / "moved.txt").st_mtime_ns == 10**18
    with open(mnt / "rs" / "sub" / "moved.txt", "ab") as f:  # a write after: now again
        f.write(b"!")
    assert client.stat("rs/sub/moved.txt").mtime_ns > 10**18 + 10**17


def test_df_shows_the_nodes_disks(mnt: Path, cluster: FacesCluster) -> None:
    """Both nodes' data directories are on one file system here: counted once."""
    disk = os.statvfs(cluster.procs[0].data_dir)
    shown = os.statvfs(mnt)
    total = disk.f_blocks * disk.f_frsize
    assert abs(shown.f_blocks * shown.f_frsize - total) < 2 * shown.f_frsize
    assert 0 < shown.f_bavail * shown.f_frsize <= total
    df = run("df", "-B1", str(mnt), cwd=mnt)
    assert df.returncode == 0 and str(shown.f_blocks * shown.f_frsize) in df.stdout
