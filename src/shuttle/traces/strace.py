"""Reader for ``strace -f -tt -T`` output (format name ``strace``).

What becomes a record, and why:

* ``open``/``openat``/``openat2`` → ``open`` (``create`` when ``O_CREAT`` is set,
  and for ``creat``); a failed open or stat → ``lookup`` (a file server still saw
  the name looked up). ``close`` of a tracked descriptor → ``close``.
* ``read``/``readv``/``pread64``/``preadv*`` → ``read``, the write family →
  ``write``, with ``offset`` the file position (explicit for the ``p*`` calls,
  otherwise tracked per open file: advanced by every transfer, set by ``lseek``,
  shared by ``dup``-ed and inherited descriptors as POSIX says) and ``size`` the
  bytes actually transferred. Calls that moved no bytes (a read at end of file)
  ask nothing of a file server and are skipped.
* ``stat``/``lstat``/``fstat``/``newfstatat``/``statx`` → ``getattr``;
  ``access``/``faccessat*`` → ``access``; ``getdents*`` → ``readdir``;
  ``readlink*`` → ``readlink``; ``statfs``/``fstatfs`` → ``fsstat``; the
  namespace calls → ``mkdir``/``rmdir``/``remove``/``rename``/``link``/
  ``symlink``; ``chmod``/``chown``/``truncate``/``utimensat`` and friends →
  ``setattr``; ``fsync``/``fdatasync`` → ``commit``.
* Descriptors are followed across ``dup*``, ``fcntl(F_DUPFD*)``, ``fork``/``clone``
  (a copied table, or a shared one with ``CLONE_FILES``), ``execve`` (which
  closes ``O_CLOEXEC`` descriptors) and ``close_range``. I/O on descriptors that
  were not opened from a path (pipes, sockets, inherited stdio) is not file-server
  traffic and is skipped.
* Paths are made absolute with the directory descriptor or the process's working
  directory (tracked through ``chdir``/``fchdir``) when it is known.

``client`` is the process: 0 for the first pid seen, 1 for the next, and so on.
Times are when each call started (``-tt`` wall clock; ``-ttt`` also works).

Each kind of call has a small handler (``_on_io``, ``_on_open``, ...) taking the
parsed call (:class:`_Call`); one table, ``_HANDLERS``, maps every system call name
to its handler, and calls not in it are skipped unparsed.
"""

from __future__ import annotations

import os.path
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from shuttle.errors import TraceFormatError
from shuttle.traces import io
from shuttle.traces.formats import TraceReader, register
from shuttle.traces.record import Op, TraceRecord
from shuttle.traces.strace_args import decode_string, split_args

_MICROS_PER_DAY = 86_400 * 1_000_000

#: ``[pid N] `` or ``N `` (strace -f), then ``HH:MM:SS.ffffff`` (-tt) or epoch (-ttt).
_LINE = re.compile(
    r"^(?:\[pid\s+(?P<pid1>\d+)\]\s+|(?P<pid2>\d+)\s+)?"
    r"(?:(?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d(?:\.\d+)?)|(?P<epoch>\d{9,}\.\d+))\s+(?P<body>.*)$"
)
_NAME = re.compile(r"^(\w+)\(")
#: ``name(args) = ret [ERRNO (text)] [<duration>]``; ``.*`` is greedy so the split is
#: at the last ``) = ``, which is the right one because the tail is fully anchored.
_CALL = re.compile(
    r"^(?P<name>\w+)\((?P<args>.*)\)\s+=\s+(?P<ret>-?\d+|0x[0-9a-fA-F]+|\?)(?:<[^>]*>)?"
    r"(?:\s+(?P<errno>E[A-Z0-9]+)\s+\(.*?\))?(?:\s+\(.*?\))?(?:\s+<(?P<dur>\d+\.\d+)>)?\s*$"
)
_UNFINISHED = " <unfinished ...>"
_RESUMED = re.compile(r"^<\.\.\. (?P<name>\w+) resumed>\s?(?P<rest>.*)$")
_FD = re.compile(r"^(?P<fd>AT_FDCWD|-?\d+)(?:<(?P<path>.*)>)?$")
_DUP_CMDS = ("F_DUPFD", "F_DUPFD_CLOEXEC")

# Syscalls by what they do; everything else is skipped without parsing its arguments.
_READS = {"read", "readv", "pread64", "preadv", "preadv2"}
_WRITES = {"write", "writev", "pwrite64", "pwritev", "pwritev2"}
_POSITIONED = {"pread64", "pwrite64", "preadv", "preadv2", "pwritev", "pwritev2"}
_OPENS = {"open", "openat", "openat2", "creat"}
_PATH_STATS = {"stat", "lstat", "stat64", "lstat64"}
_AT_STATS = {"newfstatat", "fstatat64", "statx"}
_FD_OPS: dict[str, Op] = {
    "fstat": Op.GETATTR,
    "fstat64": Op.GETATTR,
    "fstatfs": Op.FSSTAT,
    "fchmod": Op.SETATTR,
    "fchown": Op.SETATTR,
    "ftruncate": Op.SETATTR,
    "fsync": Op.COMMIT,
    "fdatasync": Op.COMMIT,
    "getdents": Op.READDIR,
    "getdents64": Op.READDIR,
}
#: Calls naming a path as argument 0 (or, for the ``*at`` forms, a dirfd then a path).
_PATH_OPS: dict[str, Op] = {
    "access": Op.ACCESS,
    "readlink": Op.READLINK,
    "statfs": Op.FSSTAT,
    "mkdir": Op.MKDIR,
    "rmdir": Op.RMDIR,
    "unlink": Op.REMOVE,
    "rename": Op.RENAME,
    "link": Op.LINK,
    "chmod": Op.SETATTR,
    "chown": Op.SETATTR,
    "lchown": Op.SETATTR,
    "truncate": Op.SETATTR,
    "utime": Op.SETATTR,
    "utimes": Op.SETATTR,
}
_AT_OPS: dict[str, Op] = {
    "faccessat": Op.ACCESS,
    "faccessat2": Op.ACCESS,
    "readlinkat": Op.READLINK,
    "mkdirat": Op.MKDIR,
    "unlinkat": Op.REMOVE,
    "renameat": Op.RENAME,
    "renameat2": Op.RENAME,
    "linkat": Op.LINK,
    "fchmodat": Op.SETATTR,
    "fchownat": Op.SETATTR,
    "utimensat": Op.SETATTR,
    "futimesat": Op.SETATTR,
}
_FORKS = {"clone", "clone3", "fork", "vfork"}


@dataclass
class _OpenFile:
    """An open file description: shared by dup-ed and inherited descriptors."""

    path: str
    offset: int = 0


@dataclass
class _Process:
    """What strace shows of one process: its descriptor table and working directory."""

    fds: dict[int, _OpenFile] = field(default_factory=dict)
    cloexec: set[int] = field(default_factory=set)
    cwd: list[str | None] = field(default_factory=lambda: [None])  # shared on CLONE_FS


@register
class StraceReader(TraceReader):
    """``strace -f -tt -T [-y] [-s N] -o FILE`` output, one call per line.

    ``cwd`` is the directory the traced command started in (to make relative paths
    absolute); ``include`` keeps only records whose file it accepts.
    """

    name = "strace"
    description = "strace -f -tt -T output (file system calls of a real program)"

    def __init__(
        self, cwd: str | None = None, include: Callable[[str], bool] | None = None
    ) -> None:
        super().__init__()
        self.cwd = cwd
        self.include = include

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        first = head.split(b"\n", 1)[0].decode("utf-8", "replace")
        m = _LINE.match(first)
        return m is not None and bool(_NAME.match(m["body"]) or m["body"].startswith("<..."))

    def records(self, path: str | Path) -> Iterator[TraceRecord]:
        with io.open_text(path, "r") as stream:
            yield from self.parse(stream, name=str(path))

    def parse(
        self, lines: Iterator[str] | list[str], name: str = "<strace>"
    ) -> Iterator[TraceRecord]:
        """Parse strace lines from any iterable (the file reader uses this)."""
        state = _State(self.cwd)
        day_us = 0
        last_us = -1
        first_us: int | None = None
        for lineno, raw in enumerate(lines, start=1):
            self.position = f"line {lineno}"
            line = raw.rstrip("\n")
            if not line or line.startswith("strace: "):
                continue
            m = _LINE.match(line)
            if m is None:
                raise TraceFormatError(
                    f"{name}:{lineno}: expected 'PID HH:MM:SS.ffffff syscall(...) = result' "
                    f"(strace -f -tt -T output), got {line[:80]!r}"
                )
            # Integer microseconds relative to the first line: float seconds since
            # midnight (or the epoch) would add rounding noise to every gap.
            if m["epoch"] is not None:
                sec, _, frac = m["epoch"].partition(".")
                micros = int(sec) * 1_000_000 + int(frac.ljust(6, "0")[:6])
            else:
                sec, _, frac = m["s"].partition(".")
                whole = int(m["h"]) * 3600 + int(m["m"]) * 60 + int(sec)
                micros = whole * 1_000_000 + int(frac.ljust(6, "0")[:6]) + day_us
                if micros < last_us - _MICROS_PER_DAY // 2:  # the clock passed midnight
                    day_us += _MICROS_PER_DAY
                    micros += _MICROS_PER_DAY
            last_us = micros
            if first_us is None:
                first_us = micros
            t = (micros - first_us) / 1e6
            pid = int(m["pid1"] or m["pid2"] or 0)
            body = m["body"]
            if body.startswith(("---", "+++")):
                if body.startswith("+++"):
                    state.exit(pid)
                continue
            if body.endswith(_UNFINISHED):
                state.pending[pid] = (t, body[: -len(_UNFINISHED)])
                name_m = _NAME.match(body)
                if name_m and name_m[1] in _FORKS:
                    state.forking.add(pid)
                continue
            resumed = _RESUMED.match(body)
            if resumed is not None:
                start = state.pending.pop(pid, None)
                state.forking.discard(pid)
                if start is None:  # strace started mid-call: nothing to pair with
                    self.skipped["resumed without start"] += 1
                    continue
                t, head = start
                body = head + resumed["rest"]
            call_name = _NAME.match(body)
            if call_name is None or call_name[1] not in _HANDLERS:
                continue
            call = _CALL.match(body)
            if call is None:
                if body.rstrip().endswith("= ?"):  # the process died inside the call
                    continue
                raise TraceFormatError(
                    f"{name}:{lineno}: cannot parse the {call_name[1]} call; expected "
                    f"'{call_name[1]}(args) = result', got {body[:100]!r}"
                )
            try:
                args = split_args(call["args"])
                yield from state.apply(self, pid, t, call["name"], args, call["ret"])
            except (ValueError, IndexError) as exc:
                raise TraceFormatError(
                    f"{name}:{lineno}: unexpected arguments for {call['name']}: "
                    f"{call['args'][:100]!r} ({exc})"
                ) from exc


class _State:
    """Processes, descriptors and client numbers while a strace log is replayed."""

    def __init__(self, cwd: str | None) -> None:
        self.procs: dict[int, _Process] = {}
        self.clients: dict[int, int] = {}
        self.pending: dict[int, tuple[float, str]] = {}
        self.forking: set[int] = set()
        self.initial_cwd = cwd

    def proc(self, pid: int) -> _Process:
        p = self.procs.get(pid)
        if p is None:
            # A child can print before its parent's fork returns: inherit from the
            # one process that is inside a fork, if there is exactly one.
            parents = [self.procs[q] for q in self.forking if q in self.procs]
            if len(parents) == 1:
                p = _copy_process(parents[0], share_files=False, share_fs=False)
            else:
                p = _Process(cwd=[self.initial_cwd])
            self.procs[pid] = p
        return p

    def client(self, pid: int) -> int:
        c = self.clients.get(pid)
        if c is None:
            c = self.clients[pid] = len(self.clients)
        return c

    def exit(self, pid: int) -> None:
        self.procs.pop(pid, None)
        self.pending.pop(pid, None)
        self.forking.discard(pid)

    def resolve(self, proc: _Process, dirfd: str | None, path: str) -> str:
        if not path.startswith("/"):
            base: str | None
            if dirfd is None or dirfd.startswith("AT_FDCWD"):
                m = _FD.match(dirfd) if dirfd else None
                base = (m["path"] if m and m["path"] else None) or proc.cwd[0]
            else:
                m = _FD.match(dirfd)
                base = m["path"] if m and m["path"] else None
                if base is None and m is not None:
                    of = proc.fds.get(int(m["fd"]))
                    base = of.path if of else None
            if base:
                path = base + "/" + path if path else base
        return os.path.normpath(path) if path else path

    def apply(
        self, reader: StraceReader, pid: int, t: float, name: str, args: list[str], ret: str
    ) -> Iterator[TraceRecord]:
        """The records one finished call makes, by the handler for its name (``_HANDLERS``)."""
        handler = _HANDLERS.get(name)
        if handler is None:
            return iter(())
        return handler(_Call(self, reader, pid, t, name, args, ret))


@dataclass(slots=True)
class _Call:
    """One finished system call, as its handler sees it."""

    state: _State
    reader: StraceReader
    pid: int
    t: float
    name: str
    args: list[str]
    ret: str
    proc: _Process = field(init=False)
    failed: bool = field(init=False)
    #: The return value (-1 if the call failed).
    value: int = field(init=False)

    def __post_init__(self) -> None:
        self.proc = self.state.proc(self.pid)
        self.failed = self.ret.startswith("-") or self.ret == "?"
        self.value = -1 if self.failed else int(self.ret, 0)

    def emit(self, op: Op, path: str, offset: int = 0, size: int = 0) -> Iterator[TraceRecord]:
        """A record of this call (if the reader's ``include`` accepts the path)."""
        include = self.reader.include
        if include is None or include(path):
            yield TraceRecord(self.t, self.state.client(self.pid), op, path, offset, size)

    def resolve(self, dirfd: str | None, path_arg: str) -> str:
        """``path_arg`` (a strace string) made absolute for this process."""
        return self.state.resolve(self.proc, dirfd, decode_string(path_arg))

    def tracked(self, arg: str) -> _OpenFile | None:
        return _tracked(self.proc, arg)


# --- one small handler per kind of call ---------------------------------------------

_Handler = Callable[[_Call], Iterator[TraceRecord]]


def _on_io(c: _Call) -> Iterator[TraceRecord]:
    of = c.tracked(c.args[0])
    if of is None:
        return
    if c.failed or c.value == 0:
        c.reader.skipped["failed I/O" if c.failed else "zero-byte I/O"] += 1
        return
    op = Op.READ if c.name in _READS else Op.WRITE
    if c.name in _POSITIONED:
        offset = int(c.args[3], 0)
    else:
        offset = of.offset
        of.offset += c.value
    yield from c.emit(op, of.path, offset, c.value)


def _on_open(c: _Call) -> Iterator[TraceRecord]:
    at = c.name.startswith("openat")
    dirfd = c.args[0] if at else None
    path = c.resolve(dirfd, c.args[1] if at else c.args[0])
    flags = c.args[2] if at else (c.args[1] if len(c.args) > 1 else "")
    if c.failed:
        yield from c.emit(Op.LOOKUP, path)
        return
    _install(c.proc, c.value, _OpenFile(path), cloexec="O_CLOEXEC" in flags)
    creating = c.name == "creat" or "O_CREAT" in flags
    yield from c.emit(Op.CREATE if creating else Op.OPEN, path)


def _on_close(c: _Call) -> Iterator[TraceRecord]:
    fd = _fd_number(c.args[0])
    of = c.proc.fds.pop(fd, None) if fd is not None else None
    c.proc.cloexec.discard(fd if fd is not None else -1)
    if of is not None and not c.failed:
        yield from c.emit(Op.CLOSE, of.path)


def _on_close_range(c: _Call) -> Iterator[TraceRecord]:
    # close_range(first, last, flags): closes a range unless CLOSE_RANGE_CLOEXEC only
    # marks it close-on-exec.
    first, last = int(c.args[0], 0), int(c.args[1].split()[0], 0)
    in_range = [fd for fd in c.proc.fds if first <= fd <= last]
    if c.failed:
        return
    if "CLOSE_RANGE_CLOEXEC" in c.args[2]:
        c.proc.cloexec.update(in_range)
        return
    for fd in sorted(in_range):
        of = c.proc.fds.pop(fd)
        c.proc.cloexec.discard(fd)
        yield from c.emit(Op.CLOSE, of.path)


def _on_lseek(c: _Call) -> Iterator[TraceRecord]:
    of = c.tracked(c.args[0])
    if of is not None and not c.failed:
        of.offset = c.value
    return iter(())


def _on_dup(c: _Call) -> Iterator[TraceRecord]:
    if c.failed:
        return iter(())
    # The new descriptor now means whatever the old one does, which may be something
    # untracked (a shell restoring its saved stdout with dup2).
    c.proc.fds.pop(c.value, None)
    c.proc.cloexec.discard(c.value)
    of = c.tracked(c.args[0])
    if of is not None:
        cloexec = "O_CLOEXEC" in "".join(c.args[2:]) or c.args[1:2] == ["F_DUPFD_CLOEXEC"]
        _install(c.proc, c.value, of, cloexec=cloexec)
    return iter(())


def _on_fcntl(c: _Call) -> Iterator[TraceRecord]:
    if c.args[1] in _DUP_CMDS:
        return _on_dup(c)
    fd = _fd_number(c.args[0])
    if fd is not None and c.args[1] == "F_SETFD" and not c.failed:
        if "FD_CLOEXEC" in c.args[2]:
            c.proc.cloexec.add(fd)
        else:
            c.proc.cloexec.discard(fd)
    return iter(())


def _on_path(c: _Call) -> Iterator[TraceRecord]:
    """A call naming a path as argument 0: stat, access, mkdir, unlink, ..."""
    op = Op.GETATTR if c.name in _PATH_STATS else _PATH_OPS[c.name]
    return c.emit(Op.LOOKUP if c.failed else op, c.resolve(None, c.args[0]))


def _on_at(c: _Call) -> Iterator[TraceRecord]:
    """A ``*at`` call: a directory descriptor, then a path."""
    op = Op.GETATTR if c.name in _AT_STATS else _AT_OPS[c.name]
    # A NULL or "" path with AT_EMPTY_PATH means the descriptor itself.
    rel = "" if c.args[1] == "NULL" else decode_string(c.args[1])
    if c.args[1] == "NULL" or (rel == "" and "AT_EMPTY_PATH" in " ".join(c.args[2:])):
        of = c.tracked(c.args[0])
        if of is not None and not c.failed:
            yield from c.emit(op, of.path)
        return
    path = c.state.resolve(c.proc, c.args[0], rel)
    if c.name == "unlinkat" and "AT_REMOVEDIR" in c.args[2]:
        op = Op.RMDIR
    yield from c.emit(Op.LOOKUP if c.failed else op, path)


def _on_symlink(c: _Call) -> Iterator[TraceRecord]:
    # symlink(target, linkpath) / symlinkat(target, newdirfd, linkpath)
    dirfd, rel = (None, c.args[1]) if c.name == "symlink" else (c.args[1], c.args[2])
    if c.failed:
        return iter(())
    return c.emit(Op.SYMLINK, c.resolve(dirfd, rel))


def _on_fd_op(c: _Call) -> Iterator[TraceRecord]:
    """A call on a descriptor: fstat, fsync, getdents, ..."""
    of = c.tracked(c.args[0])
    if of is None or c.failed:
        return
    op = _FD_OPS[c.name]
    if op is Op.READDIR and c.value == 0:
        c.reader.skipped["zero-byte I/O"] += 1
        return
    yield from c.emit(op, of.path, 0, c.value if op is Op.READDIR else 0)


def _on_copy(c: _Call) -> Iterator[TraceRecord]:
    # sendfile(out, in, offset, count); copy_file_range(in, off_in, out, off_out, ...)
    args = c.args
    if c.name == "copy_file_range":
        ends = ((args[0], args[1], Op.READ), (args[2], args[3], Op.WRITE))
    else:
        ends = ((args[1], args[2], Op.READ), (args[0], "NULL", Op.WRITE))
    if c.failed or c.value == 0:
        c.reader.skipped["zero-byte I/O"] += 1
        return
    for fd_arg, off_arg, op in ends:
        of = c.tracked(fd_arg)
        if of is None:
            continue
        if off_arg == "NULL":
            offset = of.offset
            of.offset += c.value
        else:  # [N] is the offset after the call on return
            offset = int(off_arg.strip("[]"), 0) - c.value
        yield from c.emit(op, of.path, offset, c.value)


def _on_fork(c: _Call) -> Iterator[TraceRecord]:
    if not c.failed and c.value > 0:
        flags = " ".join(c.args)
        child = _copy_process(
            c.proc, share_files="CLONE_FILES" in flags, share_fs="CLONE_FS" in flags
        )
        c.state.procs.setdefault(c.value, child)
    return iter(())


def _on_exec(c: _Call) -> Iterator[TraceRecord]:
    if not c.failed:
        for fd in list(c.proc.cloexec):
            c.proc.fds.pop(fd, None)
        c.proc.cloexec.clear()
    return iter(())


def _on_chdir(c: _Call) -> Iterator[TraceRecord]:
    if not c.failed:
        c.proc.cwd[0] = c.resolve(None, c.args[0])
    return iter(())


def _on_fchdir(c: _Call) -> Iterator[TraceRecord]:
    of = c.tracked(c.args[0])
    if of is not None and not c.failed:
        c.proc.cwd[0] = of.path
    return iter(())


def _table(*groups: tuple[Iterable[str], _Handler]) -> dict[str, _Handler]:
    table: dict[str, _Handler] = {}
    for names, handler in groups:
        for name in names:
            assert name not in table, f"{name} has two handlers"
            table[name] = handler
    return table


#: What each system call becomes; calls not in the table are skipped unparsed.
_HANDLERS: dict[str, _Handler] = _table(
    (_READS | _WRITES, _on_io),
    (_OPENS, _on_open),
    (("close",), _on_close),
    (("close_range",), _on_close_range),
    (("lseek",), _on_lseek),
    (("dup", "dup2", "dup3"), _on_dup),
    (("fcntl", "fcntl64"), _on_fcntl),
    (_PATH_STATS | set(_PATH_OPS), _on_path),
    (_AT_STATS | set(_AT_OPS), _on_at),
    (("symlink", "symlinkat"), _on_symlink),
    (_FD_OPS, _on_fd_op),
    (("sendfile", "sendfile64", "copy_file_range"), _on_copy),
    (_FORKS, _on_fork),
    (("execve", "execveat"), _on_exec),
    (("chdir",), _on_chdir),
    (("fchdir",), _on_fchdir),
)


def _copy_process(parent: _Process, *, share_files: bool, share_fs: bool) -> _Process:
    if share_files:
        child = _Process(fds=parent.fds, cloexec=parent.cloexec)
    else:
        child = _Process(fds=dict(parent.fds), cloexec=set(parent.cloexec))
    child.cwd = parent.cwd if share_fs else [parent.cwd[0]]
    return child


def _install(proc: _Process, fd: int, of: _OpenFile, *, cloexec: bool) -> None:
    proc.fds[fd] = of
    if cloexec:
        proc.cloexec.add(fd)
    else:
        proc.cloexec.discard(fd)


def _fd_number(arg: str) -> int | None:
    m = _FD.match(arg)
    if m is None or m["fd"] == "AT_FDCWD":
        return None
    return int(m["fd"])


def _tracked(proc: _Process, arg: str) -> _OpenFile | None:
    fd = _fd_number(arg)
    return proc.fds.get(fd) if fd is not None else None
