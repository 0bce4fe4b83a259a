"""The strace reader: descriptor and offset tracking, checked on real strace runs too."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from shuttle.errors import TraceFormatError, UsageError
from shuttle.traces.formats import in_time_order, read_trace
from shuttle.traces.record import Op, TraceRecord
from shuttle.traces.recorder import record_strace
from shuttle.traces.strace import StraceReader
from shuttle.traces.strace_args import decode_string, split_args


def parse(text: str, **kwargs: object) -> list[TraceRecord]:
    reader = StraceReader(**kwargs)  # type: ignore[arg-type]
    return list(reader.parse(textwrap.dedent(text).splitlines()))


def ops(records: list[TraceRecord]) -> list[tuple[str, str, int, int]]:
    return [(r.op.value, r.file, r.offset, r.size) for r in records]


def test_sequential_reads_advance_the_offset_and_eof_reads_are_skipped() -> None:
    reader = StraceReader()
    records = list(
        reader.parse(
            [
                '1 10:00:00.000001 openat(AT_FDCWD, "/d/f", O_RDONLY) = 3 <0.000010>',
                '1 10:00:00.000002 read(3, ""..., 4096) = 4096 <0.000010>',
                '1 10:00:00.000003 read(3, ""..., 4096) = 100 <0.000010>',
                '1 10:00:00.000004 read(3, "", 4096) = 0 <0.000010>',
                "1 10:00:00.000005 close(3) = 0 <0.000010>",
            ]
        )
    )
    assert ops(records) == [
        ("open", "/d/f", 0, 0),
        ("read", "/d/f", 0, 4096),
        ("read", "/d/f", 4096, 100),
        ("close", "/d/f", 0, 0),
    ]
    assert reader.skipped["zero-byte I/O"] == 1
    assert [r.time for r in records] == [0.0, 1e-6, 2e-6, 4e-6]


def test_lseek_pread_and_dup_share_one_file_position() -> None:
    records = parse(
        """\
        7 00:00:01.000000 open("/f", O_RDWR|O_CREAT, 0644) = 3 <0.1>
        7 00:00:01.000001 lseek(3, 8192, SEEK_SET) = 8192 <0.1>
        7 00:00:01.000002 dup2(3, 5) = 5 <0.1>
        7 00:00:01.000003 write(5, "abc", 3) = 3 <0.1>
        7 00:00:01.000004 pread64(3, ""..., 10, 100) = 10 <0.1>
        7 00:00:01.000005 read(3, ""..., 10) = 10 <0.1>
        7 00:00:01.000006 fcntl(3, F_DUPFD_CLOEXEC, 10) = 10 <0.1>
        7 00:00:01.000007 writev(10, [{iov_base="a,b", iov_len=3}, {iov_base=""}], 2) = 3 <0.1>
        """
    )
    assert ops(records) == [
        ("create", "/f", 0, 0),
        ("write", "/f", 8192, 3),
        ("read", "/f", 100, 10),
        ("read", "/f", 8195, 10),
        ("write", "/f", 8205, 3),
    ]


def test_unfinished_and_resumed_calls_pair_up_at_their_start_time() -> None:
    records = parse(
        """\
        1 10:00:00.000000 openat(AT_FDCWD, "/a", O_RDONLY) = 3 <0.1>
        1 10:00:00.000010 read(3,  <unfinished ...>
        2 10:00:00.000020 openat(AT_FDCWD, "/b", O_RDONLY) = 3 <0.1>
        1 10:00:00.000030 <... read resumed>""..., 512) = 512 <0.1>
        """
    )
    # The reader yields the read when it completes; read_trace's reorder buffer then
    # puts it back at its start time.
    in_order = list(in_time_order(iter(records)))
    assert [(r.time, r.client, r.op, r.file) for r in in_order] == [
        (0.0, 0, Op.OPEN, "/a"),
        (1e-05, 0, Op.READ, "/a"),
        (2e-05, 1, Op.OPEN, "/b"),
    ]


def test_fork_copies_the_table_and_clone_files_shares_it() -> None:
    records = parse(
        """\
        1 10:00:00.000000 openat(AT_FDCWD, "/f", O_RDONLY) = 3 <0.1>
        1 10:00:00.000001 clone(child_stack=NULL, flags=SIGCHLD) = 2 <0.1>
        2 10:00:00.000002 read(3, ""..., 100) = 100 <0.1>
        1 10:00:00.000003 read(3, ""..., 100) = 100 <0.1>
        2 10:00:00.000004 close(3) = 0 <0.1>
        1 10:00:00.000005 read(3, ""..., 100) = 100 <0.1>
        1 10:00:00.000006 clone3({flags=CLONE_VM|CLONE_FILES|CLONE_THREAD}, 88) = 3 <0.1>
        3 10:00:00.000007 close(3) = 0 <0.1>
        1 10:00:00.000008 read(3, ""..., 100) = 100 <0.1>
        """
    )
    # The child shares the open file description (offsets interleave) but closing
    # its copy leaves the parent's open; the thread's close closes the shared table.
    assert ops(records) == [
        ("open", "/f", 0, 0),
        ("read", "/f", 0, 100),
        ("read", "/f", 100, 100),
        ("close", "/f", 0, 0),
        ("read", "/f", 200, 100),
        ("close", "/f", 0, 0),
    ]
    assert [r.client for r in records] == [0, 1, 0, 1, 0, 2]


def test_child_printing_before_its_fork_returns_inherits_the_table() -> None:
    records = parse(
        """\
        1 10:00:00.000000 openat(AT_FDCWD, "/f", O_RDONLY) = 3 <0.1>
        1 10:00:00.000001 clone(child_stack=NULL, flags=SIGCHLD <unfinished ...>
        2 10:00:00.000002 read(3, ""..., 100) = 100 <0.1>
        1 10:00:00.000003 <... clone resumed>) = 2 <0.1>
        """
    )
    assert ops(records)[-1] == ("read", "/f", 0, 100)


def test_execve_closes_cloexec_descriptors_only() -> None:
    records = parse(
        """\
        1 10:00:00.000000 openat(AT_FDCWD, "/keep", O_RDONLY) = 3 <0.1>
        1 10:00:00.000001 openat(AT_FDCWD, "/drop", O_RDONLY|O_CLOEXEC) = 4 <0.1>
        1 10:00:00.000002 execve("/bin/x", ["x"], 0x1 /* 1 var */) = 0 <0.1>
        1 10:00:00.000003 read(3, ""..., 10) = 10 <0.1>
        1 10:00:00.000004 read(4, ""..., 10) = 10 <0.1>
        """
    )
    assert ops(records)[2:] == [("read", "/keep", 0, 10)]


def test_paths_resolve_against_cwd_dirfds_and_chdir() -> None:
    records = parse(
        """\
        1 10:00:00.000000 openat(AT_FDCWD, "src/a.py", O_RDONLY) = 3 <0.1>
        1 10:00:00.000001 openat(AT_FDCWD, "/t", O_RDONLY|O_DIRECTORY) = 4 <0.1>
        1 10:00:00.000002 newfstatat(4, "x/../y", {st_mode=S_IFREG|0644, ...}, 0) = 0 <0.1>
        1 10:00:00.000003 newfstatat(3, "", {st_mode=S_IFREG|0644, ...}, AT_EMPTY_PATH) = 0 <0.1>
        1 10:00:00.000004 getdents64(4, 0x55 /* 3 entries */, 32768) = 80 <0.1>
        1 10:00:00.000005 getdents64(4, 0x55 /* 0 entries */, 32768) = 0 <0.1>
        1 10:00:00.000006 chdir("/t") = 0 <0.1>
        1 10:00:00.000007 stat("gone", 0x7ffc) = -1 ENOENT (No such file or directory) <0.1>
        1 10:00:00.000008 unlinkat(4, "sub", AT_REMOVEDIR) = 0 <0.1>
        1 10:00:00.000009 rename("a", "b") = 0 <0.1>
        1 10:00:00.000010 symlinkat("target", AT_FDCWD, "ln") = 0 <0.1>
        1 10:00:00.000011 utimensat(3, NULL, [UTIME_NOW, UTIME_NOW], 0) = 0 <0.1>
        1 10:00:00.000012 faccessat2(AT_FDCWD, "q", R_OK, AT_EACCESS) = 0 <0.1>
        """,
        cwd="/home/u",
    )
    assert ops(records) == [
        ("open", "/home/u/src/a.py", 0, 0),
        ("open", "/t", 0, 0),
        ("getattr", "/t/y", 0, 0),
        ("getattr", "/home/u/src/a.py", 0, 0),
        ("readdir", "/t", 0, 80),
        ("lookup", "/t/gone", 0, 0),
        ("rmdir", "/t/sub", 0, 0),
        ("rename", "/t/a", 0, 0),
        ("symlink", "/t/ln", 0, 0),
        ("setattr", "/home/u/src/a.py", 0, 0),
        ("access", "/t/q", 0, 0),
    ]


def test_untracked_descriptors_and_other_calls_are_ignored() -> None:
    records = parse(
        """\
        1 10:00:00.000000 read(0, "x", 1) = 1 <0.1>
        1 10:00:00.000001 write(1, "a = 1) = 2", 10) = 10 <0.1>
        1 10:00:00.000002 mmap(NULL, 8192, PROT_READ, MAP_PRIVATE, 3, 0) = 0x7f00 <0.1>
        1 10:00:00.000003 --- SIGCHLD {si_signo=SIGCHLD, si_code=CLD_EXITED} ---
        1 10:00:00.000004 exit_group(0) = ?
        1 10:00:00.000005 +++ exited with 0 +++
        """
    )
    assert records == []


def test_decorated_descriptors_from_strace_y() -> None:
    records = parse(
        """\
        1 10:00:00.000000 openat(AT_FDCWD</w>, "f", O_RDONLY) = 3</w/f> <0.1>
        1 10:00:00.000001 read(3</w/f>, ""..., 10) = 10 <0.1>
        """
    )
    assert ops(records) == [("open", "/w/f", 0, 0), ("read", "/w/f", 0, 10)]


def test_clock_passing_midnight_keeps_time_increasing() -> None:
    records = parse(
        """\
        1 23:59:59.999000 openat(AT_FDCWD, "/f", O_RDONLY) = 3 <0.1>
        1 00:00:00.001000 close(3) = 0 <0.1>
        """
    )
    assert [r.time for r in records] == [0.0, 0.002]


def test_pid_prefix_forms_and_epoch_times() -> None:
    records = parse(
        """\
        [pid  12] 1700000000.500000 openat(AT_FDCWD, "/f", O_RDONLY) = 3 <0.1>
        1700000000.750000 openat(AT_FDCWD, "/g", O_RDONLY) = 4 <0.1>
        """
    )
    assert [(r.time, r.client, r.file) for r in records] == [(0.0, 0, "/f"), (0.25, 1, "/g")]


def test_include_filters_files() -> None:
    records = parse(
        """\
        1 10:00:00.000000 openat(AT_FDCWD, "/lib/libc.so", O_RDONLY) = 3 <0.1>
        1 10:00:00.000001 openat(AT_FDCWD, "/data/f", O_RDONLY) = 4 <0.1>
        """,
        include=lambda p: p.startswith("/data/"),
    )
    assert ops(records) == [("open", "/data/f", 0, 0)]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("read(3, ...) = 1", "expected 'PID HH:MM:SS"),
        ("1 10:00:00.000000 read(3, ) = banana", "cannot parse the read call"),
        ("1 10:00:00.000000 openat(AT_FDCWD, /f, O_RDONLY) = 3", "unexpected arguments"),
    ],
)
def test_malformed_lines_name_the_line(line: str, message: str) -> None:
    ok = '1 09:59:59.000000 openat(AT_FDCWD, "/x", O_RDONLY) = 5 <0.1>'
    with pytest.raises(TraceFormatError, match=f"<strace>:2: {message}"):
        list(StraceReader().parse([ok, line]))


def test_split_args_respects_strings_and_brackets() -> None:
    assert split_args('3, "a,\\"b", [{x=1, y=2}], f(1, 2)') == [
        "3",
        '"a,\\"b"',
        "[{x=1, y=2}]",
        "f(1, 2)",
    ]
    assert split_args("") == []
    with pytest.raises(ValueError, match="unterminated"):
        split_args('"abc')


def test_decode_string_handles_escapes_and_truncation() -> None:
    assert decode_string('"a\\tb\\x41\\303\\251"') == "a\tbAé"
    assert decode_string('"abc"...') == "abc"
    with pytest.raises(ValueError):
        decode_string("NULL")


# --- real programs under real strace --------------------------------------------------

PROGRAM = """
import os, sys
d = sys.argv[1]
fd = os.open(os.path.join(d, "data"), os.O_RDONLY)
os.read(fd, 1000)
os.lseek(fd, 5000, os.SEEK_SET)
os.read(fd, 2000)
os.pread(fd, 300, 100)
fd2 = os.dup(fd)
os.read(fd2, 10)
pid = os.fork()
if pid == 0:
    os.read(fd, 7)
    os._exit(0)
os.waitpid(pid, 0)
os.read(fd, 3)
os.close(fd2)
os.close(fd)
os.stat(os.path.join(d, "data"))
os.listdir(d)
with open(os.path.join(d, "out"), "wb") as f:
    f.write(b"x" * 12345)
"""


def test_real_strace_of_a_program_with_seeks_dups_and_a_fork(tmp_path: Path) -> None:
    (tmp_path / "data").write_bytes(bytes(10_000))
    log = tmp_path / "log"
    assert record_strace([sys.executable, "-c", PROGRAM, str(tmp_path)], log) == 0
    reader = StraceReader(include=lambda p: p.startswith(str(tmp_path) + "/") or p == str(tmp_path))
    got = ops(list(read_trace(log, reader=reader)))
    data = str(tmp_path / "data")
    assert got[:9] == [
        ("open", data, 0, 0),
        ("read", data, 0, 1000),
        ("read", data, 5000, 2000),
        ("read", data, 100, 300),
        ("read", data, 7000, 10),
        ("read", data, 7010, 7),  # the child, through the inherited description
        ("read", data, 7017, 3),
        ("close", data, 0, 0),
        ("close", data, 0, 0),
    ]
    rest = got[9:]
    assert ("getattr", data, 0, 0) in rest
    assert any(op == "readdir" and f == str(tmp_path) for op, f, _, _ in rest)
    assert ("write", str(tmp_path / "out"), 0, 12345) in rest
    assert any(op == "create" and f == str(tmp_path / "out") for op, f, _, _ in rest)


def test_record_strace_needs_a_command(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no command"):
        record_strace([], tmp_path / "log")


def test_dup2_from_an_untracked_descriptor_untracks_the_target() -> None:
    # A shell redirects stdout to a file, runs a command, then restores stdout.
    records = parse(
        """\
        1 10:00:00.000000 openat(AT_FDCWD, "/out", O_WRONLY|O_CREAT|O_TRUNC, 0666) = 3 <0.1>
        1 10:00:00.000001 fcntl(1, F_DUPFD_CLOEXEC, 10) = 10 <0.1>
        1 10:00:00.000002 dup2(3, 1) = 1 <0.1>
        1 10:00:00.000003 close(3) = 0 <0.1>
        1 10:00:00.000004 write(1, "x", 1) = 1 <0.1>
        1 10:00:00.000005 dup2(10, 1) = 1 <0.1>
        1 10:00:00.000006 write(1, "y", 1) = 1 <0.1>
        """
    )
    assert ops(records) == [
        ("create", "/out", 0, 0),
        ("close", "/out", 0, 0),
        ("write", "/out", 0, 1),
    ]


def test_close_range_closes_tracked_descriptors_in_range() -> None:
    records = parse(
        """\
        1 10:00:00.000000 openat(AT_FDCWD, "/a", O_RDONLY) = 3 <0.1>
        1 10:00:00.000001 openat(AT_FDCWD, "/b", O_RDONLY) = 4 <0.1>
        1 10:00:00.000002 openat(AT_FDCWD, "/c", O_RDONLY) = 5 <0.1>
        1 10:00:00.000003 close_range(4, 4294967295 /* ~0U */, 0) = 0 <0.1>
        1 10:00:00.000004 close_range(3, 3, CLOSE_RANGE_CLOEXEC) = 0 <0.1>
        1 10:00:00.000005 execve("/bin/x", ["x"], 0x1 /* 1 var */) = 0 <0.1>
        1 10:00:00.000006 read(3, ""..., 10) = 10 <0.1>
        """
    )
    assert ops(records)[3:] == [("close", "/b", 0, 0), ("close", "/c", 0, 0)]


def test_record_strace_of_a_missing_program_says_so(tmp_path: Path) -> None:
    from shuttle.errors import ExternalToolError

    with pytest.raises(ExternalToolError, match="no-such-program"):
        record_strace(["no-such-program-xyz"], tmp_path / "log")


def test_every_handled_call_has_exactly_one_handler() -> None:
    """The syscall table: each name the docs list maps to one small handler."""
    from shuttle.traces import strace

    table = strace._HANDLERS
    for group in (strace._READS, strace._WRITES, strace._OPENS, strace._FORKS):
        assert group <= set(table)
    assert set(strace._FD_OPS) | set(strace._PATH_OPS) | set(strace._AT_OPS) <= set(table)
    assert table["read"] is table["pwrite64"] is strace._on_io
    assert table["fcntl"] is strace._on_fcntl and table["dup2"] is strace._on_dup
    assert "mmap" not in table and "getpid" not in table
