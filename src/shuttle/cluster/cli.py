"""``shuttle cluster up|down|status``: local clusters of node processes."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape

from shuttle.cluster.user_cli import app as user_app
from shuttle.errors import AuthenticationError, ConfigError, ShuttleError

if TYPE_CHECKING:
    from shuttle.cluster.clusterfile import ClusterFile

# The command tree is built whenever ``shuttle`` starts: the node processes, the cluster
# file's reader and the wire come in when a command runs (tests/unit/test_cli_start.py).
# So the names the options' help shows are written here, as
# ``shuttle.cluster.clusterfile`` defines them (the same test checks they agree):
CLUSTER_ENV = "SHUTTLE_CLUSTER"
CLUSTER_FILE_NAME = "cluster.toml"
DEFAULT_ROOT = Path(".shuttle")
#: Nodes of a new cluster when --nodes is not given (``shuttle.cluster.local.up``'s).
NODES_DEFAULT = 3

app = typer.Typer(
    help="Start, stop and inspect a local cluster of storage nodes.", no_args_is_help=True
)
console = Console()
app.add_typer(user_app, name="user")


# Every cluster command names its cluster the same two ways: by its file or by the
# folder that holds it (``cluster up`` writes ROOT/cluster.toml).
ClusterOpt = Annotated[
    Path | None,
    typer.Option(
        "--cluster",
        help=f"Cluster file (default: ROOT/{CLUSTER_FILE_NAME}, else ${CLUSTER_ENV}, "
        f"else {DEFAULT_ROOT}/{CLUSTER_FILE_NAME}).",
    ),
]
RootOpt = Annotated[
    Path | None,
    typer.Option(
        "--root",
        help=f"Folder of the cluster: its file ({CLUSTER_FILE_NAME}), data directories and logs "
        f"(default: the folder of the cluster file, {DEFAULT_ROOT} for a new one).",
    ),
]


@app.command()
def up(
    nodes: Annotated[
        int | None,
        typer.Option(
            help=f"Number of storage nodes of a new cluster (default {NODES_DEFAULT}). An "
            "existing cluster keeps its nodes: a different number is refused."
        ),
    ] = None,
    root: RootOpt = None,
    cluster: ClusterOpt = None,
    base_port: Annotated[
        int, typer.Option(help="Node i listens on BASE+i (0: any free ports).")
    ] = 0,
    cpu_factor: Annotated[
        str, typer.Option(help="CPU speed factor: one for all nodes, or a comma list (1,0.5,1).")
    ] = "1",
    window: Annotated[
        float | None,
        typer.Option(
            help="Run-time: observation window H of every node, seconds (default: the node's, 1)."
        ),
    ] = None,
    threshold: Annotated[
        float | None,
        typer.Option(
            help="Run-time: B_thresh, the fraction of H a migration must save (default: "
            "the node's, 0.3)."
        ),
    ] = None,
    object_memory: Annotated[
        int | None,
        typer.Option(help="Run-time: bytes each node lends to hosted objects (default: no limit)."),
    ] = None,
    cache_bytes: Annotated[
        int | None,
        typer.Option(help="Server block cache per node, bytes (default: the node's, 64 MiB)."),
    ] = None,
    link: Annotated[
        str, typer.Option(help="Client–node link profile: loopback, san, lan, wan or bw=..,lat=..")
    ] = "loopback",
    netns: Annotated[
        bool,
        typer.Option(
            "--netns",
            help="Run each node in its own network namespace behind a veth pair shaped by "
            "the kernel (tc tbf) to --link's bandwidth (Linux, root).",
        ),
    ] = False,
    ceph: Annotated[
        bool,
        typer.Option(
            "--ceph",
            help="Start a single-host Ceph under ROOT/ceph (one mon, --ceph-osds OSDs, pool "
            "'shuttle') and run the nodes over it (--store rados:shuttle). Needs "
            "scripts/setup.sh --ceph. See docs/ceph.md.",
        ),
    ] = False,
    ceph_osds: Annotated[
        int, typer.Option(help="With --ceph: OSDs of the local Ceph (pool size min(3, N)).")
    ] = 3,
    tls: Annotated[
        bool | None,
        typer.Option(
            "--tls/--no-tls",
            help="Serve every connection over TLS 1.3 with a cluster CA made under ROOT/tls/ "
            "(default: as the cluster file says; for a new cluster, on when the nodes listen "
            "beyond loopback, as with --netns, off on loopback).",
        ),
    ] = None,
    ca_cert: Annotated[
        Path | None,
        typer.Option(
            "--ca-cert",
            help="With --tls: your own CA certificate (PEM) to sign the nodes' certificates "
            "with, instead of a CA made for the cluster. Needs --ca-key.",
        ),
    ] = None,
    ca_key: Annotated[
        Path | None,
        typer.Option("--ca-key", help="With --ca-cert: that CA's private key (PEM, mode 0600)."),
    ] = None,
) -> None:
    """Start N storage-node processes on loopback and write the cluster file.

    The cluster gets a random key (ROOT/cluster.key, mode 0600, recorded in the
    cluster file); its nodes refuse clients that do not prove they hold it. With
    --tls, a CA (ROOT/tls/ca.pem) and a certificate per node too, and every
    connection is TLS; the cluster file names the CA for its clients.

    Name the cluster as every cluster command does: --cluster FILE, or --root DIR
    for DIR/cluster.toml (a new cluster keeps its data beside its file). Run it again
    on the same cluster to restart nodes that stopped: they come back on their ports
    with their data. Point clients at the cluster with --cluster FILE or
    `export SHUTTLE_CLUSTER=FILE`.
    """
    from shuttle.cluster import ceph as local_ceph
    from shuttle.cluster import local
    from shuttle.cluster.clusterfile import ClusterFile, cluster_path
    from shuttle.net.certs import CertPair
    from shuttle.net.profiles import parse_link_profile

    try:
        factors = [float(x) for x in cpu_factor.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(
            f"--cpu-factor: expected numbers like 1 or 1,0.5, got {cpu_factor!r}"
        ) from None
    parse_link_profile(link)  # a bad profile fails before any node starts
    if (ca_cert is None) != (ca_key is None):
        raise ConfigError("--ca-cert and --ca-key go together: your CA's certificate and key")
    own_ca = CertPair(ca_cert.resolve(), ca_key.resolve()) if ca_cert and ca_key else None
    if own_ca is not None and tls is False:
        raise ConfigError("--ca-cert signs TLS certificates: leave out --no-tls")
    path = cluster_path(cluster, root)
    if path.exists() and nodes is not None:
        _check_node_count(ClusterFile.load(path), nodes)
    cluster_root = (root or path.parent).resolve()
    store_args: list[str] = []
    if ceph or local_ceph.has_cluster_ceph(cluster_root):  # a cluster's Ceph comes back too
        store_args = _start_ceph(cluster_root, ceph_osds)
    result = local.up(
        cluster_root,
        nodes=NODES_DEFAULT if nodes is None else nodes,
        base_port=base_port,
        cpu_factors=factors,
        cache_bytes=cache_bytes,
        links={"default": link},
        netns_profile=link if netns else None,
        cluster_path=path.resolve(),
        node_args=[
            *store_args,
            *(
                arg
                for flag, value in (
                    ("--window", window),
                    ("--threshold", threshold),
                    ("--object-memory", object_memory),
                )
                if value is not None
                for arg in (flag, str(value))
            ),
        ],
        report=lambda line: console.print(escape(line), highlight=False),
        tls=True if own_ca is not None else tls,
        ca=own_ca,
    )
    _sync_principals(result)
    path_text = escape(str(result.path))  # paths are text, not markup
    console.print(f"cluster file: {path_text}")
    if result.key_file is not None:
        key_text = escape(str(result.key_file))
        console.print(f"cluster key:  {key_text} (clients of the cluster file use it)")
    if result.tls and result.ca_file is not None:
        ca_text = escape(str(result.ca_file))
        console.print(f"TLS:          every connection; CA {ca_text} (named in the cluster file)")
    console.print(f"use it:       export {CLUSTER_ENV}={path_text}")


def _check_node_count(existing: ClusterFile, nodes: int) -> None:
    """``cluster up --nodes N`` on a cluster that has another number of nodes: refused,
    before anything starts. Keys are placed by rendezvous hashing over the node ids
    (``client/routing.py``) and nothing moves objects yet, so another node count would
    hide the objects whose home changed."""
    have = len(existing.nodes)
    if nodes == have:
        return
    root = existing.root
    raise ConfigError(
        f"the cluster {existing.path} has {have} node(s); --nodes {nodes} cannot change it "
        f"(keys are placed over the nodes there are, and objects are not moved, so "
        f"{'more' if nodes > have else 'fewer'} nodes would hide some of them). Leave out "
        f"--nodes to start this cluster's {have} node(s); for {nodes} nodes start a new "
        f"cluster in another folder (`shuttle cluster up --nodes {nodes} --root "
        f"{root.parent / (root.name + '-' + str(nodes))}`), or `shuttle cluster down "
        f"--root {root}` and remove {root} first if its data can go"
    )


def _sync_principals(cluster: ClusterFile) -> None:
    """Nodes that were down while principals changed get the newest table (a node's
    own table survives its restart; this brings a stale one up to date)."""
    from shuttle.cluster import principals as cluster_principals
    from shuttle.net.auth import Credentials

    key = cluster.key()
    if key is None:
        return
    try:
        outcome = cluster_principals.sync(cluster, Credentials(key))
    except ShuttleError as exc:  # the nodes run; their principals are for `user sync`
        console.print(escape(f"principals: not synced ({exc})"), highlight=False)
        return
    if outcome.changed:
        console.print(
            escape(f"principals: brought every node to epoch {outcome.table.epoch}"),
            highlight=False,
        )


def _start_ceph(cluster_root: Path, osds: int) -> list[str]:
    """Start (or restart) the cluster's Ceph; the nodes' store flags for its pool."""
    from shuttle.cluster import ceph as local_ceph

    ceph_root = local_ceph.cluster_ceph_root(cluster_root)
    info = local_ceph.LocalCeph(
        ceph_root, osds=osds, report=lambda line: console.print(escape(line), highlight=False)
    ).start()
    console.print(escape(f"ceph conf:    {info.conf_path}"), highlight=False)
    console.print(escape(f"ceph keyring: {info.keyring_path} ({info.user})"), highlight=False)
    console.print(escape(f"ceph pool:    {info.pool}"), highlight=False)
    return info.store_args()


@app.command()
def down(cluster: ClusterOpt = None, root: RootOpt = None) -> None:
    """Stop every node of the cluster (SIGTERM, SIGKILL after 10 s). Data stays on disk,
    except a Ceph that `cluster up --ceph` started: its daemons are killed and ROOT/ceph
    (with the objects in it) is removed."""
    from shuttle.cluster import ceph as local_ceph
    from shuttle.cluster import local
    from shuttle.cluster.clusterfile import ClusterFile, cluster_path

    path = cluster_path(cluster, root)

    def report(line: str) -> None:
        console.print(escape(line), highlight=False)

    if path.exists() or not local_ceph.has_cluster_ceph(path.parent.resolve()):
        spec = ClusterFile.load(path)
        local.down(spec, report=report)
        cluster_root = spec.root
    else:  # the Ceph started, then the nodes did not
        cluster_root = path.parent.resolve()
    if local_ceph.has_cluster_ceph(cluster_root):
        ceph_root = local_ceph.cluster_ceph_root(cluster_root)
        local_ceph.LocalCeph(ceph_root).down()
        report(f"ceph: stopped, {ceph_root} removed")


@app.command()
def status(cluster: ClusterOpt = None, root: RootOpt = None) -> None:
    """Show each node: address, process, whether it answers, and a summary of its counters.

    Exit status 6 if a node does not answer, 7 if one refuses the cluster file's key.
    """
    from rich.table import Table

    from shuttle.cluster import ceph as local_ceph
    from shuttle.cluster import local
    from shuttle.cluster.clusterfile import ClusterFile, cluster_path

    spec = ClusterFile.load(cluster_path(cluster, root))
    # At 80 columns nothing is cut: the address (what a user copies next) stays whole
    # on one line, and other cells wrap rather than end in "…".
    table = Table(title=escape(f"cluster {spec.name} ({spec.path})"))
    width = max([len(e.address) for e in spec.nodes] + [len("address")])
    for col in ("node", "address", "pid", "cpu", "link", "state", "detail"):
        if col == "address":
            table.add_column(col, no_wrap=True, min_width=width)
        else:
            table.add_column(col, overflow="fold", min_width=len(col))
    states = local.status(spec)
    for st in states:
        e = st.entry
        if st.reachable:
            state = "[green]up[/]"
        elif st.refused:
            state = "[red]refused this client's key[/]"
        else:
            state = "[yellow]running, not answering[/]" if st.running else "[red]down[/]"
        table.add_row(
            escape(e.id),
            e.address,
            str(e.pid or "-"),
            f"{e.cpu_factor:g}",
            escape(str(spec.link_for(e.id))),
            state,  # the only cell that is markup
            escape(st.detail),
        )
    console.print(table)
    if local_ceph.has_cluster_ceph(spec.root):
        daemons = local_ceph.LocalCeph(local_ceph.cluster_ceph_root(spec.root)).running()
        text = ", ".join(f"{name} {'running' if up else 'DOWN'}" for name, up in daemons.items())
        console.print(escape(f"ceph: {text}"), highlight=False)
    if any(st.refused for st in states):
        raise typer.Exit(code=AuthenticationError.exit_code)
    if not all(st.reachable for st in states):
        raise typer.Exit(code=6)
