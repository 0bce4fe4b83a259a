"""The power-loss tier: a real node on a LazyFS mount, writers, and power cuts.

Each crash point: the node (``shuttle serve``, as the crash tests start it) serves
writer threads doing puts (inline, staged, upload sessions), truncate-then-write and
removes on their own keys; after a random number of acknowledged operations the node is
killed (SIGKILL) and LazyFS drops every byte that was not fsynced; then the node is
started again on the same directory and every key is checked:

* **lost**: the object is in a state older than its last acknowledged one (an
  acknowledged put, write, truncate or remove undone);
* **torn**: its contents are no generation ever written (or empty where no truncate
  could leave it), or its attributes (size, blake3) do not match its contents;
* **unclean restart**: the node did not start, or logged a traceback or a failed redo.

A key's acceptable states after a cut are its last acknowledged state plus every state
an operation in flight could leave. What the restarted node shows becomes the key's
state for the next point, so an object recovery made visible but not durable shows up
as lost at the next cut.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import blake3

import shuttle
from shuttle.errors import NotFoundError, ShuttleError, StorageIOError
from tests.integration.nodeproc import NodeProcess
from tests.powerloss.lazyfs import LazyFS

#: Writer threads, each with its own client and keys (the first try used 3).
WRITERS = 3
#: Keys per writer: half at the top of its prefix, half two levels down (directories
#: made and pruned as objects come and go).
KEYS_PER_WRITER = 6
#: A point cuts the power after 1..this many acknowledged operations: a few dozen puts
#: of up to 1 MiB fill the journal's 64 MiB bound, so some points cut across a checkpoint
#: (every restart's recovery checkpoints too).
ACKS_PER_POINT_MAX = 150
#: A point that sees no acknowledgement this long is a failure of the node, not a wait.
POINT_TIMEOUT_S = 60.0
WRITER_JOIN_TIMEOUT_S = 60.0
#: States of a key: a generation >= 1 (its body), EMPTY (truncated), ABSENT (removed).
EMPTY = 0
ABSENT = -1


def body(key: str, gen: int) -> bytes:
    """A reproducible body for (key, generation) whose size and bytes depend on both, so
    a mix of two generations passes for neither. Every 8th is 1.1-3 MiB (a staged put on
    the node); the rest 20 KiB-1 MiB (journaled inline)."""
    seed = blake3.blake3(f"{key}:{gen}".encode()).digest()
    n = int.from_bytes(seed[:4], "big")
    size = 1_100_000 + n % 2_000_000 if gen % 8 == 0 else 20_000 + n % 1_000_000
    return blake3.blake3(seed).digest(length=size)


@dataclass
class KeyState:
    """What a key may hold: ``allowed`` is its last acknowledged state followed by every
    state an unacknowledged operation since then may have left."""

    allowed: list[int] = field(default_factory=lambda: [ABSENT])
    highest_gen: int = 0

    def attempt(self, state: int) -> None:
        self.allowed.append(state)
        self.highest_gen = max(self.highest_gen, state)

    def acked(self, state: int) -> None:
        self.allowed = [state]


@dataclass
class Report:
    """The tier's figures (the JSON it writes)."""

    points: int = 0
    acked_ops: int = 0
    keys_checked: int = 0
    lost: int = 0
    torn: int = 0
    unclean_restarts: int = 0
    #: LazyFS itself crashed (a bug in its cache; see lazyfs.py): a power cut at a moment
    #: nobody chose. Checked like a point, counted apart, and LazyFS is mounted again.
    lazyfs_crashes: int = 0
    #: The node's disk answered an operation with an error (LazyFS's cache fails an
    #: ``ftruncate`` with ENOENT now and then; see lazyfs.py): the node refuses changes
    #: until it restarts, as its error says. The harness cuts the power there, restarts
    #: and checks as after any point; each is listed here (not among the problems).
    disk_errors: list[str] = field(default_factory=list)
    checkpoints: int = 0
    recovered_records: int = 0
    elapsed_s: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.torn == 0 and self.unclean_restarts == 0


class Tally:
    """Acknowledgements and stopped writers, for the harness to wait on (no sleeps)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.acks = 0
        self.stopped = 0

    def ack(self) -> None:
        with self._cond:
            self.acks += 1
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self.stopped += 1
            self._cond.notify_all()

    def wait(self, acks: int, writers: int, timeout_s: float) -> bool:
        """Wait until ``acks`` acknowledgements (True), or every writer stopped or the
        time is up (False)."""
        with self._cond:
            self._cond.wait_for(lambda: self.acks >= acks or self.stopped >= writers, timeout_s)
            return self.acks >= acks


class Writer(threading.Thread):
    """One client doing random changes to its keys until ``stop`` (or the node dies)."""

    def __init__(
        self,
        address: str,
        keys: dict[str, KeyState],
        rng: random.Random,
        stop: threading.Event,
        tally: Tally,
    ) -> None:
        super().__init__(daemon=True)
        self.address = address
        self.keys = keys
        self.rng = rng
        self.stop = stop
        self.tally = tally
        self.acked = 0
        #: Why the writer stopped (the node dying under it is the usual reason).
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with shuttle.connect(node=self.address, request_timeout_s=10) as client:
                while not self.stop.is_set():
                    self._one(client)
                    self.acked += 1
                    self.tally.ack()
        except (ShuttleError, OSError) as exc:
            self.error = exc  # the node died under us: expected
        finally:
            self.tally.stop()

    def _one(self, client: shuttle.Client) -> None:
        key = self.rng.choice(sorted(self.keys))
        st = self.keys[key]
        gen = st.highest_gen + 1
        exists = st.allowed[0] != ABSENT
        roll = self.rng.random()
        if exists and roll < 0.1:
            st.attempt(ABSENT)
            client.remove(key)
            st.acked(ABSENT)
        elif exists and roll < 0.35:
            st.attempt(EMPTY)
            client.truncate(key, 0)  # two steps, each atomic: both states are possible
            st.acked(EMPTY)
            st.attempt(gen)
            client.write(key, 0, body(key, gen))
            st.acked(gen)
        elif roll < 0.5:
            st.attempt(gen)
            data = body(key, gen)
            client.put(key, iter([data[: len(data) // 2], data[len(data) // 2 :]]))  # upload
            st.acked(gen)
        else:
            st.attempt(gen)
            client.put(key, body(key, gen))  # inline, or staged when over 1 MiB
            st.acked(gen)


def check(address: str, keys: dict[str, KeyState], report: Report) -> None:
    """Compare every key with its acceptable states; count what is lost or torn; make
    what the node shows the key's state for the next point."""
    with shuttle.connect(node=address, request_timeout_s=60) as client:
        for key, st in sorted(keys.items()):
            try:
                data = client.get(key)
                info = client.stat(key)
            except NotFoundError:
                data, info = None, None
            found = _identify(key, data, st)
            report.keys_checked += 1
            if (
                data is not None
                and info is not None
                and (info.size != len(data) or info.hash != blake3.blake3(data).digest())
            ):
                report.torn += 1
                report.problems.append(f"{key}: attributes do not match contents")
            if found in st.allowed:
                st.acked(found)
                continue
            if found is None:
                report.torn += 1
                report.problems.append(
                    f"{key}: {len(data or b'')} bytes that are no generation (allowed {st.allowed})"
                )
                st.acked(st.allowed[0])  # keep checking the others; the run has failed
            else:
                report.lost += 1
                report.problems.append(
                    f"{key}: shows state {found} but {st.allowed[0]} was acknowledged "
                    f"(allowed {st.allowed})"
                )
                st.acked(found)


def _identify(key: str, data: bytes | None, st: KeyState) -> int | None:
    """The state ``data`` shows (ABSENT, EMPTY or a generation), None if it is none."""
    if data is None:
        return ABSENT
    if not data:
        return EMPTY
    candidates = [g for g in st.allowed if g > 0]
    candidates += [g for g in range(st.highest_gen, 0, -1) if g not in candidates]
    for g in candidates:
        if data == body(key, g):
            return g
    return None


def _restart_was_clean(node: NodeProcess, log_from: int) -> str | None:
    text = node.log.read_bytes()[log_from:].decode(errors="replace")
    for bad in ("Traceback", "could not redo", "CRITICAL"):
        if bad in text:
            return f"node log after restart has {bad!r}:\n{text[-2000:]}"
    return None


def run_points(
    lazyfs: LazyFS,
    points: int,
    *,
    seed: int = 1,
    progress: Callable[[Report], None] | None = None,
) -> Report:
    """Run ``points`` power cuts against a node whose data directory is ``lazyfs``'s
    mount (mounted by the caller). Stops early at the first unclean restart.

    Raises RuntimeError if the node stops answering while LazyFS is alive, or a writer
    cannot be stopped (failures of the harness's assumptions, not findings)."""
    rng = random.Random(seed)
    report = Report()
    keys = {
        f"w{w}/{'d/s/' if k % 2 else ''}k{k}": KeyState()
        for w in range(WRITERS)
        for k in range(KEYS_PER_WRITER)
    }
    node = NodeProcess(lazyfs.mount)
    started = time.monotonic()
    node.start()
    try:
        while report.points < points and not report.unclean_restarts:
            try:
                _one_point(lazyfs, node, keys, rng, report)
            except Exception:
                if lazyfs.alive():
                    raise
                # LazyFS crashed (a bug in its cache, lazyfs.py): its unsynced data is
                # gone, as in a power cut at a moment nobody chose. Mount it again over
                # the same directory and check as after any cut.
                report.lazyfs_crashes += 1
                node.kill()
                lazyfs.stop()
                lazyfs.start()
                _restart_and_check(lazyfs, node, keys, report)
            report.elapsed_s = time.monotonic() - started
            if progress is not None:
                progress(report)
    finally:
        node.terminate()
        report.elapsed_s = time.monotonic() - started
    return report


def _one_point(
    lazyfs: LazyFS,
    node: NodeProcess,
    keys: dict[str, KeyState],
    rng: random.Random,
    report: Report,
) -> None:
    """Writers, a power cut after a random number of acknowledgements, restart, check."""
    point = report.points
    stop = threading.Event()
    tally = Tally()
    target = rng.randint(1, ACKS_PER_POINT_MAX)
    writers = [
        Writer(
            node.address,
            {k: v for k, v in keys.items() if k.startswith(f"w{w}/")},
            random.Random(rng.random()),
            stop,
            tally,
        )
        for w in range(WRITERS)
    ]
    for t in writers:
        t.start()
    reached = tally.wait(target, len(writers), POINT_TIMEOUT_S)
    disk_error = not reached and any(isinstance(t.error, StorageIOError) for t in writers)
    if not reached and not disk_error and lazyfs.alive():
        errors = [repr(t.error) for t in writers]
        stop.set()
        raise RuntimeError(
            f"point {point}: {tally.acks} of {target} acknowledgements; writers stopped "
            f"with {errors}; node log:\n{node.log.read_text(errors='replace')[-3000:]}\n"
            f"LazyFS log:\n{lazyfs.log_tail()}"
        )
    if disk_error:
        # Every writer stopped: the store refuses changes after the disk's error until
        # it restarts. Cut the power here (harder than a clean restart), then check.
        first = next(t.error for t in writers if isinstance(t.error, StorageIOError))
        report.disk_errors.append(f"point {point}: {first}")
    stats = _store_stats(node.address) if reached else {}
    stop.set()
    node.kill()  # the process dies at once ...
    for t in writers:
        t.join(WRITER_JOIN_TIMEOUT_S)
        if t.is_alive():
            raise RuntimeError(f"point {point}: a writer did not stop")
    report.acked_ops += sum(t.acked for t in writers)
    report.checkpoints += stats.get("checkpoints", 0)
    lazyfs.clear_cache()  # ... and so does everything not fsynced
    report.points += 1
    _restart_and_check(lazyfs, node, keys, report)


def _restart_and_check(
    lazyfs: LazyFS, node: NodeProcess, keys: dict[str, KeyState], report: Report
) -> None:
    """Start the node after a cut (it must start cleanly) and check every key. Raises
    RuntimeError if LazyFS died meanwhile (the caller mounts it again)."""
    log_from = node.log.stat().st_size
    try:
        node.start()
    except RuntimeError as exc:
        if not lazyfs.alive():
            raise
        report.unclean_restarts += 1
        report.problems.append(f"after point {report.points}: {exc}")
        return
    unclean = _restart_was_clean(node, log_from)
    if unclean is not None and lazyfs.alive():
        report.unclean_restarts += 1
        report.problems.append(f"after point {report.points}: {unclean}")
    report.recovered_records += _store_stats(node.address).get("recovered_records", 0)
    check(node.address, keys, report)
    if not lazyfs.alive():
        raise RuntimeError("LazyFS died during the check")


def _store_stats(address: str) -> dict[str, int]:
    """The store's counters (checkpoints since start, records recovered at start); {} if
    the node does not answer (the figures are informative only)."""
    try:
        with shuttle.connect(node=address, request_timeout_s=10) as client:
            store = client.node_stats(client.nodes[0]).get("store", {})
    except (ShuttleError, OSError):
        return {}
    return {k: v for k, v in store.items() if isinstance(v, int)}


def write_json(report: Report, path: Path) -> None:
    path.write_text(json.dumps({**asdict(report), "ok": report.ok}, indent=2) + "\n")
