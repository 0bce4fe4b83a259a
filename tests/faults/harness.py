"""The fault tier: real nodes, many migrations, and a fault at every step of the
protocol in turn.

Four nodes (``shuttle serve``) run in network namespaces on one bridge
(:mod:`tests.faults.lab`); this process is the application, with its run-time on the
bridge. It keeps two durable journals (homed on n0 and n1; a shipped class) and a
non-durable counter (homed here), appends to them all the time from a worker
thread, and at each *point*:

1. picks the next (step, fault, victim) of a shuffled rotation: a step of the
   protocol (the source's quiesce, checkpoint, install, activate, switch; the
   target's staged, commit, open; the home's commit and committed; a host's
   persist of a call), a fault (``kill -9``, or cutting the process off the network
   for a while) and who suffers it (the source, the target or the home);
2. arms that step at the process that performs it (:mod:`shuttle.runtime.faultpoints`)
   and starts a migration that will reach it (or, for persist, lets the next call);
3. when the step is reached (the process holds there), injects the fault, lets the
   step go on, and after 0.5-2.5 s restarts the killed node (same data, same
   address) or heals the cut;
4. waits for the object to settle and checks every node.

What runs (the steps, the rotation) is :mod:`tests.faults.plan`; what is counted,
:mod:`tests.faults.report`. Counted (``Report``): **two_live_copies**, two copies of
an object serving at once
(every node probed for the object's id, ``object.probe``; when two say they serve,
the older epoch is asked again: serving after the newer one is an overlap);
**lost_acknowledged_calls**, an acknowledged append missing from its journal, or
not where its answer said (and a durable object reported lost counts as all its
calls lost); **unclear_errors**, a call or a migration that failed with anything
but a clear, typed error (in doubt, unreachable, busy, timeout, migration failed;
for the non-durable counter, "lost"). Everything else is reported for reading.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shuttle.client.model import NodeAddress
from shuttle.errors import (
    MigrationError,
    ObjectBusyError,
    ObjectInDoubtError,
    ObjectNotFoundError,
    RequestTimeoutError,
    ShuttleError,
    UnreachableError,
)
from shuttle.net import certs
from shuttle.net.aio import AsyncConnection
from shuttle.net.auth import write_key_file
from shuttle.net.tls import ClientTls
from shuttle.runtime import faultpoints
from shuttle.runtime.client import Runtime
from shuttle.runtime.config import RuntimeConfig
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.mobile import MobileObject
from shuttle.runtime.refs import Ref
from tests.faults.lab import FaultLab
from tests.faults.plan import (
    DURABLE_LEASE_S,
    HOME_STEPS,
    HOST_STEPS,
    NODES,
    SOURCE_STEPS,
    TARGET_STEPS,
    rotation,
)
from tests.faults.report import Report
from tests.integration.nodeproc import NodeProcess

#: How long a killed node stays down, or a cut-off one cut off.
FAULT_S_MIN, FAULT_S_MAX = 0.5, 2.5
#: Starts of a node tried before the tier gives up (a start can time out when others
#: load the machine: the node's 20 s start timeout).
START_ATTEMPTS = 3
#: How long a point waits for its armed step to be reached.
HIT_TIMEOUT_S = 30.0
#: How long a point waits for its migration to end, and its object to serve again.
SETTLE_TIMEOUT_S = 150.0
#: Pause between two appends of the worker (a few dozen calls a second), and after a
#: call that failed (an object being brought back is not hammered meanwhile).
CALL_PAUSE_S = 0.02
ERROR_PAUSE_S = 0.1


class Journal(MobileObject):
    """The durable object under test: an append-only list."""

    durable = True
    readonly = frozenset({"items"})

    def __init__(self) -> None:
        self.entries: list[int] = []

    def append(self, x: int) -> int:
        self.entries.append(x)
        return len(self.entries)

    def items(self) -> list[int]:
        return list(self.entries)


class Counter(MobileObject):
    """A non-durable object: lost with its node, reported lost, made again."""

    def __init__(self) -> None:
        self.n = 0

    def add(self) -> int:
        self.n += 1
        return self.n


@dataclass
class Tracked:
    """One object under test and what was acknowledged of it."""

    name: str
    ref: Ref
    durable: bool
    home: str
    #: (value appended, position its answer gave) per acknowledged append.
    acked: list[tuple[int, int]] = field(default_factory=list)
    #: The counter's last acknowledged value (non-durable).
    count: int = 0
    #: Values found twice in the journal (each counted once).
    duplicates: set[int] = field(default_factory=set)


CLEAR = (
    ObjectInDoubtError,
    RequestTimeoutError,
    UnreachableError,
    ObjectBusyError,
    MigrationError,
)


class Tier:
    """The nodes, the application, and the points."""

    def __init__(self, lab: FaultLab, work: Path, report: Report, seed: int) -> None:
        self.lab = lab
        self.work = work
        self.report = report
        self.random = random.Random(seed)
        self.key_file = work / "cluster.key"
        self.key = write_key_file(self.key_file)
        # The nodes listen beyond loopback (the bridge), so with TLS, as a cluster made
        # by `shuttle cluster up --tls` does: a CA and a certificate per node.
        ca = certs.make_ca(work / "tls")
        self.tls = ClientTls(ca.cert)
        # This process performs the steps of objects at the client: its hooks too.
        self._env_before = os.environ.get(faultpoints.FAULT_DIR_ENV)
        os.environ[faultpoints.FAULT_DIR_ENV] = str(self._dir("client"))
        self.names = [f"n{i}" for i in range(NODES)]
        self.procs: dict[str, NodeProcess] = {}
        for i, name in enumerate(self.names):
            fault_dir = work / "points" / name
            fault_dir.mkdir(parents=True)
            pair = certs.make_node_cert(ca, work / "tls", name, lab.addresses[i])
            self.procs[name] = NodeProcess(
                work / name,
                host=lab.addresses[i],
                prefix=lab.prefix(i),
                extra=[
                    "--key-file",
                    str(self.key_file),
                    "--durable-lease",
                    str(DURABLE_LEASE_S),
                    *("--tls-cert", str(pair.cert), "--tls-key", str(pair.key)),
                    *("--ca-file", str(ca.cert)),
                ],
                env={faultpoints.FAULT_DIR_ENV: str(fault_dir)},
            )
            self._start(name)
        self.rt = Runtime(
            [NodeAddress(n, p.host, p.port) for n, p in self.procs.items()],
            key=self.key,
            listen_host=lab.bridge_address,
            config=RuntimeConfig(durable_lease_s=DURABLE_LEASE_S),
            tls=self.tls,
        )
        self.objects: list[Tracked] = []
        self._values = itertools.count(1)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._worker: threading.Thread | None = None
        #: Non-durable counters lost with their node, to be made again.
        self._lost_counters = 0

    # --- the application's objects and its calls ------------------------------------------

    def setup_objects(self) -> None:
        for home, at in (("n0", "n2"), ("n1", "n3")):
            ref = self.rt.create(Journal, at=at, home=home, placement="static")
            self.objects.append(Tracked(f"journal@{home}", ref, True, home))
        self.objects.append(self._new_counter())

    def _new_counter(self) -> Tracked:
        ref = self.rt.create(Counter, at=self.random.choice(self.names), placement="static")
        return Tracked("counter", ref, False, self.rt.id)

    def start_calls(self) -> None:
        self._worker = threading.Thread(target=self._calls, name="fault-tier calls", daemon=True)
        self._worker.start()

    def stop_calls(self) -> None:
        self._stop.set()
        if self._worker is not None:
            self._worker.join(SETTLE_TIMEOUT_S)

    def _calls(self) -> None:
        while not self._stop.is_set():
            if self._lost_counters:
                try:
                    counter = self._new_counter()
                except ShuttleError:
                    pass  # its node is down: next round
                else:
                    with self._lock:
                        self._lost_counters -= 1
                        self.objects.append(counter)
            for obj in list(self.objects):
                if self._stop.is_set():
                    return
                self._call(obj)
            time.sleep(CALL_PAUSE_S)

    def _call(self, obj: Tracked) -> None:
        try:
            if obj.durable:
                value = next(self._values)
                position = obj.ref.append(value)
                with self._lock:
                    obj.acked.append((value, int(position)))
            else:
                n = int(obj.ref.add())
                with self._lock:
                    if n != obj.count + 1:
                        self.report.lost_acknowledged_calls += 1
                        self.report.problem(f"counter answered {n} after {obj.count}")
                    obj.count = n
            with self._lock:
                self.report.acknowledged_calls += 1
        except BaseException as exc:  # every failure is classified, none escapes
            self._failed(obj, exc)
            time.sleep(ERROR_PAUSE_S)

    def _failed(self, obj: Tracked, exc: BaseException) -> None:
        with self._lock:
            self.report.failed_calls += 1
            kind = type(exc).__name__
            self.report.errors_by_type[kind] = self.report.errors_by_type.get(kind, 0) + 1
            if isinstance(exc, ObjectNotFoundError):
                if obj.durable:
                    self.report.durable_objects_lost += 1
                    self.report.problem(f"durable {obj.name} reported lost: {exc}")
                else:
                    self.report.non_durable_lost += 1
                    self.objects.remove(obj)
                    self._lost_counters += 1  # made again by the worker, when it can
                return
            if not isinstance(exc, CLEAR) or not str(exc):
                self.report.unclear_errors += 1
                self.report.problem(f"unclear error from {obj.name}: {kind}: {exc}")

    # --- where things are ------------------------------------------------------------------

    def probe(self, rid: ObjectId) -> dict[str, dict[str, Any]]:
        """Every reachable node's copy of ``rid`` (and this run-time's)."""

        async def ask(name: str) -> tuple[str, dict[str, Any] | None]:
            proc = self.procs[name]
            if not proc.alive():
                return name, None
            conn = AsyncConnection(
                proc.host,
                proc.port,
                key=self.key,
                connect_timeout_s=1.0,
                request_timeout_s=2.0,
                tls=self.tls,
            )
            try:
                reply = await asyncio.wait_for(conn.call("object.probe", {"rid": str(rid)}), 3.0)
                return name, reply.result if isinstance(reply.result, dict) else None
            except (ShuttleError, OSError, TimeoutError):
                return name, None
            finally:
                with contextlib.suppress(Exception):
                    await conn.close()

        async def ask_all() -> list[tuple[str, dict[str, Any] | None]]:
            return await asyncio.gather(*(ask(n) for n in self.names))

        self.report.probes += 1
        out = {name: answer for name, answer in asyncio.run(ask_all()) if answer}
        hosted = self.rt.bm.table.hosted(rid)
        if hosted is not None:
            out["client"] = {
                "hosted": True,
                "epoch": hosted.epoch,
                "serving": hosted.serving(time.monotonic()),
            }
        return {k: v for k, v in out.items() if v.get("hosted")}

    def serving(self, rid: ObjectId) -> dict[str, int]:
        return {k: int(v["epoch"]) for k, v in self.probe(rid).items() if v.get("serving")}

    def check_copies(self, obj: Tracked) -> dict[str, int]:
        """Who serves ``obj`` now; counts an overlap of two serving copies."""
        serving = self.serving(obj.ref.rid)
        if len(serving) > 1:
            newest = max(serving.values())
            again = self.serving(obj.ref.rid)
            overlap = {w: e for w, e in again.items() if e < newest}
            if overlap or len(again) > 1:
                self.report.two_live_copies += 1
                self.report.problem(f"{obj.name}: two serving copies {serving} then {again}")
            serving = again
        return serving

    # --- one point ---------------------------------------------------------------------------

    def run_point(self, step: str, kind: str, victim: str) -> None:
        obj = self._choose_object(victim)
        rid = obj.ref.rid
        source = self._settle(obj)
        if source is None:
            return
        if source == "client" and step in SOURCE_STEPS + HOST_STEPS and victim == "source":
            source = self._move_off_client(obj)
            if source is None:
                return
        home = obj.home if obj.durable else "client"
        target = self._choose_target(source, home, victim, step)
        performer = {"source": source, "target": target, "home": home}[
            "source"
            if step in SOURCE_STEPS + HOST_STEPS
            else "target"
            if step in TARGET_STEPS
            else "home"
        ]
        hurt = {"source": source, "target": target, "home": home}[victim]
        if hurt == "client" or (performer == "client" and step in HOME_STEPS):
            return  # the application itself is never the victim; its home steps are not armed
        self.report.planned += 1
        point_dir = self._dir(performer)
        for stale in point_dir.glob(f"{step}.*"):
            stale.unlink(missing_ok=True)
        (point_dir / f"{step}.arm").write_text(str(rid))
        mover: threading.Thread | None = None
        outcome: list[BaseException | None] = []
        if step not in HOST_STEPS:
            self.report.migrations += 1
            mover = threading.Thread(target=self._migrate, args=(obj, target, outcome))
            mover.start()
        hit = point_dir / f"{step}.hit"
        deadline = time.monotonic() + HIT_TIMEOUT_S
        while not hit.exists() and time.monotonic() < deadline:
            if mover is not None and not mover.is_alive():
                break
            time.sleep(0.005)
        if not hit.exists():
            (point_dir / f"{step}.arm").unlink(missing_ok=True)
            self.report.not_reached += 1
            self._join(mover, outcome)
            return
        self.report.points += 1
        label = f"{kind} {victim} at {step}"
        self.report.faults[label] = self.report.faults.get(label, 0) + 1
        self._inject(kind, hurt, point_dir / f"{step}.go", performer)
        down_s = self.random.uniform(FAULT_S_MIN, FAULT_S_MAX)
        end = time.monotonic() + down_s
        while time.monotonic() < end:
            self.check_copies(obj)
            time.sleep(0.1)
        self._recover(kind, hurt)
        self._join(mover, outcome)
        self._settle(obj)
        self._check_journal(obj)

    def _choose_object(self, victim: str) -> Tracked:
        candidates = [o for o in self.objects if o.durable or victim != "home"]
        return self.random.choice(candidates)

    def _choose_target(self, source: str, home: str, victim: str, step: str) -> str:
        options = [n for n in [*self.names, "client"] if n != source]
        if victim == "target" or step in TARGET_STEPS:
            options = [n for n in options if n != "client"]
        if victim == "home" and len(options) > 1:
            options = [n for n in options if n != home] or options
        return self.random.choice(options)

    def _dir(self, who: str) -> Path:
        path = self.work / "points" / who
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _migrate(self, obj: Tracked, target: str, outcome: list[BaseException | None]) -> None:
        try:
            self.rt.migrate(obj.ref, target)
            self.report.migrations_ok += 1
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)
            if not isinstance(exc, (*CLEAR, ObjectNotFoundError)):
                with self._lock:
                    self.report.unclear_errors += 1
                    self.report.problem(f"unclear migration error: {type(exc).__name__}: {exc}")

    def _join(self, mover: threading.Thread | None, outcome: list[BaseException | None]) -> None:
        if mover is None:
            return
        mover.join(SETTLE_TIMEOUT_S)
        if mover.is_alive():
            self.report.not_settled += 1
            self.report.problem("a migration did not end within the settle timeout")

    def _inject(self, kind: str, victim: str, go: Path, performer: str) -> None:
        index = self.names.index(victim)
        if kind == "kill":
            self.procs[victim].kill()
            self.report.restarts += 1
        else:
            self.lab.cut(index)
            self.report.cuts += 1
        if not (kind == "kill" and victim == performer):
            go.write_text("go\n")

    def _recover(self, kind: str, victim: str) -> None:
        if kind == "kill":
            self._start(victim)
        else:
            self.lab.heal(self.names.index(victim))

    def _start(self, name: str) -> None:
        """Start (or restart) a node; a start that times out on a loaded machine is
        tried again (the node's data is the same: it only comes back later)."""
        for attempt in range(START_ATTEMPTS):
            try:
                self.procs[name].start()
                return
            except RuntimeError:
                self.procs[name].kill()
                if attempt == START_ATTEMPTS - 1:
                    raise
                self.report.slow_starts += 1

    def _move_off_client(self, obj: Tracked) -> str | None:
        target = self.random.choice(self.names)
        try:
            self.rt.migrate(obj.ref, target)
        except ShuttleError:
            return None
        return self._settle(obj)

    def _settle(self, obj: Tracked) -> str | None:
        """Wait until ``obj`` serves at exactly one place and answers; where it is."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while time.monotonic() < deadline:
            if obj not in self.objects:  # the counter was lost and made again
                return None
            serving = self.check_copies(obj)
            if len(serving) == 1:
                return next(iter(serving))
            time.sleep(0.1)
        self.report.not_settled += 1
        self.report.problem(f"{obj.name} did not settle: {self.probe(obj.ref.rid)}")
        return None

    def _check_journal(self, obj: Tracked) -> None:
        if not obj.durable:
            return
        # What was acknowledged before the read: the read must show all of it (an
        # append acknowledged while the read runs may not be in it yet).
        with self._lock:
            acked = list(obj.acked)
        try:
            items = obj.ref.items()
        except ShuttleError as exc:
            self._failed(obj, exc)
            return
        seen: set[int] = set()
        for x in items:
            if x in seen and x not in obj.duplicates:
                obj.duplicates.add(x)
                self.report.duplicated_appends += 1
                self.report.problem(f"{obj.name}: {x} appended twice")
            seen.add(x)
        lost = [(v, p) for v, p in acked if p > len(items) or items[p - 1] != v]
        if lost:
            self.report.lost_acknowledged_calls += len(lost)
            self.report.problem(
                f"{obj.name}: acknowledged appends (value, position) missing: {lost[:5]} "
                f"from {len(items)} items"
            )
        # Checked once: a later point checks only what was acknowledged since.
        with self._lock:
            obj.acked = [a for a in obj.acked if a not in acked]

    def close(self) -> None:
        self.stop_calls()
        with contextlib.suppress(Exception):
            self.rt.close()
        for proc in self.procs.values():
            proc.kill()
        if self._env_before is None:
            os.environ.pop(faultpoints.FAULT_DIR_ENV, None)
        else:
            os.environ[faultpoints.FAULT_DIR_ENV] = self._env_before


def run_points(
    work: Path,
    points: int,
    *,
    seed: int = 1,
    progress: Callable[[Report], None] | None = None,
) -> Report:
    """Inject ``points`` faults (steps not reached are tried again with the next);
    return the report."""
    report = Report(seed=seed)
    started = time.monotonic()
    with FaultLab(NODES) as lab:
        tier = Tier(lab, work, report, seed)
        try:
            tier.setup_objects()
            tier.start_calls()
            combos = itertools.cycle(rotation(seed))
            attempts = 0
            while report.points < points and attempts < points * 4:
                attempts += 1
                tier.run_point(*next(combos))
                report.elapsed_s = time.monotonic() - started
                if progress is not None:
                    progress(report)
            tier.stop_calls()
            for obj in list(tier.objects):
                tier._settle(obj)
                tier._check_journal(obj)
        finally:
            tier.close()
    report.elapsed_s = time.monotonic() - started
    return report
