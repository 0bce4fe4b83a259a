"""Running a mount: the FUSE loop in this process, or a mount in a child process.

* :func:`serve_mount` mounts, serves the kernel until SIGINT/SIGTERM or an unmount
  from outside (``shuttle umount``, ``fusermount3 -u``), then unmounts cleanly. It is
  what ``shuttle mount --foreground`` runs.
* :class:`MountProcess` runs ``shuttle mount --foreground`` as a child process and
  waits until the mount is ready; ``stop()`` unmounts it (SIGTERM, then
  ``fusermount3 -u -z`` if the child is gone or stuck). Tests and benchmarks use it
  to mount with given client options (validation mode, link profile, lookaside).
* :func:`unmount` is ``shuttle umount``: ``fusermount3 -u``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import pyfuse3
import trio

from shuttle.client.client import Client
from shuttle.errors import ConfigError, ExternalToolError
from shuttle.faces.fuse import ATTR_TIMEOUT_S_DEFAULT, DIR_TIMEOUT_S_DEFAULT, ShuttleOperations

#: How long a child mount may take to come up (start Python, connect, mount).
MOUNT_START_TIMEOUT_S = 30.0
#: How long a child mount may take to unmount after SIGTERM before it is killed and
#: the mount point detached with ``fusermount3 -u -z``.
MOUNT_STOP_TIMEOUT_S = 10.0
#: The device FUSE needs.
FUSE_DEVICE = Path("/dev/fuse")


def fuse_unavailable_reason() -> str | None:
    """Why this machine cannot mount (None if it can)."""
    if not FUSE_DEVICE.exists():
        return f"{FUSE_DEVICE} is missing (load the fuse module, or run with --device /dev/fuse)"
    if not os.access(FUSE_DEVICE, os.R_OK | os.W_OK):
        return f"{FUSE_DEVICE} is not readable and writable by this user"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (apt-get install fuse3; scripts/setup.sh does it)"
    return None


def serve_mount(
    client: Client,
    mountpoint: str | Path,
    *,
    validation: str | None = None,
    attr_timeout_s: float = ATTR_TIMEOUT_S_DEFAULT,
    dir_timeout_s: float = DIR_TIMEOUT_S_DEFAULT,
    ready_file: Path | None = None,
    allow_other: bool = False,
    debug: bool = False,
) -> None:
    """Mount ``client``'s cluster at ``mountpoint`` and serve until told to stop."""
    reason = fuse_unavailable_reason()
    if reason is not None:
        raise ConfigError(f"cannot mount: {reason}")
    mountpoint = Path(mountpoint)
    check_mountpoint(mountpoint)
    ops = ShuttleOperations(
        client,
        validation=validation,
        attr_timeout_s=attr_timeout_s,
        dir_timeout_s=dir_timeout_s,
    )
    options = set(pyfuse3.default_options) | {"fsname=shuttle", "subtype=shuttle"}
    if allow_other:
        options.add("allow_other")
    if debug:
        options.add("debug")
    pyfuse3.init(ops, str(mountpoint), options)
    try:
        trio.run(_serve, ready_file, mountpoint)
    finally:
        pyfuse3.close(unmount=True)
        ops.close()
        if ready_file is not None:
            ready_file.unlink(missing_ok=True)


async def _serve(ready_file: Path | None, mountpoint: Path) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_stop_on_signal, nursery.cancel_scope)
        if ready_file is not None:
            tmp = ready_file.with_name(ready_file.name + ".tmp")
            tmp.write_text(json.dumps({"pid": os.getpid(), "mountpoint": str(mountpoint)}))
            tmp.replace(ready_file)
        await pyfuse3.main()
        nursery.cancel_scope.cancel()  # unmounted from outside: stop watching signals


async def _stop_on_signal(scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async for _ in signals:
            pyfuse3.terminate()
            return


def check_mountpoint(mountpoint: Path) -> None:
    """Refuse a mount point a mount would go wrong on, with what to do instead
    (:class:`ConfigError`, exit status 2): one that is already mounted (a second mount
    would stack on the first and hide it), one that is not a directory, and a directory
    that is not empty (the mount would hide its files while it runs)."""
    mounted = mounted_at(mountpoint)
    if mounted is not None:
        source, fstype = mounted
        how = (
            f"`shuttle umount {mountpoint}`"
            if fstype.endswith("shuttle")
            else f"`umount {mountpoint}`"
        )
        raise ConfigError(
            f"{mountpoint} is already a mount point ({source}, {fstype}); a second mount "
            f"would hide it. Unmount it first ({how}; if its process died, `shuttle umount "
            f"--lazy {mountpoint}`) or choose another directory"
        )
    if not mountpoint.is_dir():
        raise ConfigError(f"mount point {mountpoint} is not a directory; create it first")
    with os.scandir(mountpoint) as entries:
        names = sorted(entry.name for entry in entries)
    if names:
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        raise ConfigError(
            f"mount point {mountpoint} is not empty ({len(names)} entries: {shown}); the "
            "mount would hide them while it runs. Mount on an empty directory (mkdir a new "
            "one), or move the entries away first"
        )


def mounted_at(mountpoint: str | Path) -> tuple[str, str] | None:
    """(source, file system type) of what is mounted at ``mountpoint``, or None (even a
    mount whose process died, which ``os.path.ismount`` cannot stat)."""
    target = os.path.realpath(mountpoint)
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) > 2 and _unescape(fields[1]) == target:
                return _unescape(fields[0]), fields[2]
    return None


def is_mounted(mountpoint: str | Path) -> bool:
    """True if something is mounted at ``mountpoint`` (:func:`mounted_at`)."""
    return mounted_at(mountpoint) is not None


def _unescape(field: str) -> str:
    """A /proc/mounts path (spaces and the like written as octal escapes)."""
    return field.encode().decode("unicode_escape")


def unmount(mountpoint: str | Path, *, lazy: bool = False) -> None:
    """Unmount ``mountpoint`` with ``fusermount3 -u`` (``-z``: even while busy)."""
    args = ["fusermount3", "-u", *(["-z"] if lazy else []), str(mountpoint)]
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ExternalToolError(
            f"{' '.join(args)} failed: {done.stderr.strip() or done.returncode}. "
            "Close programs using the mount (see `fuser -m MOUNTPOINT`) or pass --lazy."
        )


class MountProcess:
    """``shuttle mount MOUNTPOINT --foreground`` in a child process.

    ``args`` are the mount's client options as the command takes them, for example
    ``["--cluster", "c.toml", "--validation", "check", "--link", "bw=10Mbit,lat=5ms"]``;
    ``env`` is added to the child's environment (``SHUTTLE_LOOKASIDE=1`` reads through
    the user's lookaside stores). Use as a context manager, or ``start()``/``stop()``.
    """

    def __init__(
        self,
        mountpoint: str | Path,
        args: Sequence[str] = (),
        *,
        env: dict[str, str] | None = None,
        log: Path | None = None,
    ) -> None:
        self.mountpoint = Path(mountpoint)
        self.args = list(args)
        self.env = dict(env or {})
        self.log = log or self.mountpoint.with_name(f"{self.mountpoint.name}.mount.log")
        self.ready_file = self.mountpoint.with_name(f".{self.mountpoint.name}.mount-ready")
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "shuttle",
            "mount",
            str(self.mountpoint),
            "--foreground",
            "--ready-file",
            str(self.ready_file),
            *self.args,
        ]

    def start(self, *, detach: bool = False) -> MountProcess:
        """Start the child and wait until the mount serves (``detach``: in a session of
        its own, so it outlives this process)."""
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.ready_file.unlink(missing_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                start_new_session=detach,
            )
        deadline = time.monotonic() + MOUNT_START_TIMEOUT_S
        while not self.ready_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.log.read_text(errors="replace")[-3000:]
                raise ExternalToolError(f"the mount at {self.mountpoint} did not start:\n{tail}")
            time.sleep(0.01)
        return self

    def stop(self) -> int | None:
        """Unmount: SIGTERM and wait; if that fails, kill and detach the mount point."""
        proc, self.proc = self.proc, None
        status: int | None = None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                status = proc.wait(MOUNT_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                status = proc.wait()
        if is_mounted(self.mountpoint):
            unmount(self.mountpoint, lazy=True)
        return status

    def __enter__(self) -> MountProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
