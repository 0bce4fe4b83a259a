"""Where a warm read's p99 goes with many clients at once (issue 26, tail latency).

    .venv/bin/python benchmarks/tail_profile.py --clients 64 --seconds 3 --repeats 3
    .venv/bin/python benchmarks/tail_profile.py --clients 64 --no-pin

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
"""

from __future__ import annotations

import argparse
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
#: The benchmark's client of the node: forked clients reconnect with its credentials.
CLIENT: list[Any] = []
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


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
    if target == "shuttle":
        client = CLIENT[0]
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
    target: str, port: int, pid: int, n: int, seconds: float, seed: int, gc_file: Path
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
    gc_before = node_gc(pid, gc_file) if target == "shuttle" else {}
    # perf first (it takes a moment to attach), then the clients go.
    events = [arg for event in SYSCALL_EVENTS.values() for arg in ("-e", event)]
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
    gc_after = node_gc(pid, gc_file) if target == "shuttle" else {}
    counted: dict[str, int] = {}
    for line in perf_err.splitlines():
        fields = line.split(",")
        if len(fields) > 2 and fields[0].isdigit():
            for name, event in SYSCALL_EVENTS.items():
                if fields[2] == event:
                    counted[name] = int(fields[0])
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
        "server_cpu_us_per_req": (cpu1 - cpu0) * 1e6 / reqs,
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-pin", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from shuttle.bench.nodes import bench_client
    from shuttle.bench.placement import default_cpu, pin_process
    from shuttle.bench.redis_anchor import RedisServer, RespClient

    site = Path(tempfile.mkdtemp(prefix="tail-profile-site-"))
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    gc_file = site / "node-gc.jsonl"
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    os.environ["TAIL_PROFILE_GC"] = str(gc_file)
    data = os.urandom(OBJECT_BYTES)
    pids: list[int] = []
    rows: list[dict[str, Any]] = []
    try:
        with bench_client(None, cache_bytes=0, node_pids=pids) as (client, scratch):
            CLIENT.append(client)
            client.put(KEY, data)
            for off in range(0, OBJECT_BYTES, 64 << 10):  # into the node's block cache
                client.read(KEY, off, 64 << 10)
            redis = RedisServer(scratch)
            try:
                resp = RespClient(redis.port)
                resp.set_many(
                    (b"p:%d" % i, data[i * PAGE : (i + 1) * PAGE])
                    for i in range(OBJECT_BYTES // PAGE)
                )
                resp.close()
                node_pid, port = pids[0], client.nodes[0].port
                # Each session is one scheduling group under the kernel's autogroups: the
                # node and Redis should each have one of their own (see the README).
                groups = {
                    name: Path(f"/proc/{pid}/autogroup").read_text().split()[0]
                    for name, pid in (("node", node_pid), ("redis", redis.proc.pid))
                    if Path(f"/proc/{pid}/autogroup").exists()
                }
                print("scheduling groups:", groups, flush=True)
                if not args.no_pin:
                    cpu = default_cpu()
                    os.sched_setaffinity(0, {cpu})
                    pin_process(node_pid, cpu)
                    pin_process(redis.proc.pid, cpu)
                for rep in range(args.repeats):
                    for target, p, pid in (
                        ("shuttle", port, node_pid),
                        ("redis", redis.port, redis.proc.pid),
                    ):
                        row = run_pass(target, p, pid, args.clients, args.seconds, rep, gc_file)
                        row["repeat"] = rep
                        rows.append(row)
                        print(json.dumps(row), flush=True)
            finally:
                redis.stop()
    finally:
        shutil.rmtree(site, ignore_errors=True)
    for target in ("shuttle", "redis"):
        mine = [r for r in rows if r["target"] == target]
        syscalls = statistics.median(r["server_syscalls_per_req"].get("all", 0) for r in mine)
        print(
            f"{target:8s} pages/s {statistics.median(r['pages_per_s'] for r in mine):8.0f} "
            f"p50 {statistics.median(r['p50_us'] for r in mine):7.0f} µs "
            f"p99 {statistics.median(r['p99_us'] for r in mine):7.0f} µs "
            f"server CPU {statistics.median(r['server_cpu_us_per_req'] for r in mine):5.1f} µs/req "
            f"client CPU {statistics.median(r['client_cpu_us_per_req'] for r in mine):5.1f} µs/req "
            f"syscalls {syscalls:4.2f}/req "
            f"per poll {statistics.median(r['requests_per_epoll_wait'] or 0 for r in mine):5.1f} "
            "run delay (server; clients) "
            f"{statistics.median(r['server_run_delay_us_per_req'] for r in mine):5.1f}; "
            f"{statistics.median(r['client_run_delay_us_per_req'] for r in mine):5.1f} µs/req"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"args": vars(args) | {"json": str(args.json)}, "groups": groups, "passes": rows},
                indent=1,
            )
        )


if __name__ == "__main__":
    sys.exit(main())
