"""``shuttle fs ...``: the object-based file system from the command line.

Every command makes a run-time of its own and the volume's objects (a directory
object, and a file's stack for ``put``/``cat``), at the client to start with; with
``--placement auto`` (the default) the nodes may move them while the command runs.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from shuttle.client.cli import ClusterOpt, KeyFileOpt, LinkOpt, NodeOpt

if TYPE_CHECKING:
    # The file system and the run-time come in when a command runs, not to build the
    # command tree (tests/unit/test_cli_start.py).
    from shuttle.objects.fs.volume import Volume

app = typer.Typer(
    help="The object-based file system (ABACUS 4.3.1): directories and files whose "
    "functions (cache, RAID 5, directory management) are mobile objects.",
    no_args_is_help=True,
)
# Paths are data, not Rich markup: "/a/[b]" must print as written.
console = Console(markup=False)

VolumeOpt = Annotated[str, typer.Option("--volume", help="The volume (a namespace) to use.")]
PlacementOpt = Annotated[
    str,
    typer.Option(
        help="Where the file system's objects run: auto (start at the client; the run-time "
        "moves them when that pays) or static (stay at the client)."
    ),
]
PathArg = Annotated[str, typer.Argument(help="An absolute path in the volume, like /logs/a.txt.")]


@contextmanager
def _volume(
    node: str | None,
    cluster: Path | None,
    key_file: Path | None,
    link: str | None,
    volume: str,
    placement: str,
) -> Iterator[Volume]:
    from shuttle.objects.fs.volume import Volume
    from shuttle.runtime.config import RuntimeConfig

    with Volume.connect(
        node=node,
        cluster=cluster,
        key_file=key_file,
        link=link,
        volume=volume,
        placement=placement,
        config=RuntimeConfig(),
    ) as fs:
        yield fs


@app.command()
def mkdir(
    path: PathArg,
    volume: VolumeOpt = "default",
    placement: PlacementOpt = "auto",
    node: NodeOpt = None,
    cluster: ClusterOpt = None,
    key_file: KeyFileOpt = None,
    link: LinkOpt = None,
) -> None:
    """Make directory PATH (its parent must exist)."""
    with _volume(node, cluster, key_file, link, volume, placement) as fs:
        fs.mkdir(path)


@app.command()
def ls(
    path: Annotated[str, typer.Argument(help="A directory (default: the root).")] = "/",
    recursive: Annotated[bool, typer.Option("-R", "--recursive", help="List below, too.")] = False,
    volume: VolumeOpt = "default",
    placement: PlacementOpt = "auto",
    node: NodeOpt = None,
    cluster: ClusterOpt = None,
    key_file: KeyFileOpt = None,
    link: LinkOpt = None,
) -> None:
    """List directory PATH: each name, its type and its layout."""
    with _volume(node, cluster, key_file, link, volume, placement) as fs:
        rows = (
            list(fs.walk(path))
            if recursive
            else [(f"{path.rstrip('/')}/{e.name}", e) for e in fs.ls(path)]
        )
        from rich.table import Table

        table = Table(box=None, show_header=True)
        for col in ("name", "type", "layout"):
            table.add_column(col)
        for full, e in rows:
            name = full if recursive else e.name
            table.add_row(name + ("/" if e.type == "dir" else ""), e.type, e.layout or "-")
        console.print(table)


@app.command()
def put(
    local: Annotated[Path, typer.Argument(help="A local file, or - for standard input.")],
    path: PathArg,
    raid: Annotated[
        bool,
        typer.Option(
            help="Stripe the file with parity over up to 5 nodes (RAID 5; needs 3 or "
            "more); it is cached like any file, coherently across clients."
        ),
    ] = False,
    volume: VolumeOpt = "default",
    placement: PlacementOpt = "auto",
    node: NodeOpt = None,
    cluster: ClusterOpt = None,
    key_file: KeyFileOpt = None,
    link: LinkOpt = None,
) -> None:
    """Store a local file as PATH (the data first, then the name)."""
    data = sys.stdin.buffer.read() if str(local) == "-" else local.read_bytes()
    with _volume(node, cluster, key_file, link, volume, placement) as fs:
        entry = fs.put(path, data, raid=raid)
    console.print(f"{path}: {len(data)} bytes ({entry.layout})", highlight=False)


@app.command()
def cat(
    path: PathArg,
    volume: VolumeOpt = "default",
    placement: PlacementOpt = "auto",
    node: NodeOpt = None,
    cluster: ClusterOpt = None,
    key_file: KeyFileOpt = None,
    link: LinkOpt = None,
) -> None:
    """Write file PATH to standard output."""
    with _volume(node, cluster, key_file, link, volume, placement) as fs:
        data = fs.cat(path)
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


@app.command()
def stat(
    path: PathArg,
    volume: VolumeOpt = "default",
    placement: PlacementOpt = "auto",
    node: NodeOpt = None,
    cluster: ClusterOpt = None,
    key_file: KeyFileOpt = None,
    link: LinkOpt = None,
) -> None:
    """Show PATH's type, layout, size and the key of its data."""
    with _volume(node, cluster, key_file, link, volume, placement) as fs:
        e = fs.stat(path)
    console.print(
        f"{path}: {e.type}"
        + (f", {e.layout}, {e.size} bytes, data key {e.key}" if e.type == "file" else ""),
        highlight=False,
    )


@app.command()
def rm(
    path: PathArg,
    volume: VolumeOpt = "default",
    placement: PlacementOpt = "auto",
    node: NodeOpt = None,
    cluster: ClusterOpt = None,
    key_file: KeyFileOpt = None,
    link: LinkOpt = None,
) -> None:
    """Remove file PATH (the name first, then its data) or an empty directory."""
    with _volume(node, cluster, key_file, link, volume, placement) as fs:
        fs.rm(path)
