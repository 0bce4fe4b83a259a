"""Instructions per warm 4 KiB read, client and node, counted by valgrind's callgrind.

    .venv/bin/python benchmarks/roundtrip_instructions.py \
        --json benchmarks/results/roundtrip-instructions.json

Wall-clock round trips on a shared 2-core machine swing by more than a change to the
read path is worth; instruction counts do not. This runs one ``shuttle serve`` under
callgrind and a client (``Client.read`` of one warm page, the netrand's read) under
callgrind too, warms both up with instrumentation off, then counts user-space
instructions over ``--requests`` reads on each side, and reports them per read,
for the compiled build and for the pure Python modules (``SHUTTLE_PURE=1``) in turn.
The kernel's part (system calls, context switches) is not counted; the floor a
minimal uvloop server and raw client need is, for comparison.

``--top N`` also prints the node's N costliest functions per read (self cost, from
``callgrind_annotate``, the second run's counts less the first's) and its N costliest
compiled functions with what they call (inclusive: ``CachedReads.read`` with the block
cache's hit under it, the protocol's ``_read`` around both), and ``--compiled-only``
skips the pure Python pass: the profile to cut the node's serving code by.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from shuttle.bench.session import BenchSession

PAGE = 4096
HERE = Path(__file__).resolve()


def _total_ir(out_file: Path) -> int:
    """The instructions a callgrind output file counted (its ``totals``)."""
    text = out_file.read_text()
    found = re.search(r"^totals: (\d+)", text, re.MULTILINE)
    if not found:
        raise RuntimeError(f"no instruction total in {out_file}")
    return int(found.group(1))


#: The libuv function that handles a readable connection: a request's whole cost on the
#: node (the socket read, the protocol, the reply's write), without the timers' and
#: idle callbacks' (the node's periodic work, which callgrind's slowdown inflates).
NODE_REQUEST_FUNCTION = "uv__stream_io"


def _inclusive_ir(out_file: Path, function: str) -> int:
    """The instructions counted in ``function`` and its callees."""
    found = _costs(out_file, inclusive=True).get(function)
    if found is None:
        raise RuntimeError(f"no {function} in {out_file}")
    return found


#: How mypyc names the C function of a compiled method or function (``CPyDef_`` plus
#: module, class and name, joined by three underscores).
COMPILED_PREFIX = "CPyDef_"


def _per_read(
    runs: dict[int, dict[str, Any]], field: str, requests: int
) -> list[tuple[str, float]]:
    """Each function's cost per read in ``field``: the second run's less the first's."""
    after, before = runs[2 * requests][field], runs[requests][field]
    return sorted(
        ((name, (cost - before.get(name, 0)) / requests) for name, cost in after.items()),
        key=lambda item: -item[1],
    )


def _toggle(pid: int, on: bool) -> None:
    subprocess.run(
        ["callgrind_control", "-i", "on" if on else "off", str(pid)],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _client(port: int, requests: int) -> None:
    """The client process (run under callgrind): warm up, then count ``requests`` reads."""
    from shuttle.client import connect

    with connect(node=f"127.0.0.1:{port}", cache_bytes=0) as client:
        client.put("ic/page", os.urandom(64 * PAGE))
        for _ in range(300):
            client.read("ic/page", PAGE, PAGE)
        _toggle(os.getpid(), True)
        for _ in range(requests):
            client.read("ic/page", PAGE, PAGE)
        _toggle(os.getpid(), False)


def _costs(out_file: Path, *, inclusive: bool) -> dict[str, int]:
    """Instructions counted in each function, by its name: in the function itself
    (callgrind's exclusive cost) or with its callees (``inclusive``)."""
    text = subprocess.run(
        [
            "callgrind_annotate",
            f"--inclusive={'yes' if inclusive else 'no'}",
            # No annotated source: its lines (and its "=>" call lines) look like costs.
            "--auto=no",
            "--threshold=100",
            str(out_file),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    costs: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and re.fullmatch(r"[\d,]+", parts[0]) and ":" in parts[1]:
            # (newer callgrind_annotate puts each cost's share in brackets after it)
            where = re.sub(r"^\([\d.]+%\)\s+", "", parts[1]).split(" [", 1)[0]
            name = where.rsplit(":", 1)[1]  # the function, without its file
            costs[name] = costs.get(name, 0) + int(parts[0].replace(",", ""))
    return costs


def measure(requests: int, pure: bool, workdir: Path) -> dict[str, Any]:
    env = {**os.environ, "SHUTTLE_PURE": "1" if pure else "0"}
    node_out, client_out = workdir / "node.cg", workdir / "client.cg"
    ready = workdir / "ready.json"
    valgrind = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "-q"]
    node = subprocess.Popen(
        [
            *valgrind,
            f"--callgrind-out-file={node_out}",
            sys.executable,
            "-m",
            "shuttle",
            "serve",
            "--data",
            str(workdir / "data"),
            "--listen",
            "127.0.0.1:0",
            "--ready-file",
            str(ready),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 300
        while not ready.exists() or not ready.read_text().strip().endswith("}"):
            if node.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the node did not start under valgrind")
            time.sleep(0.2)
        port = int(json.loads(ready.read_text())["port"])
        client = subprocess.Popen(
            [
                *valgrind,
                f"--callgrind-out-file={client_out}",
                sys.executable,
                str(HERE),
                "--client",
                str(port),
                str(requests),
            ],
            env=env,
        )
        # The node counts the client's connection and warm-up too; main() subtracts
        # them (two runs that differ only in the counted reads).
        _toggle(node.pid, True)
        if client.wait(timeout=1800) != 0:
            raise RuntimeError("the client failed")
        _toggle(node.pid, False)
    finally:
        node.terminate()
        node.wait(timeout=120)
    return {
        "client_ir": _total_ir(client_out),
        "node_ir": _total_ir(node_out),
        "node_request_ir": _inclusive_ir(node_out, NODE_REQUEST_FUNCTION),
        "node_functions": _costs(node_out, inclusive=False),
        "node_compiled_inclusive": {
            name: cost
            for name, cost in _costs(node_out, inclusive=True).items()
            if name.startswith(COMPILED_PREFIX)
        },
    }


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--client":
        _client(int(sys.argv[2]), int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="counted reads per run")
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument("--top", type=int, default=0, help="print the node's N costliest functions")
    parser.add_argument("--compiled-only", action="store_true", help="skip the pure pass")
    parser.add_argument(
        "--keep",
        type=Path,
        help="copy callgrind's output files here ({compiled,pure}-{node,client}-N.cg)",
    )
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("roundtrip_instructions: needs valgrind (apt-get install valgrind)")
    report: dict[str, Any] = {"requests": args.requests}
    for pure in (False,) if args.compiled_only else (False, True):
        name = "pure" if pure else "compiled"
        runs = {}
        # Two runs differing only in the counted reads: their difference is the reads'
        # alone (start-up, warm-up and shutdown cancel out).
        for n in (args.requests, 2 * args.requests):
            with tempfile.TemporaryDirectory(prefix="shuttle-ic-") as tmp:
                runs[n] = measure(n, pure, Path(tmp))
                if args.keep is not None:  # for callgrind_annotate --tree=caller, kcachegrind
                    args.keep.mkdir(parents=True, exist_ok=True)
                    for side in ("node", "client"):
                        shutil.copy(Path(tmp) / f"{side}.cg", args.keep / f"{name}-{side}-{n}.cg")
        per = {
            side: (runs[2 * args.requests][side] - runs[args.requests][side]) / args.requests
            for side in ("client_ir", "node_ir", "node_request_ir")
        }
        top = _per_read(runs, "node_functions", args.requests)[: args.top]
        compiled = _per_read(runs, "node_compiled_inclusive", args.requests)[: args.top]
        report[name] = per | {
            "node_top_functions": dict(top),
            "node_compiled_inclusive": dict(compiled),
        }
        print(
            f"{name:9s} client {per['client_ir'] / 1000:7.1f} k instructions per read, "
            f"node {per['node_ir'] / 1000:7.1f} k (of which handling the connection "
            f"{per['node_request_ir'] / 1000:.1f} k; the rest is periodic work)",
            flush=True,
        )
        if top:
            print("  the node's costliest functions per read (self):")
        for function, cost in top:
            print(f"    {cost:8.0f}  {function}")
        if compiled:
            print("  the node's costliest compiled functions per read (with their callees):")
        for function, cost in compiled:
            print(f"    {cost:8.0f}  {function.removeprefix(COMPILED_PREFIX)}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    # Stops what the run started on any exit (SIGTERM too) and prints how long it took.
    with BenchSession(f"benchmarks/{Path(__file__).name}", {"argv": sys.argv[1:]}):
        main()
