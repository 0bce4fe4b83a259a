"""Entering the jail: run by the sandbox worker before it loads any shipped code.

:func:`enter` turns the freshly started worker process (the *launcher*, still in all
of the node's namespaces, with the node's uid) into three processes:

``launcher`` (outside, in the node's namespaces)
    joins the jail's cgroups (as root), makes the new namespaces (user — unless it
    runs as root —, mount, pid, network, ipc, uts, cgroup), forks the jail's init and
    waits for it; it exits as the worker did (the same exit status, or the same
    signal), so the node diagnoses a stopped object exactly as without a jail. It
    holds nothing the object can reach.
``init`` (pid 1 of the jail's pid namespace)
    builds the minimal root (below), pivots into it, brings up loopback, forks the
    worker and reaps every orphan until the worker exits; then it exits, and the
    kernel kills every process left in the namespace. It is not the worker because
    the kernel drops the default-action signals of a namespace's init, SIGXCPU (the
    CPU limit) among them.
``worker`` (pid 2)
    starts a session of its own, drops to the jail's uid (a dedicated one when the
    node runs as root; the user namespace's unprivileged mapping of the node's uid
    otherwise) with no capabilities, sets ``no_new_privs``, its process and file
    limits and the seccomp filter (:mod:`shuttle.runtime.jail_seccomp`), and returns
    from :func:`enter` to serve the object.

Every process dies with its parent (``PR_SET_PDEATHSIG``): the node's SIGKILL of the
launcher, or the node's own death, takes the init and with it the whole namespace.

The root is a read-only tmpfs holding read-only bind mounts of what the interpreter
needs, each at its own path: ``/usr`` (with the ``/bin``, ``/lib``, ``/lib64`` links a
merged-``/usr`` system has), ``/etc/ld.so.cache``, the interpreter's prefix, the
virtualenv and every directory on ``sys.path`` (Shuttle's source for an editable
install). Then ``/dev`` with ``null``, ``zero``, ``full``, ``random`` and ``urandom``;
``/proc`` of the jail's own pid namespace; and a private, size-bounded ``/tmp``
(also ``/dev/shm``). No ``/etc/passwd``, no home, no data directory, no key, no
``/sys``.

A step that fails raises :class:`JailError` naming it and the kernel's answer: the
worker reports it to the node (which refuses shipped code, saying what is missing).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import resource
import signal
import socket
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from shuttle.runtime.jail_seccomp import load_filter

# --- the kernel's constants (linux/sched.h, linux/mount.h, linux/prctl.h) --------------
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SYS_PIVOT_ROOT = 155  # x86_64
SYS_CAPSET = 126  # x86_64
LINUX_CAPABILITY_VERSION_3 = 0x20080522
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 1
#: statvfs flags → the mount flags a read-only remount must keep (in a user namespace
#: the kernel refuses a remount that would clear a flag the outer mount has locked).
STATVFS_TO_MOUNT = {
    os.ST_NOSUID: MS_NOSUID,
    os.ST_NODEV: MS_NODEV,
    os.ST_NOEXEC: MS_NOEXEC,
    os.ST_NOATIME: MS_NOATIME,
    os.ST_NODIRATIME: MS_NODIRATIME,
    os.ST_RELATIME: MS_RELATIME,
}
#: Devices the interpreter and ordinary libraries open.
DEVICES = ("null", "zero", "full", "random", "urandom")
#: Where the new root may be built before the pivot: the first of these that exists
#: and neither holds nor lies inside a path to bind (the root's tmpfs shadows it, in
#: the jail's mount namespace only; the node's is untouched). /tmp, unless Shuttle
#: itself lives under /tmp (a checkout in /tmp/x), whose binds it would hide.
STAGING_CANDIDATES = ("/tmp", "/mnt", "/media", "/srv", "/opt", "/var/tmp")
#: The jail's host name (its own uts namespace).
HOSTNAME = b"shuttle-jail"
#: Exit status of a launcher or init whose jail could not be built.
EXIT_JAIL_FAILED = 6

_libc = ctypes.CDLL(None, use_errno=True)


class JailError(Exception):
    """A step of building the jail failed; the text says which and why."""


@dataclass(frozen=True, slots=True)
class JailSpec:
    """What the node asks of one jail (it travels as JSON on the worker's command line).

    * ``uid``, ``gid``: the dedicated ids the worker runs under when the node runs as
      root (ignored otherwise: the user namespace maps the node's own).
    * ``processes_max``: processes (threads count) the jail may have at once.
    * ``tmp_bytes``: size of its private ``/tmp`` (and ``/dev/shm``), and its largest file.
    * ``cgroups``: ``{controller directory: {file: value}}`` to create and join, as
      root (empty: none; the process limit is then ``RLIMIT_NPROC`` alone)."""

    uid: int
    gid: int
    processes_max: int
    tmp_bytes: int
    cgroups: dict[str, dict[str, str]]

    def to_json(self) -> str:
        return json.dumps(
            {
                "uid": self.uid,
                "gid": self.gid,
                "processes_max": self.processes_max,
                "tmp_bytes": self.tmp_bytes,
                "cgroups": self.cgroups,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> JailSpec:
        raw = json.loads(text)
        return cls(
            int(raw["uid"]),
            int(raw["gid"]),
            int(raw["processes_max"]),
            int(raw["tmp_bytes"]),
            {
                str(k): {str(f): str(v) for f, v in files.items()}
                for k, files in raw["cgroups"].items()
            },
        )


def enter(spec: JailSpec, channel: int, fail: Callable[[str], None]) -> None:
    """Build the jail and return in its worker; the launcher and the init never return.

    ``channel`` is the worker's socket to the node: the launcher closes its copy once
    the jail stands (so the node's only peer is the worker). :class:`JailError` if a
    step fails in the launcher; a step that fails in the init is written to a pipe the
    launcher reads, which calls ``fail(reason)`` (the worker sends it to the node) and
    exits with :data:`EXIT_JAIL_FAILED`."""
    as_root = os.geteuid() == 0
    if as_root:
        for directory, files in spec.cgroups.items():
            _join_cgroup(directory, files)
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    flags |= CLONE_NEWCGROUP
    if not as_root:
        flags |= CLONE_NEWUSER
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare (new namespaces)", _unshare_hint(as_root))
    if not as_root:
        _write("/proc/self/setgroups", "deny", "the user namespace's setgroups")
        _write("/proc/self/uid_map", f"0 {uid} 1", "the user namespace's uid map")
        _write("/proc/self/gid_map", f"0 {gid} 1", "the user namespace's gid map")
    binds = _bind_sources()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write_end)
        _launcher(pid, read_end, channel, fail)
    os.close(read_end)
    try:
        _die_with_parent()
        _build_root(binds, spec.tmp_bytes)
        _loopback_up()
        _check(_libc.sethostname(HOSTNAME, len(HOSTNAME)), "sethostname", "")
    except BaseException as exc:  # report it through the launcher, which raises it
        os.write(write_end, str(exc).encode()[:4000])
        os._exit(EXIT_JAIL_FAILED)
    os.close(write_end)  # the launcher reads EOF: the jail stands
    for number in range(1, signal.NSIG):  # the init takes no signal from inside
        if number not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
            try:
                signal.signal(number, signal.SIG_DFL)
            except (OSError, ValueError):
                continue
    worker = os.fork()
    if worker:
        os.close(channel)
        _init(worker)
    _die_with_parent()
    os.setsid()  # kill(0, ...) and the terminal reach the jail's processes only
    _drop_privileges(spec, as_root)


# --- the launcher and the init ---------------------------------------------------------


def _launcher(init_pid: int, report: int, channel: int, fail: Callable[[str], None]) -> NoReturn:
    """Wait for the jail's init and end as its worker did (or report why the jail
    could not be built, on the worker's channel, before the worker exists)."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    failure = b""
    while chunk := os.read(report, 4096):
        failure += chunk
    os.close(report)
    if failure:
        os.waitpid(init_pid, 0)
        fail(failure.decode(errors="replace"))
        os._exit(EXIT_JAIL_FAILED)
    os.close(channel)  # the worker's end is the node's only peer from here on
    _, status = os.waitpid(init_pid, 0)
    _exit_as(os.waitstatus_to_exitcode(status))


def _init(worker: int) -> NoReturn:
    """Reap every process of the jail until the worker ends; then end as it did."""
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(EXIT_JAIL_FAILED)
        if pid == worker:
            code = os.waitstatus_to_exitcode(status)
            os._exit(128 - code if code < 0 else code)  # a signal as a shell shows it


def _exit_as(code: int) -> NoReturn:
    """Exit with ``code``; above 128, die of signal ``code - 128`` as the worker did."""
    if code > 128:
        number = code - 128
        with contextlib.suppress(OSError, ValueError):  # SIGKILL's handler cannot be set
            signal.signal(number, signal.SIG_DFL)
        with contextlib.suppress(OSError, ValueError):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {number})
            os.kill(os.getpid(), number)
    os._exit(code)


def _die_with_parent() -> None:
    _check(
        _libc.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), 0, 0, 0),
        "prctl(PDEATHSIG)",
        "",
    )


# --- cgroups ---------------------------------------------------------------------------


def _join_cgroup(directory: str, files: dict[str, str]) -> None:
    try:
        os.makedirs(directory, exist_ok=True)
        for name, value in files.items():
            with open(os.path.join(directory, name), "w") as f:
                f.write(value)
        with open(os.path.join(directory, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    except OSError as exc:
        raise JailError(f"cannot set up the jail's cgroup {directory}: {exc}") from None


# --- the root --------------------------------------------------------------------------


def _bind_sources() -> list[str]:
    """Directories (and files) to bind read-only, each at its own path: what the
    interpreter, its libraries and the worker's imports live in."""
    wanted = ["/usr", "/etc/ld.so.cache", sys.base_prefix, sys.prefix, sys.exec_prefix]
    wanted += [p for p in sys.path if p and os.path.isdir(p)]
    real = sorted({os.path.realpath(p) for p in wanted if os.path.exists(p)})
    kept: list[str] = []
    for path in real:  # a path inside one already bound needs no mount of its own
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return kept


def _within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def staging_for(binds: list[str]) -> str:
    """Where to build the root: a directory the binds neither sit under nor contain."""
    for candidate in STAGING_CANDIDATES:
        if not os.path.isdir(candidate) or os.path.islink(candidate):
            continue
        if not any(_within(b, candidate) or _within(candidate, b) for b in binds):
            return candidate
    raise JailError(
        "no directory to build the jail's root in: each of "
        f"{', '.join(STAGING_CANDIDATES)} is missing or holds the interpreter's files "
        f"({', '.join(binds)}); create /mnt"
    )


def _build_root(binds: list[str], tmp_bytes: int) -> None:
    new = staging_for(binds)
    _mount(None, "/", None, MS_REC | MS_PRIVATE, None, "make the node's mounts private")
    _mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m", "the root tmpfs")
    # The private /tmp first: a bind under /tmp (the interpreter in a checkout under
    # /tmp) then lands inside the private /tmp instead of being hidden under it.
    _scratch(new, "tmp", tmp_bytes)
    for path in binds:
        target = new + path
        if os.path.isdir(path):
            os.makedirs(target, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            open(target, "w").close()
        _bind_read_only(path, target)
    for link in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        if os.path.islink("/" + link) and not os.path.lexists(f"{new}/{link}"):
            os.symlink(os.readlink("/" + link), f"{new}/{link}")
    os.makedirs(f"{new}/dev", exist_ok=True)
    _mount("tmpfs", f"{new}/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=64k", "/dev")
    for device in DEVICES:
        open(f"{new}/dev/{device}", "w").close()
        _mount(f"/dev/{device}", f"{new}/dev/{device}", None, MS_BIND, None, f"/dev/{device}")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0")):
        os.symlink(target, f"{new}/dev/{name}")
    os.symlink("/proc/self/fd/1", f"{new}/dev/stdout")
    os.symlink("/proc/self/fd/2", f"{new}/dev/stderr")
    _scratch(new, "dev/shm", tmp_bytes)
    os.makedirs(f"{new}/proc", exist_ok=True)
    _mount(
        "proc", f"{new}/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None, "the jail's /proc"
    )
    os.makedirs(f"{new}/.old", exist_ok=True)
    os.chdir(new)
    _check(
        _libc.syscall(SYS_PIVOT_ROOT, b".", b".old"),
        "pivot_root into the jail's root",
        "",
    )
    os.chdir("/")
    _check(_libc.umount2(b"/.old", MNT_DETACH), "detach the node's root", "")
    os.rmdir("/.old")
    _mount(
        "/",
        "/",
        None,
        MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV,
        None,
        "a read-only root",
    )


def _scratch(new: str, scratch: str, tmp_bytes: int) -> None:
    """A private, size-bounded tmpfs at ``/scratch`` of the root being built."""
    os.makedirs(f"{new}/{scratch}", exist_ok=True)
    options = f"mode=1777,size={max(tmp_bytes, 4096)}"
    _mount("tmpfs", f"{new}/{scratch}", "tmpfs", MS_NOSUID | MS_NODEV, options, "/" + scratch)


def _bind_read_only(source: str, target: str) -> None:
    _mount(source, target, None, MS_BIND | MS_REC, None, f"bind {source}")
    locked = 0
    flags = os.statvfs(source).f_flag
    for bit, mount_flag in STATVFS_TO_MOUNT.items():
        if flags & bit:
            locked |= mount_flag
    remount = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | locked
    _mount(source, target, None, remount, None, f"make {source} read-only")


def _mount(
    source: str | None, target: str, fstype: str | None, flags: int, data: str | None, what: str
) -> None:
    def b(text: str | None) -> bytes | None:
        return None if text is None else text.encode()

    result = _libc.mount(b(source), b(target), b(fstype), ctypes.c_ulong(flags), b(data))
    _check(result, f"mount ({what})", "")


def _loopback_up() -> None:
    """Bring up ``lo``, the only interface of the jail's network namespace."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:  # any socket takes the ioctl
        request = struct.pack("16sH14x", b"lo", 0)
        try:
            flags = struct.unpack("16sH14x", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
            fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))
        except OSError as exc:
            raise JailError(f"cannot bring up the jail's loopback: {exc}") from None


# --- the worker ------------------------------------------------------------------------


def _drop_privileges(spec: JailSpec, as_root: bool) -> None:
    """The jail's uid, no capabilities, no_new_privs, limits, the seccomp filter."""
    resource.setrlimit(resource.RLIMIT_NPROC, (spec.processes_max, spec.processes_max))
    resource.setrlimit(resource.RLIMIT_FSIZE, (spec.tmp_bytes, spec.tmp_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    _check(
        _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0),
        "clear ambient capabilities",
        "",
    )
    last_cap = int(open("/proc/sys/kernel/cap_last_cap").read())  # noqa: SIM115
    for cap in range(last_cap + 1):
        _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "drop the capability bounding set", "")
    if as_root:
        os.setgroups([])
        os.setresgid(spec.gid, spec.gid, spec.gid)
        os.setresuid(spec.uid, spec.uid, spec.uid)  # clears every capability
    header = struct.pack("II", LINUX_CAPABILITY_VERSION_3, 0)
    data = bytes(24)  # effective, permitted, inheritable: empty, both 32-bit halves
    _check(_libc.syscall(SYS_CAPSET, header, data), "drop capabilities", "")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "set no_new_privs", "")
    try:
        load_filter()
    except OSError as exc:
        raise JailError(f"cannot load the seccomp filter: {exc}") from None


# --- errors ----------------------------------------------------------------------------


def _check(result: int, what: str, hint: str) -> None:
    if result == -1:
        number = ctypes.get_errno()
        detail = f"{what} failed: {os.strerror(number)} ({errno_name(number)})"
        raise JailError(f"{detail}; {hint}" if hint else detail)


def errno_name(number: int) -> str:
    import errno

    return errno.errorcode.get(number, str(number))


def _unshare_hint(as_root: bool) -> str:
    if as_root:
        return "the kernel lacks namespaces (CONFIG_NAMESPACES), or a container refuses them"
    return (
        "user namespaces are off for unprivileged users (sysctl user.max_user_namespaces, "
        "kernel.unprivileged_userns_clone, or an AppArmor/SELinux policy)"
    )


def _write(path: str, text: str, what: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as exc:
        raise JailError(f"cannot write {what} ({path}): {exc}") from None
