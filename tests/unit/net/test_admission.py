"""The node's admission limits: validated, and fitted to the descriptor limit."""

from __future__ import annotations

from pathlib import Path

import pytest

from shuttle.errors import ConfigError
from shuttle.net.admission import (
    EXECUTING_MAX,
    EXECUTING_MAX_RADOS,
    EXECUTOR_THREADS_RADOS,
    ServerLimits,
    effective_connections_max,
)
from shuttle.net.server import EXECUTOR_THREADS
from shuttle.node.config import NodeConfig, is_loopback


def test_the_connection_cap_fits_under_the_descriptor_limit() -> None:
    assert effective_connections_max(16_384, 1_048_576) == 16_384
    assert effective_connections_max(16_384, 20_000) == 16_384
    assert effective_connections_max(16_384, 1024) == 512  # 512 kept for the node
    assert effective_connections_max(16_384, 256) == 128  # at most half kept
    assert effective_connections_max(100, 256) == 100


def test_bad_limits_are_refused_naming_the_flag() -> None:
    with pytest.raises(ConfigError, match="--connections-max"):
        ServerLimits(connections_max=0)
    with pytest.raises(ConfigError, match="--frame-timeout"):
        ServerLimits(frame_timeout_s=0)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.0.1", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.1", False),
        ("node1.example", False),
    ],
)
def test_loopback_addresses(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_a_node_beyond_loopback_needs_a_key_or_insecure(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--insecure"):
        NodeConfig(data_dir=tmp_path, host="10.0.0.1")
    NodeConfig(data_dir=tmp_path, host="10.0.0.1", insecure=True, tls=False)
    NodeConfig(data_dir=tmp_path, host="10.0.0.1", key_file=tmp_path / "key", **_tls(tmp_path))


def _tls(tmp_path: Path) -> dict[str, Path]:
    return {
        "tls_cert": tmp_path / "n.pem",
        "tls_key": tmp_path / "n.key",
        "ca_file": tmp_path / "ca",
    }


def test_a_node_beyond_loopback_serves_tls_unless_insecure(tmp_path: Path) -> None:
    """TLS is on by default beyond loopback (it needs the node's certificate and the
    CA), off on loopback unless asked; without it beyond loopback, only --insecure."""
    key = tmp_path / "key"
    with pytest.raises(ConfigError, match="--tls-cert, --tls-key, --ca-file"):
        NodeConfig(data_dir=tmp_path, host="10.0.0.1", key_file=key)
    assert NodeConfig(
        data_dir=tmp_path, host="10.0.0.1", key_file=key, **_tls(tmp_path)
    ).tls_enabled
    with pytest.raises(ConfigError, match=r"without TLS.*--insecure"):
        NodeConfig(data_dir=tmp_path, host="10.0.0.1", key_file=key, tls=False)
    assert not NodeConfig(
        data_dir=tmp_path, host="10.0.0.1", key_file=key, tls=False, insecure=True
    ).tls_enabled
    assert not NodeConfig(data_dir=tmp_path).tls_enabled
    with pytest.raises(ConfigError, match="--tls was given"):
        NodeConfig(data_dir=tmp_path, tls=True)
    assert NodeConfig(data_dir=tmp_path, tls=True, **_tls(tmp_path)).tls_enabled


def test_a_rados_node_runs_more_requests_per_connection_than_a_file_node(
    tmp_path: Path,
) -> None:
    """A RADOS node's requests wait on OSDs: 8 of a connection at once in 16 threads
    (a stream keeps its window of reads in flight); a file node keeps 2 in 4."""
    files = NodeConfig(data_dir=tmp_path)
    rados = NodeConfig(data_dir=tmp_path, store="rados:pool")
    assert files.admission().executing_max == EXECUTING_MAX == 2
    assert files.executor_threads() == EXECUTOR_THREADS == 4
    assert rados.admission().executing_max == EXECUTING_MAX_RADOS == 8
    assert rados.executor_threads() == EXECUTOR_THREADS_RADOS == 16
    # Every request the connection may run has a thread, with room for a second stream.
    assert EXECUTOR_THREADS_RADOS >= 2 * EXECUTING_MAX_RADOS
