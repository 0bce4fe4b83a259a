"""``shuttle lookaside add|index|ls|rm``: the local directories a client may take
object contents from before asking the node (docs/lookaside.md).

The stores and their indexes live under ``$SHUTTLE_HOME/lookaside/`` (default
``~/.local/share/shuttle/lookaside/``). Clients use them when ``$SHUTTLE_LOOKASIDE``
is ``1``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:
    from shuttle.client.lookaside.index import IndexProgress, IndexReport
    from shuttle.client.lookaside.stores import LookasideStore, StoreSet

# The command tree is built whenever ``shuttle`` starts: the stores (sqlite, chunking)
# come in when a command runs (tests/unit/test_cli_start.py). The variables' names, as
# ``shuttle.client.lookaside.stores`` defines them (the same test checks they agree):
HOME_ENV = "SHUTTLE_HOME"
LOOKASIDE_ENV = "SHUTTLE_LOOKASIDE"


def _stores() -> StoreSet:
    from shuttle.client.lookaside.stores import StoreSet

    return StoreSet()


app = typer.Typer(
    help=f"Local directories (a USB stick, an older copy of a data set, a previous release) "
    f"that reads take matching chunks from before the network. Clients use them when "
    f"${LOOKASIDE_ENV}=1; they are kept under ${HOME_ENV}/lookaside/ "
    "(default ~/.local/share/shuttle/lookaside/).",
    no_args_is_help=True,
)
console = Console(markup=False)
err = Console(stderr=True)

DirArg = Annotated[Path, typer.Argument(help="The store's directory.")]


@contextmanager
def _progress(store: LookasideStore) -> Iterator[IndexProgress]:
    if not err.is_terminal:
        yield lambda _n: None
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    total = store.index.pending_bytes()
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=err,
        transient=True,
    ) as bar:
        task = bar.add_task(f"indexing {escape(str(store.root))}", total=total)
        yield lambda n: bar.advance(task, n)


def _refresh(store: LookasideStore) -> IndexReport:
    with _progress(store) as advance:
        report = store.refresh(advance)
    for path, why in report.skipped:
        err.print(f"[yellow]warning[/]: skipped {escape(path)}: {escape(why)}")
    err.print(
        f"{escape(str(store.root))}: {report.files_indexed} files indexed "
        f"({report.bytes_indexed / 1e6:.1f} MB, {report.chunks_indexed} chunks), "
        f"{report.files_unchanged} unchanged, {report.files_removed} removed, "
        f"{len(report.skipped)} skipped"
    )
    return report


@app.command()
def add(directory: DirArg) -> None:
    """Add DIRECTORY as a lookaside store and index every file in it."""
    store = _stores().add(directory)
    try:
        _refresh(store)
    finally:
        store.close()


@app.command()
def index(
    directory: Annotated[
        Path | None, typer.Argument(help="One store (default: every added store).")
    ] = None,
) -> None:
    """Re-index stores: new and changed files (by size and mtime) are chunked again,
    removed files forgotten."""
    stores = _stores()
    if directory is not None:
        entry = stores.find(directory)
        if entry is None:
            raise typer.BadParameter(
                f"{directory} is not a lookaside store; add it with `shuttle lookaside add`",
                param_hint="DIRECTORY",
            )
        entries = [entry]
    else:
        entries = stores.entries()
    for entry in entries:
        if not entry.root.is_dir():
            err.print(f"[yellow]warning[/]: {escape(str(entry.root))} is not there; skipped")
            continue
        store = stores.store(entry)
        try:
            _refresh(store)
        finally:
            store.close()


@app.command("ls")
def list_stores() -> None:
    """List the stores: files, chunks and bytes indexed, and when last indexed."""
    from rich.table import Table

    stores = _stores()
    table = Table(title="lookaside stores")
    for col in ("directory", "files", "chunks", "MB", "last indexed", "state"):
        table.add_column(col, justify="left" if col in ("directory", "state") else "right")
    for entry in stores.entries():
        store = stores.store(entry)
        try:
            s = store.summary()
        finally:
            store.close()
        when = (
            datetime.fromtimestamp(s.last_indexed, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
            if s.last_indexed is not None
            else "never"
        )
        state = "ok" if entry.root.is_dir() else "missing"
        table.add_row(
            str(entry.root), str(s.files), str(s.chunks), f"{s.bytes / 1e6:.1f}", when, state
        )
    console.print(table)


@app.command()
def rm(directory: DirArg) -> None:
    """Remove the store DIRECTORY and its index (the directory itself is untouched)."""
    _stores().remove(directory)
    err.print(f"removed lookaside store {escape(str(directory))}")
