"""A client with its own Ceph credentials reads a RADOS node's misses from the OSD
itself (shuttle.client.rados_direct; docs/ceph.md, "A client that reads a miss from
the OSD itself"): one node process on the local Ceph, whose block cache holds 32 pages
of a 1 MiB object, so that reading pages it has not read before soon misses a full
cache, which the node then answers with the object's location instead of its bytes."""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shuttle.client.aio import AsyncClient
from shuttle.client.client import Client
from shuttle.client.gateways import GatewayClient
from shuttle.client.model import NodeAddress
from shuttle.client.rados_direct import CephOptions, location_of
from shuttle.cluster import principals as cluster_ops
from shuttle.cluster.ceph import LocalCeph
from shuttle.cluster.cephclient import mon_command
from shuttle.cluster.clusterfile import ClusterFile, NodeEntry
from shuttle.errors import InvalidArgumentError, NotPermittedError, VersionMismatchError
from shuttle.net import auth
from shuttle.net.principals import Caps
from tests.cephfixture import rados_stats, wait_trusting
from tests.integration.nodeproc import NodeProcess, shuttle_cli

PAGE = 4096
OBJECT_BYTES = 1 << 20
#: The node's cache: 32 pages of 4 KiB, an eighth of the object.
CACHE_BYTES = 32 * PAGE


@dataclass
class Gateway:
    proc: NodeProcess
    addr: NodeAddress
    key: bytes
    key_file: Path
    root: Path
    namespace: str
    ceph: LocalCeph

    def client(self, **options: Any) -> Client:
        return Client([self.addr], key=self.key, request_timeout_s=30, **options)

    def direct(
        self, keyring: Path | None = None, user: str = "client.admin", remember_s: float = 0
    ) -> CephOptions:
        """The local Ceph's credentials (or ``user``'s); by default the client asks the
        node for every read (remembers no key it named)."""
        info = self.ceph.info()
        return CephOptions(
            info.conf_path, keyring or info.keyring_path, user, remember_s=remember_s
        )


@pytest.fixture(scope="module")
def gw(ceph: LocalCeph, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    root = tmp_path_factory.mktemp("direct")
    key_file = root / "cluster.key"
    key = auth.write_key_file(key_file)
    namespace = f"direct{secrets.token_hex(4)}"
    extra = [
        *ceph.info().store_args(namespace),
        "--key-file",
        str(key_file),
        "--cache-bytes",
        str(CACHE_BYTES),
        "--cache-block-bytes",
        str(PAGE),
    ]
    proc = NodeProcess(root / "gw", extra=extra).start()
    try:
        g = Gateway(
            proc, NodeAddress("gw", "127.0.0.1", proc.port), key, key_file, root, namespace, ceph
        )
        with g.client() as c:
            wait_trusting(c, g.addr)
        yield g
    finally:
        proc.terminate()


def _object(c: Client, key: str) -> bytes:
    data = secrets.token_bytes(OBJECT_BYTES)
    c.put(key, data)
    c.read(key, 0, PAGE)  # its first read: the node's, which makes its entry
    return data


def _pages() -> Iterator[int]:
    """Offsets of pages the node has not read yet (never the first, which it has)."""
    return iter(range(PAGE, OBJECT_BYTES, PAGE))


def test_a_direct_read_returns_what_the_node_returns(gw: Gateway) -> None:
    with gw.client() as plain, gw.client(rados_direct=gw.direct()) as c:
        data = _object(plain, "d/same")
        before = rados_stats(plain, gw.addr)
        offsets = list(_pages())[:96]
        for offset in offsets:
            assert c.read("d/same", offset, PAGE) == data[offset : offset + PAGE]
        # A range across the object's end: fewer bytes, as through the node.
        assert c.read("d/same", OBJECT_BYTES - 100, PAGE) == data[-100:]
        after = rados_stats(plain, gw.addr)
        answers = after["direct_answers"] - before["direct_answers"]
        stats = c.rados_direct.stats() if c.rados_direct else {}
        # The cache fills with the first 32 pages the node reads; then it is full.
        assert answers >= 48, (answers, stats)
        assert stats["direct"] == answers and stats["fallbacks"] == {}
        # The same reads through the node (no direct) give the same bytes.
        for offset in offsets[:8]:
            assert plain.read("d/same", offset, PAGE) == data[offset : offset + PAGE]
    # A client that remembers a key the node named reads its pages from RADOS without
    # asking the node again (for remember_s), the ones the node holds too.
    with gw.client() as plain, gw.client(rados_direct=gw.direct(remember_s=60)) as c:
        before = rados_stats(plain, gw.addr)
        got = [c.read("d/same", offset, PAGE) for offset in offsets]
        assert got == [data[offset : offset + PAGE] for offset in offsets]
        after = rados_stats(plain, gw.addr)
        assert c.rados_direct is not None
        stats = c.rados_direct.stats()
        named = after["direct_answers"] - before["direct_answers"]
        assert named == 1 and stats["remembered"] == stats["direct"] - 1, (named, stats)
        assert stats["remembered"] + stats["node_bytes"] == len(offsets) - 1


def test_a_gateway_client_reads_a_remembered_key_without_choosing_a_node(
    gw: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client ``connect`` gives for a RADOS cluster (a GatewayClient, which ranks
    the nodes for every request and fails over between them) reads a key its node
    named from RADOS without ranking its nodes: no node is asked, so none is chosen
    (ranking them cost a remembered read 6-10 µs; benchmarks/README.md, issue 26
    item 2). A key not remembered still goes to the node the ranking picks."""
    direct = gw.direct(remember_s=60)
    with (
        gw.client() as plain,
        GatewayClient([gw.addr], key=gw.key, request_timeout_s=30, rados_direct=direct) as c,
    ):
        data = _object(plain, "d/gateway")
        assert c.rados_direct is not None
        pages = _pages()
        for offset in pages:  # until the node names the key (its cache full)
            assert c.read("d/gateway", offset, PAGE) == data[offset : offset + PAGE]
            if c.rados_direct.stats()["direct"]:
                break
        ranked, orders = c._order, []

        def counted(key: str, *, keyed: bool = True) -> list[NodeAddress]:
            orders.append(key)
            return ranked(key, keyed=keyed)

        monkeypatch.setattr(c, "_order", counted)
        remembered = c.rados_direct.stats()["remembered"]
        offsets = [next(pages) for _ in range(8)]
        got = [c.read("d/gateway", offset, PAGE) for offset in offsets]
        assert got == [data[offset : offset + PAGE] for offset in offsets]
        assert c.rados_direct.stats()["remembered"] == remembered + len(offsets)
        assert orders == [], "a remembered read ranked the nodes"
        # A key not remembered: ranked, and asked of the node the ranking picks.
        other = _object(plain, "d/gateway-other")
        assert c.read("d/gateway-other", 0, PAGE) == other[:PAGE]
        assert orders == ["d/gateway-other"]


def test_each_thread_reads_rados_through_its_own_io_context(gw: Gateway) -> None:
    """The version a read reports is its I/O context's last operation's, so each thread
    has its own (one per thread and pool), the module compiled or not."""
    with gw.client() as plain, gw.client(rados_direct=gw.direct(remember_s=60)) as c:
        data = _object(plain, "d/threads")
        assert c.rados_direct is not None
        pages = list(_pages())
        for offset in pages:  # until the node names the key (its cache full)
            c.read("d/threads", offset, PAGE)
            if c.rados_direct.stats()["direct"]:
                break
        got: dict[int, list[bytes]] = {}
        offsets = pages[-64:]

        def reader(n: int) -> None:
            got[n] = [c.read("d/threads", offset, PAGE) for offset in offsets]

        threads = [threading.Thread(target=reader, args=(n,)) for n in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        want = [data[offset : offset + PAGE] for offset in offsets]
        assert got == {0: want, 1: want, 2: want}
        assert c.rados_direct.stats()["remembered"] >= 3 * len(offsets)
        # This thread's context and the three readers' (a thread's id may be reused
        # once it ended, and its contexts with it: never by two threads at once).
        assert 2 <= len(c.rados_direct._ctxs) <= 4


def test_a_change_between_the_node_s_answer_and_the_client_s_read(gw: Gateway) -> None:
    """The node names version V; a put through the node makes V+; the client's own read
    then gets the new version's bytes, reported as such, or with V expected the
    version-mismatch error; a read through the client gives the new bytes."""
    with gw.client() as plain, gw.client(rados_direct=gw.direct()) as c:
        data = _object(plain, "d/changed")
        assert c.rados_direct is not None
        where = None
        for offset in _pages():
            res = plain.call(
                gw.addr,
                "read",
                {"key": "d/changed", "offset": offset, "length": PAGE, "direct": True},
            )
            where = location_of(res.result)
            if where is not None:
                assert res.payload == b""
                break
            assert res.payload == data[offset : offset + PAGE]
        assert where is not None, "the node never named the object"
        assert where.object == "d/changed" and where.namespace == gw.namespace
        assert where.version == plain.stat("d/changed").version
        new = secrets.token_bytes(OBJECT_BYTES)
        info = plain.put("d/changed", new)
        assert info.version > where.version
        # The newer version's bytes (not the version the node named): no caller's
        # expectation to check, so the current bytes are answered.
        got = c.rados_direct.read_at(where, "d/changed", offset, PAGE, None)
        assert got == new[offset : offset + PAGE]
        with pytest.raises(VersionMismatchError, match=f"version {info.version}"):
            c.rados_direct.read_at(where, "d/changed", offset, PAGE, where.version)
        assert c.read("d/changed", offset, PAGE) == new[offset : offset + PAGE]


def _keyring_of(ceph: LocalCeph, user: str, root: Path, **caps: str) -> Path:
    cluster = ceph.rados()
    try:
        flat = [x for pair in caps.items() for x in pair]
        out = mon_command(cluster, prefix="auth get-or-create", entity=user, caps=flat)
    finally:
        cluster.shutdown()
    entry = json.loads(out)[0]
    path = root / f"{user}.keyring"
    path.write_text(f"[{entry['entity']}]\n\tkey = {entry['key']}\n")
    return path


def test_a_cephx_user_without_caps_on_the_pool_falls_back_to_the_node(gw: Gateway) -> None:
    user = f"client.nocaps{secrets.token_hex(3)}"
    keyring = _keyring_of(gw.ceph, user, gw.root, mon="allow r", osd="allow r pool=elsewhere")
    with gw.client() as plain, gw.client(rados_direct=gw.direct(keyring, user)) as c:
        data = _object(plain, "d/nocaps")
        before = rados_stats(plain, gw.addr)
        for offset in list(_pages())[:64]:
            assert c.read("d/nocaps", offset, PAGE) == data[offset : offset + PAGE]
        answers = rados_stats(plain, gw.addr)["direct_answers"] - before["direct_answers"]
        assert c.rados_direct is not None
        stats = c.rados_direct.stats()
        assert answers >= 16 and stats["direct"] == 0, (answers, stats)
        assert stats["fallbacks"].get("EPERM", 0) == answers, stats


def test_a_principal_without_the_read_capability_is_refused_and_told_nothing(
    gw: Gateway, tmp_path: Path
) -> None:
    with gw.client() as admin:
        _object(admin, "secret/s")
        cluster = ClusterFile(
            "gw",
            gw.root,
            (NodeEntry("gw", "127.0.0.1", gw.proc.port, gw.proc.data_dir),),
            key_file=gw.key_file,
        ).save(tmp_path / "cluster.toml")
        key_file = tmp_path / "bob.key"
        cluster_ops.add(cluster, auth.Credentials(gw.key), "bob", Caps.of(read=["d/"]), key_file)
    creds = auth.load_credentials(key_file)
    with Client(
        [gw.addr],
        key=creds.key,
        principal=creds.principal,
        request_timeout_s=30,
        rados_direct=gw.direct(),
    ) as bob:
        errors = []
        for key in ("secret/s", "secret/missing"):
            for offset in list(_pages())[:40]:  # well past the node's full cache
                with pytest.raises(NotPermittedError) as caught:
                    bob.read(key, offset, PAGE)
                errors.append(str(caught.value).replace(key, "KEY"))
        # The same refusal whether the object exists or not, naming no RADOS object.
        assert len(set(errors)) == 1, set(errors)
        assert gw.namespace not in errors[0] and "rados" not in errors[0].lower()
        assert bob.rados_direct is not None and bob.rados_direct.stats()["direct"] == 0
        # Those went by the read lane; the general path words the refusal the same.
        args = {"key": "secret/s", "offset": 50 * PAGE, "length": PAGE, "direct": True}
        with pytest.raises(NotPermittedError) as general:
            bob.call(gw.addr, "read", _general(args))
        assert str(general.value).replace("secret/s", "KEY") == errors[0]


def test_off_by_default_the_client_reads_nothing_from_rados(gw: Gateway) -> None:
    with gw.client() as c:
        assert c.rados_direct is None
        data = _object(c, "d/off")
        before = rados_stats(c, gw.addr)
        for offset in list(_pages())[:64]:
            assert c.read("d/off", offset, PAGE) == data[offset : offset + PAGE]
        after = rados_stats(c, gw.addr)
        assert after["direct_answers"] == before["direct_answers"]
        assert after["aio_reads"] - before["aio_reads"] >= 64  # the node read every miss


def test_a_direct_flag_that_is_not_a_boolean_is_refused(gw: Gateway) -> None:
    """Whether the request is one the read lane would take or not (its shape otherwise
    the lane's, or ``expected_version`` nil), with the same words."""
    with gw.client() as c:
        _object(c, "d/flag")
        for flag in (1, "true", None, [True]):
            words = set()
            args = {"key": "d/flag", "offset": 0, "length": PAGE, "direct": flag}
            for sent in (args, _general(args)):
                with pytest.raises(InvalidArgumentError, match="direct must be true or false") as e:
                    c.call(gw.addr, "read", sent)
                words.add(str(e.value))
            assert len(words) == 1, words


def test_shuttle_cat_reads_a_range_directly_with_the_user_s_ceph_credentials(
    gw: Gateway,
) -> None:
    with gw.client() as c:
        data = _object(c, "d/cli")
        for offset in list(_pages())[:40]:  # the node's cache is full after these
            c.read("d/cli", offset, PAGE)
        before = rados_stats(c, gw.addr)["direct_answers"]
    info = gw.ceph.info()
    where = ["--node", gw.proc.address, "--key-file", str(gw.key_file)]
    offset = 100 * PAGE
    ok = shuttle_cli(
        "cat", "d/cli", *where, "--offset", str(offset), "--length", str(PAGE),
        "--rados-direct", "--ceph-conf", str(info.conf_path),
        "--ceph-keyring", str(info.keyring_path),
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr.decode()
    assert ok.stdout == data[offset : offset + PAGE]
    with gw.client() as c:  # the node named the object; the command read it itself
        assert rados_stats(c, gw.addr)["direct_answers"] == before + 1
    bad = shuttle_cli("cat", "d/cli", *where, "--length", str(PAGE), "--rados-direct")
    assert bad.returncode == 2 and b"give --ceph-conf" in bad.stderr, bad.stderr.decode()


def _lane_reads(c: Client, addr: NodeAddress) -> int:
    return int(c.node_stats(addr)["server"]["read_lane"])


def test_direct_reads_hit_and_miss_by_the_node_s_read_lane(gw: Gateway) -> None:
    """A ``direct`` read is taken by the node's read lane both ways: pages the node
    holds answered with their bytes, misses it would not keep with the location (no
    read of them goes the node's general path)."""
    with gw.client() as plain, gw.client(rados_direct=gw.direct()) as c:
        data = _object(plain, "d/lane")
        cached = [PAGE * i for i in range(1, 5)]
        for offset in cached:  # into the node's cache (it has room, or a ghost hit)
            plain.read("d/lane", offset, PAGE)
            plain.read("d/lane", offset, PAGE)
        before, lane0 = rados_stats(plain, gw.addr), _lane_reads(plain, gw.addr)
        for i in range(40):
            offset = cached[i % len(cached)]
            assert c.read("d/lane", offset, PAGE) == data[offset : offset + PAGE]
        assert c.rados_direct is not None
        stats = c.rados_direct.stats()
        assert stats["node_bytes"] == 40 and stats["direct"] == 0, stats
        # 40 reads and one stats call between (not by the lane)
        assert _lane_reads(plain, gw.addr) - lane0 == 40
        assert rados_stats(plain, gw.addr)["direct_answers"] == before["direct_answers"]
        # Misses of a full cache: named by the lane, read by the client from RADOS.
        lane0 = _lane_reads(plain, gw.addr)
        misses = list(_pages())[200:240]
        for offset in misses:
            assert c.read("d/lane", offset, PAGE) == data[offset : offset + PAGE]
        named = rados_stats(plain, gw.addr)["direct_answers"] - before["direct_answers"]
        stats = c.rados_direct.stats()
        assert named >= 16 and stats["direct"] == named, (named, stats)
        assert _lane_reads(plain, gw.addr) - lane0 == len(misses), "a read left the lane"


def _general(args: dict[str, Any]) -> dict[str, Any]:
    """The same read, which the node's lane declines (``expected_version`` given as
    nil: the general path reads it as left out), so its general path answers it."""
    return {**args, "expected_version": None}


def test_the_lane_s_direct_answer_is_the_general_path_s(gw: Gateway) -> None:
    """The same ``direct`` request by the node's read lane and by its general path: the
    same bytes for a page the node holds; for pages it has not read (its cache full),
    the same answer, the location where it would not keep them, and only the first by
    the lane. Each way reads pages of its own: a page named once is read whole if it
    is asked again (the admission's ghost queue), so no page is asked twice."""
    with gw.client() as plain:
        data = _object(plain, "d/both")
        held = PAGE
        for _ in range(2):  # into the node's cache (it has room, or a ghost hit)
            plain.read("d/both", held, PAGE)
        fresh = iter(list(_pages())[100:])
        answers: dict[str, list[tuple[int, Any, bytes]]] = {"lane": [], "general": []}
        for i in range(48):
            for way in ("lane", "general") if i % 2 else ("general", "lane"):
                offset = held if i % 4 == 0 else next(fresh)
                args = {"key": "d/both", "offset": offset, "length": PAGE, "direct": True}
                lane0 = _lane_reads(plain, gw.addr)
                res = plain.call(gw.addr, "read", args if way == "lane" else _general(args))
                assert _lane_reads(plain, gw.addr) - lane0 == (way == "lane"), way
                answers[way].append((offset, res.result, bytes(res.payload)))
        where = {
            "pool": gw.ceph.info().pool,
            "namespace": gw.namespace,
            "object": "d/both",
            "version": plain.stat("d/both").version,
        }
        for way, got in answers.items():
            for offset, result, payload in got:
                if result is None or offset == held:
                    assert (result, payload) == (None, data[offset : offset + PAGE]), way
                else:
                    assert (result, payload) == ({"rados": where}, b""), way
            named = sum(result is not None for _, result, _ in got)
            assert named >= 16, (way, named)


def test_the_asyncio_client_reads_the_misses_the_node_names_itself(gw: Gateway) -> None:
    with gw.client() as plain:
        data = _object(plain, "d/async")
        before = rados_stats(plain, gw.addr)

    async def reads() -> tuple[list[bytes], dict[str, Any]]:
        async with AsyncClient(
            [gw.addr], key=gw.key, request_timeout_s=30, rados_direct=gw.direct(remember_s=60)
        ) as c:
            got = [await c.read("d/async", offset, PAGE) for offset in list(_pages())[:64]]
            assert c.rados_direct is not None
            return got, c.rados_direct.stats()

    got, stats = asyncio.run(reads())
    assert got == [data[offset : offset + PAGE] for offset in list(_pages())[:64]]
    with gw.client() as plain:
        named = rados_stats(plain, gw.addr)["direct_answers"] - before["direct_answers"]
    # Named once; the key's later pages read from RADOS without asking the node.
    assert named == 1 and stats["direct"] == stats["remembered"] + 1 >= 2, stats
    assert stats["direct"] + stats["node_bytes"] == 64, stats
