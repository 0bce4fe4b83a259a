"""Start, stop and check a local cluster: real ``shuttle serve`` processes on loopback.

``up`` is also how a cluster comes back: run on an existing cluster file, it starts
the nodes that are not running, on their old ports and data directories, so their
data (which survives any crash) is served again.

Every cluster ``up`` makes has a key (ROOT/cluster.key, mode 0600, recorded in the
cluster file): its nodes run with ``--key-file`` and refuse clients without it.

A cluster with TLS (``--tls``; the default when its nodes listen beyond loopback, as
in a namespace lab) has a CA under ROOT/tls/ (``ca.pem``, ``ca.key``) that signs a
certificate for each node, made again before a node starts if its address changed or
it nears expiry; the cluster file names the CA, so its clients check the nodes'
certificates without a flag. ``ca`` brings your own CA instead (docs/security.md).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from shuttle.cluster.clusterfile import ClusterFile, NodeEntry
from shuttle.errors import AuthenticationError, ConfigError, UnreachableError
from shuttle.net import certs
from shuttle.net.addresses import is_loopback
from shuttle.net.auth import load_key_file, write_key_file
from shuttle.net.blocking import BlockingConnection
from shuttle.net.netns import NetnsLab, destroy_lab, persistent_labs
from shuttle.net.profiles import parse_link_profile
from shuttle.net.tls import ClientTls

#: How long ``up`` waits for a node to report that it listens (recovery of a large
#: journal can take a moment; a node that is not up by then has failed).
START_TIMEOUT_S = 30.0
#: How long ``down`` waits after SIGTERM before it sends SIGKILL.
STOP_TIMEOUT_S = 10.0
#: Most nodes ``up`` starts on one machine (2 cores: more would only contend).
NODES_MAX = 64
#: The cluster key's file name under the cluster's root.
KEY_FILE_NAME = "cluster.key"
#: Where a TLS cluster's CA and node certificates live under its root.
TLS_DIR_NAME = "tls"

Report = Callable[[str], None]


@dataclass(frozen=True)
class NodeStatus:
    entry: NodeEntry
    running: bool
    reachable: bool
    detail: str
    #: It answered, but refused this client's key (or proved a different one).
    refused: bool = False


def pid_is_node(pid: int | None) -> bool:
    """Whether ``pid`` is alive and is a ``shuttle serve`` process (pids get reused)."""
    if not pid:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"serve" in cmdline and any(b"shuttle" in part for part in cmdline)


@dataclass(frozen=True)
class NodeTls:
    """What a node of a TLS cluster is started with: its certificate and key, and the
    cluster's CA certificate."""

    cert: Path
    key: Path
    ca_file: Path

    def argv(self) -> list[str]:
        return [
            "--tls",
            "--tls-cert",
            str(self.cert),
            "--tls-key",
            str(self.key),
            "--ca-file",
            str(self.ca_file),
        ]


def _serve_argv(
    entry: NodeEntry,
    ready_file: Path,
    key_file: Path | None,
    tls: NodeTls | None = None,
    cluster_file: Path | None = None,
) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "shuttle",
        "serve",
        "--data",
        str(entry.data_dir),
        "--listen",
        f"{entry.host}:{entry.port}",
        "--node-id",
        entry.id,
        "--cpu-factor",
        repr(entry.cpu_factor),
        "--ready-file",
        str(ready_file),
    ]
    if entry.cache_bytes is not None:
        argv += ["--cache-bytes", str(entry.cache_bytes)]
    if key_file is not None:
        argv += ["--key-file", str(key_file)]
        if cluster_file is not None:  # principals changes it missed come from the others
            argv += ["--cluster-file", str(cluster_file)]
    argv += tls.argv() if tls is not None else ["--no-tls"]
    return argv + list(entry.args)


def start_node(
    entry: NodeEntry,
    run_dir: Path,
    key_file: Path | None = None,
    tls: NodeTls | None = None,
    cluster_file: Path | None = None,
) -> NodeEntry:
    """Start one node process (inside its network namespace, if it has one), requiring
    the key in ``key_file`` of its clients if given, serving TLS with ``tls`` if given;
    with ``cluster_file`` (and a key) it takes principals changes it missed from the
    other nodes the file names."""
    prefix = NetnsLab.command(entry.netns, []) if entry.netns else []
    return _start(entry, run_dir, prefix, key_file, tls, cluster_file)


def _start(
    entry: NodeEntry,
    run_dir: Path,
    prefix: list[str],
    key_file: Path | None = None,
    tls: NodeTls | None = None,
    cluster_file: Path | None = None,
) -> NodeEntry:
    """Start one node process (detached from this one) and wait until it listens.

    Returns the entry with its pid and port (the port the kernel chose if it was 0).
    Raises :class:`UnreachableError` with the tail of the node's log if it fails.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    entry.data_dir.mkdir(parents=True, exist_ok=True)
    ready = run_dir / f"{entry.id}.ready"
    ready.unlink(missing_ok=True)
    log = run_dir / f"{entry.id}.log"
    with open(log, "ab") as log_file:
        proc = subprocess.Popen(
            [*prefix, *_serve_argv(entry, ready, key_file, tls, cluster_file)],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # survives the CLI that started it; ^C does not reach it
            close_fds=True,
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if ready.exists():
            info = json.loads(ready.read_text())
            return replace(entry, port=int(info["port"]), pid=proc.pid, log=log)
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    else:
        proc.kill()
    tail = _tail(log)
    raise UnreachableError(
        f"node {entry.id} did not start (exit status {proc.poll()}); last lines of {log}:\n{tail}"
    )


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def up(
    root: Path,
    *,
    nodes: int = 3,
    name: str = "local",
    host: str = "127.0.0.1",
    base_port: int = 0,
    cpu_factors: Sequence[float] = (),
    cache_bytes: int | None = None,
    links: dict[str, Any] | None = None,
    netns_profile: str | None = None,
    cluster_path: Path | None = None,
    node_args: Sequence[str] = (),
    report: Report = lambda _: None,
    tls: bool | None = None,
    ca: certs.CertPair | None = None,
) -> ClusterFile:
    """Start a cluster of ``nodes`` nodes under ``root`` (or restart the stopped nodes
    of the cluster file already there) and write its cluster file.

    With ``netns_profile`` (Linux, root) each node runs in a network namespace of its
    own, joined to this one by a veth pair that the kernel shapes to that profile's
    bandwidth with ``tc ... tbf``; clients add only the latency (this kernel has no
    netem), through the cluster file's ``[links]``. ``node_args`` are more ``shuttle
    serve`` flags for every node (run-time settings), recorded in the cluster file.
    ``cache_bytes`` is each node's block cache (None: the node's own default).

    ``tls``: serve every connection over TLS (None: as the cluster file says, else on
    when the nodes listen beyond loopback); ``ca``: a CA of your own to sign the nodes'
    certificates with (else ROOT/tls/ca.pem, made on first use).
    """
    path = cluster_path or root / "cluster.toml"
    if path.exists():
        cluster = ClusterFile.load(path)
        report(f"cluster file {path} exists: starting the nodes that are not running")
    else:
        if not 1 <= nodes <= NODES_MAX:
            raise ConfigError(f"--nodes must be in 1..{NODES_MAX}, got {nodes}")
        if cpu_factors and len(cpu_factors) not in (1, nodes):
            raise ConfigError(
                f"give one CPU factor for all nodes or one per node ({nodes}), "
                f"got {len(cpu_factors)}"
            )
        factors = list(cpu_factors) * nodes if len(cpu_factors) == 1 else list(cpu_factors)
        entries = tuple(
            NodeEntry(
                id=f"n{i + 1}",
                host=host,
                port=base_port + i + 1 if base_port else 0,
                data_dir=root / f"n{i + 1}",
                cpu_factor=factors[i] if factors else 1.0,
                cache_bytes=cache_bytes,
                args=tuple(node_args),
            )
            for i in range(nodes)
        )
        cluster = ClusterFile(name, root, entries, links or {"default": "loopback"}, path)
        if netns_profile is not None:
            cluster = replace(cluster, netns_profile=netns_profile)
        beyond = netns_profile is not None or not is_loopback(host)
        cluster = replace(cluster, tls=tls if tls is not None else beyond)
    if tls is not None and tls != cluster.tls:
        running = [e.id for e in cluster.nodes if pid_is_node(e.pid)]
        if running:
            raise ConfigError(
                f"node(s) {', '.join(running)} run {'with' if cluster.tls else 'without'} TLS; "
                "stop the cluster (`shuttle cluster down`) before turning TLS "
                f"{'on' if tls else 'off'}"
            )
        cluster = replace(cluster, tls=tls)
    if cluster.netns_profile is not None and (
        cluster.netns_tag is None or cluster.netns_tag not in persistent_labs()
    ):
        cluster = _build_lab(cluster, report)
    cluster = _ensure_key(cluster, report)
    if cluster.tls:
        cluster = _ensure_ca(cluster, ca, report)
    elif not all(is_loopback(e.host) for e in cluster.nodes):
        raise ConfigError(
            "the cluster's nodes listen beyond loopback (a namespace lab): they serve TLS; "
            "leave out --no-tls"
        )
    run_dir = cluster.root / "run"
    for entry in cluster.nodes:
        if pid_is_node(entry.pid):
            report(f"{entry.id}: already running (pid {entry.pid}) on {entry.address}")
            continue
        started = start_node(
            entry, run_dir, cluster.key_file, _node_tls(cluster, entry, ca), path.resolve()
        )
        cluster = cluster.with_node(started)
        cluster.save(path)  # record each node as soon as it runs: `down` can find it
        report(f"{started.id}: started (pid {started.pid}) on {started.address}")
    return cluster.save(path)


def _ensure_key(cluster: ClusterFile, report: Report) -> ClusterFile:
    """The cluster with a key file: the one it records (checked), else ROOT/cluster.key,
    written now (0600) if it does not exist yet. Restarted nodes get the same key."""
    key_file = cluster.key_file or cluster.root / KEY_FILE_NAME
    if key_file.exists():
        load_key_file(key_file)  # a bad key fails here, before any node starts
    else:
        running = [e.id for e in cluster.nodes if pid_is_node(e.pid)]
        if cluster.key_file is not None and running:
            raise ConfigError(
                f"the cluster's key file {key_file} is missing while node(s) "
                f"{', '.join(running)} run with its key; restore it, or stop the cluster "
                "(`shuttle cluster down`) and run `shuttle cluster up` again for a new key"
            )
        key_file.parent.mkdir(parents=True, exist_ok=True)
        write_key_file(key_file)
        report(f"cluster key: wrote {key_file} (mode 0600); the nodes require it")
    return replace(cluster, key_file=key_file)


def _ensure_ca(cluster: ClusterFile, ca: certs.CertPair | None, report: Report) -> ClusterFile:
    """The TLS cluster with its CA: ``ca`` if given (your own), else the one it records,
    else ROOT/tls/ca.pem (made now if it does not exist)."""
    tls_dir = cluster.root / TLS_DIR_NAME
    if ca is not None:
        certs.load_ca(ca)  # a bad CA fails here, before any node starts
        return replace(cluster, ca_file=ca.cert)
    pair = certs.CertPair(tls_dir / certs.CA_CERT_NAME, tls_dir / certs.CA_KEY_NAME)
    if cluster.ca_file is not None and cluster.ca_file != pair.cert:
        return cluster  # a CA of the user's: its key is theirs, not under ROOT
    if not pair.key.exists():
        certs.make_ca(tls_dir, f"shuttle cluster {cluster.name}")
        report(f"TLS: made the cluster's CA {pair.cert} (its key {pair.key}, mode 0600)")
    return replace(cluster, ca_file=pair.cert)


def _node_tls(cluster: ClusterFile, entry: NodeEntry, ca: certs.CertPair | None) -> NodeTls | None:
    """A TLS cluster's node: its certificate (made or renewed now if needed) and key."""
    if not cluster.tls:
        return None
    assert cluster.ca_file is not None
    tls_dir = cluster.root / TLS_DIR_NAME
    cert = tls_dir / f"{entry.id}.pem"
    if certs.needs_renewal(cert, entry.host, entry.id, cluster.ca_file):
        signer = ca or certs.CertPair(cluster.ca_file, cluster.ca_file.with_suffix(".key"))
        if not signer.key.exists():
            raise ConfigError(
                f"node {entry.id} needs a new TLS certificate (for {entry.host}) and the CA "
                f"key beside {cluster.ca_file} is not there: pass your CA with --ca-cert and "
                "--ca-key"
            )
        certs.make_node_cert(signer, tls_dir, entry.id, entry.host)
    return NodeTls(cert, tls_dir / f"{entry.id}.key", cluster.ca_file)


def _build_lab(cluster: ClusterFile, report: Report) -> ClusterFile:
    """Put the cluster's nodes in a new persistent namespace lab (kernel-shaped links)."""
    assert cluster.netns_profile is not None
    profile = parse_link_profile(cluster.netns_profile)
    lab = NetnsLab(len(cluster.nodes), profile, hub_in_namespace=False, persistent=True)
    with lab:
        links: dict[str, Any] = {}
        nodes = []
        for entry, ns in zip(cluster.nodes, lab.nodes, strict=True):
            nodes.append(replace(entry, host=ns.address, netns=ns.namespace, pid=None))
            links[entry.id] = lab.client_profile(ns.index).spec()
    report(
        f"namespace lab {lab.tag}: {len(nodes)} veth links shaped by tc tbf to "
        f"{profile}; clients add the latency"
    )
    return replace(cluster, nodes=tuple(nodes), links=links, netns_tag=lab.tag)


def down(cluster: ClusterFile, *, report: Report = lambda _: None) -> ClusterFile:
    """Stop every node (SIGTERM, then SIGKILL after a grace period); data stays on disk."""
    for entry in cluster.nodes:
        if not pid_is_node(entry.pid):
            report(f"{entry.id}: not running")
        else:
            assert entry.pid is not None
            os.kill(entry.pid, signal.SIGTERM)
            if _wait_gone(entry.pid, STOP_TIMEOUT_S):
                report(f"{entry.id}: stopped (pid {entry.pid})")
            else:
                os.kill(entry.pid, signal.SIGKILL)
                _wait_gone(entry.pid, 2.0)
                report(f"{entry.id}: did not stop within {STOP_TIMEOUT_S:g} s; killed")
        cluster = cluster.with_node(replace(entry, pid=None))
    if cluster.netns_tag is not None:
        problems = destroy_lab(cluster.netns_tag)
        report(
            f"namespace lab {cluster.netns_tag}: removed" + (f" ({problems})" if problems else "")
        )
        cluster = replace(cluster, netns_tag=None)
    return cluster.save() if cluster.path else cluster


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            reaped, _ = os.waitpid(pid, os.WNOHANG)  # our child: reap it
            if reaped:
                return True
        except ChildProcessError:
            pass
        if not pid_is_node(pid):
            return True
        time.sleep(0.02)
    return False


def probe_node(
    host: str,
    port: int,
    timeout_s: float = 2.0,
    *,
    key: bytes | None = None,
    tls: ClientTls | None = None,
) -> str:
    """Ping a node (with the cluster ``key``, if it has one, over TLS if ``tls``); a
    one-line summary of its counters, or :class:`UnreachableError` /
    :class:`AuthenticationError`."""
    with BlockingConnection(
        host, port, connect_timeout_s=timeout_s, request_timeout_s=timeout_s, key=key, tls=tls
    ) as conn:
        stats = conn.call("node.stats").result
    server = stats.get("server", {})
    store = stats.get("store", {})
    return (
        f"up {server.get('uptime_s', 0):.0f} s, {server.get('requests', 0)} requests, "
        f"{store.get('bytes_written', 0) / 1e6:.1f} MB written"
    )


def status(cluster: ClusterFile) -> list[NodeStatus]:
    """Each node: is its process running, does it answer a ping (with the cluster's
    key). Raises :class:`ConfigError` if the cluster's key file is unusable."""
    key = cluster.key()
    tls = cluster.client_tls()
    out = []
    for entry in cluster.nodes:
        running = pid_is_node(entry.pid)
        refused = False
        try:
            detail = probe_node(entry.host, entry.port, key=key, tls=tls)
            reachable = True
        except UnreachableError as exc:
            reachable, detail = False, str(exc)
        except AuthenticationError as exc:
            reachable, refused, detail = False, True, str(exc)
        out.append(NodeStatus(entry, running, reachable, detail, refused))
    return out
