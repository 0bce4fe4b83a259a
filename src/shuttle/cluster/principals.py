"""Managing a cluster's principals from an administrator's machine
(``shuttle cluster user ...``; docs/security.md, "Principals and capabilities").

Every node holds the cluster's principal table (:mod:`shuttle.node.principal_store`),
at an *epoch* that grows with each change. A change here:

1. asks every node of the cluster file for its table (``principals.get``);
2. takes the newest (the highest epoch; two different tables at one epoch are a
   conflict to resolve by hand, :class:`ConfigError`);
3. applies the change to it, at the next epoch;
4. gives the new table to every node (``principals.put``, a compare-and-set on the
   epoch each node said it had; a node that changed meanwhile makes the whole change
   start again, at most :data:`ATTEMPTS` times).

A node that cannot be reached keeps its older table until the next change or
:func:`sync` reaches it (``shuttle cluster up`` syncs the nodes it starts); the
result names such nodes. Nodes of one RADOS pool share a table: the first stores it,
the others find it stored.

The administrator authenticates with the cluster key or as a principal with the
``admin`` capability; keys of new principals come back wrapped for that key
(``principal.key``) and are written to a key file (mode 0600).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from shuttle.cluster.clusterfile import ClusterFile, NodeEntry
from shuttle.errors import (
    AlreadyExistsError,
    ConfigError,
    NotFoundError,
    ShuttleError,
    UnreachableError,
    VersionMismatchError,
)
from shuttle.net.auth import Credentials, write_principal_key_file
from shuttle.net.blocking import BlockingConnection
from shuttle.net.principals import Caps, PrincipalTable, new_principal, unwrap_key, with_caps
from shuttle.net.tls import ClientTls

#: Times a change starts again when a node's table changed under it (another
#: administrator at work); after that the error says so.
ATTEMPTS = 3
#: Seconds to wait for a node to connect and answer (a few round trips of small maps).
TIMEOUT_S = 10.0


@dataclass(frozen=True)
class NodeTable:
    """What one node said: its table, or why it could not say."""

    entry: NodeEntry
    table: PrincipalTable | None
    error: ShuttleError | None = None


@dataclass(frozen=True)
class Outcome:
    """A change (or a sync): the table now in force, and the nodes it did not reach."""

    table: PrincipalTable
    missed: list[tuple[NodeEntry, ShuttleError]]
    changed: bool = True


Change = Callable[[PrincipalTable], PrincipalTable]


def _connect(
    entry: NodeEntry, credentials: Credentials, tls: ClientTls | None
) -> BlockingConnection:
    return BlockingConnection(
        entry.host,
        entry.port,
        client_name="shuttle-cluster-user",
        connect_timeout_s=TIMEOUT_S,
        request_timeout_s=TIMEOUT_S,
        key=credentials.key,
        principal=credentials.principal,
        tls=tls,
    )


def gather(cluster: ClusterFile, credentials: Credentials) -> list[NodeTable]:
    """Every node's table. Unreachable nodes are reported, not raised; a refusal of
    these credentials (AuthenticationError, NotPermittedError) is raised."""
    out = []
    tls = cluster.client_tls()
    for entry in cluster.nodes:
        try:
            with _connect(entry, credentials, tls) as conn:
                result = conn.call("principals.get").result
            table = PrincipalTable.from_wire(result.get("table"), f"node {entry.id}")
            out.append(NodeTable(entry, table))
        except UnreachableError as exc:
            out.append(NodeTable(entry, None, exc))
    return out


def newest(tables: list[NodeTable]) -> PrincipalTable:
    """The newest table the nodes hold; :class:`ConfigError` if two differ at one
    epoch, :class:`UnreachableError` if no node answered."""
    known = [t for t in tables if t.table is not None]
    if not known:
        raise UnreachableError(
            "no node of the cluster answered; is it running? (`shuttle cluster status`)"
        )
    top = max(t.table.epoch for t in known if t.table is not None)
    at_top = {t.table.digest(): t for t in known if t.table is not None and t.table.epoch == top}
    if len(at_top) > 1:
        nodes = ", ".join(t.entry.id for t in at_top.values())
        raise ConfigError(
            f"nodes {nodes} hold different principal tables at epoch {top} (two "
            "administrators changed them at once); list each node's with `shuttle cluster "
            "user list`, then `shuttle cluster user sync --from NODE` with the right one"
        )
    found = next(iter(at_top.values())).table
    assert found is not None
    return found


def _push(
    table: PrincipalTable,
    tables: list[NodeTable],
    credentials: Credentials,
    tls: ClientTls | None,
) -> list[tuple[NodeEntry, ShuttleError]]:
    """Give ``table`` to every node that answered; the ones it did not reach."""
    missed: list[tuple[NodeEntry, ShuttleError]] = []
    for t in tables:
        if t.table is None:
            assert t.error is not None
            missed.append((t.entry, t.error))
            continue
        if t.table.epoch == table.epoch and t.table.digest() == table.digest():
            continue  # it has it
        try:
            with _connect(t.entry, credentials, tls) as conn:
                conn.call(
                    "principals.put",
                    {"table": table.to_wire(), "expected_epoch": t.table.epoch},
                    idempotent=False,
                )
        except UnreachableError as exc:
            missed.append((t.entry, exc))
    return missed


def change(cluster: ClusterFile, credentials: Credentials, apply: Change) -> Outcome:
    """Apply ``apply`` to the cluster's newest table and give the result to every node
    (see the module docstring). ``apply`` raises to refuse (nothing is changed)."""
    for attempt in range(ATTEMPTS):
        tables = gather(cluster, credentials)
        current = newest(tables)
        new = apply(current)
        try:
            return Outcome(new, _push(new, tables, credentials, cluster.client_tls()))
        except VersionMismatchError:
            if attempt == ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def sync(cluster: ClusterFile, credentials: Credentials, source: str | None = None) -> Outcome:
    """Give every node the newest table (or node ``source``'s), without changing it."""
    tables = gather(cluster, credentials)
    if source is None:
        table = newest(tables)
    else:
        chosen = next((t for t in tables if t.entry.id == source), None)
        if chosen is None or chosen.table is None:
            raise NotFoundError(f"no reachable node {source!r} in {cluster.path}")
        table = chosen.table
        top = max(t.table.epoch for t in tables if t.table is not None)
        if table.epoch < top or any(
            t.table is not None and t.table.epoch == top and t.table.digest() != table.digest()
            for t in tables
        ):
            # The chosen table must win: it takes the next epoch.
            table = PrincipalTable(top + 1, table.principals)
    stale = [
        t
        for t in tables
        if t.table is not None
        and (t.table.epoch != table.epoch or t.table.digest() != table.digest())
    ]
    missed = _push(table, tables, credentials, cluster.client_tls())
    return Outcome(table, missed, changed=bool(stale))


def fetch_key(cluster: ClusterFile, credentials: Credentials, name: str) -> bytes:
    """Principal ``name``'s key, from the first node that answers, unwrapped with the
    administrator's own key (it never crosses the wire in clear)."""
    last: ShuttleError | None = None
    tls = cluster.client_tls()
    for entry in cluster.nodes:
        try:
            with _connect(entry, credentials, tls) as conn:
                reply = conn.call("principal.key", {"name": name}).result
            return unwrap_key(credentials.key, name, reply)
        except UnreachableError as exc:
            last = exc
    raise last or UnreachableError(f"the cluster in {cluster.path} has no nodes")


def write_key(path: Path, name: str, key: bytes) -> None:
    """Write principal ``name``'s key file (0600; never over an existing file)."""
    write_principal_key_file(path, name, key)


def check_key_out(path: Path) -> None:
    """Refuse a key file path that cannot be written, before anything is changed."""
    if path.exists() or path.is_symlink():
        raise ConfigError(
            f"{path} already exists; choose another --key-out (a key file is never "
            "overwritten: it may be someone's only copy)"
        )
    if not path.parent.is_dir():
        raise ConfigError(f"cannot write {path}: its folder {path.parent} does not exist")


# --- the changes the commands make ----------------------------------------------------


def add(
    cluster: ClusterFile, credentials: Credentials, name: str, caps: Caps, key_out: Path
) -> Outcome:
    """Add principal ``name`` with ``caps`` and write its key file ``key_out`` (checked
    writable first: a refusal changes nothing)."""
    check_key_out(key_out)

    def apply(table: PrincipalTable) -> PrincipalTable:
        if table.get(name) is not None:
            raise AlreadyExistsError(
                f"principal {name!r} exists already: change its caps with `shuttle cluster "
                f"user caps {name} ...`, or remove it first (its old key then stops working)"
            )
        return table.with_principal(new_principal(name, caps))

    outcome = change(cluster, credentials, apply)
    try:
        write_key(key_out, name, fetch_key(cluster, credentials, name))
    except ShuttleError as exc:
        raise type(exc)(
            f"{exc}; principal {name!r} was added: write its key file with `shuttle cluster "
            f"user key {name} --key-out FILE`"
        ) from exc
    return outcome


def set_caps(cluster: ClusterFile, credentials: Credentials, name: str, caps: Caps) -> Outcome:
    """Give principal ``name`` exactly ``caps`` (its key is unchanged)."""

    def apply(table: PrincipalTable) -> PrincipalTable:
        found = table.get(name)
        if found is None:
            raise NotFoundError(f"no principal {name!r} (`shuttle cluster user list`)")
        return table.with_principal(with_caps(found, caps))

    return change(cluster, credentials, apply)


def remove(cluster: ClusterFile, credentials: Credentials, name: str) -> Outcome:
    """Remove principal ``name`` (its key stops working)."""

    def apply(table: PrincipalTable) -> PrincipalTable:
        if table.get(name) is None:
            raise NotFoundError(f"no principal {name!r} (`shuttle cluster user list`)")
        return table.without(name)

    return change(cluster, credentials, apply)
