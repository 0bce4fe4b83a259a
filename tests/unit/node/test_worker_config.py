"""``--workers``: what a node's configuration accepts, how it reaches a worker, and
each worker's share of the node's limits."""

from __future__ import annotations

from pathlib import Path

import pytest

from shuttle.errors import ConfigError
from shuttle.net.registry import Mode, OperationRegistry, Reply
from shuttle.node.config import WORKERS_MAX, NodeConfig


def test_one_process_is_the_default_and_bad_counts_say_what_to_give(tmp_path: Path) -> None:
    assert NodeConfig(data_dir=tmp_path).workers == 1
    for bad in (0, -1, WORKERS_MAX + 1):
        with pytest.raises(ConfigError, match=f"from 1 to {WORKERS_MAX}, got {bad}"):
            NodeConfig(data_dir=tmp_path, workers=bad)


def test_workers_are_refused_on_a_rados_store(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"local store only.*more gateway nodes"):
        NodeConfig(data_dir=tmp_path, store="rados:pool", workers=2)
    NodeConfig(data_dir=tmp_path, store="rados:pool")  # one process: as before


def test_a_worker_gets_the_primarys_settings_exactly(tmp_path: Path) -> None:
    config = NodeConfig(
        data_dir=tmp_path / "d",
        port=7411,
        workers=3,
        key_file=tmp_path / "k",
        callback_term_s=5.0,
        residence_s=None,
    )
    assert NodeConfig.from_wire(config.to_wire()) == config
    with pytest.raises(ConfigError, match="unknown setting"):
        NodeConfig.from_wire({**config.to_wire(), "bogus": 1})


def test_the_node_holds_what_one_process_would(tmp_path: Path) -> None:
    config = NodeConfig(data_dir=tmp_path, workers=3, connections_max=1000, unauthenticated_max=90)
    share = config.worker_admission()
    assert share.connections_max == 334  # a third, rounded up
    assert share.unauthenticated == 30
    assert config.admission().connections_max == 1000  # the primary's: its workers' too
    tiny = NodeConfig(data_dir=tmp_path, workers=3, connections_max=2, unauthenticated_max=1)
    assert tiny.worker_admission().unauthenticated == 1


def test_an_async_operation_may_answer_inline_first() -> None:
    reg = OperationRegistry()

    async def slow(args: dict[str, object], payload: bytes) -> str:
        return "the long way"

    reg.add("op", slow, Mode.ASYNC, inline_try=lambda a, p: Reply("here") if a else None)
    op = reg.get("op")
    assert op.inline is not None
    reply = op.inline({"x": 1}, b"")
    assert reply is not None and reply.result == "here"
    assert op.inline({}, b"") is None
    with pytest.raises(ConfigError, match="THREAD or ASYNC"):
        reg.add("op2", lambda a, p: None, Mode.INLINE, inline_try=lambda a, p: None)
    with pytest.raises(ConfigError, match="inline_when only applies to THREAD"):
        reg.add("op3", slow, Mode.ASYNC, inline_when=lambda a: True)
