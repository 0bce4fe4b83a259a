"""A storage node's settings: one dataclass, filled from flags or a TOML file."""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from shuttle.errors import ConfigError
from shuttle.net.addresses import is_loopback as is_loopback
from shuttle.net.addresses import parse_address
from shuttle.net.admission import (
    CONNECTIONS_MAX,
    EXECUTING_MAX,
    EXECUTING_MAX_RADOS,
    EXECUTOR_THREADS_RADOS,
    FRAME_TIMEOUT_S,
    HANDSHAKE_TIMEOUT_S,
    IDLE_TIMEOUT_S,
    ServerLimits,
)
from shuttle.net.cpu import parse_speed_factor
from shuttle.net.principal_limits import (
    OBJECTS_MAX,
    PRINCIPAL_OBJECTS_MAX,
    PRINCIPAL_REQUESTS_MAX,
    REQUESTS_MAX,
    PrincipalLimits,
)
from shuttle.net.server import EXECUTOR_THREADS
from shuttle.node.callbacks import CALLBACK_TERM_S_DEFAULT, CALLBACK_TERM_S_MAX
from shuttle.node.principal_peers import PEERS_CHECK_S
from shuttle.runtime.config import (
    DURABLE_LEASE_S_DEFAULT,
    LEASE_S_DEFAULT,
    THRESHOLD_FRACTION_DEFAULT,
    WINDOW_S_DEFAULT,
    RuntimeConfig,
)
from shuttle.runtime.placement import (
    AGGREGATE_CLIENTS_MIN_DEFAULT,
    ARRIVALS_MAX_DEFAULT,
    ARRIVALS_MAX_SATURATED_DEFAULT,
    SERVER_CPU_SHARE_MAX_DEFAULT,
    SERVER_CPU_SHARE_SATURATED_DEFAULT,
)
from shuttle.runtime.sandbox_limits import (
    CPU_S_PER_CALL_DEFAULT as SANDBOX_CPU_S_DEFAULT,
)
from shuttle.runtime.sandbox_limits import (
    MEMORY_BYTES_DEFAULT as SANDBOX_MEMORY_BYTES_DEFAULT,
)
from shuttle.runtime.sandbox_limits import (
    WALL_S_PER_CALL_DEFAULT as SANDBOX_WALL_S_DEFAULT,
)
from shuttle.runtime.sandbox_limits import SandboxLimits
from shuttle.store.config import OBJECT_BYTES_MAX_DEFAULT, OBJECT_SIZE_BYTES_MAX
from shuttle.store.rados_conn import CephOptions
from shuttle.store.registry import StoreSpec, parse_store_spec

#: Default server block cache: big enough for a working set of small files, small
#: enough that the netrand benchmark's default file (larger than it) misses when cold.
CACHE_BYTES_DEFAULT = 64 << 20
CACHE_BLOCK_BYTES_DEFAULT = 4096
#: Processes of one node at most (``--workers``): a worker is a whole interpreter
#: (~40 MB) and more than the machine's cores only adds switching; 64 covers the
#: largest machines we expect without letting a typo start thousands.
WORKERS_MAX = 64
#: The settings that are paths (kept as strings in :meth:`NodeConfig.to_wire`).
_PATH_FIELDS = (
    "data_dir",
    "ready_file",
    "key_file",
    "ceph_conf",
    "ceph_keyring",
    "tls_cert",
    "tls_key",
    "ca_file",
    "cluster_file",
)


#: Seconds between a slow node's full collections when it schedules them itself
#: (docs/runtime.md, "The node profiled": the interpreter's own came every 13-23 s).
SCHEDULED_GC_S_SLOW = 10.0


@dataclass(frozen=True)
class NodeConfig:
    """Everything a node needs to run."""

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 7400
    node_id: str = ""
    cache_bytes: int = CACHE_BYTES_DEFAULT
    cache_block_bytes: int = CACHE_BLOCK_BYTES_DEFAULT
    #: CPU speed relative to this machine (0.5: the node does the same work on half
    #: the CPU, by burning the difference).
    cpu_factor: float = 1.0
    #: Where to write ``{"host", "port", "pid", "node_id"}`` once listening (for
    #: ``cluster up`` when the port is chosen by the kernel).
    ready_file: Path | None = None
    #: The cluster key file (``shuttle cluster up`` writes one): with it the node
    #: serves only clients that prove they hold the key; without it, any client
    #: (data only: the run-time refuses shipped code from unauthenticated clients).
    key_file: Path | None = None
    log_level: str = "INFO"
    #: Listen on an address other hosts can reach without TLS or without a cluster key
    #: (docs/security.md, "The wire"): only where every host and link is trusted.
    insecure: bool = False
    # --- TLS (docs/security.md) ---
    #: TLS on every connection: True, False, or None for the default (on when the
    #: node listens beyond loopback, or when it is given a certificate).
    tls: bool | None = None
    #: The node's certificate and private key (PEM; ``cluster up --tls`` makes them).
    tls_cert: Path | None = None
    tls_key: Path | None = None
    #: The cluster's CA certificate: the node's run-time checks other nodes with it.
    ca_file: Path | None = None
    # --- principals (docs/security.md, "Principals and capabilities") ---
    #: A cluster file naming the other nodes: a node that missed a change of principals
    #: takes the newest table from them at start and every ``principals_check_s``
    #: (None: only ``shuttle cluster user`` changes its table).
    cluster_file: Path | None = None
    principals_check_s: float = PEERS_CHECK_S
    # --- what clients may make the node hold (docs/operations.md) ---
    connections_max: int = CONNECTIONS_MAX
    frame_timeout_s: float = FRAME_TIMEOUT_S
    idle_timeout_s: float = IDLE_TIMEOUT_S
    #: Seconds a connection has to finish its handshake (TLS and HELLO).
    handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S
    #: Connections in their handshake at once (None: a quarter of the connection cap,
    #: at most 1,024); a new one past it closes the one that waited longest.
    unauthenticated_max: int | None = None
    # --- what each principal may hold (net/principal_limits.py) ---
    #: Connections per principal (None: a quarter of the connection cap, at most 1,024).
    principal_connections_max: int | None = None
    principal_requests_max: int = PRINCIPAL_REQUESTS_MAX
    requests_max: int = REQUESTS_MAX
    principal_objects_max: int = PRINCIPAL_OBJECTS_MAX
    objects_max: int = OBJECTS_MAX
    # --- the run-time of mobile objects (docs/runtime.md) ---
    #: H, the observation window of the resource monitor, seconds.
    window_s: float = WINDOW_S_DEFAULT
    #: B_thresh as a fraction of H: a move must save more than this per window.
    threshold: float = THRESHOLD_FRACTION_DEFAULT
    #: Scale each stack's B_thresh by its share of its client's time (docs/runtime.md).
    threshold_share: bool = False
    #: Leave a stack undecided while its top calls have not returned (docs/runtime.md).
    settle_calls: bool = False
    #: From this many clients with stacks here, decide for their aggregate throughput
    #: (docs/runtime.md, "Many clients"); 0: never.
    aggregate_clients: int = AGGREGATE_CLIENTS_MIN_DEFAULT
    #: With many clients, the stacks that may be on their way here and not yet
    #: observed (docs/runtime.md, "Many clients"); 0: no limit.
    arrivals_max: int = ARRIVALS_MAX_DEFAULT
    #: The same while the clients report their CPUs saturated (docs/runtime.md,
    #: "The ramp").
    arrivals_max_saturated: int = ARRIVALS_MAX_SATURATED_DEFAULT
    #: With many clients, the share of its CPU the node lets arrivals fill
    #: (docs/runtime.md, "Saturation").
    cpu_budget: float = SERVER_CPU_SHARE_MAX_DEFAULT
    #: With many clients, the share arrivals may fill while the clients report their
    #: CPUs saturated (docs/runtime.md, "The clients' saturation").
    cpu_budget_saturated: float = SERVER_CPU_SHARE_SATURATED_DEFAULT
    #: With many clients, climb the share arrivals may fill from ``cpu_budget`` on the
    #: clients' measured calls a second (docs/runtime.md, "The admission edge").
    cpu_climb: bool = False
    #: With many clients, keep the raised share while the node is the bound
    #: (docs/runtime.md, "The raise held").
    raise_hold: bool = True
    #: With many clients, rank arrivals by what they save per node CPU second
    #: (docs/runtime.md, "Ranked by the node's CPU").
    rank_by_node_cpu: bool = True
    #: With many clients, send back for the node's CPU only stacks whose leaving frees
    #: it (docs/runtime.md, "What a send-back frees").
    shed_by_freed_cpu: bool = True
    #: The run-time's decision log kept in memory as JSON lines, not dicts (docs/
    #: runtime.md, "The node profiled").
    log_as_text: bool = True
    #: Seconds between the node's full garbage collections, made on a thread of their
    #: own instead of inside a call (``shuttle.node.full_collections``); 0: the
    #: interpreter's own, wherever they fall; None: :data:`SCHEDULED_GC_S_SLOW` on a
    #: node slower than this machine (``cpu_factor`` < 1, where a collection inside a
    #: call is burned with it), the interpreter's own otherwise.
    scheduled_gc_s: float | None = None
    #: Anti-thrashing: an object that moved stays put this long (None: 5 H).
    residence_s: float | None = None
    #: Memory lent to hosted mobile objects, for the placement model (None: no limit).
    object_memory_bytes: int | None = None
    #: False: measure and log placement decisions, but never move anything.
    adaptive: bool = True
    #: Objects of an application's run-time not heard from for this long are dropped.
    lease_s: float = LEASE_S_DEFAULT
    #: A durable object's lease: how long a host serves it without word from its home.
    durable_lease_s: float = DURABLE_LEASE_S_DEFAULT
    #: Limits of each shipped object's worker process.
    sandbox_memory_bytes: int = SANDBOX_MEMORY_BYTES_DEFAULT
    sandbox_cpu_s: float = SANDBOX_CPU_S_DEFAULT
    sandbox_wall_s: float = SANDBOX_WALL_S_DEFAULT
    #: Run shipped code without the jail (``--unsafe-code``): as the node's user, with
    #: its files, key and network. Without it a node that cannot jail refuses code.
    unsafe_code: bool = False
    #: Largest object the node stores (``--object-bytes-max``); see docs/operations.md.
    object_bytes_max: int = OBJECT_BYTES_MAX_DEFAULT
    #: How long a callback promise holds unless broken (``--callback-term``): the
    #: longest a client that stopped without closing its connection holds up writers.
    callback_term_s: float = CALLBACK_TERM_S_DEFAULT
    # --- where the objects live (docs/ceph.md) ---
    #: ``local`` (files under data_dir) or ``rados:POOL[/NAMESPACE]`` (a Ceph pool that
    #: several nodes may serve; data_dir then holds only the node's local state).
    store: str = "local"
    #: Ceph configuration and keyring (None: Ceph's defaults, $CEPH_CONF or
    #: /etc/ceph/ceph.conf and the keyring it names), and the cephx user.
    ceph_conf: Path | None = None
    ceph_keyring: Path | None = None
    ceph_user: str = "client.admin"
    #: This node's CRUSH host (``--ceph-host``; None: the machine's short host name, as
    #: Ceph names OSD hosts). Clients prefer this node for keys whose primary OSD is there.
    ceph_host: str | None = None
    # --- processes (docs/architecture.md, "Workers") ---
    #: Processes serving the node's port: 1, the primary alone (the default); N > 1
    #: starts N-1 workers that answer small reads themselves and send everything else
    #: to the primary.
    workers: int = 1

    def full_collections_s(self) -> float | None:
        """Seconds between the node's scheduled full collections; None: none scheduled."""
        if self.scheduled_gc_s is None:
            return SCHEDULED_GC_S_SLOW if self.cpu_factor < 1 else None
        return self.scheduled_gc_s or None

    def __post_init__(self) -> None:
        if self.scheduled_gc_s is not None and not (
            self.scheduled_gc_s >= 0 and math.isfinite(self.scheduled_gc_s)
        ):
            raise ConfigError(
                "--scheduled-gc takes the seconds between the node's full collections "
                f"(0: the interpreter's own, wherever they fall), got {self.scheduled_gc_s!r}"
            )
        if self.cache_bytes < 0:
            raise ConfigError(f"cache size must be ≥ 0 bytes, got {self.cache_bytes}")
        if self.cache_block_bytes <= 0 or self.cache_block_bytes & (self.cache_block_bytes - 1):
            raise ConfigError(
                f"cache block size must be a power of two, got {self.cache_block_bytes}"
            )
        parse_speed_factor(self.cpu_factor)
        if not 0 < self.object_bytes_max <= OBJECT_SIZE_BYTES_MAX:
            raise ConfigError(
                f"--object-bytes-max must be in 1..{OBJECT_SIZE_BYTES_MAX} (1 TiB), got "
                f"{self.object_bytes_max}"
            )
        if not 0 < self.callback_term_s <= CALLBACK_TERM_S_MAX:
            raise ConfigError(
                f"--callback-term must be in (0, {CALLBACK_TERM_S_MAX:g}] seconds, got "
                f"{self.callback_term_s:g}"
            )
        if not self.principals_check_s > 0:
            raise ConfigError(
                f"--principals-check must be positive seconds, got {self.principals_check_s:g}"
            )
        self.admission()
        self.principal_limits()
        parse_store_spec(self.store)
        if self.key_file is None and not self.insecure and not is_loopback(self.host):
            raise ConfigError(
                f"refusing to listen on {self.host} without a cluster key: every host that "
                "reaches it could read and overwrite all data. Give --key-file (`shuttle "
                "cluster up` makes one), listen on 127.0.0.1, or pass --insecure on a "
                "network where every host is trusted"
            )
        self._check_tls()
        self._check_workers()
        self.runtime_config()
        self.sandbox_limits()
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ConfigError(
                f"log level must be DEBUG, INFO, WARNING or ERROR, not {self.log_level!r}"
            )

    @property
    def name(self) -> str:
        return self.node_id or f"{self.host}:{self.port}"

    @property
    def tls_enabled(self) -> bool:
        """Whether the node serves TLS: as asked, else when it has a certificate or
        listens beyond loopback."""
        if self.tls is not None:
            return self.tls
        return self.tls_cert is not None or not is_loopback(self.host)

    def _check_tls(self) -> None:
        if self.tls_enabled:
            missing = [
                flag
                for flag, value in (
                    ("--tls-cert", self.tls_cert),
                    ("--tls-key", self.tls_key),
                    ("--ca-file", self.ca_file),
                )
                if value is None
            ]
            if missing:
                why = "--tls was given" if self.tls else f"{self.host} is beyond loopback"
                raise ConfigError(
                    f"the node serves TLS ({why}) and needs {', '.join(missing)}: its "
                    "certificate and key, and the cluster's CA certificate (`shuttle cluster "
                    "up --tls` makes all three under ROOT/tls/; docs/security.md says how to "
                    "use your own CA). Or serve without TLS: --no-tls (beyond loopback, with "
                    "--insecure too)"
                )
        elif not self.insecure and not is_loopback(self.host):
            raise ConfigError(
                f"refusing to listen on {self.host} without TLS: anyone on the network path "
                "could read every byte and change requests and replies. Give the node a "
                "certificate (--tls-cert, --tls-key, --ca-file; `shuttle cluster up` makes "
                "them), listen on 127.0.0.1, or pass --insecure on a network where every host "
                "and link is trusted"
            )

    def _check_workers(self) -> None:
        if type(self.workers) is not int or not 1 <= self.workers <= WORKERS_MAX:
            raise ConfigError(
                f"--workers must be a whole number from 1 to {WORKERS_MAX}, got {self.workers!r}"
            )
        if self.workers > 1 and self.store_spec().kind == "rados":
            raise ConfigError(
                "--workers applies to a local store only: a RADOS store's processes would "
                "each need their own watch and cache; run more gateway nodes over the pool "
                "instead (docs/ceph.md)"
            )

    def worker_admission(self) -> ServerLimits:
        """A worker's share of :meth:`admission`: the connection cap and the handshake
        cap divided among the node's processes, so the node as a whole holds what one
        process would. (The primary keeps the whole cap: the connections its workers
        open to it for their clients count there too.)"""
        whole = self.admission()
        share = -(-whole.connections_max // self.workers)
        waiting = whole.unauthenticated
        return replace(
            whole,
            connections_max=share,
            unauthenticated=(
                None if waiting is None else max(1, min(-(-waiting // self.workers), share - 1))
            ),
        )

    def to_wire(self) -> dict[str, Any]:
        """The settings as JSON values (a primary hands them to its workers)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = str(value) if isinstance(value, Path) else value
        return out

    @classmethod
    def from_wire(cls, values: dict[str, Any]) -> NodeConfig:
        """The settings :meth:`to_wire` gave (checked again, as any config is)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown setting(s) {', '.join(unknown)}")
        out = dict(values)
        for name in _PATH_FIELDS:
            if out.get(name) is not None:
                out[name] = Path(out[name])
        return cls(**out)

    def runtime_config(self) -> RuntimeConfig:
        """The node run-time's settings (the decision log lives in the data folder)."""
        return RuntimeConfig(
            window_s=self.window_s,
            threshold_fraction=self.threshold,
            threshold_per_share=self.threshold_share,
            settle_calls=self.settle_calls,
            aggregate_clients_min=self.aggregate_clients,
            arrivals_max=self.arrivals_max,
            arrivals_max_saturated=self.arrivals_max_saturated,
            cpu_budget=self.cpu_budget,
            cpu_budget_saturated=self.cpu_budget_saturated,
            cpu_climb=self.cpu_climb,
            raise_hold=self.raise_hold,
            rank_by_node_cpu=self.rank_by_node_cpu,
            shed_by_freed_cpu=self.shed_by_freed_cpu,
            log_as_text=self.log_as_text,
            residence_s=self.residence_s,
            object_memory_bytes=self.object_memory_bytes,
            adaptive=self.adaptive,
            lease_s=self.lease_s,
            durable_lease_s=self.durable_lease_s,
            decision_log=self.data_dir / ".shuttle" / "runtime" / "placement.jsonl",
            durable_dir=self.data_dir / ".shuttle" / "runtime" / "objects",
        )

    def admission(self) -> ServerLimits:
        """What clients may make the node hold (connections, stalled frames, idling,
        requests running per connection: more on a RADOS store, whose requests wait on
        the network; see :data:`~shuttle.net.admission.EXECUTING_MAX_RADOS`)."""
        rados = self.store_spec().kind == "rados"
        return ServerLimits(
            connections_max=self.connections_max,
            frame_timeout_s=self.frame_timeout_s,
            idle_timeout_s=self.idle_timeout_s,
            executing_max=EXECUTING_MAX_RADOS if rados else EXECUTING_MAX,
            handshake_timeout_s=self.handshake_timeout_s,
            unauthenticated=self.unauthenticated_max,
        )

    def principal_limits(self) -> PrincipalLimits:
        """What each principal (and all of them together) may hold of the node."""
        return PrincipalLimits(
            connections=self.principal_connections_max,
            requests=self.principal_requests_max,
            requests_total=self.requests_max,
            objects=self.principal_objects_max,
            objects_total=self.objects_max,
        )

    def executor_threads(self) -> int:
        """Threads of the node's pool for blocking requests: the server's default, for
        a disk; more for a RADOS store, whose requests wait on OSDs."""
        return EXECUTOR_THREADS_RADOS if self.store_spec().kind == "rados" else EXECUTOR_THREADS

    def store_spec(self) -> StoreSpec:
        return parse_store_spec(self.store)

    def ceph_options(self) -> CephOptions:
        """How a RADOS store reaches its cluster (checked when the store opens)."""
        return CephOptions(self.ceph_conf, self.ceph_keyring, self.ceph_user)

    def sandbox_limits(self) -> SandboxLimits:
        return SandboxLimits(
            self.sandbox_memory_bytes,
            self.sandbox_cpu_s,
            self.sandbox_wall_s,
            unsafe_code=self.unsafe_code,
        )

    @classmethod
    def from_toml(cls, path: Path, **overrides: Any) -> NodeConfig:
        """Read ``[node]`` from a TOML file; ``overrides`` (flags given) win."""
        try:
            raw = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
        table = raw.get("node", raw)
        known = {f.name for f in fields(cls)} | {"listen"}
        unknown = sorted(set(table) - known)
        if unknown:
            raise ConfigError(
                f"config file {path}: unknown setting(s) {', '.join(unknown)}; "
                f"known: {', '.join(sorted(known))}"
            )
        values: dict[str, Any] = dict(table)
        if "listen" in values:
            values["host"], values["port"] = parse_address(str(values.pop("listen")))
        for key in _PATH_FIELDS:
            if values.get(key) is not None:
                values[key] = Path(values[key])
        if "data_dir" not in values and "data_dir" not in overrides:
            raise ConfigError(f"config file {path}: data_dir is required")
        base = cls(**{**values, **{k: v for k, v in overrides.items() if k == "data_dir"}})
        return replace(base, **{k: v for k, v in overrides.items() if v is not None})
