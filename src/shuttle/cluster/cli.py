"""``shuttle cluster up|down|status``: local clusters of node processes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from shuttle.cluster import local
from shuttle.cluster.clusterfile import CLUSTER_ENV, ClusterFile, default_cluster_path
from shuttle.errors import AuthenticationError, ConfigError
from shuttle.net.profiles import parse_link_profile
from shuttle.node.config import CACHE_BYTES_DEFAULT

app = typer.Typer(
    help="Start, stop and inspect a local cluster of storage nodes.", no_args_is_help=True
)
console = Console()

DEFAULT_ROOT = Path(".shuttle")

ExistingClusterOpt = Annotated[
    Path | None,
    typer.Option(help=f"Cluster file (default ${CLUSTER_ENV} or .shuttle/cluster.toml)."),
]


def _cluster_path(cluster: Path | None) -> Path:
    path = cluster or default_cluster_path() or DEFAULT_ROOT / "cluster.toml"
    return path


@app.command()
def up(
    nodes: Annotated[int, typer.Option(help="Number of storage nodes.")] = 3,
    root: Annotated[
        Path, typer.Option(help="Folder for data directories, logs and the cluster file.")
    ] = DEFAULT_ROOT,
    cluster: Annotated[
        Path | None, typer.Option(help="Cluster file to write (default ROOT/cluster.toml).")
    ] = None,
    base_port: Annotated[
        int, typer.Option(help="Node i listens on BASE+i (0: any free ports).")
    ] = 0,
    cpu_factor: Annotated[
        str, typer.Option(help="CPU speed factor: one for all nodes, or a comma list (1,0.5,1).")
    ] = "1",
    window: Annotated[
        float | None, typer.Option(help="Run-time: observation window H of every node, seconds.")
    ] = None,
    threshold: Annotated[
        float | None,
        typer.Option(help="Run-time: B_thresh, the fraction of H a migration must save."),
    ] = None,
    object_memory: Annotated[
        int | None, typer.Option(help="Run-time: bytes each node lends to hosted objects.")
    ] = None,
    cache_bytes: Annotated[
        int, typer.Option(help="Server block cache per node, bytes.")
    ] = CACHE_BYTES_DEFAULT,
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
) -> None:
    """Start N storage-node processes on loopback and write the cluster file.

    The cluster gets a random key (ROOT/cluster.key, mode 0600, recorded in the
    cluster file); its nodes refuse clients that do not prove they hold it.

    Run it again on the same ROOT to restart nodes that stopped: they come back on
    their ports with their data. Point clients at the cluster with --cluster FILE or
    `export SHUTTLE_CLUSTER=FILE`.
    """
    try:
        factors = [float(x) for x in cpu_factor.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(
            f"--cpu-factor: expected numbers like 1 or 1,0.5, got {cpu_factor!r}"
        ) from None
    parse_link_profile(link)  # a bad profile fails before any node starts
    path = cluster or root / "cluster.toml"
    result = local.up(
        root.resolve(),
        nodes=nodes,
        base_port=base_port,
        cpu_factors=factors,
        cache_bytes=cache_bytes,
        links={"default": link},
        netns_profile=link if netns else None,
        cluster_path=path.resolve(),
        node_args=[
            arg
            for flag, value in (
                ("--window", window),
                ("--threshold", threshold),
                ("--object-memory", object_memory),
            )
            if value is not None
            for arg in (flag, str(value))
        ],
        report=lambda line: console.print(line, highlight=False),
    )
    console.print(f"cluster file: {result.path}")
    if result.key_file is not None:
        console.print(f"cluster key:  {result.key_file} (clients of the cluster file use it)")
    console.print(f"use it:       export {CLUSTER_ENV}={result.path}")


@app.command()
def down(
    cluster: ExistingClusterOpt = None,
) -> None:
    """Stop every node of the cluster (SIGTERM, SIGKILL after 10 s). Data stays on disk."""
    spec = ClusterFile.load(_cluster_path(cluster))
    local.down(spec, report=lambda line: console.print(line, highlight=False))


@app.command()
def status(
    cluster: ExistingClusterOpt = None,
) -> None:
    """Show each node: address, process, whether it answers, and a summary of its counters.

    Exit status 6 if a node does not answer, 7 if one refuses the cluster file's key.
    """
    spec = ClusterFile.load(_cluster_path(cluster))
    table = Table(title=f"cluster {spec.name} ({spec.path})")
    for col in ("node", "address", "pid", "cpu", "link", "state", "detail"):
        table.add_column(col)
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
            e.id,
            e.address,
            str(e.pid or "-"),
            f"{e.cpu_factor:g}",
            str(spec.link_for(e.id)),
            state,
            st.detail,
        )
    console.print(table)
    if any(st.refused for st in states):
        raise typer.Exit(code=AuthenticationError.exit_code)
    if not all(st.reachable for st in states):
        raise typer.Exit(code=6)
