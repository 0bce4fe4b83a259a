"""``shuttle trace ...``: record, convert and inspect traces."""

from __future__ import annotations

import typer

app = typer.Typer(
    help="Record, convert and inspect I/O traces (strace, nfsdump, block traces).",
    no_args_is_help=True,
)
