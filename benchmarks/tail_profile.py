"""Where a warm read's p99 goes with many clients at once (issue 26, tail latency).

    .venv/bin/python benchmarks/tail_profile.py --clients 64 --seconds 3 --repeats 3
    .venv/bin/python benchmarks/tail_profile.py --clients 64 --no-pin
    .venv/bin/python benchmarks/tail_profile.py --clients 64 --no-pin --compare /tmp/main/src

A node (started here, as ``shuttle bench netrand`` starts one) and Redis serve the same
warm 4 KiB pages of a 16 MiB object; N forked client processes read random pages from
one of them for a few seconds, Shuttle and Redis passes alternating. Besides each pass's
throughput and p50/p99, it counts what wall-clock figures on a shared machine cannot
show: per request, each server's CPU (``/proc/PID/stat``), its context switches
(``/proc/PID/status``), its ``epoll_wait`` calls (``perf stat`` on the syscall
tracepoint: requests ÷ waits is the batch one loop turn takes) and its system calls
(all of them, and the receives and sends among them), how long each server and the
clients waited for a CPU while runnable (``/proc/PID/schedstat``'s run delay: who
waits for the CPU), the clients' CPU, and
every garbage collection in the node and in the clients with its pause
(``gc.callbacks``, installed by a ``sitecustomize`` this script puts first on the
node's ``PYTHONPATH``). Prints one line per pass and a summary; ``--json`` writes them.

**Work per request that does not drift with load.** Wall-clock figures and CPU
seconds on a shared machine move with whoever else runs (caches, frequency, the
hypervisor); the instructions a server retires per request do not. Where ``perf``
can count the CPU's events (``perf stat -e instructions:u``; this VM's can), each
pass also reports each server's instructions and cycles per request, user space and
kernel apart (``server_instructions_per_req``), and the user and system CPU
seconds apart (``server_user_us_per_req``, ``server_sys_us_per_req``). A pass's
instructions per request repeat within a few per cent where its throughput moves by
half: the figure to drive the node's serving code down with, against Redis's in the
same run.

``--compare SRC`` also starts a node running another checkout's ``src`` folder
(``git archive main | tar -x -C /tmp/main``, then build its compiled modules with
``.venv/bin/python /tmp/main/scripts/build_compiled.py`` and give ``--compare
/tmp/main/src``; an unbuilt tree runs pure Python, which the pass lines say), and
alternates three passes per repeat, this node, that one, Redis: the code before and
after a change under the same load, with the same clients (this checkout's).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import multiprocessing
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PAGE = 4096
#: The benchmark's client of each node, by target ("shuttle"; "compare": the node of
#: ``--compare``): forked clients reconnect with its credentials.
CLIENTS: dict[str, Any] = {}
OBJECT_BYTES = 16 << 20
KEY = "tail/profile.dat"

#: Put first on the node's PYTHONPATH: records every collection of a `shuttle serve`
#: process and appends a summary line to $TAIL_PROFILE_GC on each SIGUSR2.
SITECUSTOMIZE = """
import os, sys
if "serve" in sys.argv and os.environ.get("TAIL_PROFILE_GC"):
    import gc, json, signal, time
    _stats = {"collections": [0, 0, 0], "pause_ns": [0, 0, 0], "max_ns": [0, 0, 0]}
    _t = [0]
    def _cb(phase, info):
        if phase == "start":
            _t[0] = time.perf_counter_ns()
        else:
            g = info["generation"]; d = time.perf_counter_ns() - _t[0]
            _stats["collections"][g] += 1; _stats["pause_ns"][g] += d
            _stats["max_ns"][g] = max(_stats["max_ns"][g], d)
    gc.callbacks.append(_cb)
    def _dump(*_):
        with open(os.environ["TAIL_PROFILE_GC"], "a") as f:
            f.write(json.dumps(_stats) + "\\n")
    signal.signal(signal.SIGUSR2, _dump)
"""


def proc_cpu_s(pid: int) -> tuple[float, float]:
    """The process's user and system CPU seconds (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def proc_run_delay_s(pid: int) -> float:
    """Time the process's threads spent runnable but waiting for a CPU (schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total / 1e9


#: System calls counted per pass (``perf stat`` tracepoints): all of them, then those a
#: request costs a server (polls, receives, sends).
SYSCALL_EVENTS = {
    "all": "raw_syscalls:sys_enter",
    "epoll_wait": "syscalls:sys_enter_epoll_wait",
    "epoll_pwait": "syscalls:sys_enter_epoll_pwait",
    "read": "syscalls:sys_enter_read",
    "recvfrom": "syscalls:sys_enter_recvfrom",
    "write": "syscalls:sys_enter_write",
    "writev": "syscalls:sys_enter_writev",
    "sendto": "syscalls:sys_enter_sendto",
    "sendmsg": "syscalls:sys_enter_sendmsg",
}


#: The CPU's own counters, per pass (``perf stat``), where the machine lets perf count
#: them: instructions and cycles in user space (``:u``) and in the kernel (``:k``).
HARDWARE_EVENTS = {
    "instructions_user": "instructions:u",
    "instructions_kernel": "instructions:k",
    "cycles_user": "cycles:u",
    "cycles_kernel": "cycles:k",
}


def hardware_counters_work() -> bool:
    """Whether ``perf stat`` can count instructions here (a VM may not pass the CPU's
    counters through, and perf then says ``<not supported>``)."""
    try:
        out = subprocess.run(
            ["perf", "stat", "-x", ",", "-e", "instructions:u", "true"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return any(line.split(",")[0].isdigit() for line in out.stderr.splitlines())


def proc_switches(pid: int) -> int:
    total = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
            total += int(line.split()[1])
    return total


def node_gc(pid: int, path: Path) -> dict[str, Any]:
    before = path.read_text().count("\n") if path.exists() else 0
    os.kill(pid, 12)  # SIGUSR2
    for _ in range(200):
        if path.exists() and path.read_text().count("\n") > before:
            return dict(json.loads(path.read_text().splitlines()[-1]))
        time.sleep(0.01)
    return {}


def client_proc(target: str, port: int, seconds: float, seed: int, barrier: Any, out: Any) -> None:
    """Read random warm pages from ``target`` until ``seconds`` have passed."""
    from shuttle.bench.redis_anchor import RespClient

    gc.freeze()  # the heap inherited from the parent is not this client's garbage
    pauses: list[int] = []
    started = [0]

    def cb(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter_ns()
        else:
            pauses.append(time.perf_counter_ns() - started[0])

    gc.callbacks.append(cb)
    schedstat = Path("/proc/self/schedstat")
    rng = random.Random(seed)
    pages = [rng.randrange(OBJECT_BYTES // PAGE) for _ in range(4096)]
    if target in CLIENTS:
        client = CLIENTS[target]
        client.after_fork_in_child()
        fetch = lambda p: client.read(KEY, p * PAGE, PAGE)  # noqa: E731
    else:
        resp = RespClient(port)
        fetch = lambda p: resp.get(b"p:%d" % p) or b""  # noqa: E731
    fetch(pages[0])
    lat: list[int] = []
    clock = time.perf_counter_ns
    barrier.wait()
    delay0 = int(schedstat.read_text().split()[1])
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.time()
    deadline = clock() + int(seconds * 1e9)
    i = 0
    while True:
        t = clock()
        if t >= deadline:
            break
        fetch(pages[i & 4095])
        lat.append(clock() - t)
        i += 1
    t1 = time.time()
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    delay = (int(schedstat.read_text().split()[1]) - delay0) / 1e9
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    out.send((lat, t0, t1, cpu, pauses, delay))


def run_pass(
    target: str,
    port: int,
    pid: int,
    n: int,
    seconds: float,
    seed: int,
    gc_file: Path,
    hardware: bool,
) -> dict[str, Any]:
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(n + 1)
    pipes, procs = [], []
    for i in range(n):
        recv, send = ctx.Pipe(duplex=False)
        p = ctx.Process(
            target=client_proc, args=(target, port, seconds, seed * 1000 + i, barrier, send)
        )
        p.start()
        pipes.append(recv)
        procs.append(p)
    is_node = target in CLIENTS
    gc_before = node_gc(pid, gc_file) if is_node else {}
    # perf first (it takes a moment to attach), then the clients go.
    counted_events = SYSCALL_EVENTS | (HARDWARE_EVENTS if hardware else {})
    events = [arg for event in counted_events.values() for arg in ("-e", event)]
    perf = subprocess.Popen(
        ["perf", "stat", "-x", ",", *events, "-p", str(pid)],
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.0)
    barrier.wait()
    cpu0, sw0, delay0 = proc_cpu_s(pid), proc_switches(pid), proc_run_delay_s(pid)
    results = [r.recv() for r in pipes]
    perf.send_signal(2)
    perf_err = perf.communicate()[1]
    cpu1, sw1, delay1 = proc_cpu_s(pid), proc_switches(pid), proc_run_delay_s(pid)
    for p in procs:
        p.join()
    gc_after = node_gc(pid, gc_file) if is_node else {}
    counted: dict[str, int] = {}
    for line in perf_err.splitlines():
        fields = line.split(",")
        if len(fields) > 2 and fields[0].isdigit():
            for name, event in counted_events.items():
                if fields[2] == event:
                    counted[name] = int(fields[0])
    hw = {name: counted.pop(name) for name in HARDWARE_EVENTS if name in counted}
    waits = counted.get("epoll_wait", 0) + counted.get("epoll_pwait", 0)
    lat = sorted(x for r in results for x in r[0])
    elapsed = max(r[2] for r in results) - min(r[1] for r in results)
    reqs = len(lat)
    pauses = sorted(x for r in results for x in r[4])
    out: dict[str, Any] = {
        "target": target,
        "requests": reqs,
        "pages_per_s": reqs / elapsed,
        "p50_us": lat[reqs // 2] / 1e3,
        "p99_us": lat[int(reqs * 0.99)] / 1e3,
        "p999_us": lat[int(reqs * 0.999)] / 1e3,
        "server_cpu_us_per_req": (sum(cpu1) - sum(cpu0)) * 1e6 / reqs,
        "server_user_us_per_req": (cpu1[0] - cpu0[0]) * 1e6 / reqs,
        "server_sys_us_per_req": (cpu1[1] - cpu0[1]) * 1e6 / reqs,
        "server_instructions_per_req": {name: n / reqs for name, n in hw.items()},
        "server_switches_per_req": (sw1 - sw0) / reqs,
        "requests_per_epoll_wait": reqs / waits if waits else None,
        "server_syscalls_per_req": {name: n / reqs for name, n in counted.items()},
        "server_run_delay_us_per_req": (delay1 - delay0) * 1e6 / reqs,
        "client_run_delay_us_per_req": sum(r[5] for r in results) * 1e6 / reqs,
        "client_cpu_us_per_req": sum(r[3] for r in results) * 1e6 / reqs,
        "client_gc": {
            "collections_per_1k_req": len(pauses) * 1000 / reqs,
            "pause_max_us": pauses[-1] / 1e3 if pauses else 0,
            "pauses_over_1ms": sum(1 for x in pauses if x > 1e6),
        },
    }
    if gc_after:
        out["node_gc"] = {
            "collections": [
                a - b
                for a, b in zip(gc_after["collections"], gc_before["collections"], strict=True)
            ],
            "pause_ms": [
                (a - b) / 1e6
                for a, b in zip(gc_after["pause_ns"], gc_before["pause_ns"], strict=True)
            ],
            "max_ms_ever": [x / 1e6 for x in gc_after["max_ns"]],
        }
    return out


def _start_node(
    stack: contextlib.ExitStack, target: str, src: Path | None, data: bytes
) -> tuple[int, int]:
    """Start a node for ``target`` (from ``src``, another checkout's, when given), put
    the object and read it all into the node's block cache; returns (pid, port)."""
    from shuttle.bench.nodes import bench_client

    saved = os.environ.get("PYTHONPATH")
    if src is not None:  # the node process inherits this environment
        os.environ["PYTHONPATH"] = os.pathsep.join([*filter(None, [saved]), str(src.resolve())])
    pids: list[int] = []
    try:
        client, _ = stack.enter_context(bench_client(None, cache_bytes=0, node_pids=pids))
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    CLIENTS[target] = client
    client.put(KEY, data)
    for off in range(0, OBJECT_BYTES, 64 << 10):  # into the node's block cache
        client.read(KEY, off, 64 << 10)
    return pids[0], client.nodes[0].port


def _compiled(pid: int) -> str:
    """Whether node ``pid`` runs the compiled modules (their extension is mapped)."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    return "compiled" if "native__mypyc" in maps else "pure"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-pin", action="store_true")
    ap.add_argument(
        "--compare",
        type=Path,
        help="another checkout's src folder: its node is measured too, pass by pass",
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from shuttle.bench.ceph_stand import check_compare_src
    from shuttle.bench.placement import default_cpu, pin_process
    from shuttle.bench.redis_anchor import RedisServer, RespClient
    from shuttle.bench.session import scratch_dir

    if args.compare is not None:
        check_compare_src(args.compare)
    hardware = hardware_counters_work()
    print("hardware counters:", "yes" if hardware else "no (perf cannot count them here)")
    site = Path(tempfile.mkdtemp(prefix="tail-profile-site-"))
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    gc_file = site / "node-gc.jsonl"
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    os.environ["TAIL_PROFILE_GC"] = str(gc_file)
    data = os.urandom(OBJECT_BYTES)
    rows: list[dict[str, Any]] = []
    groups: dict[str, str] = {}
    builds: dict[str, str] = {}
    scratch = scratch_dir("tail-profile-", None)
    try:
        with contextlib.ExitStack() as stack:
            servers = [("shuttle", *_start_node(stack, "shuttle", None, data))]
            if args.compare is not None:
                servers.append(("compare", *_start_node(stack, "compare", args.compare, data)))
            redis = RedisServer(scratch)
            stack.callback(redis.stop)
            resp = RespClient(redis.port)
            resp.set_many(
                (b"p:%d" % i, data[i * PAGE : (i + 1) * PAGE]) for i in range(OBJECT_BYTES // PAGE)
            )
            resp.close()
            servers.append(("redis", redis.proc.pid, redis.port))
            # Each session is one scheduling group under the kernel's autogroups: the
            # nodes and Redis should each have one of their own (see the README).
            for name, pid, _ in servers:
                group = Path(f"/proc/{pid}/autogroup")
                if group.exists():
                    groups[name] = group.read_text().split()[0]
                if name in CLIENTS:
                    builds[name] = _compiled(pid)
            print("scheduling groups:", groups, "builds:", builds, flush=True)
            if not args.no_pin:
                cpu = default_cpu()
                os.sched_setaffinity(0, {cpu})
                for _, pid, _ in servers:
                    pin_process(pid, cpu)
            for rep in range(args.repeats):
                for target, pid, port in servers:
                    row = run_pass(
                        target, port, pid, args.clients, args.seconds, rep, gc_file, hardware
                    )
                    row["repeat"] = rep
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(site, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)
    summary = {
        target: summarize([r for r in rows if r["target"] == target])
        for target in dict.fromkeys(r["target"] for r in rows)
    }
    for target, figures in summary.items():
        print(f"{target:8s} " + "  ".join(f"{k} {v}" for k, v in figures.items()))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "args": vars(args)
                    | {"json": str(args.json), "compare": str(args.compare or "")},
                    "hardware_counters": hardware,
                    "groups": groups,
                    "builds": builds,
                    "summary": summary,
                    "passes": rows,
                },
                indent=1,
            )
        )


def summarize(mine: list[dict[str, Any]]) -> dict[str, Any]:
    """One server's passes: the median of each figure, and for instructions per request
    (the steady figure) the range over its passes too."""

    def med(get: Any) -> float:
        return round(statistics.median(get(r) for r in mine), 2)

    out: dict[str, Any] = {
        "pages_per_s": med(lambda r: r["pages_per_s"]),
        "p50_us": med(lambda r: r["p50_us"]),
        "p99_us": med(lambda r: r["p99_us"]),
        "server_cpu_us_per_req": med(lambda r: r["server_cpu_us_per_req"]),
        "server_user_us_per_req": med(lambda r: r["server_user_us_per_req"]),
        "client_cpu_us_per_req": med(lambda r: r["client_cpu_us_per_req"]),
        "syscalls_per_req": med(lambda r: r["server_syscalls_per_req"].get("all", 0)),
        "requests_per_poll": med(lambda r: r["requests_per_epoll_wait"] or 0),
        "server_run_delay_us_per_req": med(lambda r: r["server_run_delay_us_per_req"]),
    }
    for name in HARDWARE_EVENTS:
        values = [
            r["server_instructions_per_req"][name]
            for r in mine
            if name in r["server_instructions_per_req"]
        ]
        if values:
            out[name + "_per_req"] = round(statistics.median(values))
            out[name + "_range_pct"] = round(
                (max(values) - min(values)) * 100 / statistics.median(values), 1
            )
    return out


if __name__ == "__main__":
    sys.exit(main())
