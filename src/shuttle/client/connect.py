"""``shuttle.connect``: a client from a node address, a cluster file, or the environment."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from shuttle.client.client import Client
from shuttle.client.gateways import GatewayClient
from shuttle.client.lookaside import stores_from_env
from shuttle.client.model import NodeAddress
from shuttle.client.validation import VALIDATION_ENV
from shuttle.cluster.clusterfile import CLUSTER_ENV, ClusterFile, default_cluster_path
from shuttle.errors import ConfigError
from shuttle.net.addresses import parse_address
from shuttle.net.auth import KEY_FILE_ENV, Credentials, load_credentials
from shuttle.net.profiles import parse_link_profile

_ADDRESS = re.compile(r"^[\w.\-\[\]:]+:\d+$")


def connect(
    target: str | Path | None = None,
    *,
    node: str | None = None,
    cluster: str | Path | None = None,
    link: str | None = None,
    key_file: str | Path | None = None,
    **client_options: Any,
) -> Client:
    """A :class:`Client` of one node or of a whole cluster.

    ``target`` may be ``"HOST:PORT"`` (one node) or the path of a cluster file; or
    name it explicitly with ``node=`` / ``cluster=``. With none of them, the cluster
    file named by ``$SHUTTLE_CLUSTER`` is used. ``link`` overrides the link profile of
    every node (``"lan"``, ``"bw=5Mbit,lat=2ms"``...). Other options go to
    :class:`Client` (``cache_bytes``, ``request_timeout_s``, ``piece_bytes``...).

    The key (nodes started with a cluster key refuse clients without one) comes from
    ``key_file``, else the file named by ``$SHUTTLE_KEY_FILE``, else the cluster file's
    ``key_file``; with none, the client has no key (keyless nodes serve it). A key file
    holds the cluster key or a principal's key (``shuttle cluster user add``; the
    client then acts as that principal, within its capabilities). A bad key file
    raises :class:`ConfigError` saying what to do.

    Lookaside stores (docs/lookaside.md) come from ``lookaside=``, else, if
    ``$SHUTTLE_LOOKASIDE`` is ``1``, the stores the user added with ``shuttle lookaside
    add``; with neither, none. The validation mode (docs/consistency.md) comes from
    ``validation=``, else ``$SHUTTLE_VALIDATION``, else ``check``.

    A cluster whose nodes all serve one shared store (``shuttle serve --store rados:...``,
    as ``shuttle cluster up --ceph`` starts them) gets a
    :class:`~shuttle.client.gateways.GatewayClient`, which fails over between them.
    """
    if target is not None:
        if isinstance(target, str) and _ADDRESS.match(target) and not Path(target).exists():
            node = target
        else:
            cluster = target
    profile = parse_link_profile(link) if link else None
    if "validation" not in client_options and os.environ.get(VALIDATION_ENV):
        client_options["validation"] = os.environ[VALIDATION_ENV]  # checked by Client
    if "lookaside" not in client_options:  # $SHUTTLE_LOOKASIDE=1: the user's added stores
        client_options["lookaside"] = stores_from_env()
    if node is not None:
        host, port = parse_address(node, "node address")
        if "key" not in client_options:
            _set_credentials(client_options, _load_key(key_file, None))
        return Client([NodeAddress(node, host, port, profile)], **client_options)
    path = Path(cluster) if cluster is not None else default_cluster_path()
    if path is None:
        raise ConfigError(
            "no node or cluster given: pass --node HOST:PORT or --cluster FILE, "
            f"or set {CLUSTER_ENV} to a cluster file (`shuttle cluster up` writes one)"
        )
    spec = ClusterFile.load(path)
    addresses = spec.addresses()
    if "key" not in client_options:
        _set_credentials(client_options, _load_key(key_file, spec))
    if profile is not None:
        addresses = [NodeAddress(a.node_id, a.host, a.port, profile) for a in addresses]
    if _shared_store(spec) is not None:
        # Nodes over one shared store (RADOS): any node serves any key, so fail over.
        return GatewayClient(addresses, **client_options)
    return Client(addresses, **client_options)


def _shared_store(spec: ClusterFile) -> str | None:
    """The store every node of ``spec`` serves, if they share one (``--store rados:...``
    in each node's recorded flags, the same for all); None for nodes with stores of
    their own."""
    stores = set()
    for entry in spec.nodes:
        args = list(entry.args)
        value = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--store"), None)
        value = value or next((a.split("=", 1)[1] for a in args if a.startswith("--store=")), None)
        stores.add(value)
    if len(stores) != 1:
        return None
    only = stores.pop()
    return only if only is not None and only.startswith("rados:") else None


def _load_key(key_file: str | Path | None, cluster: ClusterFile | None) -> Credentials | None:
    """The client's key: from ``key_file``, else the environment, else the cluster file.

    The environment comes before the cluster file so that a principal can use the
    cluster's shared file with its own key (``export SHUTTLE_KEY_FILE=alice.key``)."""
    if key_file is not None:
        return load_credentials(Path(key_file))
    from_env = os.environ.get(KEY_FILE_ENV)
    if from_env:
        return load_credentials(Path(from_env))
    if cluster is not None and cluster.key_file is not None:
        return load_credentials(cluster.key_file)
    return None


def _set_credentials(options: dict[str, Any], credentials: Credentials | None) -> None:
    options["key"] = None if credentials is None else credentials.key
    options["principal"] = None if credentials is None else credentials.principal
