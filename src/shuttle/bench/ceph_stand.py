"""The stand every ``shuttle bench ceph netrand|stream`` run measures on: one local
Ceph (:class:`shuttle.cluster.ceph.LocalCeph`) and, beside it, two nodes on loopback,
one storing its objects in the Ceph pool (``shuttle serve --store rados:POOL``) and one
on local files, with librados open on the same pool; the same bytes loaded into all
three (:func:`load`). Also: a third node from another checkout (``--compare SRC``), a
node's CPU from /proc, and the ratio every report rounds alike.

The passes themselves are in :mod:`shuttle.bench.ceph_netrand` and
:mod:`shuttle.bench.ceph_stream`; what a RADOS node says about its reads, in
:mod:`shuttle.bench.ceph_node_stats`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shuttle.bench.session import scratch_dir
from shuttle.client.client import Client
from shuttle.client.connect import connect
from shuttle.cluster import local
from shuttle.cluster.ceph import LocalCeph
from shuttle.cluster.cephclient import CephInfo
from shuttle.cluster.cephclient import connect as rados_connect
from shuttle.cluster.clusterfile import ClusterFile
from shuttle.errors import ConfigError

KEY = "bench/ceph.dat"
#: The mode, and the RADOS namespace, of the node started from ``--compare SRC``.
COMPARE_MODE = "rados_node_compare"
#: A client with Ceph credentials that reads the misses of a RADOS node of its own
#: (on the same pool and namespace as ``rados_node``) from the OSDs itself.
DIRECT_MODE = "rados_node_direct"
COMPARE_NAMESPACE = "compare"
OID = "bench-ceph-direct"
#: RADOS write size when loading the object (the OSD's default max write is 90 MiB).
LOAD_BYTES = 4 << 20

Progress = Callable[[str], None]


@dataclass
class Stand:
    """The benchmark's Ceph, its nodes and clients, and librados on the same pool."""

    info: CephInfo
    ioctx: Any
    #: Clients by mode name: ``file_node`` and, when this build has it, ``rados_node``.
    clients: dict[str, Client] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    #: Each node's process id, by mode (its CPU is read from /proc around each pass).
    pids: dict[str, int] = field(default_factory=dict)
    #: Modes whose node serves the same objects as another mode's (nothing to load).
    shared: set[str] = field(default_factory=set)


@contextlib.contextmanager
def stand(
    osds: int,
    progress: Progress,
    workdir: Path | None = None,
    compare_src: Path | None = None,
    node_cache_bytes: int | None = None,
    node_block_bytes: int | None = None,
    direct_remember_s: float | None = None,
    **client_options: Any,
) -> Iterator[Stand]:
    """Start Ceph and the two nodes; yield them with clients; tear it all down.

    ``compare_src``: also start a RADOS node (mode ``rados_node_compare``) from another
    checkout's ``src`` folder, on a namespace of its own in the same pool, so that two
    versions of the node are measured in one run, interleaved. ``node_cache_bytes``:
    every node's block cache (None: the node's default); ``node_block_bytes``: its
    block size (None: the node's default, 4 KiB). ``direct_remember_s``: also start a
    second RADOS node on the same pool and namespace (mode ``rados_node_direct``, its own
    block cache) whose client reads its misses from RADOS itself with the Ceph's
    admin credentials (:mod:`shuttle.client.rados_direct`), remembering a key the node
    named this many seconds (0: it asks the node every time); None: no such mode."""
    block_args = [] if node_block_bytes is None else ["--cache-block-bytes", str(node_block_bytes)]
    scratch = scratch_dir("shuttle-bench-ceph-", workdir)
    ceph = LocalCeph(scratch / "ceph", osds=osds)
    clusters: list[ClusterFile] = []
    rados = None
    try:
        progress(f"starting a local Ceph ({osds} OSDs)")
        info = ceph.start()
        rados = rados_connect(info.conf_path, info.keyring_path, op_timeout_s=60)
        ioctx = rados.open_ioctx(info.pool)
        bench = Stand(info, ioctx)
        with contextlib.ExitStack() as stack:

            def start_node(mode: str, name: str, node_args: list[str], **options: Any) -> None:
                """A one-node cluster under ``scratch/name`` and a client of it for ``mode``."""
                cluster = local.up(
                    scratch / name, nodes=1, cache_bytes=node_cache_bytes, node_args=node_args
                )
                clusters.append(cluster)
                assert cluster.path is not None
                bench.clients[mode] = stack.enter_context(
                    connect(cluster=cluster.path, **client_options, **options)
                )
                _note_pid(bench, mode, cluster)

            progress("starting a node on local files")
            start_node("file_node", "file", block_args)
            if has_rados_store():
                if compare_src is not None:
                    # First: with --no-wait-for-trust, this node's probation then ends
                    # before the other's, which favours the code compared against.
                    progress(f"starting a RADOS node from {compare_src}")
                    bench.clients[COMPARE_MODE] = stack.enter_context(
                        connect(
                            cluster=_compare_cluster(
                                scratch,
                                info,
                                compare_src,
                                clusters,
                                node_cache_bytes,
                                block_args,
                            ),
                            **client_options,
                        )
                    )
                    _note_pid(bench, COMPARE_MODE, clusters[-1])
                progress(f"starting a node on the RADOS pool {info.pool}")
                start_node("rados_node", "rados", [*info.store_args(), *block_args])
                if direct_remember_s is not None:
                    from shuttle.client.rados_direct import CephOptions

                    progress("starting a second node on the pool, for a client that reads RADOS")
                    options = CephOptions(
                        info.conf_path, info.keyring_path, info.user, remember_s=direct_remember_s
                    )
                    start_node(
                        DIRECT_MODE,
                        "direct",
                        [*info.store_args(), *block_args],
                        rados_direct=options,
                    )
                    bench.shared.add(DIRECT_MODE)  # the same objects as rados_node's
            else:
                bench.skipped["rados_node"] = (
                    "this build's `shuttle serve` has no --store rados:POOL yet; only the "
                    "file-backed node and librados were measured"
                )
            yield bench
            ioctx.close()
    finally:
        for cluster in clusters:
            local.down(cluster)
        if rados is not None:
            rados.shutdown()
        ceph.down()
        shutil.rmtree(scratch, ignore_errors=True)


def _note_pid(bench: Stand, mode: str, cluster: ClusterFile) -> None:
    pid = cluster.nodes[0].pid
    if pid is not None:
        bench.pids[mode] = pid


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system, every thread: librados's too) the process ``pid``
    has used, from /proc (None where there is no /proc or the process is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _compare_cluster(
    scratch: Path,
    info: CephInfo,
    src: Path,
    clusters: list[ClusterFile],
    cache_bytes: int | None = None,
    block_args: list[str] | None = None,
) -> Path:
    """A one-node cluster on ``info``'s pool (namespace ``compare``) whose node runs the
    code in ``src`` (``PYTHONPATH``: the node process inherits this one's environment);
    returns its cluster file."""
    check_compare_src(src)
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(src.resolve())
    try:
        cluster = local.up(
            scratch / "compare",
            nodes=1,
            node_args=[*info.store_args(COMPARE_NAMESPACE), *(block_args or [])],
            cache_bytes=cache_bytes,
        )
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved
    clusters.append(cluster)
    assert cluster.path is not None
    return cluster.path


def check_compare_src(src: Path) -> None:
    """ConfigError unless ``src`` holds a ``shuttle`` package to start a node from."""
    if not (src / "shuttle" / "__init__.py").is_file():
        raise ConfigError(
            f"--compare {src}: no shuttle package there; give another checkout's src "
            "folder (git archive main src | tar -x -C /tmp/main; --compare /tmp/main/src)"
        )


def has_rados_store() -> bool:
    """Whether this build's nodes take ``--store rados:POOL`` (``shuttle.store.rados``)."""
    return importlib.util.find_spec("shuttle.store.rados") is not None


def load(bench: Stand, path: Path, progress: Progress) -> int:
    """Put the file into every node and into the pool as one RADOS object."""
    size = path.stat().st_size
    for mode, client in bench.clients.items():
        if mode in bench.shared:
            continue
        progress(f"putting {size >> 20} MiB into the {mode.replace('_', ' ')}")
        client.put(KEY, path)
    progress(f"writing {size >> 20} MiB to RADOS object {OID}")
    with open(path, "rb") as f:
        offset = 0
        while piece := f.read(LOAD_BYTES):
            bench.ioctx.write(OID, piece, offset)
            offset += len(piece)
    return size


def ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None
