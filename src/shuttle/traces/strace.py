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
"""

from __future__ import annotations

import codecs
import os.path
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from shuttle.errors import TraceFormatError
from shuttle.traces import io
from shuttle.traces.formats import TraceReader, register
from shuttle.traces.record import Op, TraceRecord

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
_HANDLED = (
    _READS
    | _WRITES
    | _OPENS
    | _PATH_STATS
    | _AT_STATS
    | set(_FD_OPS)
    | set(_PATH_OPS)
    | set(_AT_OPS)
    | _FORKS
    | {"close", "close_range", "lseek", "dup", "dup2", "dup3", "fcntl", "fcntl64"}
    | {"execve", "execveat"}
    | {"chdir", "fchdir", "symlink", "symlinkat", "sendfile", "sendfile64", "copy_file_range"}
)


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
            if call_name is None or call_name[1] not in _HANDLED:
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
        proc = self.proc(pid)
        failed = ret.startswith("-") or ret == "?"
        value = -1 if failed else int(ret, 0)

        def emit(op: Op, path: str, offset: int = 0, size: int = 0) -> Iterator[TraceRecord]:
            if reader.include is None or reader.include(path):
                yield TraceRecord(t, self.client(pid), op, path, offset, size)

        if name in _READS or name in _WRITES:
            of = _tracked(proc, args[0])
            if of is None:
                return
            if failed or value == 0:
                reader.skipped["zero-byte I/O" if not failed else "failed I/O"] += 1
                return
            op = Op.READ if name in _READS else Op.WRITE
            if name in _POSITIONED:
                offset = int(args[3], 0)
            else:
                offset = of.offset
                of.offset += value
            yield from emit(op, of.path, offset, value)
        elif name in _OPENS:
            dirfd = args[0] if name.startswith("openat") else None
            path_arg = args[1] if dirfd is not None else args[0]
            path = self.resolve(proc, dirfd, decode_string(path_arg))
            flags = args[2] if name.startswith("openat") else (args[1] if len(args) > 1 else "")
            if failed:
                yield from emit(Op.LOOKUP, path)
                return
            _install(proc, value, _OpenFile(path), cloexec="O_CLOEXEC" in flags)
            creating = name == "creat" or "O_CREAT" in flags
            yield from emit(Op.CREATE if creating else Op.OPEN, path)
        elif name == "close":
            fd = _fd_number(args[0])
            of = proc.fds.pop(fd, None) if fd is not None else None
            proc.cloexec.discard(fd if fd is not None else -1)
            if of is not None and not failed:
                yield from emit(Op.CLOSE, of.path)
        elif name == "close_range":
            # close_range(first, last, flags): closes a range unless CLOSE_RANGE_CLOEXEC
            # only marks it close-on-exec.
            first, last = int(args[0], 0), int(args[1].split()[0], 0)
            in_range = [fd for fd in proc.fds if first <= fd <= last]
            if failed:
                return
            if "CLOSE_RANGE_CLOEXEC" in args[2]:
                proc.cloexec.update(in_range)
                return
            for fd in sorted(in_range):
                of = proc.fds.pop(fd)
                proc.cloexec.discard(fd)
                yield from emit(Op.CLOSE, of.path)
        elif name == "lseek":
            of = _tracked(proc, args[0])
            if of is not None and not failed:
                of.offset = value
        elif name in ("dup", "dup2", "dup3") or (
            name in ("fcntl", "fcntl64") and args[1] in _DUP_CMDS
        ):
            if failed:
                return
            # The new descriptor now means whatever the old one does, which may be
            # something untracked (a shell restoring its saved stdout with dup2).
            proc.fds.pop(value, None)
            proc.cloexec.discard(value)
            of = _tracked(proc, args[0])
            if of is not None:
                cloexec = "O_CLOEXEC" in "".join(args[2:]) or args[1:2] == ["F_DUPFD_CLOEXEC"]
                _install(proc, value, of, cloexec=cloexec)
        elif name in ("fcntl", "fcntl64"):
            fd = _fd_number(args[0])
            if fd is not None and args[1] == "F_SETFD" and not failed:
                if "FD_CLOEXEC" in args[2]:
                    proc.cloexec.add(fd)
                else:
                    proc.cloexec.discard(fd)
        elif name in _PATH_STATS or name in _PATH_OPS:
            path = self.resolve(proc, None, decode_string(args[0]))
            op = Op.GETATTR if name in _PATH_STATS else _PATH_OPS[name]
            yield from emit(Op.LOOKUP if failed else op, path)
        elif name in _AT_STATS or name in _AT_OPS:
            op = Op.GETATTR if name in _AT_STATS else _AT_OPS[name]
            # A NULL or "" path with AT_EMPTY_PATH means the descriptor itself.
            rel = "" if args[1] == "NULL" else decode_string(args[1])
            if args[1] == "NULL" or (rel == "" and "AT_EMPTY_PATH" in " ".join(args[2:])):
                of = _tracked(proc, args[0])
                if of is not None and not failed:
                    yield from emit(op, of.path)
                return
            path = self.resolve(proc, args[0], rel)
            if name == "unlinkat" and "AT_REMOVEDIR" in args[2]:
                op = Op.RMDIR
            yield from emit(Op.LOOKUP if failed else op, path)
        elif name in ("symlink", "symlinkat"):
            # symlink(target, linkpath) / symlinkat(target, newdirfd, linkpath)
            dirfd, rel = (None, args[1]) if name == "symlink" else (args[1], args[2])
            if not failed:
                yield from emit(Op.SYMLINK, self.resolve(proc, dirfd, decode_string(rel)))
        elif name in _FD_OPS:
            of = _tracked(proc, args[0])
            if of is not None and not failed:
                if _FD_OPS[name] is Op.READDIR and value == 0:
                    reader.skipped["zero-byte I/O"] += 1
                    return
                size = value if _FD_OPS[name] is Op.READDIR else 0
                yield from emit(_FD_OPS[name], of.path, 0, size)
        elif name in ("sendfile", "sendfile64", "copy_file_range"):
            yield from self._copy(reader, proc, emit, name, args, value, failed)
        elif name in _FORKS:
            if not failed and value > 0:
                flags = " ".join(args)
                child = _copy_process(
                    proc, share_files="CLONE_FILES" in flags, share_fs="CLONE_FS" in flags
                )
                self.procs.setdefault(value, child)
        elif name in ("execve", "execveat"):
            if not failed:
                for fd in list(proc.cloexec):
                    proc.fds.pop(fd, None)
                proc.cloexec.clear()
        elif name == "chdir":
            if not failed:
                proc.cwd[0] = self.resolve(proc, None, decode_string(args[0]))
        elif name == "fchdir":
            of = _tracked(proc, args[0])
            if of is not None and not failed:
                proc.cwd[0] = of.path

    def _copy(
        self,
        reader: StraceReader,
        proc: _Process,
        emit: Callable[[Op, str, int, int], Iterator[TraceRecord]],
        name: str,
        args: list[str],
        value: int,
        failed: bool,
    ) -> Iterator[TraceRecord]:
        # sendfile(out, in, offset, count); copy_file_range(in, off_in, out, off_out, ...)
        if name == "copy_file_range":
            ends = ((args[0], args[1], Op.READ), (args[2], args[3], Op.WRITE))
        else:
            ends = ((args[1], args[2], Op.READ), (args[0], "NULL", Op.WRITE))
        if failed or value == 0:
            reader.skipped["zero-byte I/O"] += 1
            return
        for fd_arg, off_arg, op in ends:
            of = _tracked(proc, fd_arg)
            if of is None:
                continue
            if off_arg == "NULL":
                offset = of.offset
                of.offset += value
            else:  # [N] is the offset after the call on return
                offset = int(off_arg.strip("[]"), 0) - value
            yield from emit(op, of.path, offset, value)


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


def split_args(text: str) -> list[str]:
    """Split strace's argument text at top-level commas.

    Commas inside strings (with backslash escapes), ``{...}``, ``[...]`` and
    ``(...)`` do not split. Raises :class:`ValueError` on an unterminated string.
    """
    args: list[str] = []
    depth = 0
    start = 0
    i = 0
    n = len(text)
    while i < n:
        c = text[i]
        if c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            if i >= n:
                raise ValueError("unterminated string")
        elif c in "{[(":
            depth += 1
        elif c in "}])":
            depth -= 1
        elif c == "," and depth == 0:
            args.append(text[start:i].strip())
            start = i + 1
        i += 1
    tail = text[start:].strip()
    if tail or args:
        args.append(tail)
    return args


def decode_string(arg: str) -> str:
    """The text of a strace string argument (``"a\\tb"`` → ``a<TAB>b``).

    A trailing ``...`` (truncated by ``-s``) is dropped. Raises :class:`ValueError`
    if ``arg`` is not a quoted string.
    """
    if arg.endswith("..."):
        arg = arg[:-3]
    if len(arg) < 2 or arg[0] != '"' or arg[-1] != '"':
        raise ValueError(f"expected a quoted string, got {arg[:60]!r}")
    body = arg[1:-1]
    if "\\" not in body:
        return body
    raw, _ = codecs.escape_decode(body.encode("utf-8", "surrogateescape"))
    return bytes(raw).decode("utf-8", "surrogateescape")
