"""The jail's parts that need no node: bounded decoding, RE2 patterns, call budgets,
what the node says when it cannot jail, and the seccomp filter in a real process."""

from __future__ import annotations

import functools
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shuttle.errors import InvalidArgumentError, LimitExceededError, ObjectLimitError
from shuttle.runtime import budget, jail, values
from shuttle.runtime.patterns import compile_pattern
from shuttle.runtime.sandbox import cannot_jail

LIMITS = values.DecodeLimits(64 << 20)

# --- bounded decoding --------------------------------------------------------------------

msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=40)
    | st.binary(max_size=300),
    lambda inner: st.lists(inner, max_size=20) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=200,
)


def count_items(value: object) -> int:
    if isinstance(value, list):
        return 1 + sum(count_items(v) for v in value)
    if isinstance(value, dict):
        return 1 + sum(count_items(k) + count_items(v) for k, v in value.items())
    return 1


@settings(max_examples=300, deadline=None)
@given(msgpack_values)
def test_the_walk_counts_exactly_the_items_the_decoder_builds(value: object) -> None:
    data = values.pack(value)
    items = count_items(value)
    values.check_limits(data, values.DecodeLimits(len(data), items_max=items))
    with pytest.raises(LimitExceededError, match=f"more than {items - 1} items"):
        values.check_limits(data, values.DecodeLimits(len(data), items_max=items - 1))
    assert values.unpack(data, None, LIMITS) == msgpack.unpackb(data, strict_map_key=False)


def test_eight_megabytes_of_empty_lists_are_refused_before_decoding_by_item_count() -> None:
    data = values.pack([[]] * 8_000_000)
    start = time.perf_counter()
    with pytest.raises(LimitExceededError, match=r"holds more than 1048576 items") as caught:
        values.unpack(data, None, LIMITS)
    assert "range requests" not in str(caught.value)
    assert time.perf_counter() - start < 5  # one walk to the limit, no objects built


def test_nesting_and_bytes_are_limits_of_their_own() -> None:
    deep = functools.reduce(lambda inner, _: [inner], range(values.DEPTH_MAX + 1), 1)
    with pytest.raises(LimitExceededError, match=f"more than {values.DEPTH_MAX} deep"):
        values.unpack(values.pack(deep), None, LIMITS)
    with pytest.raises(LimitExceededError, match="over the limit of 10 bytes"):
        values.unpack(values.pack("x" * 20), None, values.DecodeLimits(10))
    assert values.unpack(values.pack(list(range(1000))), None, LIMITS) == list(range(1000))


# --- patterns ----------------------------------------------------------------------------


def test_the_catastrophic_pattern_runs_in_linear_time() -> None:
    regex = compile_pattern("(a+)+$")
    start = time.perf_counter()
    assert regex.search(b"a" * 10_000 + b"!") is None  # Python's re: longer than a lifetime
    assert time.perf_counter() - start < 1


@pytest.mark.parametrize(
    ("pattern", "named"),
    [
        (r"(a)\1", "backreference"),
        ("(?P<x>a)(?P=x)", "named backreference"),
        ("a(?=b)", "look-ahead"),
        ("(?<!a)b", "look-behind"),
        ("(?>a)", "atomic group"),
        ("a++", "possessive"),
    ],
)
def test_constructs_re2_cannot_match_are_refused_by_name(pattern: str, named: str) -> None:
    with pytest.raises(InvalidArgumentError, match=named):
        compile_pattern(pattern)


def test_python_syntax_is_kept_where_re2_has_it() -> None:
    text = b"first line\nERROR 12 disk\nlast"
    assert compile_pattern(r"^ERROR \d+").search(text).group() == b"ERROR 12"
    assert compile_pattern("error", ignore_case=True).search(text) is not None
    assert compile_pattern(r"last\Z").search(text) is not None
    assert compile_pattern(r"(?P<word>\w+) disk").search(text).group(1) == b"12"
    with pytest.raises(InvalidArgumentError, match="bad regular expression '\\['"):
        compile_pattern("[")


# --- budgets -----------------------------------------------------------------------------


def test_a_budgeted_call_is_stopped_at_its_next_checkpoint_naming_the_budget() -> None:
    with budget.running(budget.Budget(cpu_s=0.05, wall_s=60), lambda: "object n1/7 (grep).next"):
        budget.check()
        end = time.thread_time() + 0.1
        while time.thread_time() < end:
            pass
        with pytest.raises(ObjectLimitError, match=r"\(grep\)\.next used more than its CPU budget"):
            budget.check()
    with budget.running(budget.Budget(cpu_s=60, wall_s=0.05), lambda: "object n1/8 (count).next"):
        time.sleep(0.1)
        with pytest.raises(ObjectLimitError, match=r"wall budget of 0\.05 s"):
            budget.check()
    budget.check()  # outside a call: nothing to check


# --- a node that cannot jail -------------------------------------------------------------


def _fake_proc(tmp: Path, *, userns: int, namespaces: tuple[str, ...] = jail.NAMESPACES) -> Path:
    (tmp / "self" / "ns").mkdir(parents=True)
    for ns in namespaces:
        (tmp / "self" / "ns" / ns).touch()
    (tmp / "sys" / "user").mkdir(parents=True)
    (tmp / "sys" / "user" / "max_user_namespaces").write_text(f"{userns}\n")
    (tmp / "self" / "status").write_text("Name: x\nSeccomp: 0\n")
    return tmp


def test_what_a_node_lacks_for_the_jail_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    proc = _fake_proc(tmp_path / "a", userns=0)
    assert "user namespaces are off" in (jail.unavailable(proc) or "")
    proc = _fake_proc(tmp_path / "b", userns=100, namespaces=("mnt", "pid"))
    assert "no user, net, ipc, uts, cgroup namespaces" in (jail.unavailable(proc) or "")
    assert jail.unavailable(_fake_proc(tmp_path / "c", userns=100)) is None
    message = cannot_jail("user namespaces are off")
    assert "refuses it: user namespaces are off" in message and "--unsafe-code" in message


def test_this_machine_can_jail() -> None:
    assert jail.unavailable() is None


# --- the seccomp filter in a real process ------------------------------------------------

SECCOMP_SCRIPT = """
import ctypes, os, socket
from shuttle.runtime.jail_seccomp import load_filter
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(38, 1, 0, 0, 0)  # no_new_privs
load_filter()
out = []
for name, call in [
    ("ptrace", lambda: libc.ptrace(16, os.getppid(), 0, 0)),
    ("unshare", lambda: libc.unshare(0x20000000)),
    ("mount", lambda: libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)),
    ("keyctl", lambda: libc.syscall(250, 0, 0, 0, 0, 0)),
    ("bpf", lambda: libc.syscall(321, 0, 0, 0)),
    ("perf_event_open", lambda: libc.syscall(298, 0, 0, -1, -1, 0)),
]:
    out.append(f"{name}={call()}/{ctypes.get_errno()}")
try:
    socket.socket(socket.AF_INET)
    out.append("inet=allowed")
except PermissionError:
    out.append("inet=refused")
socket.socket(socket.AF_UNIX).close()
pid = os.fork()
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
print(" ".join(out))
"""


def test_the_seccomp_filter_refuses_the_calls_that_leave_the_jail() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SECCOMP_SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    words = dict(word.split("=") for word in result.stdout.split())
    for call in ("ptrace", "unshare", "mount", "keyctl", "bpf", "perf_event_open"):
        assert words[call] == "-1/1", (call, words[call])  # EPERM
    assert words["inet"] == "refused"


def test_the_cgroups_of_a_killed_nodes_jails_are_swept_and_a_live_nodes_kept(
    tmp_path: Path,
) -> None:
    proc = tmp_path / "proc"
    (proc / "4242").mkdir(parents=True)  # a node that still runs
    for controller in ("pids", "memory"):
        parent = tmp_path / controller / jail.CGROUP_PARENT
        for name in ("4242-1a", "999999-2b", "not-a-jail"):
            (parent / name).mkdir(parents=True)
    removed = jail.sweep_stale_cgroups(tmp_path, proc)
    assert sorted(removed) == sorted(
        str(tmp_path / c / jail.CGROUP_PARENT / "999999-2b") for c in ("pids", "memory")
    )
    for controller in ("pids", "memory"):
        left = sorted(p.name for p in (tmp_path / controller / jail.CGROUP_PARENT).iterdir())
        assert left == ["4242-1a", "not-a-jail"]
