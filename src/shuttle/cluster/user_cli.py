"""``shuttle cluster user add|list|remove|caps|key|sync``: principals and their caps."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape

from shuttle.errors import ConfigError, UnreachableError

if TYPE_CHECKING:
    from shuttle.cluster import principals as ops
    from shuttle.cluster.clusterfile import ClusterFile
    from shuttle.net.auth import Credentials
    from shuttle.net.principals import Caps

# The command tree is built whenever ``shuttle`` starts: the principals' machinery (the
# wire, the client connections) comes in when a command runs (test_cli_start.py).
#: ``shuttle.net.auth.KEY_FILE_ENV`` (the same test checks they agree)
KEY_FILE_ENV = "SHUTTLE_KEY_FILE"

app = typer.Typer(
    help="Principals: named keys with capabilities (read and write per key prefix, ship "
    "code, admin), checked by every node on every operation. Run as the cluster key's "
    "holder (the cluster file's key) or as a principal with --admin.",
    no_args_is_help=True,
)
console = Console()
err = Console(stderr=True)

ClusterOpt = Annotated[
    Path | None,
    typer.Option(
        "--cluster", help="Cluster file (default: ROOT/cluster.toml, else $SHUTTLE_CLUSTER)."
    ),
]
RootOpt = Annotated[
    Path | None,
    typer.Option("--root", help="Folder of the cluster (its cluster.toml; default: --cluster's)."),
]
KeyFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--key-file",
        help=f"Your key: an admin principal's key file (default: ${KEY_FILE_ENV}, else the "
        "cluster file's cluster key).",
    ),
]
ReadOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--read",
        help="Allow reads, stats and listings of keys under this prefix (repeat for more; "
        "'' for every key). 'data/' covers data/x, not database.",
    ),
]
WriteOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--write",
        help="Allow writes, creates, truncates, removes and uploads of keys under this "
        "prefix (repeat for more; '' for every key). Reading needs --read too.",
    ),
]
ShipOpt = Annotated[
    bool,
    typer.Option(
        "--ship", help="Allow shipping code (Python classes run on the nodes, in the jail)."
    ),
]
AdminOpt = Annotated[
    bool,
    typer.Option(
        "--admin",
        help="Allow cluster operations: managing principals, node counters (shuttle stats), "
        "the run-time's tables (shuttle objects), dropping caches.",
    ),
]


def _cluster(cluster: Path | None, root: Path | None) -> ClusterFile:
    from shuttle.cluster.clusterfile import ClusterFile, cluster_path

    return ClusterFile.load(cluster_path(cluster, root))


def _credentials(spec: ClusterFile, key_file: Path | None) -> Credentials:
    """The administrator's key: --key-file, else $SHUTTLE_KEY_FILE, else the cluster's."""
    from shuttle.net.auth import load_credentials

    path = key_file or (Path(os.environ[KEY_FILE_ENV]) if os.environ.get(KEY_FILE_ENV) else None)
    path = path or spec.key_file
    if path is None:
        raise ConfigError(
            f"cluster {spec.path} has no key, so it has no principals: principals need "
            "nodes started with a cluster key (`shuttle cluster up` makes one)"
        )
    return load_credentials(path)


def _report(outcome: ops.Outcome, what: str) -> None:
    """Say what happened; exit 6 if some node still holds an older table."""
    reached = outcome.table.epoch
    if outcome.missed:
        names = ", ".join(e.id for e, _ in outcome.missed)
        err.print(
            escape(
                f"{what}, but node(s) {names} could not be reached and keep their older "
                f"principals: run `shuttle cluster user sync` once they are back (`shuttle "
                "cluster up` does it for the nodes it starts)"
            ),
            highlight=False,
        )
        for entry, exc in outcome.missed:
            err.print(escape(f"  {entry.id}: {exc}"), highlight=False)
        raise typer.Exit(UnreachableError.exit_code)
    console.print(escape(f"{what} (principals at epoch {reached}, on every node)"), highlight=False)


def _caps(read: list[str] | None, write: list[str] | None, ship: bool, admin: bool) -> Caps:
    from shuttle.net.principals import Caps

    return Caps.of(read or [], write or [], ship, admin)


@app.command()
def add(
    name: Annotated[str, typer.Argument(help="The principal's name (letters, digits, . _ @ -).")],
    key_out: Annotated[
        Path, typer.Option("--key-out", help="Where to write its key file (mode 0600; new file).")
    ],
    read: ReadOpt = None,
    write: WriteOpt = None,
    ship: ShipOpt = False,
    admin: AdminOpt = False,
    cluster: ClusterOpt = None,
    root: RootOpt = None,
    key_file: KeyFileOpt = None,
) -> None:
    """Add principal NAME with the given caps and write its key to --key-out.

    Give the key file to whoever acts as NAME: they use it as any key, with --key-file
    FILE or $SHUTTLE_KEY_FILE (with the cluster file for the node addresses). Every
    node checks each of their operations against these caps; `user caps` changes them
    and `user remove` revokes the key, both without restarting anything.
    """
    from shuttle.cluster import principals as ops
    from shuttle.net.principals import check_name

    check_name(name)
    caps = _caps(read, write, ship, admin)
    spec = _cluster(cluster, root)
    outcome = ops.add(spec, _credentials(spec, key_file), name, caps, key_out)
    console.print(escape(f"principal {name}: {caps.describe()}"), highlight=False)
    console.print(escape(f"key file:     {key_out} (mode 0600)"), highlight=False)
    _report(outcome, f"added principal {name}")


@app.command("caps")
def caps_(
    name: Annotated[str, typer.Argument(help="The principal whose caps to set.")],
    read: ReadOpt = None,
    write: WriteOpt = None,
    ship: ShipOpt = False,
    admin: AdminOpt = False,
    cluster: ClusterOpt = None,
    root: RootOpt = None,
    key_file: KeyFileOpt = None,
) -> None:
    """Set NAME's caps to exactly the ones given (as `ceph auth caps` does: what is not
    given is taken away). Its key stays the same; every node applies the new caps from
    the principal's next operation, on connections already open too."""
    from shuttle.cluster import principals as ops

    caps = _caps(read, write, ship, admin)
    spec = _cluster(cluster, root)
    outcome = ops.set_caps(spec, _credentials(spec, key_file), name, caps)
    console.print(escape(f"principal {name}: {caps.describe()}"), highlight=False)
    _report(outcome, f"changed the caps of {name}")


@app.command()
def remove(
    name: Annotated[str, typer.Argument(help="The principal to remove.")],
    cluster: ClusterOpt = None,
    root: RootOpt = None,
    key_file: KeyFileOpt = None,
) -> None:
    """Remove principal NAME: its key stops working at once. Every node closes its open
    connections and refuses its next ones; objects it made keep running with no rights
    (their calls are refused) until their applications end them."""
    from shuttle.cluster import principals as ops

    spec = _cluster(cluster, root)
    _report(ops.remove(spec, _credentials(spec, key_file), name), f"removed principal {name}")


@app.command()
def key(
    name: Annotated[str, typer.Argument(help="The principal whose key to write again.")],
    key_out: Annotated[
        Path, typer.Option("--key-out", help="Where to write the key file (mode 0600; new file).")
    ],
    cluster: ClusterOpt = None,
    root: RootOpt = None,
    key_file: KeyFileOpt = None,
) -> None:
    """Write principal NAME's key file again (its key is unchanged: to issue a new key,
    remove the principal and add it again)."""
    from shuttle.cluster import principals as ops

    ops.check_key_out(key_out)
    spec = _cluster(cluster, root)
    ops.write_key(key_out, name, ops.fetch_key(spec, _credentials(spec, key_file), name))
    console.print(escape(f"key file: {key_out} (mode 0600)"), highlight=False)


@app.command("list")
def list_(
    cluster: ClusterOpt = None,
    root: RootOpt = None,
    key_file: KeyFileOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List the principals and their caps (the newest table the nodes hold), and any
    node that holds an older one. Exit status 6 if a node could not be reached."""
    from rich.table import Table

    from shuttle.cluster import principals as ops

    spec = _cluster(cluster, root)
    tables = ops.gather(spec, _credentials(spec, key_file))
    table = ops.newest(tables)
    behind = [t for t in tables if t.table is None or t.table.digest() != table.digest()]
    if as_json:
        out = {
            "epoch": table.epoch,
            "principals": {n: table.principals[n].caps.to_json() for n in table.names()},
            "nodes": {t.entry.id: (t.table.epoch if t.table is not None else None) for t in tables},
        }
        print(json.dumps(out, indent=2))
    else:
        view = Table(title=escape(f"principals of {spec.name} (epoch {table.epoch})"))
        for col in ("principal", "read", "write", "ship", "admin", "added"):
            view.add_column(col)
        for n in table.names():
            p = table.principals[n]
            added = datetime.fromtimestamp(p.created_ns / 1e9, UTC).strftime("%Y-%m-%d %H:%M")
            view.add_row(
                escape(n),
                escape(", ".join(repr(x) for x in p.caps.read) or "-"),
                escape(", ".join(repr(x) for x in p.caps.write) or "-"),
                "yes" if p.caps.ship else "-",
                "yes" if p.caps.admin else "-",
                added,
            )
        console.print(view)
    for t in behind:
        state = f"epoch {t.table.epoch}" if t.table is not None else f"not reached ({t.error})"
        err.print(
            escape(f"node {t.entry.id}: {state}, behind: run `shuttle cluster user sync`"),
            highlight=False,
        )
    if any(t.table is None for t in tables):
        raise typer.Exit(UnreachableError.exit_code)


@app.command("sync")
def sync_(
    cluster: ClusterOpt = None,
    root: RootOpt = None,
    key_file: KeyFileOpt = None,
    source: Annotated[
        str | None,
        typer.Option("--from", help="Take this node's table (after a conflict), not the newest."),
    ] = None,
) -> None:
    """Give every node the newest principal table (nodes that were down during a change
    have an older one)."""
    from shuttle.cluster import principals as ops

    spec = _cluster(cluster, root)
    outcome = ops.sync(spec, _credentials(spec, key_file), source)
    _report(outcome, "synced" if outcome.changed else "every node had the newest principals")
