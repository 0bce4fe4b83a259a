"""The jail's parts that run in the node or can be read without building a jail: what
a machine lacks (runtime/jail.py), each jail's uid and cgroups, their removal, the
worker inside, the environment, the spec on the worker's command line, and the
seccomp policy as libseccomp compiles it (runtime/jail_seccomp.py). The jail being
built and escaped from is tests/integration/test_jail.py; the filter in a real
process, tests/unit/runtime/test_jail_limits.py."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from shuttle.runtime import jail, jail_enter, jail_seccomp
from shuttle.runtime.jail_enter import JailError, JailSpec

# --- what a machine lacks ------------------------------------------------------------------


def fake_proc(
    tmp: Path,
    *,
    namespaces: tuple[str, ...] = jail.NAMESPACES,
    userns: str | None = "100\n",
    userns_clone: str | None = None,
    status: str | None = "Name: x\nSeccomp: 0\n",
) -> Path:
    (tmp / "self" / "ns").mkdir(parents=True)
    for ns in namespaces:
        (tmp / "self" / "ns" / ns).touch()
    (tmp / "sys" / "user").mkdir(parents=True)
    (tmp / "sys" / "kernel").mkdir(parents=True)
    if userns is not None:
        (tmp / "sys" / "user" / "max_user_namespaces").write_text(userns)
    if userns_clone is not None:
        (tmp / "sys" / "kernel" / "unprivileged_userns_clone").write_text(userns_clone)
    if status is not None:
        (tmp / "self" / "status").write_text(status)
    return tmp


@pytest.fixture
def unprivileged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 1000)


@pytest.mark.usefixtures("unprivileged")
@pytest.mark.parametrize(
    ("proc", "reason"),
    [
        ({"userns": "0\n"}, "user namespaces are off (sysctl user.max_user_namespaces = 0)"),
        (
            {"userns_clone": "0\n"},
            "unprivileged user namespaces are off (sysctl kernel.unprivileged_userns_clone = 0)",
        ),
        (
            {"namespaces": ("user", "mnt")},
            "the kernel has no pid, net, ipc, uts, cgroup namespaces (/proc/self/ns)",
        ),
        ({"status": "Name: x\n"}, "the kernel has no seccomp (CONFIG_SECCOMP_FILTER)"),
        ({"status": None}, "the kernel has no seccomp (CONFIG_SECCOMP_FILTER)"),
    ],
)
def test_each_thing_a_machine_lacks_for_the_jail_is_named(
    tmp_path: Path, proc: dict[str, object], reason: str
) -> None:
    assert jail.unavailable(fake_proc(tmp_path, **proc)) == reason  # type: ignore[arg-type]


@pytest.mark.usefixtures("unprivileged")
@pytest.mark.parametrize(
    "proc",
    [
        {},
        {"userns_clone": "1\n"},
        {"userns": None},  # an older kernel without the sysctl: user namespaces are on
        {"userns": "\n"},
        {"userns": "many\n"},
        {"userns_clone": "2 extra words\n"},
    ],
)
def test_a_machine_with_everything_can_jail(tmp_path: Path, proc: dict[str, object]) -> None:
    assert jail.unavailable(fake_proc(tmp_path, **proc)) is None  # type: ignore[arg-type]


def test_a_node_run_as_root_needs_no_unprivileged_user_namespaces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 0)
    assert jail.unavailable(fake_proc(tmp_path / "a", userns="0\n")) is None
    assert jail.unavailable(fake_proc(tmp_path / "b", userns_clone="0\n")) is None


def test_the_jail_is_linux_on_x86_64_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proc = fake_proc(tmp_path)
    monkeypatch.setattr(sys, "platform", "darwin")
    assert jail.unavailable(proc) == "the jail needs Linux namespaces and seccomp; this is darwin"
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr("os.uname", lambda: SimpleNamespace(machine="aarch64"))
    assert jail.unavailable(proc) == (
        "the jail's system-call numbers are x86_64's; this machine is aarch64"
    )


def test_a_machine_without_libseccomp_is_told_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyseccomp", None)  # import fails as if absent
    reason = jail.unavailable(fake_proc(tmp_path)) or ""
    assert reason.startswith("libseccomp cannot be loaded (")
    assert reason.endswith("); install libseccomp2 and pyseccomp")


def test_the_real_machine_is_checked_once_and_the_answer_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked: list[Path] = []

    def check(proc: Path) -> str | None:
        checked.append(proc)
        return "no namespaces here"

    monkeypatch.setattr(jail, "_unavailable", False)  # not checked yet
    monkeypatch.setattr(jail, "_check", check)
    assert jail.unavailable() == "no namespaces here"
    assert jail.unavailable() == "no namespaces here"
    assert checked == [Path("/proc")]
    # a /proc given by a test is checked every time, and not kept
    assert jail.unavailable(tmp_path) == "no namespaces here"
    assert jail.unavailable(tmp_path) == "no namespaces here"
    assert checked == [Path("/proc"), tmp_path, tmp_path]
    monkeypatch.setattr(jail, "_unavailable", None)  # checked: it can jail
    assert jail.unavailable() is None and len(checked) == 3


# --- each jail's uid and cgroups ---------------------------------------------------------


def test_each_jail_gets_a_dedicated_uid_from_the_jails_range(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    drawn: list[int] = []

    def randbelow(n: int) -> int:
        drawn.append(n)
        return 7

    monkeypatch.setattr("secrets.randbelow", randbelow)
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    spec = jail.new_spec(1 << 30)
    assert drawn == [jail.JAIL_UID_COUNT]
    assert spec == JailSpec(
        jail.JAIL_UID_FIRST + 7,
        jail.JAIL_UID_FIRST + 7,
        jail.PROCESSES_MAX_DEFAULT,
        jail.TMP_BYTES_DEFAULT,
        {},  # an unprivileged node makes no cgroups
    )
    spec = jail.new_spec(1 << 30, processes_max=5, tmp_bytes=4096)
    assert (spec.processes_max, spec.tmp_bytes) == (5, 4096)


def test_a_root_node_gives_each_jail_a_pids_and_a_memory_cgroup_where_it_can(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 0)
    monkeypatch.setattr("secrets.randbelow", lambda n: 0xAB)
    monkeypatch.setattr(jail, "CGROUP_ROOT", tmp_path)
    for controller in ("pids", "memory", "cpu"):
        (tmp_path / controller).mkdir()
        (tmp_path / controller / "cgroup.procs").touch()
    name = f"{os.getpid()}-ab"
    spec = jail.new_spec(100 << 20, processes_max=9, tmp_bytes=1 << 20)
    memory_max = (100 << 20) + (1 << 20) + jail.MEMORY_SLACK_BYTES
    assert spec.cgroups == {
        str(tmp_path / "pids" / "shuttle-jail" / name): {"pids.max": "9"},
        str(tmp_path / "memory" / "shuttle-jail" / name): {
            "memory.limit_in_bytes": str(memory_max)
        },
    }
    # a controller that is not mounted, or not writable, is left out
    (tmp_path / "pids" / "cgroup.procs").unlink()
    monkeypatch.setattr(
        "os.access", lambda path, mode: Path(path) != tmp_path / "memory" or mode != os.W_OK
    )
    assert jail.new_spec(100 << 20).cgroups == {}


def no_sleep(s: float) -> None:
    pytest.fail(f"release waited {s} s with nothing busy")


def test_an_ended_jails_cgroups_are_removed(tmp_path: Path) -> None:
    a, b = tmp_path / "pids" / "1-a", tmp_path / "memory" / "1-a"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    gone = tmp_path / "never-made"
    spec = JailSpec(1, 1, 1, 1, {str(a): {}, str(gone): {}, str(b): {}})
    assert jail.release(spec, sleep=no_sleep) == []  # nothing busy: no wait
    assert not a.exists() and not b.exists()


def test_a_cgroup_removed_meanwhile_does_not_stop_the_others_removal(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    # ``a/../a`` is a directory until ``a`` is removed, then FileNotFoundError
    spec = JailSpec(1, 1, 1, 1, {str(a): {}, str(a / ".." / "a"): {}, str(b): {}})
    assert jail.release(spec, sleep=no_sleep) == []
    assert not b.exists()


def test_a_busy_cgroup_is_retried_with_doubling_pauses_until_the_wait_ends(
    tmp_path: Path,
) -> None:
    busy, free = tmp_path / "busy", tmp_path / "free"
    busy.mkdir()
    free.mkdir()
    (busy / "still-here").touch()  # rmdir fails: the kernel has not emptied it yet
    now = [100.0]
    pauses: list[float] = []

    def sleep(s: float) -> None:
        pauses.append(s)
        now[0] += s

    spec = JailSpec(1, 1, 1, 1, {str(busy): {}, str(free): {}})
    left = jail.release(spec, wait_s=0.2, clock=lambda: now[0], sleep=sleep)
    assert left == [str(busy)] and not free.exists()
    assert pauses == [0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.05, 0.05, 0.05]
    assert now[0] == pytest.approx(100.213)  # the first check at or past the deadline
    # emptied while it waits: removed at the next try
    now[0], pauses[:] = 0.0, []

    def empty_then_sleep(s: float) -> None:
        (busy / "still-here").unlink()
        sleep(s)

    assert jail.release(spec, wait_s=1.0, clock=lambda: now[0], sleep=empty_then_sleep) == []
    assert pauses == [0.001] and not busy.exists()


def test_release_stops_exactly_at_the_deadline(tmp_path: Path) -> None:
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").touch()
    spec = JailSpec(1, 1, 1, 1, {str(busy): {}})
    times = iter([10.0, 10.5])  # the deadline, then a check landing on it exactly
    assert jail.release(spec, wait_s=0.5, clock=lambda: next(times), sleep=no_sleep) == [str(busy)]


def test_stale_cgroups_are_swept_from_each_controller_present(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    parent = tmp_path / "memory" / jail.CGROUP_PARENT  # no pids controller at all
    (parent / "999999-2b").mkdir(parents=True)
    (parent / "999998-2c").mkdir()
    (parent / "999997-2d" / "still-busy").mkdir(parents=True)  # rmdir fails: kept
    assert sorted(jail.sweep_stale_cgroups(tmp_path, proc)) == [
        str(parent / "999998-2c"),
        str(parent / "999999-2b"),
    ]
    assert sorted(p.name for p in parent.iterdir()) == ["999997-2d"]


# --- the worker inside, its environment -------------------------------------------------

# A launcher whose child has one child (the jail's init and worker), then prints the
# worker's pid and waits for stdin to close.
CHAIN = """
import os, sys
if os.fork() == 0:
    if os.fork() == 0:
        print(os.getpid(), flush=True)
        sys.stdin.read()
        os._exit(0)
    os.wait()
    os._exit(0)
os.wait()
"""


def test_the_worker_is_the_launchers_grandchild() -> None:
    with subprocess.Popen(
        [sys.executable, "-c", CHAIN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as launcher:
        assert launcher.stdout is not None and launcher.stdin is not None
        worker = int(launcher.stdout.readline())
        try:
            assert jail.worker_pid(launcher.pid) == worker
            assert jail.worker_pid(worker) is None  # no children: not a launcher
        finally:
            launcher.stdin.close()
    assert jail.worker_pid(launcher.pid) is None  # gone


def test_the_workers_environment_is_only_what_python_and_shuttle_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SHUTTLE_KEY_FILE", "/secret")
    monkeypatch.delenv("SHUTTLE_PURE", raising=False)
    assert jail.environment() == {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    monkeypatch.setenv("SHUTTLE_PURE", "1")
    assert jail.environment() == {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "SHUTTLE_PURE": "1"}


# --- the spec and the worker's first steps --------------------------------------------


def test_a_spec_crosses_the_command_line_unchanged() -> None:
    spec = JailSpec(7, 8, 9, 10, {"/sys/fs/cgroup/pids/shuttle-jail/1-7": {"pids.max": "9"}})
    text = spec.to_json()
    assert JailSpec.from_json(text) == spec
    assert re.fullmatch(r'\{"uid": 7, "gid": 8, "processes_max": 9, "tmp_bytes": 10, .*\}', text)
    loose = (
        '{"uid": "7", "gid": 8, "processes_max": 9, "tmp_bytes": 10, "cgroups": {"c": {"f": 1}}}'
    )
    assert JailSpec.from_json(loose) == JailSpec(7, 8, 9, 10, {"c": {"f": "1"}})


def test_joining_a_cgroup_writes_its_limits_then_the_pid(tmp_path: Path) -> None:
    directory = tmp_path / "pids" / "shuttle-jail" / "1-a"
    jail_enter._join_cgroup(str(directory), {"pids.max": "9", "other": "x"})
    assert (directory / "pids.max").read_text() == "9"
    assert (directory / "other").read_text() == "x"
    assert (directory / "cgroup.procs").read_text() == str(os.getpid())
    jail_enter._join_cgroup(str(directory), {})  # made already: joined again
    blocked = tmp_path / "file"
    blocked.touch()
    with pytest.raises(JailError, match=rf"^cannot set up the jail's cgroup {blocked}/x: "):
        jail_enter._join_cgroup(str(blocked / "x"), {})


def test_what_the_root_binds_covers_the_interpreter_once_each() -> None:
    binds = jail_enter._bind_sources()
    assert binds == sorted(binds)
    for a in binds:  # none inside another
        assert not any(a != b and a.startswith(b.rstrip("/") + "/") for b in binds), a
    needed = ["/usr", sys.prefix, os.path.dirname(jail.__file__)]
    needed += [p for p in ["/etc/ld.so.cache"] if os.path.exists(p)]  # the loader's cache
    for path in needed:
        real = os.path.realpath(path)
        assert any(real == b or real.startswith(b.rstrip("/") + "/") for b in binds), path


def test_sys_path_directories_are_bound_once_and_nothing_else_on_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with tempfile.TemporaryDirectory() as d:
        for name in ("lib", "lib2", "lib/sub"):
            os.makedirs(os.path.join(d, name))
        archive = os.path.join(d, "modules.zip")  # a file on sys.path: not a directory
        open(archive, "w").close()
        monkeypatch.setattr(
            sys, "path", [f"{d}/lib/sub", f"{d}/lib2", f"{d}/lib", "", "/nowhere", archive]
        )
        binds = jail_enter._bind_sources()
        real = os.path.realpath(d)
        assert f"{real}/lib" in binds and f"{real}/lib2" in binds  # siblings, not nested
        assert f"{real}/lib/sub" not in binds  # inside one bound already
        assert os.path.realpath(archive) not in binds and real not in binds


def test_a_failed_step_names_itself_the_kernels_answer_and_the_hint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    jail_enter._check(0, "unshare", "hint")  # success: nothing
    jail_enter._check(5, "unshare", "hint")
    monkeypatch.setattr("ctypes.get_errno", lambda: errno.EPERM)
    with pytest.raises(JailError) as info:
        jail_enter._check(-1, "unshare (new namespaces)", jail_enter._unshare_hint(False))
    assert str(info.value) == (
        "unshare (new namespaces) failed: Operation not permitted (EPERM); user namespaces "
        "are off for unprivileged users (sysctl user.max_user_namespaces, "
        "kernel.unprivileged_userns_clone, or an AppArmor/SELinux policy)"
    )
    with pytest.raises(JailError) as info:
        jail_enter._check(-1, "sethostname", "")
    assert str(info.value) == "sethostname failed: Operation not permitted (EPERM)"
    assert jail_enter._unshare_hint(True) == (
        "the kernel lacks namespaces (CONFIG_NAMESPACES), or a container refuses them"
    )
    assert jail_enter.errno_name(errno.ENOENT) == "ENOENT" and jail_enter.errno_name(9999) == "9999"


def test_a_failed_write_names_what_it_was(tmp_path: Path) -> None:
    path = tmp_path / "uid_map"
    jail_enter._write(str(path), "0 1000 1", "the uid map")
    assert path.read_text() == "0 1000 1"
    with pytest.raises(JailError, match=rf"^cannot write the gid map \({tmp_path}/no/gid_map\): "):
        jail_enter._write(str(tmp_path / "no" / "gid_map"), "x", "the gid map")


# --- the seccomp policy, as libseccomp compiles it ---------------------------------------


def compiled_policy() -> dict[str, list[str]]:
    """``{system call: the filter's lines for it}`` from libseccomp's own printout of
    the filter (its pseudo filter code), plus ``"default"`` and ``"other arch"``."""
    with tempfile.TemporaryFile() as out:
        jail_seccomp.build_filter().export_pfc(out)
        out.seek(0)
        text = out.read().decode()
    rules: dict[str, list[str]] = {}
    current = "preamble"
    for line in text.splitlines():
        line = line.strip()
        if m := re.match(r'# filter for syscall "(\w+)"', line):
            current = m.group(1)
        elif line == "# default action":
            current = "default"
        elif line == "# invalid architecture action":
            current = "other arch"
        elif line and not line.startswith("#") and not line.startswith("if ($syscall =="):
            rules.setdefault(current, []).append(line)
    return rules


def test_the_filter_refuses_each_listed_call_with_eperm_whatever_its_arguments() -> None:
    rules = compiled_policy()
    for name in jail_seccomp.REFUSED:
        assert rules.get(name) == ["action ERRNO(1);"], name
    assert rules["clone3"] == ["action ERRNO(38);"]  # ENOSYS: the C library uses clone
    assert rules["default"] == ["action ALLOW;"]
    assert rules["other arch"] == ["action KILL;"]
    assert set(rules) - {"preamble", "default", "other arch"} == {
        *jail_seccomp.REFUSED,
        "clone3",
        "clone",
        "socket",
        "socketpair",
    }


def test_the_filter_refuses_a_clone_with_any_namespace_flag() -> None:
    rules = compiled_policy()["clone"]
    flags = [
        0x00020000,  # CLONE_NEWNS
        0x02000000,  # CLONE_NEWCGROUP
        0x04000000,  # CLONE_NEWUTS
        0x08000000,  # CLONE_NEWIPC
        0x10000000,  # CLONE_NEWUSER
        0x20000000,  # CLONE_NEWPID
        0x40000000,  # CLONE_NEWNET
        0x00000080,  # CLONE_NEWTIME
    ]
    assert rules[0] == "if ($a0.hi32 & 0x00000000 == 0)"
    conditions = rules[1::2]
    assert sorted(conditions) == sorted(f"if ($a0.lo32 & 0x{f:08x} == {f})" for f in flags)
    assert rules[2::2] == ["action ERRNO(1);"] * len(flags)


def test_the_filter_allows_sockets_of_the_unix_family_only() -> None:
    rules = compiled_policy()
    for call in ("socket", "socketpair"):
        assert rules[call] == [
            "if ($a0.hi32 == 0)",
            "if ($a0.lo32 == 1)",  # AF_UNIX: allowed (the default)
            "else",
            "action ERRNO(1);",
            "else",
            "action ERRNO(1);",
        ]


def test_a_call_libseccomp_does_not_know_is_skipped_and_the_rest_still_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(jail_seccomp, "REFUSED", ("no_such_call", "ptrace", "bpf"))
    rules = compiled_policy()
    assert rules["ptrace"] == rules["bpf"] == ["action ERRNO(1);"]
    assert "no_such_call" not in rules


def test_the_namespace_mask_splits_into_its_bits() -> None:
    assert jail_seccomp._bits(0b1010_0001) == [1, 32, 128]
    assert jail_seccomp._bits(1 << 40) == [1 << 40]
    assert jail_seccomp._bits(0) == []


def test_without_libseccomp_the_filter_cannot_load_and_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pyseccomp", None)
    with pytest.raises(OSError) as info:
        jail_seccomp.load_filter()
    assert info.value.errno == errno.ENOSYS
    assert re.fullmatch(
        r"\[Errno 38\] libseccomp could not be loaded \(.+\); install libseccomp2", str(info.value)
    )
