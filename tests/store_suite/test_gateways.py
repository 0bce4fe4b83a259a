"""Several stores over one RADOS pool and namespace (nodes that are gateways): what one
changes, the others see at once, and concurrent changes never lose an update."""

from __future__ import annotations

import os
import secrets
import threading

import pytest

from shuttle.errors import LimitExceededError, VersionMismatchError
from shuttle.store import chunk_buffer, object_hash
from shuttle.store.interface import Store
from shuttle.store.rados import RADOS_OBJECT_BYTES_MAX
from tests.store_suite.conftest import Opener


@pytest.fixture
def kind() -> str:
    return "rados"  # only stores shared by several nodes


@pytest.fixture
def pair(opener: Opener) -> tuple[Store, Store]:
    namespace = f"g{secrets.token_hex(6)}"
    return opener(namespace), opener(namespace)


def test_a_change_through_one_gateway_is_read_through_the_other(pair: tuple[Store, Store]) -> None:
    a, b = pair
    a.put("k", b"1" * 8192)
    assert b.read("k", 0, 100) == b"1" * 100  # b caches blocks of this version
    assert b.read("k", 0, 100) == b"1" * 100
    hits = b.stats()["cache"]["hits"]
    assert hits > 0
    a.write("k", 0, b"2" * 100)
    assert b.read("k", 0, 100) == b"2" * 100  # not b's cached block: its version is old
    v = a.put("k", b"3").version
    assert b.stat("k").version == v
    assert b.read("k", 0, 100) == b"3"
    a.remove("k")
    assert b.stat_many(["k"]) == [None]


def test_listing_and_versions_are_shared(pair: tuple[Store, Store]) -> None:
    a, b = pair
    v1 = a.put("d/x", b"x").version
    v2 = b.put("d/x", b"y").version
    b.put("d/y", b"y")
    assert v2 > v1
    assert a.list("d/").keys == ["d/x", "d/y"] == b.list("d/").keys
    b.remove("d/x")
    v3 = a.put("d/x", b"z").version
    assert v3 > v2  # never reused, even after a remove through another gateway


def test_conditional_changes_from_two_gateways_have_one_winner(pair: tuple[Store, Store]) -> None:
    a, b = pair
    v = a.put("k", b"0").version
    b.put("k", b"b", expected_version=v)
    with pytest.raises(VersionMismatchError):
        a.put("k", b"a", expected_version=v)
    assert a.read("k") == b"b"


def test_concurrent_range_writes_from_two_gateways_lose_nothing(pair: tuple[Store, Store]) -> None:
    """Each round both gateways write their own piece at once: without the version guard
    the later write would store attributes computed before the other's piece landed."""
    a, b = pair
    size, rounds = 64 * 1024, 12
    width = size // (2 * rounds)
    a.put("k", bytes(size))
    barrier = threading.Barrier(2, timeout=60)
    errors: list[str] = []  # a thread's failed assert is only a warning to pytest

    def writer(store: Store, parity: int) -> None:
        try:
            for r in range(rounds):
                i = 2 * r + parity
                barrier.wait()
                store.write("k", i * width, bytes([i + 1]) * width)
                attrs = store.stat("k")
                barrier.wait()
                content = store.read("k")
                same = attrs.version == store.stat("k").version  # nobody wrote in between
                if same and attrs.hash != object_hash(content):
                    errors.append(f"round {r}: the hash is not of the bytes read")
        except Exception as exc:
            errors.append(f"writer {parity}: {exc!r}")
            barrier.abort()  # the other writer stops too, instead of waiting 60 s

    threads = [threading.Thread(target=writer, args=(s, p)) for s, p in ((a, 0), (b, 1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    want = b"".join(bytes([i + 1]) * width for i in range(2 * rounds))
    want += bytes(size - len(want))
    for s in (a, b):
        attrs = s.stat("k")
        assert s.read("k") == want
        assert (attrs.hash, list(attrs.chunks)) == (object_hash(want), chunk_buffer(want))


def test_objects_above_the_rados_limit_are_refused_with_advice(pair: tuple[Store, Store]) -> None:
    a, _b = pair
    with pytest.raises(LimitExceededError, match="several objects"):
        a.put("huge", os.urandom(1) * (RADOS_OBJECT_BYTES_MAX + 1))
