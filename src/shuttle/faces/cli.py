"""``shuttle mount`` and ``shuttle umount``: the cluster as a directory tree (FUSE).

The mount takes the client options every client command takes (``--node`` /
``--cluster`` / ``--key-file`` / ``--link``) plus the validation mode and the
lookaside stores its reads go through. docs/mount.md describes the semantics.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated, Any

import typer

from shuttle.client.cli import CLUSTER_ENV, KEY_FILE_ENV

# The command tree is built from these signatures whenever ``shuttle`` starts: the FUSE
# face (pyfuse3, trio) and the client come in when ``mount`` runs
# (tests/unit/test_cli_start.py). So the defaults are written here, as their modules
# define them (the same test checks they agree):
#: ``shuttle.client.validation.VALIDATION_DEFAULT`` and ``VALIDATION_ENV``
VALIDATION_DEFAULT = "check"
VALIDATION_ENV = "SHUTTLE_VALIDATION"
#: ``shuttle.faces.fuse.ATTR_TIMEOUT_S_DEFAULT`` and ``DIR_TIMEOUT_S_DEFAULT``
ATTR_TIMEOUT_S_DEFAULT = 0.0
DIR_TIMEOUT_S_DEFAULT = 1.0


def mount(
    mountpoint: Annotated[Path, typer.Argument(help="An existing empty directory to mount on.")],
    node: Annotated[str | None, typer.Option("--node", help="Mount one node at HOST:PORT.")] = None,
    cluster: Annotated[
        Path | None, typer.Option("--cluster", help=f"Cluster file (default: ${CLUSTER_ENV}).")
    ] = None,
    key_file: Annotated[
        Path | None,
        typer.Option(
            "--key-file",
            help=f"Cluster key file (default: the cluster file's key, else ${KEY_FILE_ENV}).",
        ),
    ] = None,
    link: Annotated[
        str | None,
        typer.Option(
            "--link",
            help="Emulate this link to every node: loopback, san, lan, wan, bw=..,lat=..",
        ),
    ] = None,
    validation: Annotated[
        str | None,
        typer.Option(
            "--validation",
            help=f"When cached data may be used: check, callback, speculative (default: "
            f"${VALIDATION_ENV}, else {VALIDATION_DEFAULT}; see docs/consistency.md).",
        ),
    ] = None,
    lookaside: Annotated[
        bool | None,
        typer.Option(
            "--lookaside/--no-lookaside",
            help="Read missed chunks from the lookaside stores added with `shuttle "
            "lookaside add` (default: as $SHUTTLE_LOOKASIDE says).",
        ),
    ] = None,
    attr_timeout: Annotated[
        float,
        typer.Option(
            "--attr-timeout",
            help="Seconds the kernel may keep names and attributes without asking "
            "(0: every stat asks the validation mode).",
        ),
    ] = ATTR_TIMEOUT_S_DEFAULT,
    dir_timeout: Annotated[
        float,
        typer.Option(
            "--dir-timeout",
            help="Seconds the kernel may keep a directory's name (a directory removed "
            "elsewhere is seen that long).",
        ),
    ] = DIR_TIMEOUT_S_DEFAULT,
    foreground: Annotated[
        bool,
        typer.Option(
            "--foreground", help="Serve in this process until Ctrl-C or SIGTERM (then unmount)."
        ),
    ] = False,
    ready_file: Annotated[
        Path | None,
        typer.Option("--ready-file", help="Write this file once the mount serves (scripts)."),
    ] = None,
    log: Annotated[
        Path | None,
        typer.Option("--log", help="Log file of a background mount (default: beside it)."),
    ] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Log every FUSE request.")] = False,
    counters: Annotated[
        Path | None,
        typer.Option(
            "--counters",
            help="When the mount stops, write the client's counters (requests, cache, "
            "lookaside) to this JSON file (benchmarks).",
        ),
    ] = None,
) -> None:
    """Mount the cluster at MOUNTPOINT: any program reads and writes objects as files.

    Reads go through the client cache, the validation mode and the lookaside stores;
    a file's writes become the whole object when it is closed. Without --foreground
    the mount runs in the background; `shuttle umount MOUNTPOINT` ends it.
    """
    from shuttle.faces.mount import MountProcess, check_mountpoint, serve_mount

    if not foreground:
        check_mountpoint(mountpoint)  # here, not in the child's log
        args = _client_args(node, cluster, key_file, link, validation, lookaside)
        args += ["--attr-timeout", str(attr_timeout), "--dir-timeout", str(dir_timeout)]
        args += ["--debug"] if debug else []
        args += ["--counters", str(counters)] if counters is not None else []
        proc = MountProcess(mountpoint, args, log=log)
        proc.start(detach=True)
        assert proc.proc is not None
        typer.echo(
            f"mounted at {mountpoint} (pid {proc.proc.pid}, log {proc.log}); "
            f"`shuttle umount {mountpoint}` unmounts"
        )
        return
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from shuttle.client.connect import connect
    from shuttle.client.lookaside import StoreSet

    options: dict[str, Any] = {}
    if validation is not None:
        options["validation"] = validation
    if lookaside is not None:
        options["lookaside"] = StoreSet() if lookaside else None
    with connect(node=node, cluster=cluster, link=link, key_file=key_file, **options) as client:
        serve_mount(
            client,
            mountpoint,
            validation=validation,
            attr_timeout_s=attr_timeout,
            dir_timeout_s=dir_timeout,
            ready_file=ready_file,
            debug=debug,
        )
        if counters is not None:
            counters.write_text(json.dumps(client.counters(), indent=2, default=str))


def umount(
    mountpoint: Annotated[Path, typer.Argument(help="Where `shuttle mount` mounted.")],
    lazy: Annotated[
        bool, typer.Option("--lazy", help="Detach now even if programs still use it.")
    ] = False,
) -> None:
    """Unmount a `shuttle mount` (fusermount3 -u); its process then exits."""
    from shuttle.faces.mount import unmount

    unmount(mountpoint, lazy=lazy)


def _client_args(
    node: str | None,
    cluster: Path | None,
    key_file: Path | None,
    link: str | None,
    validation: str | None,
    lookaside: bool | None,
) -> list[str]:
    """The client options of a background mount's child, as the command takes them."""
    args: list[str] = []
    for flag, value in (
        ("--node", node),
        ("--cluster", cluster),
        ("--key-file", key_file),
        ("--validation", validation),
    ):
        if value is not None:
            args += [flag, str(value)]
    if link is not None:
        args += ["--link", link]
    if lookaside is not None:
        args.append("--lookaside" if lookaside else "--no-lookaside")
    return args


COMMANDS: tuple[Any, ...] = (mount, umount)
