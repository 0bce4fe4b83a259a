"""A node process sampled from outside while a benchmark pass runs (py-spy), and what
its CPU went to, chunk by chunk.

``shuttle bench abacus mix --profile-node DIR`` samples each adaptive pass's node with
``py-spy record --nonblocking --format raw`` in consecutive chunks of
:data:`CHUNK_S` seconds (collapsed stacks, idle threads left out: a chunk's samples
are the node's CPU in it, and a swing of a few seconds is told from the rest of its
pass) and writes beside the chunks a summary: per chunk and over the pass, the sampled
CPU by where it went (:data:`CATEGORIES`) and the top functions (self and inclusive).
py-spy runs on the clients' CPU, not the node's, and does not stop the node
(``--nonblocking``); its own CPU is in the summary. ``--profile-native`` adds the C
frames (a garbage collection shows as ``gc_collect_main``) but stops the node for each
sample: at 100 a second it cut a 64-client node's calls to a third, so it is for short
looks, not for a pass's figures.

The categories are decided by the frames of each sample, the first that matches (a
burn is the emulation of the node's slower CPU, ``shuttle.net.cpu``: it is charged to
what it multiplies, the section it ends):

* ``gc``: a garbage collection (``gc_collect_main``; with ``--profile-native`` only),
  itself (the slow node's burn that multiplies it is its section's);
* ``evaluation``: the resource manager deciding (``runtime/planner*``: digests
  received, the evaluation and its decision log; ``runtime/digest``;
  ``runtime/placement*``);
* ``migration``: a stack's state packed, unpacked or installed (``checkpoint``,
  ``restore``, ``install``, ``migrat``, ``pickle``/``cloudpickle``);
* ``hosted call``: a call to a hosted object (``runtime/hosting``, ``objects/filter``);
* ``serve``: a request served from a client (the storage read ops, the RPC handler;
  in a built checkout the store's hot modules are compiled and show no Python frames,
  so their serving falls under ``event loop``, the protocol frames that call them);
* ``event loop``: asyncio's own bookkeeping (``asyncio/``, ``selectors``) and the
  protocol's framing (``net/``);
* ``other``: the rest.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shuttle.errors import ConfigError

#: Samples a second py-spy takes (its default).
RATE_DEFAULT = 100
#: Seconds of one py-spy recording: a pass is sampled in consecutive chunks, so that
#: its seconds can be told apart (a swing lasts a few).
CHUNK_S = 2
#: py-spy's nice value (root may raise its priority; others keep their own).
PY_SPY_NICE = -15
#: How long py-spy gets to write its trace after it is told to stop.
STOP_TIMEOUT_S = 30.0
#: The categories of a sample, in the order they are tried (module docstring).
CATEGORIES = ("gc", "evaluation", "migration", "hosted call", "serve", "event loop", "other")
#: Functions listed in a summary's top lists.
TOP_FUNCTIONS = 25

_MATCHERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("gc", ("gc_collect_main", "gc_collect_with_callback", "gc_collect_generations")),
    (
        "evaluation",
        # The resource manager (planner.py: receive, evaluate, the decision log), its
        # input (planner_input.py, digest.py) and the model (placement*.py).
        ("runtime/planner", "runtime/digest", "runtime/placement", "placement_log"),
    ),
    ("migration", ("checkpoint", "restore", "migrat", "install_stack", "pickle")),
    ("hosted call", ("runtime/hosted_calls", "runtime/hosting", "objects/filter")),
    ("serve", ("store/", "storage_ops", "call_sync", "blockcache")),
    ("event loop", ("asyncio/", "selectors", "net/", "uvloop")),
)


def py_spy_path() -> str:
    """The py-spy binary beside this interpreter (the dev extras pin it), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.exists():
        return str(beside)
    found = shutil.which("py-spy")
    if found is None:
        raise ConfigError(
            "--profile-node needs py-spy, which the dev extras pin: run `make setup-dev` "
            "(or `pip install py-spy`) and try again"
        )
    return found


@dataclass
class Recording:
    """py-spy on one process in consecutive chunks of :data:`CHUNK_S` (one ``py-spy
    record --duration`` each, collapsed stacks: only threads on a CPU are sampled, so a
    chunk's samples are its CPU), run by a thread from :func:`start_recording` until
    :meth:`stop`. Chunk ``i``'s file is ``<stem>.<i>.txt`` in :attr:`directory`."""

    pid: int
    directory: Path
    stem: str
    rate: int
    cpu: int | None
    native: bool
    gil: bool = False
    started: float = 0.0
    #: The py-spy binary (:func:`py_spy_path`), found once for all the chunks.
    py_spy: str = "py-spy"
    #: (start, ``time.monotonic()``, and the file) of each chunk.
    chunks: list[tuple[float, Path]] = field(default_factory=list)
    py_spy_cpu_s: float = 0.0
    said: list[str] = field(default_factory=list)
    #: py-spy exited without a chunk (could not attach): the recording ended there.
    failed: bool = False
    _stop: threading.Event = field(default_factory=threading.Event)
    _proc: subprocess.Popen[bytes] | None = None
    _thread: threading.Thread | None = None

    def _args(self, out: Path) -> list[str]:
        args = [self.py_spy, "record", "--pid", str(self.pid), "--rate", str(self.rate)]
        args += ["--duration", str(CHUNK_S), "--format", "raw", "--output", str(out)]
        # --native stops the process for each sample (its C stacks cannot be read while
        # it runs): 100 a second stalled a 64-client node to a third of its calls.
        args.append("--native" if self.native else "--nonblocking")
        if self.gil:
            # Only the thread holding the GIL: the Python code running, not the threads
            # woken and waiting for the GIL or the CPU, which py-spy counts as active.
            args.append("--gil")
        return args

    def _pin(self, pid: int) -> None:
        """py-spy ``pid`` on the clients' CPU, ahead of them. (After it starts, not in a
        ``preexec_fn``, which is unsafe with threads: one recording thread a node.)"""
        if self.cpu is not None:
            os.sched_setaffinity(pid, {self.cpu})
        # Ahead of the 64 clients on their CPU: at their priority py-spy fell 15 s
        # behind in a 2 s chunk (its CPU, 0.2-0.3 s a chunk, is taken from them).
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, pid, PY_SPY_NICE)

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            out = self.directory / f"{self.stem}.{i:03d}.txt"
            started = time.monotonic()
            log = out.with_suffix(".log")
            with open(log, "wb") as err:
                proc = subprocess.Popen(
                    self._args(out), stdin=subprocess.DEVNULL, stdout=err, stderr=err
                )
            self._proc = proc
            try:
                self._pin(proc.pid)
            except OSError as exc:  # no such CPU: say so, and sample from where it runs
                self.said.append(f"Error: cannot pin py-spy to CPU {self.cpu}: {exc}")
            # wait4, not wait: py-spy's own CPU is what it cost (on the clients' CPU).
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            self.py_spy_cpu_s += usage.ru_utime + usage.ru_stime
            said = log.read_text(errors="replace").splitlines()
            # Its own words ("Error: ...", "... behind"), not a Rust backtrace's lines.
            self.said += [x.strip() for x in said if x.startswith("Error:") or "behind" in x]
            log.unlink()
            if out.exists():
                self.chunks.append((started, out))
            elif proc.returncode != 0:
                # It could not attach (no such process, no ptrace permission): trying
                # again every few milliseconds for the whole pass would say nothing new.
                if not any(x.startswith("Error:") for x in said):
                    self.said.append(f"Error: py-spy exited with {proc.returncode}")
                self.failed = True
                return
            i += 1

    def stop(self) -> dict[str, Any]:
        """Stop sampling (the chunk running is told with SIGINT and writes what it has)."""
        self._stop.set()
        if self._proc is not None and self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(signal.SIGINT)
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT_S)
        return {
            "trace": f"{self.stem}.*.txt",
            "chunks": len(self.chunks),
            "seconds": round(time.monotonic() - self.started, 3),
            "py_spy_cpu_s": round(self.py_spy_cpu_s, 3),
            "py_spy_failed": self.failed,
            "py_spy_said": self.said[-3:],
        }


def start_recording(
    pid: int,
    directory: Path,
    stem: str,
    *,
    rate: int = RATE_DEFAULT,
    cpu: int | None = None,
    native: bool = False,
    gil: bool = False,
) -> Recording:
    """Start sampling process ``pid`` with py-spy (on CPU ``cpu`` if given: the
    clients', not the profiled node's) into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    rec = Recording(pid, directory, stem, rate, cpu, native, gil, time.monotonic(), py_spy_path())
    rec._thread = threading.Thread(target=rec._run, name=f"py-spy {pid}", daemon=True)
    rec._thread.start()
    return rec


def category(frames: list[str]) -> str:
    """Where a sample's CPU went, by its frames (outermost first): the first category
    of :data:`CATEGORIES` whose marks any frame carries."""
    for name, marks in _MATCHERS:
        for frame in frames:
            if any(m in frame for m in marks):
                return name
    return "other"


def read_raw(path: Path) -> Counter[tuple[str, ...]]:
    """A py-spy raw (collapsed) file: samples by stack, outermost frame first."""
    stacks: Counter[tuple[str, ...]] = Counter()
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks[tuple(stack.split(";"))] += int(count)
    return stacks


def summarize(chunks: list[tuple[float, Path]], rate: int, pass_t0: float | None) -> dict[str, Any]:
    """What the sampled CPU went to (CPU seconds: samples ÷ ``rate``): by category in
    each chunk (its start in seconds from the pass's start ``pass_t0``) and over them
    all, and the top functions by self and inclusive time."""
    total: Counter[str] = Counter()
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    burns: Counter[str] = Counter()
    per_chunk: list[dict[str, Any]] = []
    for started, path in chunks:
        kinds: Counter[str] = Counter()
        for stack, n in read_raw(path).items():  # samples, CPU seconds once ÷ rate
            frames = list(stack)
            kind = category(frames)
            kinds[kind] += n
            if frames[-1].startswith("burn_cpu "):
                burns[kind] += n
            self_time[frames[-1]] += n
            for f in set(frames):
                inclusive[f] += n
        total.update(kinds)
        at = None if pass_t0 is None else round(started - pass_t0, 2)
        per_chunk.append(
            {"t_s": at, "seconds": CHUNK_S, **{k: round(kinds[k] / rate, 3) for k in CATEGORIES}}
        )
    return {
        "cpu_s": {k: round(total[k] / rate, 3) for k in CATEGORIES},
        "sampled_cpu_s": round(sum(total.values()) / rate, 3),
        # Of each category's, the slow node's emulation (shuttle.net.cpu's burn).
        "burn_cpu_s": {k: round(burns[k] / rate, 3) for k in CATEGORIES},
        "per_chunk": per_chunk,
        "top_self": [[f, round(n / rate, 3)] for f, n in self_time.most_common(TOP_FUNCTIONS)],
        "top_inclusive": [[f, round(n / rate, 3)] for f, n in inclusive.most_common(TOP_FUNCTIONS)],
    }


def write_summary(
    recording: Recording, said: dict[str, Any], pass_t0: float | None
) -> dict[str, Any]:
    """Summarize a stopped recording (:func:`summarize`) into ``<stem>.summary.json``
    beside its chunks, and return the summary with what py-spy said."""
    out: dict[str, Any] = {**said, **summarize(recording.chunks, recording.rate, pass_t0)}
    path = recording.directory / f"{recording.stem}.summary.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    return out
