"""``shuttle demo``: Shuttle's main job on an embedded default data set.

Starts a local cluster of storage-node processes, puts a real data set into it (the
Python standard library's source tree: about 1,800 files), reads every object back
and verifies it byte for byte and by blake3 hash, kills one node with SIGKILL and
restarts it to show that nothing acknowledged is lost, and prints what happened.
"""

from __future__ import annotations

import os
import shutil
import signal
import sysconfig
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from shuttle.errors import ShuttleError

if TYPE_CHECKING:
    from shuttle.cluster.clusterfile import ClusterFile

# ``shuttle`` builds its command tree from ``demo``'s signature whenever it starts: the
# client and the node processes come in when the demo runs (test_cli_start.py).

console = Console()

#: Parallel client threads: each has its own connection per node, so puts to
#: different nodes overlap (2 cores: more threads would only contend).
THREADS = 4


def default_dataset() -> Path:
    """The Python standard library's source tree of the running interpreter."""
    return Path(sysconfig.get_paths()["stdlib"])


def dataset_files(root: Path) -> list[Path]:
    """Source files under ``root`` (``.py``; skipping caches and site-packages)."""
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("__pycache__", "site-packages"))
        files += [Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py")]
    return files


def demo(
    data: Annotated[
        Path | None,
        typer.Option(help="Folder to load (default: the Python standard library source)."),
    ] = None,
    nodes: Annotated[int, typer.Option(help="Storage nodes to start.")] = 3,
    root: Annotated[
        Path | None,
        typer.Option(help="Where the cluster keeps its data (default: a temporary folder)."),
    ] = None,
    keep: Annotated[
        bool, typer.Option(help="Leave the cluster running (and its data) when done.")
    ] = False,
) -> None:
    """Start a local cluster, load a real data set, read it back, verify it, and show
    that a node killed with SIGKILL comes back with all of its data."""
    from shuttle.cluster import local
    from shuttle.cluster.clusterfile import ClusterFile

    source = (data or default_dataset()).resolve()
    files = dataset_files(source)
    if not files:
        raise typer.BadParameter(f"no .py files under {source}", param_hint="--data")
    total_bytes = sum(f.stat().st_size for f in files)
    workdir = root.resolve() if root else Path(tempfile.mkdtemp(prefix="shuttle-demo-"))
    console.rule("[bold]Shuttle demo")
    console.print(f"data set: {source} ({len(files)} files, {total_bytes / 1e6:.1f} MB)")
    console.print(f"cluster:  {nodes} storage-node processes on 127.0.0.1, data under {workdir}")
    cluster = local.up(workdir, nodes=nodes, report=lambda line: console.print("  " + line))
    try:
        _run(cluster, source, files, total_bytes)
    finally:
        if keep:
            console.print(f"cluster left running: export SHUTTLE_CLUSTER={cluster.path}")
        else:
            local.down(ClusterFile.load(cluster.path or workdir / "cluster.toml"))
            if root is None:
                shutil.rmtree(workdir, ignore_errors=True)
            console.print("cluster stopped")


def _key(source: Path, f: Path) -> str:
    return f"{source.name}/{f.relative_to(source).as_posix()}"


def _run(cluster: ClusterFile, source: Path, files: list[Path], total_bytes: int) -> None:
    import blake3
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
    from rich.table import Table

    from shuttle.client.client import Client
    from shuttle.cluster import local

    client = Client(cluster.addresses(), key=cluster.key(), tls=cluster.client_tls())
    pool = ThreadPoolExecutor(THREADS)
    progress = Progress(
        "{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )
    expected = {_key(source, f): f for f in files}

    def put_one(f: Path) -> int:
        return client.put(_key(source, f), f.read_bytes()).size

    def check_one(key: str) -> str | None:
        want = expected[key].read_bytes()
        got = client.get(key)
        if got != want:
            return f"{key}: contents differ ({len(got)} bytes read, {len(want)} expected)"
        info = client.stat(key)
        if info.hash != blake3.blake3(want).digest():
            return f"{key}: node's blake3 hash does not match the local file"
        return None

    with progress:
        task = progress.add_task("put", total=len(files))
        t0 = time.perf_counter()
        for _ in pool.map(put_one, files):
            progress.advance(task)
        put_s = time.perf_counter() - t0
        task = progress.add_task("get + verify", total=len(files))
        t0 = time.perf_counter()
        problems = []
        for problem in pool.map(check_one, expected):
            progress.advance(task)
            if problem:
                problems.append(problem)
        get_s = time.perf_counter() - t0

    by_node = {n.node_id: 0 for n in client.nodes}
    for key in expected:
        by_node[client.node_for(key).node_id] += 1
    table = Table(title="what happened")
    table.add_column("step")
    table.add_column("result", justify="right")
    table.add_row("objects put", f"{len(files)} ({total_bytes / 1e6:.1f} MB)")
    table.add_row("put time", f"{put_s:.2f} s ({total_bytes / 1e6 / put_s:.1f} MB/s, durable)")
    table.add_row("get + verify time", f"{get_s:.2f} s ({total_bytes / 1e6 / get_s:.1f} MB/s)")
    table.add_row("verified (bytes and blake3)", f"{len(files) - len(problems)} of {len(files)}")
    table.add_row("objects per node", ", ".join(f"{k}: {v}" for k, v in by_node.items()))
    counters = client.counters()
    table.add_row(
        "client requests / round trips", f"{counters['requests']} / {counters['round_trips']}"
    )
    console.print(table)
    for problem in problems[:10]:
        console.print(f"[red]mismatch[/] {problem}")

    # Durability: kill one node without warning, restart it, check all of its objects.
    victim = cluster.nodes[0]
    mine = [k for k in expected if client.node_for(k).node_id == victim.id]
    console.print(f"killing {victim.id} (pid {victim.pid}) with SIGKILL, then restarting it…")
    if victim.pid:
        os.kill(victim.pid, signal.SIGKILL)
        local._wait_gone(victim.pid, 5.0)
    client.close()
    cluster = local.up(cluster.root, cluster_path=cluster.path)
    lost = [p for p in pool.map(check_one, mine) if p]
    intact = len(mine) - len(lost)
    console.print(f"after restart {victim.id} serves {intact} of its {len(mine)} objects intact")
    sample = _key(source, files[len(files) // 2])
    info = client.stat(sample)
    console.print(
        f"e.g. {sample}: {info.size} bytes, version {info.version}, {len(info.chunks)} "
        f"content-defined chunk(s), blake3 {info.hash.hex()[:16]}…"
    )
    pool.shutdown()
    client.close()
    if problems or lost:
        raise ShuttleError(
            f"{len(problems) + len(lost)} object(s) failed verification (listed above)"
        )
    console.print("[bold green]all objects verified[/]")
    _grep_step(cluster, source, list(expected), total_bytes)


#: What the demo's grep looks for (selective: a few hundred lines of 31 MB).
DEMO_PATTERN = r"TODO|XXX"


def _grep_step(cluster: ClusterFile, source: Path, keys: list[str], total_bytes: int) -> None:
    """Grep the data set over an emulated 10 Mbit/s LAN with placement auto: each grep
    object starts at the client and the nodes move them next to the data."""
    from shuttle.apps.grep import run_grep
    from shuttle.net.profiles import parse_link_profile
    from shuttle.runtime.client import Runtime

    lan = parse_link_profile("lan")
    assert lan.bandwidth_bits_per_s is not None
    console.rule("[bold]Mobile objects: grep over a 10 Mbit/s link, placement auto")
    console.print(
        f"searching {len(keys)} objects ({total_bytes / 1e6:.1f} MB) for {DEMO_PATTERN!r}; "
        f"at the client that would move all of it over the link "
        f"(≥ {total_bytes * 8 / lan.bandwidth_bits_per_s:.0f} s)"
    )
    nodes = [replace(a, link=lan) for a in cluster.addresses()]
    with Runtime(nodes, key=cluster.key(), tls=cluster.client_tls()) as rt:
        result = run_grep(rt, DEMO_PATTERN, sorted(keys), placement="auto")
    for m in result.migrations:
        console.print(
            f"  moved grep object {m['object'].rpartition('/')[2]} from the client to "
            f"{m['to']} at {m['t_s']:.2f} s: {m['reason']}",
            highlight=False,
        )
    console.print(
        f"{result.matches} matching lines in {result.elapsed_s:.1f} s; the grep objects ended "
        f"at {', '.join(sorted(set(result.final.values())))}"
    )
    if not result.migrations:
        raise ShuttleError("no grep object moved to its node; see `shuttle placement log`")
