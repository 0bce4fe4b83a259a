"""The client commands of ``shuttle``: put, get, cat, ls, stat, rm, stats.

Every command takes ``--node HOST:PORT`` or ``--cluster FILE`` (default: the file
named by ``$SHUTTLE_CLUSTER``), and ``--key-file FILE`` for the cluster key (default:
the cluster file's, else ``$SHUTTLE_KEY_FILE``). Exit status: 0 done, 2 bad usage or
input, 3 node error, 4 no such object, 5 version conflict or object exists, 6 node
unreachable, 7 refused (a missing or wrong cluster key), 8 node busy, 9 the node's disk
is full (nothing changed; ``rm`` still works there).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from shuttle.errors import InvalidArgumentError

if TYPE_CHECKING:
    from shuttle.client.client import Client

# The command tree is built from these signatures whenever ``shuttle`` starts, so this
# module imports only what they need; the client comes in when a command runs
# (tests/unit/test_cli_start.py). The variables' names, as their modules define them
# (``shuttle.cluster.clusterfile.CLUSTER_ENV``, ``shuttle.net.auth.KEY_FILE_ENV``; the
# same test checks they agree):
CLUSTER_ENV = "SHUTTLE_CLUSTER"
KEY_FILE_ENV = "SHUTTLE_KEY_FILE"
#: ``shuttle.net.tls.TLS_ENV`` and ``CA_FILE_ENV`` (TLS would import ssl and cryptography)
TLS_ENV = "SHUTTLE_TLS"
CA_FILE_ENV = "SHUTTLE_CA_FILE"

# Keys and paths are data, not Rich markup: a key "logs/[2026]" must print as written.
console = Console(markup=False)
err = Console(stderr=True)

NodeOpt = Annotated[str | None, typer.Option("--node", help="Talk to one node at HOST:PORT.")]
ClusterOpt = Annotated[
    Path | None, typer.Option("--cluster", help=f"Cluster file (default: ${CLUSTER_ENV}).")
]
KeyFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--key-file",
        help=f"Cluster key file (default: the cluster file's key, else ${KEY_FILE_ENV}).",
    ),
]
TlsOpt = Annotated[
    bool | None,
    typer.Option(
        "--tls/--no-tls",
        help=f"TLS to the nodes (default: as the cluster file says; for --node, on unless "
        f"the node is on loopback; ${TLS_ENV}=1/0).",
    ),
]
CaFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--ca-file",
        help=f"The cluster's CA certificate for TLS (default: the cluster file's, else "
        f"${CA_FILE_ENV}).",
    ),
]
LinkOpt = Annotated[
    str | None,
    typer.Option(
        "--link", help="Emulate this link to every node: loopback, san, lan, wan, bw=..,lat=.."
    ),
]
#: Transfers larger than this show a progress bar (on a terminal).
PROGRESS_BYTES_MIN = 8 << 20


def connect(**where: Any) -> Client:
    """:func:`shuttle.client.connect`, imported when a command runs."""
    from shuttle.client.connect import connect as connect_client

    return connect_client(**where)


def _client(
    node: str | None,
    cluster: Path | None,
    key_file: Path | None,
    link: str | None = None,
    tls: bool | None = None,
    ca_file: Path | None = None,
) -> Client:
    return connect(
        node=node, cluster=cluster, link=link, key_file=key_file, tls=tls, ca_file=ca_file
    )


@contextmanager
def _progress(total: int, what: str) -> Iterator[Any]:
    if total < PROGRESS_BYTES_MIN or not err.is_terminal:
        yield lambda _n: None
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
    ) as bar:
        task = bar.add_task(what, total=total)
        yield lambda n: bar.advance(task, n)


def put(
    local: Annotated[Path, typer.Argument(help="Local file to upload ('-' for stdin).")],
    key: Annotated[
        str,
        typer.Argument(
            help="Object key, e.g. logs/2026/a.txt; a key ending in / puts the file into "
            "that directory under its own name (as cp does)."
        ),
    ],
    node: NodeOpt = None,
    cluster: ClusterOpt = None,
    key_file: KeyFileOpt = None,
    tls: TlsOpt = None,
    ca_file: CaFileOpt = None,
    link: LinkOpt = None,
) -> None:
    """Upload a local file as object KEY (atomically: readers never see half of it)."""
    key = put_key(local, key)
    if str(local) != "-" and not local.is_file():  # before any node is asked anything
        raise typer.BadParameter(f"{local} is not a readable file", param_hint="LOCAL")
    with _client(node, cluster, key_file, link, tls, ca_file) as client:
        client.check_new_key(key)  # a name is an object or a directory, cluster-wide
        if str(local) == "-":
            info = client.put(key, sys.stdin.buffer)
        else:
            with _progress(local.stat().st_size, f"put {key}") as advance:
                info = client.put(key, local, progress=advance)
    console.print(
        f"{key}: {info.size} bytes, version {info.version}, blake3 {info.hash.hex()[:16]}…"
    )


def get(
    key: Annotated[str, typer.Argument(help="Object key.")],
    local: Annotated[
        str,
        typer.Argument(
            help="Local file to write, or a directory to write it into under the key's "
            "last name (as cp does); '-' for stdout."
        ),
    ],
    node: NodeOpt = None,
    cluster: ClusterOpt = None,
    key_file: KeyFileOpt = None,
    tls: TlsOpt = None,
    ca_file: CaFileOpt = None,
    link: LinkOpt = None,
) -> None:
    """Download object KEY into a local file (written whole or not at all)."""
    with _client(node, cluster, key_file, link, tls, ca_file) as client:
        if local == "-":
            client.get_to(key, sys.stdout.buffer)
            return
        target = local_target(key, local)
        info = client.stat(key)
        with _progress(info.size, f"get {key}") as advance:
            try:
                client.get_to(key, target, progress=advance)
            except OSError as exc:
                err.print(
                    f"[red]error[/] (local_file): cannot write {escape(str(target))}: "
                    f"{escape(exc.strerror or str(exc))}. Nothing was written; choose a path "
                    "you can write to.",
                    soft_wrap=True,
                )
                raise typer.Exit(code=2) from exc
    err.print(f"{escape(key)} → {escape(str(target))}: {info.size} bytes, version {info.version}")


def put_key(local: Path, key: str) -> str:
    """The key ``shuttle put LOCAL KEY`` writes, as ``cp`` would: ``KEY`` itself, or,
    for a ``KEY`` ending in ``/``, LOCAL's name inside that directory. Raises
    :class:`InvalidArgumentError` (exit status 2) for standard input, which has no name."""
    if not key.endswith("/"):
        return key
    if str(local) == "-":
        raise InvalidArgumentError(
            f"key {key!r} names a directory, and standard input has no name to put "
            f"under it; name the object in full, e.g. {key}data.bin"
        )
    return key + local.name


def local_target(key: str, local: str) -> Path:
    """Where ``shuttle get KEY LOCAL`` writes, as ``cp`` would: into LOCAL under the key's
    last name if LOCAL is a directory (or ends in ``/``), else LOCAL itself. Raises
    :class:`InvalidArgumentError` (exit status 2) naming a directory that does not exist."""
    path = Path(local)
    if path.is_dir():
        return path / key.rstrip("/").rpartition("/")[2]
    if local.endswith("/"):
        raise InvalidArgumentError(
            f"directory {local} does not exist; create it first (mkdir -p {local})"
        )
    if not path.parent.is_dir():
        raise InvalidArgumentError(
            f"cannot write {local}: directory {path.parent} does not exist; create it first "
            f"(mkdir -p {path.parent}) or name an existing directory"
        )
    return path


def cat(
    keys: Annotated[list[str], typer.Argument(help="Object keys.")],
    node: NodeOpt = None,
    cluster: ClusterOpt = None,
    key_file: KeyFileOpt = None,
    tls: TlsOpt = None,
    ca_file: CaFileOpt = None,
    link: LinkOpt = None,
    offset: Annotated[
        int, typer.Option("--offset", min=0, help="Start at this byte of each object.")
    ] = 0,
    length: Annotated[
        int | None,
        typer.Option("--length", min=0, help="Write at most this many bytes of each object."),
    ] = None,
    rados_direct: Annotated[
        bool,
        typer.Option(
            "--rados-direct",
            help="Read a small range (--length up to 64 KiB) that misses a RADOS node's "
            "cache from the OSD itself, with your own Ceph credentials (--ceph-conf, "
            "--ceph-keyring, --ceph-user): the node names the object after checking your "
            "caps; see docs/ceph.md. Off by default.",
        ),
    ] = False,
    ceph_conf: Annotated[
        Path | None,
        typer.Option("--ceph-conf", help="Your ceph.conf (with --rados-direct)."),
    ] = None,
    ceph_keyring: Annotated[
        Path | None,
        typer.Option(
            "--ceph-keyring",
            help="Your keyring (with --rados-direct; default: the one the conf names).",
        ),
    ] = None,
    ceph_user: Annotated[
        str,
        typer.Option("--ceph-user", help="Your cephx user (with --rados-direct)."),
    ] = "client.admin",
) -> None:
    """Write objects (or a range of each: --offset, --length) to standard output,
    streaming large ones."""
    options: dict[str, Any] = {}
    if rados_direct:
        if ceph_conf is None:
            raise InvalidArgumentError(
                "--rados-direct reads with your own Ceph credentials: give --ceph-conf "
                "CONF (and --ceph-keyring KEYRING, --ceph-user USER unless the conf "
                "names them)"
            )
        from shuttle.client.rados_direct import CephOptions

        options["rados_direct"] = CephOptions(ceph_conf, ceph_keyring, ceph_user)
    elif ceph_conf is not None or ceph_keyring is not None:
        raise InvalidArgumentError(
            "--ceph-conf and --ceph-keyring only apply with --rados-direct; add it, or "
            "leave them out"
        )
    out = sys.stdout.buffer
    with connect(
        node=node,
        cluster=cluster,
        link=link,
        key_file=key_file,
        tls=tls,
        ca_file=ca_file,
        **options,
    ) as client:
        for key in keys:
            if length is not None and length <= client.piece_bytes:
                out.write(client.read(key, offset, length))  # one range read
                continue
            for piece in client.iter_read(key, offset, length):
                out.write(piece)
    out.flush()


def ls(
    prefix: Annotated[str, typer.Argument(help="Key prefix (a 'directory' ends in /).")] = "",
    recursive: Annotated[
        bool, typer.Option("--recursive", "-r", help="List every key below.")
    ] = False,
    long: Annotated[
        bool, typer.Option("--long", "-l", help="Show size, version and mtime.")
    ] = False,
    node: NodeOpt = None,
    cluster: ClusterOpt = None,
    key_file: KeyFileOpt = None,
    tls: TlsOpt = None,
    ca_file: CaFileOpt = None,
) -> None:
    """List keys under PREFIX, across all nodes (directories end in /)."""
    with _client(node, cluster, key_file, None, tls, ca_file) as client:
        if recursive:
            prefixes: list[str] = []
            keys = list(client.list(prefix))
        else:
            prefixes, keys = client.listdir(prefix)
        for p in prefixes:
            console.print(p, highlight=False)
        if long and keys:
            for key, info in zip(keys, client.stat_many(keys), strict=True):
                if info is None:
                    continue
                when = _date(info.mtime_ns)[:19]
                console.print(f"{info.size:>12} v{info.version:<8} {when}  {key}", highlight=False)
        else:
            for key in keys:
                console.print(key, highlight=False)


def _date(mtime_ns: int) -> str:
    """``mtime_ns`` as a UTC date to the nanosecond: ``2026-11-24 05:20:31.123456789 UTC``."""
    seconds, nanoseconds = divmod(mtime_ns, 1_000_000_000)
    when = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S")
    return f"{when}.{nanoseconds:09d} UTC"


def stat(
    key: Annotated[str, typer.Argument(help="Object key.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    node: NodeOpt = None,
    cluster: ClusterOpt = None,
    key_file: KeyFileOpt = None,
    tls: TlsOpt = None,
    ca_file: CaFileOpt = None,
) -> None:
    """Show an object's attributes: size, version, mtime, content hash, chunks."""
    with _client(node, cluster, key_file, None, tls, ca_file) as client:
        info = client.stat(key)
        where = client.node_for(key)
        # A stat lists the first 8,192 chunks; JSON gets them all (paged, one version).
        chunks = client.chunks(key) if as_json and not info.chunks_complete else info.chunks
    record = {
        "key": info.key,
        "node": where.node_id,
        "size": info.size,
        "version": info.version,
        "mtime_ns": info.mtime_ns,
        "mtime": _date(info.mtime_ns),
        "blake3": info.hash.hex(),
        "chunks": [
            {"offset": c.offset, "length": c.length, "blake3": c.hash.hex()} for c in chunks
        ],
    }
    if as_json:
        print(json.dumps(record, indent=2))
        return
    for name in ("key", "node", "size", "version", "mtime", "mtime_ns", "blake3"):
        console.print(f"{name:>9}: {record[name]}", highlight=False)
    console.print(f"{'chunks':>9}: {info.chunks_total} (content-defined, blake3)", highlight=False)


def rm(
    keys: Annotated[list[str], typer.Argument(help="Object keys to remove.")],
    force: Annotated[bool, typer.Option("--force", "-f", help="Ignore missing keys.")] = False,
    node: NodeOpt = None,
    cluster: ClusterOpt = None,
    key_file: KeyFileOpt = None,
    tls: TlsOpt = None,
    ca_file: CaFileOpt = None,
) -> None:
    """Remove objects."""
    with _client(node, cluster, key_file, None, tls, ca_file) as client:
        existed = client.remove_many(keys)
    missing = [k for k, e in zip(keys, existed, strict=True) if not e]
    if missing and not force:
        err.print(f"[red]error[/] (not_found): no object(s) {escape(', '.join(missing))}")
        raise typer.Exit(code=4)


def stats(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the raw counters as JSON.")
    ] = False,
    node: NodeOpt = None,
    cluster: ClusterOpt = None,
    key_file: KeyFileOpt = None,
    tls: TlsOpt = None,
    ca_file: CaFileOpt = None,
) -> None:
    """Show each node's counters: requests, bytes, errors, store and cache, free space
    on its disk and the journal's share of the used space (--json: all of them)."""
    with _client(node, cluster, key_file, None, tls, ca_file) as client:
        all_stats = {n.node_id: client.node_stats(n) for n in client.nodes}
    if as_json:
        print(json.dumps(all_stats, indent=2, default=str))
        return
    rows = {node_id: _counters(s) for node_id, s in all_stats.items()}
    console.print(_stats_table(rows, console.width))


#: The columns of ``shuttle stats``, in order (each row is one node).
STATS_COLUMNS = (
    "node",
    "uptime s",
    "requests",
    "errors",
    "connections",
    "bytes in",
    "bytes out",
    "written MB",
    "cache hit %",
    "free MB",
    "journal MB",
)


def _counters(s: dict[str, Any]) -> list[str]:
    """One node's row of :data:`STATS_COLUMNS` after the node's id."""
    srv, store = s.get("server", {}), s.get("store", {})
    cache = store.get("cache", {})
    looked = cache.get("hits", 0) + cache.get("misses", 0)
    hit = f"{100 * cache.get('hits', 0) / looked:.1f}" if looked else "-"
    space = store.get("space", {})
    free = f"{space['free_bytes'] / 1e6:.1f}" if "free_bytes" in space else "-"
    # The journal holds a second copy of recent small writes until a checkpoint.
    journal = (
        f"{space['journal_bytes'] / 1e6:.1f} ({100 * space['journal_share']:.0f}% of used)"
        if "journal_bytes" in space
        else "-"
    )
    return [
        f"{srv.get('uptime_s', 0):.0f}",
        str(srv.get("requests", 0)),
        str(srv.get("errors", 0)),
        _connections(srv),
        str(srv.get("bytes_in", 0)),
        str(srv.get("bytes_out", 0)),
        f"{store.get('bytes_written', 0) / 1e6:.1f}",
        hit,
        free,
        journal,
    ]


def _stats_table(rows: dict[str, list[str]], width: int) -> Any:
    """A row per node when that fits in ``width`` columns; else a column per node (the
    counters' names down the side), so no header and no figure is cut at 80 columns."""
    from rich.measure import Measurement
    from rich.table import Table

    table = Table(title="node counters")
    for col in STATS_COLUMNS:
        table.add_column(col, justify="right")
    for node_id, cells in rows.items():
        table.add_row(node_id, *cells)
    natural = Measurement.get(console, console.options.update_width(1 << 16), table).maximum
    if natural <= width:
        return table
    down = Table(title="node counters")
    down.add_column("counter", no_wrap=True)
    for node_id in rows:
        down.add_column(node_id, justify="right", overflow="fold")
    for i, name in enumerate(STATS_COLUMNS[1:]):
        down.add_row(name, *(cells[i] for cells in rows.values()))
    return down


def _connections(server: dict[str, Any]) -> str:
    """``open/max``, and what the node held back or refused when it did (operations.md)."""
    text = f"{server.get('connections_open', 0)}/{server.get('connections_max', '-')}"
    held, refused = server.get("connections_held", 0), server.get("connections_refused", 0)
    if held:
        text += f" ({held} held)"
    if refused:
        text += f" ({refused} refused busy)"
    return text


COMMANDS = (put, get, cat, ls, stat, rm, stats)
