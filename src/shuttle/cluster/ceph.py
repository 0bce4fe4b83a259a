"""A single-host Ceph under one directory: one mon and N OSDs, for tests and the demo.

No cephadm, no systemd, no mgr: ``ceph-mon`` and ``ceph-osd`` run in the foreground
as children of nobody (their own sessions), their pids recorded in ROOT/ceph.json so
another process (``shuttle cluster down``) can stop them. Everything lives under ROOT:
the conf (ROOT/ceph.conf), the admin keyring (ROOT/client.admin.keyring), the mon's
store, one bluestore file per OSD, logs (ROOT/log) and admin sockets (ROOT/run).

Settings chosen at start, because they cannot be changed at run time or trip on one
host (docs/ceph.md has the list): bluestore (memstore loses data on restart and then
hangs clients), ``osd class load list = *`` (cls_lua), one OSD per failure domain
(three OSDs on one host hold a size-3 pool), a free mon port on 127.0.0.1 (several
instances coexist), per-process admin sockets, the mon's free-space warnings relaxed,
and client timeouts (I/O to a PG that is not active hangs instead of failing).

Readiness is checked without a mgr: every PG of the pool takes a probe write. The
daemons as processes (is a recorded pid still ours, has it exited, what its log says)
are :mod:`shuttle.cluster.cephprocs`'s.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from shuttle.cluster.cephclient import SETUP_HINT, CephInfo, connect, mon_command
from shuttle.cluster.cephconf import (
    ADMIN_KEYRING,
    PG_NUM,
    conf_text,
    free_port,
    keyring_text,
    new_key,
    run_dir,
)
from shuttle.cluster.cephprocs import (
    log_errors,
    log_tail,
    pid_runs,
    port_open,
    wait_exit,
    wait_gone,
)
from shuttle.errors import ConfigError, ExternalToolError, RequestTimeoutError

__all__ = ["CephInfo", "LocalCeph", "connect", "mon_command"]

#: Each OSD's bluestore file (sparse: only written blocks take disk space).
OSD_SIZE_BYTES = 10 << 30
#: How long ``start`` waits for the mon, the OSDs and the pool's PGs (about 5 s here).
START_TIMEOUT_S = 90.0
STATE_FILE = "ceph.json"
#: The Ceph of a cluster ``shuttle cluster up --ceph`` starts: ROOT/ceph.
CLUSTER_CEPH_DIR = "ceph"
CONF_FILE = "ceph.conf"
PROBE_NAMESPACE = "shuttle-probe"
Report = Callable[[str], None]


class LocalCeph:
    """A single-host Ceph under ``root``. ``start`` makes it (or restarts the daemons
    of the one already there), ``down`` kills every daemon and removes ``root``."""

    def __init__(
        self,
        root: Path,
        *,
        osds: int = 3,
        pool: str = "shuttle",
        size: int | None = None,
        min_size: int | None = None,
        osd_size_bytes: int = OSD_SIZE_BYTES,
        start_timeout_s: float = START_TIMEOUT_S,
        die_with_parent: bool = False,
        report: Report = lambda _: None,
    ) -> None:
        self.root = Path(os.path.abspath(root))
        self.osds = osds
        self.pool = pool
        self.size = size if size is not None else min(3, osds)
        self.min_size = min_size if min_size is not None else max(1, self.size - 1)
        self.osd_size_bytes = osd_size_bytes
        self.start_timeout_s = start_timeout_s
        #: Daemons get SIGKILL when this process dies (tests: no Ceph outlives a killed
        #: run). Off for ``cluster up``, whose Ceph outlives the command.
        self.die_with_parent = die_with_parent
        self.report = report
        self._admin: Any = None
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        state = self._load_state()
        self.pids: dict[str, int] = state.get("pids", {})
        self.mon_port: int = state.get("mon_port", 0)
        if state:  # an existing Ceph keeps its shape
            self.osds, self.pool = state["osds"], state["pool"]
            self.size, self.min_size = state["size"], state["min_size"]
        self._check()

    # --- paths -------------------------------------------------------------------

    @property
    def conf_path(self) -> Path:
        return self.root / CONF_FILE

    @property
    def keyring_path(self) -> Path:
        return self.root / ADMIN_KEYRING

    def log_path(self, name: str) -> Path:
        return self.root / "log" / f"{name}.log"

    def info(self) -> CephInfo:
        return CephInfo(
            self.conf_path,
            self.keyring_path,
            self.pool,
            mon_address=f"127.0.0.1:{self.mon_port}",
            osds=self.osds,
        )

    def _check(self) -> None:
        if not 1 <= self.osds <= 16:
            raise ConfigError(f"osds must be in 1..16, got {self.osds}")
        if not 1 <= self.min_size <= self.size <= self.osds:
            raise ConfigError(
                f"pool size {self.size} and min_size {self.min_size} need "
                f"1 <= min_size <= size <= osds ({self.osds})"
            )
        for tool in ("ceph-mon", "ceph-osd", "monmaptool"):
            if shutil.which(tool) is None:
                raise ConfigError(f"`{tool}` is not installed; {SETUP_HINT}")

    def _load_state(self) -> dict[str, Any]:
        path = self.root / STATE_FILE
        try:
            return dict(json.loads(path.read_text()))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path} is unreadable ({exc}); remove {self.root}") from exc

    def _save_state(self) -> None:
        state = {
            "osds": self.osds,
            "pool": self.pool,
            "size": self.size,
            "min_size": self.min_size,
            "mon_port": self.mon_port,
            "pids": self.pids,
            "info": {k: str(v) for k, v in asdict(self.info()).items()},
        }
        tmp = self.root / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self.root / STATE_FILE)

    # --- start -------------------------------------------------------------------

    def start(self) -> CephInfo:
        """Make the Ceph (or start the daemons of the one under ``root`` that are not
        running) and wait until the pool's PGs are all active. On failure the daemons
        are killed and the error names the log to read; ``root`` stays for it (remove
        it before starting a new Ceph there)."""
        t0 = time.monotonic()
        deadline = t0 + self.start_timeout_s
        fresh = not (self.root / STATE_FILE).exists()
        try:
            if fresh:
                self._bootstrap(deadline)
            else:
                run_dir(self.root).mkdir(parents=True, exist_ok=True)  # /tmp may be new
                self._resume(deadline)
            self.wait_active(timeout_s=max(1.0, deadline - time.monotonic()))
        except BaseException:
            self.kill_all()
            if fresh:  # half made: a second start would not know what it holds
                (self.root / STATE_FILE).unlink(missing_ok=True)
            raise
        self.report(
            f"ceph: {self.osds} OSDs, pool {self.pool} (size {self.size}, min_size "
            f"{self.min_size}) active in {time.monotonic() - t0:.1f} s; conf {self.conf_path}"
        )
        return self.info()

    def _bootstrap(self, deadline: float) -> None:
        if self.root.exists() and any(self.root.iterdir()):
            raise ConfigError(f"{self.root} is not empty and holds no Ceph: use an empty folder")
        for sub in ("log", "mon", "osd"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        run_dir(self.root).mkdir(parents=True, exist_ok=True)
        self.mon_port = free_port()
        fsid = str(uuid.uuid4())
        self.conf_path.write_text(
            conf_text(
                self.root,
                fsid=fsid,
                mon_port=self.mon_port,
                size=self.size,
                min_size=self.min_size,
                osd_size_bytes=self.osd_size_bytes,
            )
        )
        admin_key = new_key()
        admin_caps = {"mon": "allow *", "osd": "allow *", "mgr": "allow *"}
        self.keyring_path.write_text(keyring_text({"client.admin": (admin_key, admin_caps)}))
        self.keyring_path.chmod(0o600)
        mon_keyring = self.root / "mon.keyring"
        mon_keyring.write_text(
            keyring_text(
                {"mon.": (new_key(), {"mon": "allow *"}), "client.admin": (admin_key, admin_caps)}
            )
        )
        # The OSDs' bluestore files are made while the mon comes up.
        osd_ids = [str(uuid.uuid4()) for _ in range(self.osds)]
        for i in range(self.osds):
            (self.root / "osd" / f"osd.{i}").mkdir()
        mkfs = [
            self._popen(
                f"osd.{i}.mkfs",
                [
                    *("ceph-osd", "-c", str(self.conf_path), "-i", str(i), "--mkfs"),
                    *("--osd-uuid", osd_ids[i], "--no-mon-config"),
                ],
            )
            for i in range(self.osds)
        ]
        monmap = self.root / "monmap"
        self._run(
            [
                *("monmaptool", "--create", "--fsid", fsid, "--clobber", str(monmap)),
                *("--addv", "a", f"[v1:127.0.0.1:{self.mon_port}]"),
            ]
        )
        self._run(
            [
                *("ceph-mon", "-c", str(self.conf_path), "-i", "a", "--mkfs"),
                *("--monmap", str(monmap), "--keyring", str(mon_keyring)),
            ]
        )
        self._save_state()
        self._start_daemon("mon.a", ["ceph-mon", "-f", "-c", str(self.conf_path), "-i", "a"])
        admin = self.admin(deadline)
        for i, osd_uuid in enumerate(osd_ids):
            key = new_key()
            mon_command(
                admin, prefix="osd new", uuid=osd_uuid, id=i,
                inbuf=json.dumps({"cephx_secret": key}).encode(),
            )  # fmt: skip
            rc = wait_exit(mkfs[i], deadline)
            if rc != 0:
                raise ExternalToolError(
                    f"ceph-osd --mkfs for osd.{i} failed (exit status {rc}); "
                    f"see {self.root / 'log' / f'osd.{i}.mkfs.out'} and {self.log_path(f'osd.{i}')}"
                    f"; its last errors:\n{log_errors(self.log_path(f'osd.{i}'))}"
                )
            (self.root / "osd" / f"osd.{i}" / "keyring").write_text(
                keyring_text({f"osd.{i}": (key, {})})
            )
            self.start_osd(i, wait=False)
        self.create_pool(self.pool, size=self.size, min_size=self.min_size)
        self.wait_osds_up(set(range(self.osds)), max(1.0, deadline - time.monotonic()))

    def _resume(self, deadline: float) -> None:
        if not pid_runs(self.pids.get("mon.a"), self.conf_path):
            self._start_daemon("mon.a", ["ceph-mon", "-f", "-c", str(self.conf_path), "-i", "a"])
        self.admin(deadline)
        for i in range(self.osds):
            if not pid_runs(self.pids.get(f"osd.{i}"), self.conf_path):
                self.start_osd(i, wait=False)
        self.wait_osds_up(set(range(self.osds)), max(1.0, deadline - time.monotonic()))

    # --- processes ---------------------------------------------------------------

    def _popen(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        if self.die_with_parent and shutil.which("setpriv"):  # util-linux; keeps the pid
            argv = ["setpriv", "--pdeathsig", "KILL", "--", *argv]
        with open(self.root / "log" / f"{name}.out", "ab") as out:
            return subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # survives the process that started it
                close_fds=True,
            )

    def _run(self, argv: list[str], timeout_s: float = 30.0) -> None:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0:
            raise ExternalToolError(
                f"{argv[0]} failed (exit status {proc.returncode}): "
                f"{(proc.stderr or proc.stdout).strip()[-800:]}"
            )

    def _start_daemon(self, name: str, argv: list[str]) -> None:
        proc = self._popen(name, argv)
        self._procs[name] = proc
        self.pids[name] = proc.pid
        self._save_state()

    def _check_alive(self, name: str) -> None:
        proc = self._procs.get(name)
        if proc is not None and proc.poll() is not None:
            raise ExternalToolError(
                f"{name} exited with status {proc.returncode}; last lines of "
                f"{self.log_path(name)}:\n{log_tail(self.log_path(name))}\n"
                f"{log_tail(self.root / 'log' / f'{name}.out', 5)}"
            )

    def start_osd(self, i: int, *, wait: bool = True, timeout_s: float = 60.0) -> None:
        """Start OSD ``i`` (again) and, with ``wait``, wait until it is up and the
        pool's PGs are active."""
        if pid_runs(self.pids.get(f"osd.{i}"), self.conf_path):
            raise ConfigError(f"osd.{i} already runs (pid {self.pids[f'osd.{i}']})")
        self._start_daemon(f"osd.{i}", ["ceph-osd", "-f", "-c", str(self.conf_path), "-i", str(i)])
        if wait:
            deadline = time.monotonic() + timeout_s
            self.wait_osds_up({i}, timeout_s)
            self.wait_active(timeout_s=max(1.0, deadline - time.monotonic()))

    def stop_osd(self, i: int, *, sig: int = signal.SIGKILL, timeout_s: float = 30.0) -> None:
        """Stop OSD ``i`` (SIGKILL by default: a crash) and have the mon mark it down
        at once, so that clients move on to the other replicas."""
        name = f"osd.{i}"
        pid = self.pids.get(name)
        if pid_runs(pid, self.conf_path):
            assert pid is not None
            os.kill(pid, sig)
            wait_gone(pid, self._procs.get(name), timeout_s, self.conf_path)
        self.pids.pop(name, None)
        self._save_state()
        mon_command(self.admin(), prefix="osd down", ids=[name])
        self.wait_osds_up(set(), timeout_s, down={i})

    def kill_all(self) -> None:
        """SIGKILL every daemon of this Ceph and wait until they are gone."""
        self.close_admin()
        for name, pid in list(self.pids.items()):
            if pid_runs(pid, self.conf_path):
                os.kill(pid, signal.SIGKILL)
                wait_gone(pid, self._procs.get(name), 10.0, self.conf_path)
        # Reap the daemons this process started: a zombie left behind is reaped by the
        # next wait for any child, which then gets a pid it never started (mutmut's
        # runner does so, and stops).
        for proc in self._procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=1.0)
        self.pids.clear()
        self._procs.clear()
        if (self.root / STATE_FILE).exists():
            self._save_state()

    def down(self) -> None:
        """Kill every daemon and remove ``root`` (the data goes with it)."""
        self.kill_all()
        shutil.rmtree(run_dir(self.root), ignore_errors=True)
        shutil.rmtree(self.root, ignore_errors=True)

    def running(self) -> dict[str, bool]:
        """Each daemon of the state file: whether its process runs."""
        names = ["mon.a", *(f"osd.{i}" for i in range(self.osds))]
        return {n: pid_runs(self.pids.get(n), self.conf_path) for n in names}

    def memory_bytes(self) -> int:
        """Resident memory of the running daemons, summed (from /proc)."""
        total = 0
        for pid in self.pids.values():
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        return total

    # --- the admin client, pools and waits ----------------------------------------

    def admin(self, deadline: float | None = None) -> Any:
        """This process's ``rados.Rados`` as client.admin (connected once, bounded)."""
        if self._admin is not None:
            return self._admin
        deadline = deadline or time.monotonic() + 30.0
        last: Exception | None = None
        while time.monotonic() < deadline:
            self._check_alive("mon.a")
            if port_open(self.mon_port):
                try:
                    self._admin = connect(
                        self.conf_path, self.keyring_path, timeout_s=5, op_timeout_s=10
                    )
                    return self._admin
                except RequestTimeoutError as exc:
                    last = exc
            time.sleep(0.05)
        raise RequestTimeoutError(
            f"the mon on 127.0.0.1:{self.mon_port} did not answer in time ({last}); "
            f"see {self.log_path('mon.a')}"
        )

    def close_admin(self) -> None:
        if self._admin is not None:
            self._admin.shutdown()
            self._admin = None

    def rados(self, **kwargs: Any) -> Any:
        """A new connected ``rados.Rados`` as client.admin (the caller shuts it down)."""
        return connect(self.conf_path, self.keyring_path, **kwargs)

    def create_pool(
        self,
        name: str,
        *,
        size: int | None = None,
        min_size: int | None = None,
        pg_num: int = PG_NUM,
        rule: str | None = None,
    ) -> None:
        """Create a replicated pool (``rule``: a CRUSH rule's name) and tag it."""
        admin = self.admin()
        args: dict[str, Any] = {"pool": name, "pg_num": pg_num, "pgp_num": pg_num}
        if rule is not None:
            args.update(pool_type="replicated", rule=rule)
        mon_command(admin, prefix="osd pool create", **args)
        for var, val in (("size", size), ("min_size", min_size)):
            if val is not None:
                mon_command(
                    admin, prefix="osd pool set", pool=name, var=var, val=str(val),
                    yes_i_really_mean_it=True,  # size 1 asks for it
                )  # fmt: skip
        mon_command(admin, prefix="osd pool application enable", pool=name, app="shuttle")

    def delete_pool(self, name: str) -> None:
        mon_command(
            self.admin(), prefix="osd pool delete", pool=name, pool2=name,
            yes_i_really_really_mean_it=True,
        )  # fmt: skip

    def wait_osds_up(self, up: set[int], timeout_s: float, *, down: Collection[int] = ()) -> None:
        """Wait until the OSDs in ``up`` are up and those in ``down`` down in the
        osdmap; :class:`RequestTimeoutError` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        state: dict[int, bool] = {}
        while time.monotonic() < deadline:
            for i in up:
                self._check_alive(f"osd.{i}")
            dump = json.loads(mon_command(self.admin(), prefix="osd dump"))
            state = {o["osd"]: bool(o["up"]) for o in dump["osds"]}
            if all(state.get(i) for i in up) and not any(state.get(i) for i in down):
                return
            time.sleep(0.1)
        raise RequestTimeoutError(
            f"OSDs {sorted(up)} not up (and {sorted(down)} not down) after {timeout_s:g} s: "
            f"osdmap says {state}; see {self.root / 'log'}/osd.N.log and "
            f"`ceph -c {self.conf_path} osd tree`"
        )

    def wait_active(self, pool: str | None = None, *, timeout_s: float = 60.0) -> None:
        """Wait until every PG of ``pool`` takes a write (there is no mgr to ask);
        :class:`RequestTimeoutError` naming the PGs that did not, after ``timeout_s``."""
        pool = pool or self.pool
        deadline = time.monotonic() + timeout_s
        pending = self._probe_names(pool)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            op_timeout = max(1, min(5, int(left)))
            client = connect(
                self.conf_path, self.keyring_path, timeout_s=5, op_timeout_s=op_timeout
            )
            try:
                with _ioctx(client, pool) as io:
                    for pg, obj in sorted(pending.items()):
                        if time.monotonic() >= deadline:
                            break
                        with contextlib.suppress(Exception):
                            io.write_full(obj, b"probe")
                            io.remove_object(obj)
                            del pending[pg]
            finally:
                client.shutdown()
            if not pending:
                return
        raise RequestTimeoutError(
            f"pool {pool}: placement groups {sorted(pending)} are not active after "
            f"{timeout_s:g} s (a write to them does not complete). Check that enough OSDs "
            f"are up for the pool's min_size (`ceph -c {self.conf_path} osd tree`, "
            f"`ceph -c {self.conf_path} osd pool get {pool} all`), that its CRUSH rule can "
            f"place every replica, and the OSD logs in {self.root / 'log'}"
        )

    def _probe_names(self, pool: str) -> dict[str, str]:
        """One object name per PG of ``pool`` (from the mon's ``osd map``)."""
        admin = self.admin()
        pg_num = int(
            json.loads(mon_command(admin, prefix="osd pool get", pool=pool, var="pg_num"))["pg_num"]
        )
        names: dict[str, str] = {}
        for k in range(pg_num * 30):
            if len(names) == pg_num:
                break
            obj = f"probe.{k}"
            where = mon_command(
                admin, prefix="osd map", pool=pool, object=obj, nspace=PROBE_NAMESPACE
            )
            names.setdefault(json.loads(where)["pgid"], obj)
        return names


@contextlib.contextmanager
def _ioctx(client: Any, pool: str) -> Iterator[Any]:
    io = client.open_ioctx(pool)
    io.set_namespace(PROBE_NAMESPACE)
    try:
        yield io
    finally:
        io.close()


def cluster_ceph_root(cluster_root: Path) -> Path:
    """Where ``shuttle cluster up --ceph`` keeps a cluster's Ceph: ROOT/ceph."""
    return cluster_root / CLUSTER_CEPH_DIR


def has_cluster_ceph(cluster_root: Path) -> bool:
    return (cluster_ceph_root(cluster_root) / STATE_FILE).exists()


def main(argv: list[str] | None = None) -> int:
    """``python -m shuttle.cluster.ceph up|down|info ROOT [OSDS]``: a local Ceph by hand."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 3) or args[0] not in ("up", "down", "info"):
        print(main.__doc__, file=sys.stderr)
        return 2
    root = Path(args[1])
    if args[0] == "down":
        LocalCeph(root).down()
        return 0
    ceph = LocalCeph(root, osds=int(args[2]) if len(args) == 3 else 3, report=print)
    info = ceph.start() if args[0] == "up" else ceph.info()
    print(json.dumps({k: str(v) for k, v in asdict(info).items()}, indent=1))
    print(f"memory: {ceph.memory_bytes() / 2**20:.0f} MiB resident")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
