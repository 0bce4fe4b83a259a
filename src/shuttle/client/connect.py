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
from shuttle.net.addresses import is_loopback, parse_address
from shuttle.net.auth import KEY_FILE_ENV, Credentials, load_credentials
from shuttle.net.profiles import parse_link_profile
from shuttle.net.tls import CA_FILE_ENV, ClientTls, tls_from_env

_ADDRESS = re.compile(r"^[\w.\-\[\]:]+:\d+$")


def connect(
    target: str | Path | None = None,
    *,
    node: str | None = None,
    cluster: str | Path | None = None,
    link: str | None = None,
    key_file: str | Path | None = None,
    tls: bool | None = None,
    ca_file: str | Path | None = None,
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

    TLS (docs/security.md, "The wire"): a cluster file says whether its nodes serve TLS
    and names the CA their certificates chain to; a single node (``HOST:PORT``) is
    dialled with TLS unless it is on loopback. ``tls`` overrides either (``True``:
    TLS on loopback too; ``False``: plain, beyond loopback too, for a node started
    ``--no-tls --insecure``). The CA comes from ``ca_file``, else the cluster file, else
    ``$SHUTTLE_CA_FILE``; TLS without one raises :class:`ConfigError`. With no ``tls``
    given, ``$SHUTTLE_TLS`` (1 or 0) overrides the default.

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
    if tls is None:
        tls = tls_from_env()
    if "validation" not in client_options and os.environ.get(VALIDATION_ENV):
        client_options["validation"] = os.environ[VALIDATION_ENV]  # checked by Client
    if "lookaside" not in client_options:  # $SHUTTLE_LOOKASIDE=1: the user's added stores
        client_options["lookaside"] = stores_from_env()
    if node is not None:
        host, port = parse_address(node, "node address")
        if "key" not in client_options:
            _set_credentials(client_options, _load_key(key_file, None))
        if "tls" not in client_options:
            use_tls = tls if tls is not None else not is_loopback(host)
            client_options["tls"] = _client_tls(use_tls, ca_file, None, node)
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
    if "tls" not in client_options:
        use_tls = tls if tls is not None else spec.tls
        client_options["tls"] = _client_tls(use_tls, ca_file, spec, str(path))
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


def _client_tls(
    use_tls: bool, ca_file: str | Path | None, cluster: ClusterFile | None, what: str
) -> ClientTls | None:
    """The client's TLS (None: plain): the CA from ``ca_file``, else the cluster file,
    else the environment; :class:`ConfigError` naming them when TLS has none."""
    if not use_tls:
        return None
    if ca_file is not None:
        return ClientTls(Path(ca_file))
    if cluster is not None and cluster.ca_file is not None:
        return ClientTls(cluster.ca_file)
    from_env = os.environ.get(CA_FILE_ENV)
    if from_env:
        return ClientTls(Path(from_env))
    raise ConfigError(
        f"{what} is dialled with TLS (it is beyond loopback, or --tls was given), which needs "
        f"the cluster's CA certificate to check the node's: --ca-file FILE or ${CA_FILE_ENV} "
        "(`shuttle cluster up --tls` makes ROOT/tls/ca.pem and names it in the cluster file); "
        "--no-tls for a node that serves without TLS"
    )


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
