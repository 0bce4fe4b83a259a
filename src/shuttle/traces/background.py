"""The background workload: a synthetic stand-in for the paper's Auspex NFS trace.

The paper's background (section 3.2) is a week of NFS traffic from 236 Berkeley
workstations to an Auspex server (Dahlin et al.; the trace's README describes
getattr, block and directory reads and writes, deletes, opens and closes from each
client). That trace is not available, so :func:`generate` builds one from explicit,
documented parameters (:class:`BackgroundConfig`). Any real trace can be used
instead through :func:`shuttle.traces.formats.read_trace`.

The model, and why:

* **Clients** (236, as in the Auspex trace) differ in how busy they are: client
  ``c`` gets a share of the traffic proportional to ``1 / (c + 1) ** client_activity_zipf``
  (a few heavy users, a long tail of light ones).
* **Bursts.** A client is idle or in a *session* (a burst of work: a compile, an
  editor save, a mail check). Sessions start as a Poisson process whose rate
  follows the time of day (a cosine with ``diurnal_amplitude`` peaking at
  ``diurnal_peak_s``); their lengths are Pareto (shape ``session_pareto_shape``,
  minimum ``session_s_min``, capped at ``session_s_max``), and a session issues
  requests as a Poisson process of ``session_requests_per_s``. Heavy-tailed on
  periods summed over many clients give the bursty, self-similar arrivals that
  file system traces show (Gribble et al. 1998 found it at time scales under a
  day); a lower shape or a higher per-session rate is burstier.
* **Requests.** A request is metadata with probability ``metadata_fraction``
  (the paper: 87% of the background's requests), drawn from ``metadata_mix``
  (NFSv2-era: getattr revalidations dominate, then lookups; few writes, since an
  NFS server writes them through to disk). Otherwise it moves one block of
  ``request_bytes`` (8 KB NFS transfers), a write with probability
  ``block_write_fraction``.
* **Files and locality.** Each client has its own ``files_per_client`` files (no
  sharing between clients, nor with the mobile application, as the paper assumes),
  with Zipf popularity ``file_popularity_zipf``. A session works on a small set of
  ``session_files`` files drawn by popularity (some brand new, with probability
  ``new_file_fraction``: files created during the trace); each of its requests
  picks from that set with probability ``session_locality``, else from the client's
  whole popularity. A block request picks a block of its file uniformly. File
  sizes are lognormal (median ``file_size_median_bytes``, shape
  ``file_size_sigma``), as file-size studies find.

Every random choice derives from one seed, and each session from its own generator
seeded by ``(seed, client, session)``, so a time window's records do not depend on
what else is generated: ``generate(config, seed, start_s, end_s)`` yields exactly the
records of the full trace that fall in the window. :func:`generate_columns` yields
the same records as numpy columns in chunks, several times faster, for the
simulator.

The defaults are calibrated (``docs/traces.md``, ``benchmarks/README.md``) so that
the paper's qualitative results are reachable with the simulator's default server:
in the busiest three-minute intervals the server CPU is about half busy at speed
1.0, and it saturates at half speed once the mobile application runs there.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from shuttle.errors import ConfigError
from shuttle.traces.record import Op, TraceRecord

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
I8 = npt.NDArray[np.int8]

#: Operation codes in :class:`BackgroundChunk`: ``OPS[code]``.
OPS: tuple[Op, ...] = tuple(Op)
_CODE = {op: code for code, op in enumerate(OPS)}
_READ = _CODE[Op.READ]
_WRITE = _CODE[Op.WRITE]

#: Metadata requests by kind. Reads: getattr dominates NFS traffic (clients
#: revalidate cached files every few seconds), then lookups (name resolution),
#: directory reads, symbolic links, file system status. Writes are about 0.9% of
#: metadata: every one is written through to the server's disk, so they are kept to
#: what a disk of the time could absorb beside the reads.
DEFAULT_METADATA_MIX: tuple[tuple[Op, float], ...] = (
    (Op.GETATTR, 0.650),
    (Op.LOOKUP, 0.262),
    (Op.READDIR, 0.046),
    (Op.READLINK, 0.023),
    (Op.FSSTAT, 0.010),
    (Op.SETATTR, 0.003),
    (Op.CREATE, 0.003),
    (Op.REMOVE, 0.002),
    (Op.RENAME, 0.001),
)

#: Every background file id is below this, so a simulator can give the mobile
#: application's files ids from here up and build block keys as ``file << 32 | block``
#: in 64-bit integers (``shuttle.sim.workload`` does both).
FILE_IDS_MAX = 1 << 28
#: Files created during the trace get ids from here up (above every client's own
#: files, which are numbered ``client × files_per_client + rank``).
NEW_FILE_BASE = 1 << 24
#: New files one epoch may create (their ids are ``NEW_FILE_BASE + epoch ×`` this
#: ``+ k``, unique without counting across epochs). The default creates about 70.
NEW_FILES_PER_EPOCH_MAX = 1 << 12
#: Trace time generated per chunk: bounds memory (a minute at the default rate is
#: ~50,000 records) while keeping numpy calls large.
CHUNK_S = 60.0
_DAY_S = 86_400.0
#: Sessions starting in the same EPOCH_S of trace time are generated together
#: (vectorized, one seeded generator per epoch): large enough to amortize numpy
#: calls over a few hundred sessions, small enough to keep few epochs in memory.
EPOCH_S = 60.0


@dataclass(frozen=True, slots=True)
class BackgroundConfig:
    """Every parameter of the background workload. Units are in the names."""

    #: Length of the trace.
    duration_s: float = 12 * 3600.0
    #: Time of day at trace time 0 (06:00: a 12-hour trace covers the working day).
    start_time_of_day_s: float = 6 * 3600.0

    # --- arrivals --------------------------------------------------------------------
    #: Client workstations (the Auspex trace: 236).
    clients: int = 236
    #: Mean requests per second over whole days (calibrated; see the module docstring).
    request_rate_per_s: float = 820.0
    #: Day/night swing: the rate is mean × (1 + amplitude × cos(phase)), 0 = flat.
    diurnal_amplitude: float = 0.6
    #: Time of day of the peak (2 pm).
    diurnal_peak_s: float = 14 * 3600.0
    #: Inequality of clients: client c's share ∝ 1 / (c + 1) ** this (0 = equal).
    client_activity_zipf: float = 1.0

    # --- bursts ----------------------------------------------------------------------
    #: Requests per second a client issues while in a session.
    session_requests_per_s: float = 25.0
    #: Shortest session (Pareto minimum).
    session_s_min: float = 2.0
    #: Pareto shape of session lengths (1 < shape < 2: heavy tail, self-similar sum).
    session_pareto_shape: float = 1.4
    #: Longest session (caps the tail).
    session_s_max: float = 1800.0

    # --- requests --------------------------------------------------------------------
    #: Share of requests that are metadata (the paper: 87%).
    metadata_fraction: float = 0.87
    #: Metadata kinds and their relative weights.
    metadata_mix: tuple[tuple[Op, float], ...] = DEFAULT_METADATA_MIX
    #: Share of block requests that are writes.
    block_write_fraction: float = 0.08
    #: Bytes per block request (NFS 8 KB transfers; the last block of a file is short).
    request_bytes: int = 8192

    # --- files and locality ----------------------------------------------------------
    #: Files each client owns.
    files_per_client: int = 1000
    #: Zipf exponent of a client's file popularity.
    file_popularity_zipf: float = 1.3
    #: Files a session works on.
    session_files: int = 12
    #: Probability a session's request picks from its working set (else: any file).
    session_locality: float = 0.93
    #: Probability a working-set file is brand new (created during the trace).
    new_file_fraction: float = 0.02
    #: Median file size.
    file_size_median_bytes: int = 8192
    #: Lognormal shape of file sizes (σ of the log).
    file_size_sigma: float = 1.2
    #: Largest file.
    file_size_bytes_max: int = 16 << 20

    def __post_init__(self) -> None:
        positive = [
            "duration_s",
            "clients",
            "request_rate_per_s",
            "session_requests_per_s",
            "session_s_min",
            "request_bytes",
            "files_per_client",
            "session_files",
            "file_size_median_bytes",
            "file_size_bytes_max",
        ]
        for name in positive:
            if not getattr(self, name) > 0:
                raise ConfigError(f'"{name}" must be > 0, got {getattr(self, name)!r}')
        for name in ("metadata_fraction", "block_write_fraction", "session_locality"):
            _unit(name, getattr(self, name))
        _unit("new_file_fraction", self.new_file_fraction)
        if not 0 <= self.diurnal_amplitude <= 1:
            raise ConfigError(
                f'"diurnal_amplitude" must be in [0, 1], got {self.diurnal_amplitude}'
            )
        if not self.session_pareto_shape > 1:
            raise ConfigError(
                f'"session_pareto_shape" must be > 1 (finite mean), got {self.session_pareto_shape}'
            )
        if self.session_s_max < self.session_s_min:
            raise ConfigError('"session_s_max" must be >= "session_s_min"')
        for name in ("client_activity_zipf", "file_popularity_zipf", "file_size_sigma"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f'"{name}" must be >= 0, got {getattr(self, name)!r}')
        if not self.metadata_mix or any(w < 0 or not op.is_metadata for op, w in self.metadata_mix):
            raise ConfigError(
                '"metadata_mix" must list metadata operations with weights >= 0, '
                f"got {self.metadata_mix!r}"
            )
        if sum(w for _, w in self.metadata_mix) <= 0:
            raise ConfigError('"metadata_mix" weights must not all be 0')
        if self.clients * self.files_per_client > NEW_FILE_BASE:
            raise ConfigError(
                f'"clients" × "files_per_client" must be at most {NEW_FILE_BASE} (file ids), '
                f"got {self.clients * self.files_per_client}"
            )
        epochs_max = (FILE_IDS_MAX - NEW_FILE_BASE) // NEW_FILES_PER_EPOCH_MAX
        longest_s = epochs_max * EPOCH_S - self.session_s_max
        if self.duration_s > longest_s:
            raise ConfigError(
                f'"duration_s" must be at most {longest_s:g} s (about 42 days: new files are '
                f"numbered per minute of trace), got {self.duration_s:g}"
            )

    def to_dict(self) -> dict[str, Any]:
        """The configuration as plain JSON-ready values (recorded with results)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "metadata_mix":
                value = {op.value: w for op, w in value}
            out[f.name] = value
        return out

    @property
    def mean_session_s(self) -> float:
        """Expected session length: E[min(X, max)] for X ~ Pareto(min, shape)."""
        xm, a, m = self.session_s_min, self.session_pareto_shape, self.session_s_max
        return float(xm + xm**a * (m ** (1 - a) - xm ** (1 - a)) / (1 - a))

    def rate_at(self, t_s: F64) -> F64:
        """Expected requests per second at trace times ``t_s`` (the diurnal curve)."""
        phase = 2 * np.pi * (t_s + self.start_time_of_day_s - self.diurnal_peak_s) / _DAY_S
        result: F64 = self.request_rate_per_s * (1 + self.diurnal_amplitude * np.cos(phase))
        return result


def _unit(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f'"{name}" must be in [0, 1], got {value!r}')


# --- output -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BackgroundChunk:
    """A run of consecutive records as columns (time order). ``op`` indexes :data:`OPS`."""

    time_s: F64
    client: I64
    op: I8
    file: I64
    offset: I64
    size: I64

    def __len__(self) -> int:
        return len(self.time_s)

    def records(self) -> Iterator[TraceRecord]:
        """The chunk as :class:`TraceRecord` values (file ids as text: ``b<id>``)."""
        ops = OPS
        record = TraceRecord
        for t, c, o, f, off, size in zip(
            self.time_s.tolist(),
            self.client.tolist(),
            self.op.tolist(),
            self.file.tolist(),
            self.offset.tolist(),
            self.size.tolist(),
            strict=True,
        ):
            yield record(t, c, ops[o], f"b{f}", off, size)


def file_name(file_id: int) -> str:
    """The ``file`` text :meth:`BackgroundChunk.records` gives a file id."""
    return f"b{file_id}"


# --- the schedule of sessions ------------------------------------------------------


@dataclass(frozen=True)
class _Schedule:
    """Every session of the trace, sorted by start and cut into epochs; file tables."""

    start_s: F64
    end_s: F64
    client: I64
    origin_s: float  # start of epoch 0
    epoch_bounds: I64  # sessions of epoch e: [epoch_bounds[e], epoch_bounds[e + 1])
    popularity_cdf: F64
    file_sizes: I64  # clients × files_per_client
    metadata_codes: I8
    metadata_cdf: F64

    def epoch_start_s(self, epoch: int) -> float:
        """When epoch ``epoch`` begins (sessions starting in it begin at or after)."""
        return self.origin_s + epoch * EPOCH_S


@functools.lru_cache(maxsize=4)
def _schedule(config: BackgroundConfig, seed: int) -> _Schedule:
    c = config
    weights = 1.0 / np.arange(1, c.clients + 1, dtype=np.float64) ** c.client_activity_zipf
    weights /= weights.sum()
    per_session = c.session_requests_per_s * c.mean_session_s
    peak_rate = c.request_rate_per_s * (1 + c.diurnal_amplitude)
    # Sessions may start before 0 so the trace begins in steady state.
    lead_s = c.session_s_max
    span_s = c.duration_s + lead_s
    starts, ends, clients = [], [], []
    for client in range(c.clients):
        rng = np.random.default_rng([seed, 1, client])
        candidates = rng.poisson(peak_rate * weights[client] / per_session * span_s)
        t = np.sort(rng.uniform(-lead_s, c.duration_s, candidates))
        # Thinning: keep a candidate with probability rate(t) / peak rate.
        keep = rng.uniform(0.0, peak_rate, candidates) < c.rate_at(t)
        t = t[keep]
        length = c.session_s_min * (1.0 - rng.uniform(0.0, 1.0, len(t))) ** (
            -1.0 / c.session_pareto_shape
        )
        np.minimum(length, c.session_s_max, out=length)
        live = t + length > 0.0
        starts.append(t[live])
        ends.append((t + length)[live])
        clients.append(np.full(int(live.sum()), client, dtype=np.int64))
    start = np.concatenate(starts)
    order = np.argsort(start, kind="stable")
    start = start[order]
    origin = -lead_s
    epochs = math.ceil((c.duration_s - origin) / EPOCH_S)
    bounds = np.searchsorted(start, origin + EPOCH_S * np.arange(epochs + 1), side="left")
    ranks = np.arange(1, c.files_per_client + 1, dtype=np.float64)
    popularity = 1.0 / ranks**c.file_popularity_zipf
    size_rng = np.random.default_rng([seed, 2])
    sizes = _file_sizes(c, size_rng, (c.clients, c.files_per_client))
    meta_ops = np.array([_CODE[op] for op, _ in c.metadata_mix], dtype=np.int8)
    meta_w = np.array([w for _, w in c.metadata_mix], dtype=np.float64)
    return _Schedule(
        start_s=start,
        end_s=np.concatenate(ends)[order],
        client=np.concatenate(clients)[order],
        origin_s=origin,
        epoch_bounds=bounds.astype(np.int64),
        popularity_cdf=np.cumsum(popularity) / popularity.sum(),
        file_sizes=sizes,
        metadata_codes=meta_ops,
        metadata_cdf=np.cumsum(meta_w) / meta_w.sum(),
    )


def _file_sizes(c: BackgroundConfig, rng: np.random.Generator, shape: Any) -> I64:
    raw = rng.lognormal(math.log(c.file_size_median_bytes), c.file_size_sigma, shape)
    sizes: I64 = np.clip(np.rint(raw), 1, c.file_size_bytes_max).astype(np.int64)
    return sizes


@dataclass(frozen=True, slots=True)
class _Epoch:
    """Requests of the sessions that start in one epoch, sorted by time."""

    time_s: F64
    client: I64
    op: I8
    file: I64
    offset: I64
    size: I64
    last_s: float


def _epoch_requests(c: BackgroundConfig, s: _Schedule, seed: int, epoch: int) -> _Epoch:
    """Every request of the sessions starting in ``epoch``, in time order.

    Generated together (vectorized) from one generator seeded by ``(seed, epoch)``;
    epochs are fixed slices of trace time, so a record never depends on the window
    or chunk size it is asked for with.
    """
    lo, hi = s.epoch_bounds[epoch], s.epoch_bounds[epoch + 1]
    rng = np.random.default_rng([seed, 3, epoch])
    start, end, client = s.start_s[lo:hi], s.end_s[lo:hi], s.client[lo:hi]
    sessions = hi - lo
    counts = rng.poisson(c.session_requests_per_s * (end - start))
    n = int(counts.sum())
    owner = np.repeat(np.arange(sessions), counts)
    times = start[owner] + rng.uniform(0.0, 1.0, n) * (end - start)[owner]
    # Working sets: popular files of each session's client, some of them brand new.
    w = c.session_files
    ws_rank = _zipf(s, rng, (sessions, w), c.files_per_client)
    ws_file = client[:, None] * c.files_per_client + ws_rank
    ws_size = s.file_sizes[client[:, None], ws_rank]
    new = rng.uniform(0.0, 1.0, (sessions, w)) < c.new_file_fraction
    created = int(new.sum())
    if created > NEW_FILES_PER_EPOCH_MAX:
        raise ConfigError(
            f"{created} new files in one {EPOCH_S:g} s epoch exceed the {NEW_FILES_PER_EPOCH_MAX} "
            'the file numbering allows; lower "new_file_fraction" or "session_files"'
        )
    serial = np.cumsum(new).reshape(new.shape) - 1  # row-major: session order, then slot
    ws_file = np.where(new, NEW_FILE_BASE + epoch * NEW_FILES_PER_EPOCH_MAX + serial, ws_file)
    ws_size = np.where(new, _file_sizes(c, rng, (sessions, w)), ws_size)
    # Each request: from its session's working set, or from its client's popularity.
    req_client = client[owner]
    local = rng.uniform(0.0, 1.0, n) < c.session_locality
    pick = rng.integers(0, w, n)
    any_rank = _zipf(s, rng, n, c.files_per_client)
    files = np.where(local, ws_file[owner, pick], req_client * c.files_per_client + any_rank)
    file_size = np.where(local, ws_size[owner, pick], s.file_sizes[req_client, any_rank])
    # The kind of request.
    is_meta = rng.uniform(0.0, 1.0, n) < c.metadata_fraction
    meta_pick = np.searchsorted(s.metadata_cdf, rng.uniform(0.0, 1.0, n), side="right")
    meta_op = s.metadata_codes[np.minimum(meta_pick, len(s.metadata_codes) - 1)]
    is_write = rng.uniform(0.0, 1.0, n) < c.block_write_fraction
    ops = np.where(is_meta, meta_op, np.where(is_write, _WRITE, _READ)).astype(np.int8)
    # Block requests move one block of their file, chosen uniformly.
    blocks = -(-file_size // c.request_bytes)
    offset = (rng.uniform(0.0, 1.0, n) * blocks).astype(np.int64) * c.request_bytes
    size = np.where(is_meta, 0, np.minimum(c.request_bytes, file_size - offset))
    offset = np.where(is_meta, 0, offset)
    order = np.argsort(times, kind="stable")
    return _Epoch(
        time_s=times[order],
        client=req_client[order],
        op=ops[order],
        file=files[order].astype(np.int64),
        offset=offset[order],
        size=size[order],
        last_s=float(end.max()) if sessions else -math.inf,
    )


def _zipf(s: _Schedule, rng: np.random.Generator, shape: Any, n: int) -> I64:
    """Ranks 0..n-1 drawn with the client popularity (inverse CDF)."""
    ranks = np.searchsorted(s.popularity_cdf, rng.uniform(0.0, 1.0, shape), side="right")
    clipped: I64 = np.minimum(ranks, n - 1).astype(np.int64)
    return clipped


def generate_columns(
    config: BackgroundConfig,
    seed: int = 0,
    start_s: float = 0.0,
    end_s: float | None = None,
    chunk_s: float = CHUNK_S,
) -> Iterator[BackgroundChunk]:
    """The records with ``start_s <= time < end_s`` as time-ordered column chunks.

    Deterministic: the same ``(config, seed)`` gives the same records whatever the
    window and chunk size (equal times keep a fixed order).
    """
    c = config
    end = c.duration_s if end_s is None else min(end_s, c.duration_s)
    if not chunk_s > 0:
        raise ConfigError(f'"chunk_s" must be > 0, got {chunk_s}')
    s = _schedule(c, seed)
    live: dict[int, _Epoch] = {}
    next_epoch = 0
    epochs = len(s.epoch_bounds) - 1
    a = max(start_s, 0.0)
    while a < end:
        b = min(a + chunk_s, end)
        # Bring in every epoch whose sessions start before b and may reach a.
        while next_epoch < epochs and s.epoch_start_s(next_epoch) < b:
            if s.epoch_start_s(next_epoch) + EPOCH_S + c.session_s_max > a:
                live[next_epoch] = _epoch_requests(c, s, seed, next_epoch)
            next_epoch += 1
        parts = []
        for k in sorted(live):
            e = live[k]
            lo, hi = np.searchsorted(e.time_s, [a, b], side="left")
            if hi > lo:
                parts.append((e, int(lo), int(hi)))
        if parts:
            yield _merge(parts)
        for k in [k for k, e in live.items() if e.last_s <= b]:
            del live[k]
        a = b


def _merge(parts: list[tuple[_Epoch, int, int]]) -> BackgroundChunk:
    if len(parts) == 1:
        e, lo, hi = parts[0]
        return BackgroundChunk(
            e.time_s[lo:hi],
            e.client[lo:hi],
            e.op[lo:hi],
            e.file[lo:hi],
            e.offset[lo:hi],
            e.size[lo:hi],
        )
    time_s = np.concatenate([e.time_s[lo:hi] for e, lo, hi in parts])
    order = np.argsort(time_s, kind="stable")
    return BackgroundChunk(
        time_s=time_s[order],
        client=np.concatenate([e.client[lo:hi] for e, lo, hi in parts])[order],
        op=np.concatenate([e.op[lo:hi] for e, lo, hi in parts])[order],
        file=np.concatenate([e.file[lo:hi] for e, lo, hi in parts])[order],
        offset=np.concatenate([e.offset[lo:hi] for e, lo, hi in parts])[order],
        size=np.concatenate([e.size[lo:hi] for e, lo, hi in parts])[order],
    )


def generate(
    config: BackgroundConfig,
    seed: int = 0,
    start_s: float = 0.0,
    end_s: float | None = None,
) -> Iterator[TraceRecord]:
    """The background trace as time-ordered records (see :func:`generate_columns`)."""
    for chunk in generate_columns(config, seed, start_s, end_s):
        yield from chunk.records()
