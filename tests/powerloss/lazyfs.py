"""LazyFS: find or build it, mount it, cut the power, unmount.

LazyFS is a FUSE file system over a directory that keeps written data in its own cache
until the file is fsynced; writing ``lazyfs::clear-cache`` to its fault FIFO drops every
unsynced byte, which is what a power cut does to a page cache. It passes metadata
operations (create, rename, unlink, mkdir) straight to the directory underneath, so it
does not model a lost rename or a lost directory entry; docs/storage-format.md reasons
about those instead.

``LAZYFS`` (the make variable, or ``--lazyfs``) names either a built LazyFS directory
(``DIR/lazyfs`` and ``DIR/lib``) or a build script (``build-lazyfs.sh DEST``), which is
run once into a cache directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import select
import signal
import subprocess
import time
from pathlib import Path
from types import TracebackType

REPO = Path(__file__).resolve().parents[2]
#: Where the repository's surroundings keep the build script (relative to the repo).
DEFAULT_BUILD_SCRIPT = Path("../shared/vendor/build-lazyfs.sh")
#: Where a LazyFS built from a script is kept: the user's cache, outside any checkout,
#: so that CI's fresh clones build it once per machine (``build_cache`` names one
#: directory per build script and source, so a changed source builds again).
CACHE_ROOT = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "shuttle"


def default_source() -> Path:
    """Where to find LazyFS when no one said: ``$SHUTTLE_LAZYFS``; else the build script
    beside this checkout, or beside the repository it was cloned from (CI runs in a
    fresh clone elsewhere); else a LazyFS already built into the cache."""
    named = os.environ.get("SHUTTLE_LAZYFS")
    if named:
        return Path(named).resolve()
    candidates = [REPO / DEFAULT_BUILD_SCRIPT]
    origin = subprocess.run(
        ["git", "-C", str(REPO), "config", "--get", "remote.origin.url"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    if origin and Path(origin).is_dir():
        candidates.append(Path(origin) / DEFAULT_BUILD_SCRIPT)
    candidates += sorted(CACHE_ROOT.glob("lazyfs-*"))
    for candidate in candidates:
        if candidate.is_file() or (candidate / "lazyfs").is_file():
            return candidate.resolve()
    return candidates[0].resolve()


def build_cache(source: Path) -> Path:
    """The cache directory for a LazyFS built by the script ``source`` (keyed by the
    script and the source archives beside it)."""
    digest = hashlib.blake2b(digest_size=8)
    if source.is_file():
        for path in [source, *sorted(source.parent.glob("lazyfs-*.tar.gz"))]:
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return CACHE_ROOT / f"lazyfs-{digest.hexdigest()}"


#: The build: apt packages plus a C++ compile, about 2 minutes on 2 cores here.
BUILD_TIMEOUT_S = 1200.0
#: Mounting is a process start and a FUSE handshake: well under a second.
MOUNT_TIMEOUT_S = 20.0
#: Dropping the cache walks LazyFS's page table: milliseconds for our few MiB.
CLEAR_TIMEOUT_S = 30.0
UNMOUNT_TIMEOUT_S = 20.0
#: LazyFS's own cache; everything unsynced lives here. No eviction, so nothing is
#: written back behind our back (which would hide a missing fsync).
CACHE_SIZE = "1gb"


class LazyFSUnavailable(Exception):
    """LazyFS cannot run here (no root, no /dev/fuse, no build): a reason to skip."""


def unavailable_reason() -> str | None:
    """Why a FUSE mount cannot work on this machine, or None if it can."""
    if os.geteuid() != 0:
        return "the power-loss tier mounts LazyFS (FUSE) and needs root"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse: FUSE is not available on this machine (load the fuse module)"
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as exc:
        return f"cannot open /dev/fuse ({exc.strerror}): FUSE is not usable here"
    return None


def locate(source: Path, cache_dir: Path) -> Path:
    """A directory holding a built LazyFS (``lazyfs`` and ``lib/``).

    ``source`` is such a directory, or a build script run into ``cache_dir`` unless a
    build is already there (one build at a time, under a lock).

    Raises:
        LazyFSUnavailable: ``source`` does not exist.
        RuntimeError: the build failed (its output's tail is in the message).
    """
    if (source / "lazyfs").is_file():
        return source
    if not source.is_file():
        raise LazyFSUnavailable(
            f"no LazyFS at {source}: give a built LazyFS directory or build-lazyfs.sh "
            "(make test-powerloss LAZYFS=...)"
        )
    if (cache_dir / "lazyfs").is_file():
        return cache_dir
    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(cache_dir.parent / f".{cache_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (cache_dir / "lazyfs").is_file():
            done = subprocess.run(
                [str(source), str(cache_dir)],
                capture_output=True,
                text=True,
                timeout=BUILD_TIMEOUT_S,
            )
            if done.returncode != 0 or not (cache_dir / "lazyfs").is_file():
                raise RuntimeError(
                    f"building LazyFS with {source} failed ({done.returncode}):\n"
                    f"{(done.stdout + done.stderr)[-3000:]}"
                )
    return cache_dir


class LazyFS:
    """One LazyFS mount of ``root`` (the real directory) at ``mount``; ``workdir`` holds
    its configuration, FIFOs and log. Use as a context manager."""

    def __init__(self, build_dir: Path, root: Path, mount: Path, workdir: Path) -> None:
        self.build_dir = build_dir
        self.root = root
        self.mount = mount
        self.workdir = workdir
        self.faults = workdir / "faults.fifo"
        self.done = workdir / "done.fifo"
        self.log = workdir / "lazyfs.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._done_fd = -1
        self.clears = 0

    def __enter__(self) -> LazyFS:
        self.start()
        return self

    def __exit__(
        self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Mount; returns once the mount point answers. Raises RuntimeError if not."""
        for d in (self.root, self.mount, self.workdir):
            d.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "lazyfs.toml"
        config.write_text(
            "[faults]\n"
            f'fifo_path="{self.faults}"\n'
            f'fifo_path_completed="{self.done}"\n'
            "[cache]\napply_eviction=false\n"
            f'[cache.simple]\ncustom_size="{CACHE_SIZE}"\nblocks_per_page=1\n'
            '[filesystem]\nlog_all_operations=false\nlogfile=""\n'
        )
        for fifo in (self.faults, self.done):
            fifo.unlink(missing_ok=True)
            os.mkfifo(fifo, 0o600)
        # Open our end first: LazyFS opens the completion FIFO for writing and would
        # block until a reader exists.
        self._done_fd = os.open(self.done, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    str(self.build_dir / "lazyfs"),
                    str(self.mount),
                    "--config-path",
                    # Relative, from cwd: LazyFS ignores a config path containing "-o"
                    # (it takes it for an option), as in /tmp/pytest-of-root/...
                    config.name,
                    "-o",
                    "modules=subdir",
                    "-o",
                    f"subdir={self.root}",
                    # Not "-s": single-threaded, LazyFS fails ftruncate of an open file
                    # with ENOENT. Multi-threaded, its cache (libpcache) segfaults now
                    # and then (about once in 30 points here); the harness treats that
                    # as the power cut it is and mounts it again.
                    "-f",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.workdir,
                env={**os.environ, "LD_LIBRARY_PATH": str(self.build_dir / "lib")},
            )
        deadline = time.monotonic() + MOUNT_TIMEOUT_S
        while not os.path.ismount(self.mount):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"LazyFS did not mount {self.mount}:\n{self.log_tail()}")
            time.sleep(0.01)

    def clear_cache(self) -> None:
        """Cut the power: drop every byte not fsynced. Returns once LazyFS confirms.
        Call it only while nothing uses the mount (the node is dead).

        Raises RuntimeError if LazyFS is gone or does not confirm in time."""
        if not self.alive():
            raise RuntimeError(f"LazyFS is not running:\n{self.log_tail()}")
        try:  # non-blocking: with LazyFS gone, a blocking open would wait for ever
            fd = os.open(self.faults, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise RuntimeError(f"LazyFS does not read its fault FIFO ({exc})") from exc
        try:
            os.write(fd, b"lazyfs::clear-cache\n")
        finally:
            os.close(fd)
        self._wait_for(b"finished::clear-cache")
        self.clears += 1

    def _wait_for(self, word: bytes) -> None:
        deadline = time.monotonic() + CLEAR_TIMEOUT_S
        got = b""
        while word not in got:
            left = deadline - time.monotonic()
            if left <= 0 or (self.proc is not None and self.proc.poll() is not None):
                raise RuntimeError(f"LazyFS did not confirm {word!r}:\n{self.log_tail()}")
            ready, _, _ = select.select([self._done_fd], [], [], min(left, 1.0))
            if ready:
                with contextlib.suppress(BlockingIOError):
                    got += os.read(self._done_fd, 4096)

    def stop(self) -> None:
        """Unmount and stop LazyFS (idempotent)."""
        if self.proc is not None:
            # Also when LazyFS died: its mount is left behind ("Transport endpoint is not
            # connected") and ismount() cannot tell.
            subprocess.run(["umount", "-l", str(self.mount)], capture_output=True, check=False)
            try:
                self.proc.wait(UNMOUNT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGKILL)
                self.proc.wait(UNMOUNT_TIMEOUT_S)
            self.proc = None
        if self._done_fd >= 0:
            os.close(self._done_fd)
            self._done_fd = -1

    def alive(self) -> bool:
        """False once LazyFS has exited (it crashed, or was stopped)."""
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return "(no log)"
