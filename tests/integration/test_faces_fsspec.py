"""The ``shuttle://`` fsspec filesystem against a real two-node cluster: fsspec's own
abstract test suite, pandas reading and writing a CSV, and the semantics we add."""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import fsspec
import pytest
from fsspec.tests.abstract import AbstractFixtures
from fsspec.tests.abstract.copy import AbstractCopyTests
from fsspec.tests.abstract.get import AbstractGetTests
from fsspec.tests.abstract.open import AbstractOpenTests
from fsspec.tests.abstract.pipe import AbstractPipeTests
from fsspec.tests.abstract.put import AbstractPutTests

from shuttle.client.client import Client
from shuttle.client.validation import MODES
from shuttle.errors import KeyConflictError
from shuttle.faces.fsspec_fs import ShuttleFileSystem
from tests.integration.faces_cluster import FacesCluster

_TEST_DIRS = itertools.count()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FacesCluster]:
    c = FacesCluster(tmp_path_factory.mktemp("fsspec"))
    yield c
    c.stop()


@pytest.fixture(scope="module")
def client(cluster: FacesCluster) -> Iterator[Client]:
    c = Client(cluster.addresses(), request_timeout_s=30)
    yield c
    c.close()


class ShuttleFixtures(AbstractFixtures):
    """What fsspec's abstract tests need: the filesystem, how it joins paths, and a
    fresh directory per test (so tests never see each other's files)."""

    @pytest.fixture
    def fs(self, client: Client) -> ShuttleFileSystem:
        return ShuttleFileSystem(client=client)

    @pytest.fixture
    def fs_join(self) -> Callable[..., str]:
        return lambda *parts: "/".join(parts)

    @pytest.fixture
    def fs_path(self) -> str:
        return f"abstract/t{next(_TEST_DIRS)}"


class TestShuttleCopy(AbstractCopyTests, ShuttleFixtures):
    pass


class TestShuttleGet(AbstractGetTests, ShuttleFixtures):
    pass


class TestShuttlePut(AbstractPutTests, ShuttleFixtures):
    pass


class TestShuttleOpen(AbstractOpenTests, ShuttleFixtures):
    pass


class TestShuttlePipe(AbstractPipeTests, ShuttleFixtures):
    pass


# --- beyond the abstract suite ----------------------------------------------------------


def test_the_entry_point_registers_shuttle_urls() -> None:
    assert fsspec.get_filesystem_class("shuttle") is ShuttleFileSystem


def test_pandas_reads_and_writes_a_csv_through_shuttle_urls(
    cluster: FacesCluster, client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pd = pytest.importorskip("pandas")
    client.put("pandas/in.csv", b"city,people\nLisbon,545000\nPorto,232000\n")
    # The cluster comes from $SHUTTLE_CLUSTER, as for the CLI...
    monkeypatch.setenv("SHUTTLE_CLUSTER", str(cluster.write_cluster_file(tmp_path / "c.toml")))
    frame = pd.read_csv("shuttle://pandas/in.csv")
    assert frame["people"].sum() == 777000
    # ... or from storage_options.
    options = {"node": cluster.procs[0].address}
    single = Client(cluster.addresses()[:1])
    try:
        single.put("pandas/one.csv", b"a,b\n1,2\n")
        assert pd.read_csv("shuttle://pandas/one.csv", storage_options=options)["b"][0] == 2
    finally:
        single.close()
    frame.assign(half=frame["people"] // 2).to_csv("shuttle://pandas/out.csv", index=False)
    assert client.get("pandas/out.csv").splitlines()[1] == b"Lisbon,545000,272500"


def test_reads_validate_at_open_and_see_another_clients_write(client: Client) -> None:
    fs = ShuttleFileSystem(client=client)
    fs.pipe_file("fresh/x", b"old")
    assert fs.cat_file("fresh/x") == b"old"  # now in the client cache
    other = Client(client.nodes)
    try:
        other.put("fresh/x", b"new!")
    finally:
        other.close()
    with fs.open("fresh/x", "rb") as f:
        assert f.read() == b"new!"
    assert fs.cat_file("fresh/x", start=1, end=-1) == b"ew"


def test_a_failed_writer_leaves_the_old_object(client: Client) -> None:
    fs = ShuttleFileSystem(client=client)
    fs.pipe_file("abort/x", b"kept")
    with pytest.raises(RuntimeError), fs.open("abort/x", "wb") as f:
        f.write(b"x" * (6 << 20))  # past the first block: an upload is under way
        raise RuntimeError("the writer fails")
    assert fs.cat_file("abort/x") == b"kept"


def test_directories_made_with_mkdir_exist_empty_and_rmdir_refuses_full_ones(
    client: Client,
) -> None:
    fs = ShuttleFileSystem(client=client)
    fs.mkdir("dirs/empty")
    assert fs.isdir("dirs/empty")
    assert fs.ls("dirs/empty") == []
    assert fs.ls("dirs", detail=False) == ["dirs/empty"]
    fs.pipe_file("dirs/full/a", b"1")
    with pytest.raises(OSError, match="not empty"):
        fs.rmdir("dirs/full")
    fs.rmdir("dirs/empty")
    assert not fs.exists("dirs/empty")
    with pytest.raises(FileNotFoundError):
        fs.info("dirs/nothing")


def test_mv_renames_a_tree_across_nodes(client: Client) -> None:
    fs = ShuttleFileSystem(client=client)
    for i in range(6):
        fs.pipe_file(f"mv/src/d{i % 2}/f{i}", str(i).encode())
    fs.mv("mv/src", "mv/dst", recursive=True)
    assert not fs.exists("mv/src")
    assert sorted(fs.find("mv/dst")) == sorted(f"mv/dst/d{i % 2}/f{i}" for i in range(6))
    assert fs.cat_file("mv/dst/d1/f5") == b"5"


@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_validation_mode_reads_what_another_client_wrote(
    cluster: FacesCluster, client: Client, mode: str
) -> None:
    """Each mode promises data no older than the node's at the open; the face keeps
    that promise (a speculative open is confirmed before any byte is handed out)."""
    key = f"modes/{mode}"
    face_client = Client(cluster.addresses(), validation=mode)
    try:
        fs = ShuttleFileSystem(client=face_client, validation=mode)
        client.put(key, b"first")
        assert fs.cat_file(key) == b"first"
        assert fs.cat_file(key) == b"first"  # served from the face's client cache
        client.put(key, b"second, longer")
        assert fs.info(key)["size"] == len(b"second, longer")
        with fs.open(key, "rb") as f:
            assert f.read() == b"second, longer"
    finally:
        face_client.close()


def _split_pair(client: Client, stem: str) -> tuple[str, str]:
    """A name and a key inside it that live on different nodes (the clash no node sees)."""
    for i in itertools.count():
        name = f"{stem}{i}"
        if client.node_for(name) != client.node_for(f"{name}/part1.csv"):
            return name, f"{name}/part1.csv"
    raise AssertionError("unreachable")


def test_a_name_is_a_key_or_a_directory_across_nodes(
    cluster: FacesCluster, client: Client, tmp_path: Path
) -> None:
    """`csv` and `csv/part1.csv` on two nodes: each node alone would accept its key."""
    fs = ShuttleFileSystem(client=client)
    name, inside = _split_pair(client, "clash/csv")
    client.put(inside, b"a,b\n1,2\n")
    with pytest.raises(KeyConflictError, match="is a directory"):
        client.check_new_key(name)
    with pytest.raises(NotADirectoryError, match="is a directory"):
        fs.pipe_file(name, b"x")
    with pytest.raises(NotADirectoryError), fs.open(name, "wb") as f:
        f.write(b"x")
    assert not client.exists(name)
    # The CLI checks too, and says what to do.
    local = tmp_path / "f"
    local.write_bytes(b"x")
    cluster_file = cluster.write_cluster_file(tmp_path / "c.toml")
    put = subprocess.run(
        [sys.executable, "-m", "shuttle", "put", str(local), name, "--cluster", str(cluster_file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert put.returncode == 2, put.stderr
    assert "key_conflict" in put.stderr and "Use another key" in put.stderr
    assert not client.exists(name)
    # The other way round: an object blocks a directory of its name.
    other, other_inside = _split_pair(client, "clash/obj")
    client.put(other, b"an object")
    with pytest.raises(KeyConflictError, match="is an object"):
        client.check_new_key(other_inside)
    with pytest.raises(NotADirectoryError):
        fs.pipe_file(other_inside, b"x")
    with pytest.raises(NotADirectoryError):
        fs.makedirs(f"{other}/sub")
    assert list(client.list(f"{other}/")) == []


def test_listing_a_name_that_is_both_shows_the_object(client: Client) -> None:
    """Two clients raced (or a program skipped the check): both exist; listings work."""
    fs = ShuttleFileSystem(client=client)
    name, inside = _split_pair(client, "both/csv")
    client.put(inside, b"inside")
    client.put(name, b"the object")  # the library's put asks only the key's node
    listed = fs.ls("both", detail=True)
    assert [(e["name"], e["type"]) for e in listed] == [(name, "file")]
    assert fs.cat_file(name) == b"the object"


@pytest.mark.parametrize("mode", ["wb", "w"])
@pytest.mark.parametrize("size", [5, 6 << 20])  # in the first block; past it (an upload)
def test_leaving_fsspec_open_on_an_exception_commits_nothing(
    cluster: FacesCluster, client: Client, mode: str, size: int
) -> None:
    """fsspec's OpenFile (what `fsspec.open` and pandas use) calls a plain close() when
    its `with` ends, exception or not: that close must abort, not commit."""
    options = {"client": client}
    old, new = f"openfile/{mode}{size}/old", f"openfile/{mode}{size}/new"
    client.put(old, b"kept")
    for key in (old, new):
        with (
            pytest.raises(RuntimeError),
            fsspec.open(f"shuttle://{key}", mode, **options) as f,
        ):
            f.write("x" * size if mode == "w" else b"x" * size)
            raise RuntimeError("the writer fails")
    assert client.get(old) == b"kept"
    assert not client.exists(new)
    with fsspec.open(f"shuttle://{new}", mode, **options) as f:  # without one, it commits
        f.write("done" if mode == "w" else b"done")
    assert client.get(new) == b"done"


def test_dask_reads_csv_parts_through_shuttle_urls(
    cluster: FacesCluster, client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dask is a runtime dependency (README, docs/mount.md advertise it): no extra
    install, and a glob of parts spread over both nodes reads as one frame."""
    import dask
    import dask.dataframe as dd

    for i in range(4):
        rows = "".join(f"{i * 10 + j},{(i * 10 + j) % 3}\n" for j in range(10))
        client.put(f"dask/part{i}.csv", f"n,mod\n{rows}".encode())
    monkeypatch.setenv("SHUTTLE_CLUSTER", str(cluster.write_cluster_file(tmp_path / "c.toml")))
    with dask.config.set(scheduler="threads"):
        frame = dd.read_csv("shuttle://dask/part*.csv", blocksize=None)
        assert frame.npartitions == 4
        assert int(frame["n"].sum().compute()) == sum(range(40))
        by_mod = frame.groupby("mod")["n"].count().compute().to_dict()
        assert by_mod == {0: 14, 1: 13, 2: 13}
        # Byte-range blocks of one object (dask asks for ranges and finds line ends).
        big = "n\n" + "".join(f"{i}\n" for i in range(20_000))
        client.put("dask/big.csv", big.encode())
        blocks = dd.read_csv("shuttle://dask/big.csv", blocksize=16_000)
        assert blocks.npartitions > 3
        assert int(blocks["n"].sum().compute()) == sum(range(20_000))
        frame.to_csv("shuttle://dask/out/part-*.csv", index=False)
    written = ShuttleFileSystem(client=client).ls("dask/out", detail=False)
    assert written == [f"dask/out/part-{i}.csv" for i in range(4)]
    assert client.get("dask/out/part-2.csv").startswith(b"n,mod\n20,2\n")
