"""``shuttle.connect``: a client from a node address, a cluster file, or the environment."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from shuttle.client.client import Client
from shuttle.client.model import NodeAddress
from shuttle.cluster.clusterfile import CLUSTER_ENV, ClusterFile, default_cluster_path
from shuttle.errors import ConfigError
from shuttle.net.profiles import parse_link_profile
from shuttle.node.config import parse_address

_ADDRESS = re.compile(r"^[\w.\-\[\]:]+:\d+$")


def connect(
    target: str | Path | None = None,
    *,
    node: str | None = None,
    cluster: str | Path | None = None,
    link: str | None = None,
    **client_options: Any,
) -> Client:
    """A :class:`Client` of one node or of a whole cluster.

    ``target`` may be ``"HOST:PORT"`` (one node) or the path of a cluster file; or
    name it explicitly with ``node=`` / ``cluster=``. With none of them, the cluster
    file named by ``$SHUTTLE_CLUSTER`` is used. ``link`` overrides the link profile of
    every node (``"lan"``, ``"bw=5Mbit,lat=2ms"``...). Other options go to
    :class:`Client` (``cache_bytes``, ``request_timeout_s``, ``piece_bytes``...).
    """
    if target is not None:
        if isinstance(target, str) and _ADDRESS.match(target) and not Path(target).exists():
            node = target
        else:
            cluster = target
    profile = parse_link_profile(link) if link else None
    if node is not None:
        host, port = parse_address(node, "node address")
        return Client([NodeAddress(node, host, port, profile)], **client_options)
    path = Path(cluster) if cluster is not None else default_cluster_path()
    if path is None:
        raise ConfigError(
            "no node or cluster given: pass --node HOST:PORT or --cluster FILE, "
            f"or set {CLUSTER_ENV} to a cluster file (`shuttle cluster up` writes one)"
        )
    addresses = ClusterFile.load(path).addresses()
    if profile is not None:
        addresses = [NodeAddress(a.node_id, a.host, a.port, profile) for a in addresses]
    return Client(addresses, **client_options)
