"""Nodes for benchmarks: use the one the user named, or start a private one on loopback."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

from shuttle.bench.session import scratch_dir
from shuttle.client.client import Client
from shuttle.client.connect import connect
from shuttle.cluster import local
from shuttle.node.config import CACHE_BYTES_DEFAULT


@contextlib.contextmanager
def bench_client(
    node: str | None,
    *,
    link: str | None = None,
    cpu_factor: float = 1.0,
    node_cache_bytes: int = CACHE_BYTES_DEFAULT,
    workdir: Path | None = None,
    tls: bool = False,
    node_pids: list[int] | None = None,
    node_args: Sequence[str] = (),
    **client_options: object,
) -> Iterator[tuple[Client, Path]]:
    """A client of ``node``, or of a node process started here for the benchmark (and
    stopped, its data removed, afterwards). Yields the client and a scratch folder on
    the same disk as the node's data. ``tls``: the node serves TLS (one started here
    gets a cluster CA of its own; a given ``node`` is dialled with TLS and the CA in
    ``$SHUTTLE_CA_FILE``). ``node_pids``: gets the pid of a node started here (for
    benchmarks that count its CPU time). ``node_args``: more ``shuttle serve`` flags for
    a node started here (``--workers 2``)."""
    scratch = scratch_dir("shuttle-bench-", workdir)
    try:
        if node is not None:
            with connect(node=node, link=link, tls=tls or None, **client_options) as client:  # type: ignore[arg-type]
                yield client, scratch
            return
        cluster = local.up(
            scratch / "cluster",
            nodes=1,
            cpu_factors=[cpu_factor],
            cache_bytes=node_cache_bytes,
            tls=tls,
            node_args=node_args,
        )
        try:
            assert cluster.path is not None
            if node_pids is not None:
                node_pids.extend(e.pid for e in cluster.nodes if e.pid is not None)
            with connect(cluster=cluster.path, link=link, **client_options) as client:  # type: ignore[arg-type]
                yield client, scratch
        finally:
            local.down(cluster)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
