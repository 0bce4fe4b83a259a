"""Rendezvous hashing: every client picks the same node for a key from the node ids
alone, and a change of nodes moves only the keys it must."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from shuttle.client.routing import node_for_key, node_named, nodes_in_order, positions_by_node
from shuttle.errors import ConfigError, InvalidArgumentError
from shuttle.net.addresses import NodeAddress
from shuttle.testing import MemoryNode

KEYS = [f"dir{i % 7}/file{i}" for i in range(3000)]


def nodes(*ids: str) -> list[NodeAddress]:
    return [NodeAddress(node_id, "127.0.0.1", 7400 + i) for i, node_id in enumerate(ids)]


def test_the_choice_depends_on_ids_only_not_order_or_address() -> None:
    a = nodes("n1", "n2", "n3")
    b = [NodeAddress(n.node_id, "10.0.0.9", 9000) for n in reversed(a)]
    for key in KEYS[:200]:
        assert node_for_key(a, key).node_id == node_for_key(b, key).node_id


def test_keys_spread_about_evenly() -> None:
    counts = Counter(node_for_key(nodes("n1", "n2", "n3"), key).node_id for key in KEYS)
    assert set(counts) == {"n1", "n2", "n3"}
    assert all(800 <= c <= 1200 for c in counts.values()), counts  # 1000 each expected


def test_adding_a_node_moves_only_the_keys_it_wins() -> None:
    before = {k: node_for_key(nodes("n1", "n2", "n3"), k).node_id for k in KEYS}
    after = {k: node_for_key(nodes("n1", "n2", "n3", "n4"), k).node_id for k in KEYS}
    moved = [k for k in KEYS if before[k] != after[k]]
    assert all(after[k] == "n4" for k in moved)  # nothing moves between old nodes
    assert 600 <= len(moved) <= 900  # about a quarter


def test_removing_a_node_moves_only_the_keys_it_held() -> None:
    before = {k: node_for_key(nodes("n1", "n2", "n3"), k).node_id for k in KEYS}
    after = {k: node_for_key(nodes("n1", "n3"), k).node_id for k in KEYS}
    assert {k for k in KEYS if before[k] != after[k]} == {k for k in KEYS if before[k] == "n2"}


def test_no_nodes_is_a_config_error_saying_what_to_do() -> None:
    with pytest.raises(ConfigError, match="shuttle cluster up"):
        node_for_key([], "k")
    assert node_for_key(nodes("only"), "k").node_id == "only"


def test_the_client_sends_each_key_to_its_node(tmp_path: Path) -> None:
    members = [MemoryNode(tmp_path / f"n{i}", f"n{i}") for i in range(3)]
    try:
        client = MemoryNode.client(members)
        for key in KEYS[:60]:
            client.put(key, key.encode())
        for member in members:
            held = set(member.store.list("").keys)  # what reached this node's store
            assert held == {k for k in KEYS[:60] if client.node_for(k).node_id == member.node_id}
        assert sorted(client.list()) == sorted(KEYS[:60])  # listing merges the nodes
        assert client.stat_many([*KEYS[:5], "absent"])[-1] is None
        assert [i.key for i in client.stat_many(KEYS[:5]) if i] == KEYS[:5]
    finally:
        for member in members:
            member.close()


def test_failover_order_starts_at_the_owner_and_is_where_keys_go_without_it() -> None:
    """A gateway cluster fails over in this order: the next node of a key is the one
    that would own it were its owner gone, the same on every client."""
    three = nodes("n1", "n2", "n3")
    for key in KEYS[:300]:
        order = nodes_in_order(three, key)
        assert order[0] == node_for_key(three, key)
        assert sorted(n.node_id for n in order) == ["n1", "n2", "n3"]
        rest = [n for n in three if n.node_id != order[0].node_id]
        assert order[1] == node_for_key(rest, key)
    with pytest.raises(ConfigError):
        nodes_in_order([], "k")


def test_many_keys_are_grouped_by_the_node_the_client_chooses() -> None:
    """Both clients' many-key calls (``by_node``): each key's position under the node
    the client's own choice names (a gateway client's differs from rendezvous)."""
    members = nodes("n1", "n2", "n3")
    keys = KEYS[:100]
    groups = positions_by_node(keys, lambda key: node_for_key(members, key))
    assert sorted(i for idxs in groups.values() for i in idxs) == list(range(len(keys)))
    for node_id, idxs in groups.items():
        assert idxs == sorted(idxs)
        assert all(node_for_key(members, keys[i]).node_id == node_id for i in idxs)
    assert positions_by_node(keys, lambda key: members[2]) == {"n3": list(range(len(keys)))}


def test_a_node_is_found_by_id_or_address_and_an_unknown_one_is_named() -> None:
    members = nodes("n1", "n2")
    assert node_named(members, "n2") is members[1]
    assert node_named(members, "127.0.0.1:7400") is members[0]
    with pytest.raises(
        InvalidArgumentError, match="no node 'n9' in this cluster; its nodes: n1, n2"
    ):
        node_named(members, "n9")
