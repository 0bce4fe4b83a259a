"""The cluster file: which nodes a cluster has, where they listen, how links behave.

Written by ``shuttle cluster up``, read by every client command (``--cluster FILE``
or the ``SHUTTLE_CLUSTER`` environment variable). Example::

    [cluster]
    name = "local"
    root = "/tmp/shuttle"          # node data directories and logs live under it
    key_file = "/tmp/shuttle/cluster.key"   # the cluster key (mode 0600); nodes require it
    tls = true                     # every connection is TLS (cluster up --tls)
    ca_file = "/tmp/shuttle/tls/ca.pem"     # clients check the nodes' certificates with it

    [links]                        # client–node link profiles (see shuttle.net.profiles)
    default = "loopback"
    n2 = "wan"

    [[nodes]]
    id = "n1"
    host = "127.0.0.1"
    port = 7401
    data_dir = "/tmp/shuttle/n1"
    cpu_factor = 1.0
    cache_bytes = 67108864
    pid = 12345                    # while running
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import tomli_w

from shuttle.errors import ConfigError
from shuttle.net.addresses import NodeAddress
from shuttle.net.auth import load_key_file
from shuttle.net.profiles import LinkProfile, parse_link_profile, parse_links_table
from shuttle.net.tls import ClientTls

#: Environment variable naming the default cluster file of client commands.
CLUSTER_ENV = "SHUTTLE_CLUSTER"


@dataclass(frozen=True)
class NodeEntry:
    """One node of a cluster file."""

    id: str
    host: str
    port: int
    data_dir: Path
    cpu_factor: float = 1.0
    cache_bytes: int | None = None
    pid: int | None = None
    log: Path | None = None
    #: Network namespace the node runs in (``cluster up --netns``), if any.
    netns: str | None = None
    #: More ``shuttle serve`` flags (run-time settings such as ``--window 0.5``),
    #: kept so that a restarted node runs as it did.
    args: tuple[str, ...] = ()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def to_toml(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "host": self.host,
            "port": self.port,
            "data_dir": str(self.data_dir),
            "cpu_factor": self.cpu_factor,
        }
        if self.args:
            out["args"] = list(self.args)
        for name in ("cache_bytes", "pid", "log", "netns"):
            value = getattr(self, name)
            if value is not None:
                out[name] = str(value) if isinstance(value, Path) else value
        return out


@dataclass(frozen=True)
class ClusterFile:
    """A cluster: its nodes and the link profile between this machine's clients and each."""

    name: str
    root: Path
    nodes: tuple[NodeEntry, ...]
    #: Raw ``[links]`` table (kept as written, so custom profiles survive a rewrite).
    links: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    #: The persistent namespace lab the nodes run in (``cluster up --netns``), if any.
    netns_tag: str | None = None
    #: The link profile the kernel shapes (with ``tc tbf``) in that lab.
    netns_profile: str | None = None
    #: The cluster key file (``cluster up`` writes ROOT/cluster.key); the nodes require
    #: the key and clients of this file use it. None: a cluster without a key.
    key_file: Path | None = None
    #: Whether the nodes serve TLS (``cluster up --tls``, the default beyond loopback).
    tls: bool = False
    #: The cluster's CA certificate (``cluster up`` makes ROOT/tls/ca.pem): clients check
    #: every node's certificate against it.
    ca_file: Path | None = None

    def __post_init__(self) -> None:
        ids = [n.id for n in self.nodes]
        if len(set(ids)) != len(ids):
            raise ConfigError(f"cluster {self.name!r}: node ids must be unique, got {ids}")
        self.link_profiles()  # fail early on a bad [links] table

    def link_profiles(self) -> dict[str, LinkProfile]:
        return parse_links_table(self.links)

    def link_for(self, node_id: str) -> LinkProfile:
        profiles = self.link_profiles()
        return profiles.get(node_id) or profiles.get("default") or parse_link_profile("loopback")

    def addresses(self) -> list[NodeAddress]:
        """What a client needs: every node's address and link profile."""
        return [NodeAddress(n.id, n.host, n.port, self.link_for(n.id)) for n in self.nodes]

    def key(self) -> bytes | None:
        """The cluster key from :attr:`key_file` (None if the cluster has none);
        :class:`ConfigError` if the file is missing, malformed or open to others."""
        return load_key_file(self.key_file) if self.key_file is not None else None

    def client_tls(self) -> ClientTls | None:
        """How clients of this file dial TLS (None: the nodes serve without TLS);
        :class:`ConfigError` if the nodes serve TLS and the CA is missing or unreadable."""
        if not self.tls:
            return None
        if self.ca_file is None:
            raise ConfigError(
                f"cluster {self.name!r} serves TLS but its cluster file names no ca_file; "
                'add `ca_file = "PATH/ca.pem"` under [cluster] (cluster up writes it)'
            )
        return ClientTls(self.ca_file)

    def node(self, node_id: str) -> NodeEntry:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise ConfigError(f"cluster {self.name!r} has no node {node_id!r}")

    def with_node(self, entry: NodeEntry) -> ClusterFile:
        return replace(self, nodes=tuple(entry if n.id == entry.id else n for n in self.nodes))

    # --- TOML ------------------------------------------------------------------------

    def to_toml(self) -> str:
        meta: dict[str, Any] = {"name": self.name, "root": str(self.root)}
        if self.netns_profile is not None:
            meta["netns_profile"] = self.netns_profile
        if self.netns_tag is not None:
            meta["netns_tag"] = self.netns_tag
        if self.key_file is not None:
            meta["key_file"] = str(self.key_file)
        if self.tls:
            meta["tls"] = True
        if self.ca_file is not None:
            meta["ca_file"] = str(self.ca_file)
        doc: dict[str, Any] = {"cluster": meta}
        if self.links:
            doc["links"] = self.links
        doc["nodes"] = [n.to_toml() for n in self.nodes]
        return tomli_w.dumps(doc)

    def save(self, path: Path | None = None) -> ClusterFile:
        """Write atomically (readers never see half a file); returns self with ``path``."""
        target = path or self.path
        if target is None:
            raise ConfigError("no path to save the cluster file to")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(self.to_toml())
        os.replace(tmp, target)
        return replace(self, path=target)

    @classmethod
    def load(cls, path: Path) -> ClusterFile:
        """Read a cluster file; :class:`ConfigError` says what is wrong and where."""
        try:
            doc = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(
                f"cluster file {path} does not exist; start a cluster with "
                "`shuttle cluster up` or point --cluster at an existing file"
            ) from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"cluster file {path} is not valid TOML: {exc}") from None
        except OSError as exc:
            raise ConfigError(f"cannot read cluster file {path}: {exc.strerror}") from None
        return cls.from_dict(doc, path)

    @classmethod
    def from_dict(cls, doc: dict[str, Any], path: Path | None = None) -> ClusterFile:
        where = str(path or "cluster file")
        meta = doc.get("cluster", {})
        if not isinstance(meta, dict):
            raise ConfigError(f"{where}: [cluster] must be a table")
        raw_nodes = doc.get("nodes")
        if not isinstance(raw_nodes, list) or not raw_nodes:
            raise ConfigError(f"{where}: needs at least one [[nodes]] entry with id, host, port")
        nodes = []
        for i, raw in enumerate(raw_nodes):
            nodes.append(_node_from_dict(raw, f"{where}: nodes[{i}]"))
        links = doc.get("links", {})
        if not isinstance(links, dict):
            raise ConfigError(f"{where}: [links] must be a table of node id → profile")
        root = Path(meta.get("root", path.parent if path else "."))
        key_file = meta.get("key_file")
        if key_file is not None and not isinstance(key_file, str):
            raise ConfigError(f"{where}: [cluster] key_file must be a path (a string)")
        tls = meta.get("tls", False)
        ca_file = meta.get("ca_file")
        if not isinstance(tls, bool):
            raise ConfigError(f"{where}: [cluster] tls must be true or false, got {tls!r}")
        if ca_file is not None and not isinstance(ca_file, str):
            raise ConfigError(f"{where}: [cluster] ca_file must be a path (a string)")
        base = path.parent if path else Path()
        return cls(
            str(meta.get("name", "cluster")),
            root,
            tuple(nodes),
            links,
            path,
            netns_tag=meta.get("netns_tag"),
            netns_profile=meta.get("netns_profile"),
            # A relative key file is relative to the cluster file (the pair can move).
            key_file=base / key_file if key_file else None,
            tls=tls,
            ca_file=base / ca_file if ca_file else None,
        )


def _node_from_dict(raw: Any, where: str) -> NodeEntry:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: must be a table")
    for name, kind in (("id", str), ("host", str), ("port", int)):
        if not isinstance(raw.get(name), kind):
            raise ConfigError(f"{where}: {name!r} is required and must be a {kind.__name__}")
    port = raw["port"]
    if not 1 <= port <= 65535:
        raise ConfigError(f"{where}: port must be in 1..65535, got {port}")
    cpu = raw.get("cpu_factor", 1.0)
    if not isinstance(cpu, int | float) or cpu <= 0:
        raise ConfigError(f"{where}: cpu_factor must be a number > 0, got {cpu!r}")
    unknown = set(raw) - {f for f in NodeEntry.__dataclass_fields__}
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    return NodeEntry(
        id=raw["id"],
        host=raw["host"],
        port=port,
        data_dir=Path(raw.get("data_dir", ".")),
        cpu_factor=float(cpu),
        cache_bytes=raw.get("cache_bytes"),
        pid=raw.get("pid"),
        log=Path(raw["log"]) if raw.get("log") else None,
        netns=raw.get("netns"),
        args=_args(raw.get("args", []), where),
    )


def _args(raw: Any, where: str) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(a, str) for a in raw):
        raise ConfigError(f"{where}: 'args' must be a list of strings (shuttle serve flags)")
    return tuple(raw)


def default_cluster_path() -> Path | None:
    value = os.environ.get(CLUSTER_ENV)
    return Path(value) if value else None


#: Where cluster commands look for a cluster given neither by file nor by folder.
DEFAULT_ROOT = Path(".shuttle")
#: The cluster file's name in its folder (``cluster up`` writes ROOT/cluster.toml).
CLUSTER_FILE_NAME = "cluster.toml"


def cluster_path(cluster: Path | None, root: Path | None) -> Path:
    """The cluster file that ``--cluster`` / ``--root`` name: the file if given, else
    ROOT/cluster.toml, else ``$SHUTTLE_CLUSTER``, else .shuttle/cluster.toml."""
    if cluster is not None:
        return cluster
    if root is not None:
        return root / CLUSTER_FILE_NAME
    return default_cluster_path() or DEFAULT_ROOT / CLUSTER_FILE_NAME
