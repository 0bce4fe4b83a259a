"""``bench lookaside``: the lookaside paper's Figure 6 on the live system.

The paper compiled Linux 2.4.18 from Coda at 100 Kb/s to 100 Mb/s with no lookaside
device, a device holding 2.4.18, and devices holding older releases (DESIGN.md,
"Lookaside"). Here the build is ``python -m compileall`` of a real project's source
release over the FUSE mount (``shuttle mount``), the releases are sdists fetched from
PyPI with ``pip download``, and each lookaside store is an extracted older sdist:

* the *current* release's ``.py`` files are put in a private one-node cluster
  (per bandwidth: the whole tree, or at slow links a subset, see :func:`choose_subset`);
* every run restarts the node (its block cache is cold), drops the page cache of the
  node's data and of the store's files (``posix_fadvise``), starts a fresh mount (the
  client cache is cold) with the link shaped to the bandwidth (the LAN profile's
  latency), ``--validation callback --attr-timeout 60`` (Coda kept callbacks and
  attributes too) and the store under test, times the build, and reads the mount's
  counters and the node's requests by operation;
* the build writes its ``.pyc`` files to a local directory (``PYTHONPYCACHEPREFIX``),
  as Coda's write-back cache kept the kernel build's writes off the link.

The table is the paper's: rows bandwidth, columns no store, the current release, one,
two, ... releases back; each cell the mean seconds and the win over no store.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from shuttle.bench.lookaside_releases import (
    SOURCE_SUFFIX,
    SourceFile,
    cache_dir_default,
    choose_subset,
    fetch_release,
    find_package,
    make_tiny_releases,
    rsync_unchanged,
    source_files,
)
from shuttle.client.connect import connect
from shuttle.client.lookaside import StoreSet
from shuttle.cluster import local
from shuttle.cluster.clusterfile import ClusterFile
from shuttle.errors import ConfigError, ExternalToolError, UsageError
from shuttle.net.profiles import BUILTIN_PROFILES, parse_link_profile

#: The paper's bandwidths.
BANDWIDTHS_DEFAULT = ("100kbit", "1Mbit", "10Mbit", "100Mbit", "1Gbit")
#: One-way latency of every link: the LAN profile's.
LATENCY_S = BUILTIN_PROFILES["lan"].latency_s
#: Shrink the tree at slow links so the no-store run moves at most this many seconds
#: worth of source over the link.
TARGET_S_DEFAULT = 90.0
#: How long one build may take before the run is abandoned.
BUILD_TIMEOUT_S = 1800.0
#: The mount's validation mode and attribute timeout (see :func:`run`'s docs).
VALIDATION_DEFAULT = "callback"
ATTR_TIMEOUT_S_DEFAULT = 60.0
#: How long a mount may take to come up.
MOUNT_START_TIMEOUT_S = 30.0

#: The paper's Figure 6 (seconds; win in percent over no device), kept beside ours.
PAPER: dict[str, Any] = {
    "build": "Linux 2.4.18 kernel compile from Coda; mean of 3 trials",
    "columns": ["no device", "2.4.18", "2.4.17", "2.4.13", "2.4.9", "2.4.0"],
    "rows": {
        "100Mbit": [287.7, 292.7, 324.7, 346.4, 362.7, 358.1],
        "10Mbit": [388.4, 282.9, 364.8, 402.7, 410.9, 421.1],
        "1Mbit": [1148.3, 424.8, 543.6, 835.8, 1012.4, 1094.3],
        "100kbit": [9348.8, 884.9, 3011.2, 5824.0, 7616.0, 8356.7],
    },
}


# --- runs -----------------------------------------------------------------------------


@dataclass
class RunResult:
    seconds: float
    build_status: int
    counters: dict[str, Any] = field(default_factory=dict)


@dataclass
class Cell:
    bandwidth: str
    store: str  # "none" or a release
    runs: list[RunResult] = field(default_factory=list)

    @property
    def mean_s(self) -> float:
        return statistics.fmean(r.seconds for r in self.runs)

    @property
    def stdev_s(self) -> float:
        return statistics.stdev(r.seconds for r in self.runs) if len(self.runs) > 1 else 0.0


def link_spec(bandwidth: str) -> str:
    """The link profile of a bandwidth: that rate at the LAN profile's latency."""
    spec = f"bw={bandwidth},lat={LATENCY_S * 1e3:g}ms"
    parse_link_profile(spec)  # a bad bandwidth fails here, saying why
    return spec


def _drop_page_cache(root: Path) -> None:
    """Evict ``root``'s files from the page cache (only these files: others' runs keep
    theirs), so the node and the stores read from disk as in a cold run."""
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            try:
                fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


class Mount:
    """``shuttle mount --foreground`` in a child process, with its counters file."""

    def __init__(self, mountpoint: Path, args: list[str], env: dict[str, str]) -> None:
        self.mountpoint = mountpoint
        self.ready = mountpoint.with_name(f".{mountpoint.name}.ready")
        self.counters_file = mountpoint.with_name(f"{mountpoint.name}.counters.json")
        self.log = mountpoint.with_name(f"{mountpoint.name}.log")
        mountpoint.mkdir(parents=True, exist_ok=True)
        self.ready.unlink(missing_ok=True)
        self.counters_file.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "shuttle", "mount", str(mountpoint), "--foreground"]
        argv += ["--ready-file", str(self.ready), "--counters", str(self.counters_file), *args]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **env},
            )
        deadline = time.monotonic() + MOUNT_START_TIMEOUT_S
        while not self.ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.log.read_text(errors="replace")[-2000:]
                raise ExternalToolError(f"the mount at {mountpoint} did not start:\n{tail}")
            time.sleep(0.02)

    def stop(self) -> dict[str, Any]:
        """Unmount and return the client's counters (empty if it wrote none)."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        subprocess.run(
            ["fusermount3", "-u", "-z", str(self.mountpoint)], capture_output=True, check=False
        )
        try:
            counters: dict[str, Any] = json.loads(self.counters_file.read_text())
        except (OSError, ValueError):
            counters = {}
        return counters


@dataclass
class Config:
    project: str
    releases: list[str]
    bandwidths: list[str]
    runs: int = 1
    target_s: float = TARGET_S_DEFAULT
    #: compileall workers (0: one per core, as ``make -j``).
    jobs: int = 0
    #: Where sdists are kept between runs (None: in the run's scratch directory).
    cache_dir: Path | None = field(default_factory=cache_dir_default)
    tiny: bool = False
    #: Build only this directory of the release; ``auto``: the project's package
    #: directory if the sdist has one (:func:`find_package`: django/, lib/sqlalchemy/,
    #: src/...), else every ``.py`` file of the sdist; empty: every ``.py`` file.
    subdir: str = "auto"
    validation: str = VALIDATION_DEFAULT
    attr_timeout_s: float = ATTR_TIMEOUT_S_DEFAULT


Report = Callable[[str], None]


def run(config: Config, workdir: Path, report: Report = lambda _: None) -> dict[str, Any]:
    """The whole experiment; returns the JSON report."""
    if len(config.releases) < 1:
        raise UsageError("give at least the current release (--releases CUR,PREV1,...)")
    specs = {bw: link_spec(bw) for bw in config.bandwidths}
    workdir.mkdir(parents=True, exist_ok=True)
    if config.tiny:
        roots = make_tiny_releases(workdir / "releases", count=len(config.releases))
    else:
        roots = []
        cache = config.cache_dir if config.cache_dir is not None else workdir / "sdists"
        for version in config.releases:
            report(f"release {config.project} {version}: fetching into {cache} (kept there)")
            roots.append(fetch_release(config.project, version, cache))
    current = roots[0]
    subdir = config.subdir
    if subdir == "auto":
        subdir = "" if config.tiny else find_package(current, config.project)
    files = source_files(current, subdir)
    if not files:
        raise ConfigError(
            f"{config.project} {config.releases[0]} has no {SOURCE_SUFFIX} files to build; "
            "pick a project with Python sources"
        )
    total = sum(f.size for f in files)
    report(f"current release: {len(files)} {SOURCE_SUFFIX} files, {total / 1e6:.2f} MB")

    # Each store: its own Shuttle home, so the mount's --lookaside uses only it.
    homes: dict[str, Path] = {}
    stores_info: dict[str, Any] = {}
    for version, root in zip(config.releases, roots, strict=True):
        home = workdir / "homes" / version
        added = StoreSet(home).add(root)
        t0 = time.perf_counter()
        added.refresh()
        summary = added.summary()
        added.close()
        homes[version] = home
        stores_info[version] = {
            "root": str(root),
            "index_seconds": round(time.perf_counter() - t0, 3),
            "files": summary.files,
            "chunks": summary.chunks,
            "bytes": summary.bytes,
        }
        report(f"store {version}: indexed in {stores_info[version]['index_seconds']} s")

    cluster = local.up(workdir / "cluster", nodes=1)
    assert cluster.path is not None
    cluster_path = cluster.path
    trees: dict[str, dict[str, Any]] = {}
    #: By tree label and store release: rsync's matched and literal bytes.
    rsync: dict[str, dict[str, dict[str, int]]] = {}
    cells: list[Cell] = []
    try:
        for bw in config.bandwidths:
            profile = parse_link_profile(specs[bw])
            rate = profile.bandwidth_bytes_per_s
            budget = total if rate is None else min(total, rate * config.target_s)
            subset = choose_subset(files, budget)
            label = "full" if len(subset) == len(files) else f"subset-{len(subset)}"
            if label not in {t["label"] for t in trees.values()}:
                _upload(cluster_path, current, subset, label)
                for version, root in zip(config.releases[1:], roots[1:], strict=True):
                    found = rsync_unchanged(current, root, subset, workdir)
                    if found is not None:
                        rsync.setdefault(label, {})[version] = found
            trees[bw] = {
                "label": label,
                "files": len(subset),
                "bytes": sum(f.size for f in subset),
                "subset": label != "full",
            }
            report(
                f"{bw}: tree {label}: {trees[bw]['files']} files, {trees[bw]['bytes'] / 1e6:.2f} MB"
            )
            # Round robin (every store once, then again): a drift in the machine's
            # load over the minutes a bandwidth takes falls on every column alike.
            row = {store: Cell(bw, store) for store in ["none", *config.releases]}
            for i in range(config.runs):
                for store, cell in row.items():
                    result = _one_run(
                        cluster_path,
                        workdir,
                        specs[bw],
                        label,
                        homes.get(store),
                        roots[config.releases.index(store)] if store != "none" else None,
                        config,
                    )
                    cell.runs.append(result)
                    la = result.counters.get("lookaside", {})
                    report(
                        f"{bw} store={store} run {i + 1}: {result.seconds:.2f} s"
                        + (
                            f" (stores {la.get('bytes_from_stores', 0) / 1e6:.2f} MB, node "
                            f"{la.get('bytes_from_node', 0) / 1e6:.2f} MB, skipped "
                            f"{la.get('reads_skipped', 0)}/{la.get('reads', 0)})"
                            if la
                            else ""
                        )
                    )
            cells.extend(row.values())
    finally:
        local.down(ClusterFile.load(cluster_path))
    return _report(config, subdir, specs, trees, stores_info, cells, total, len(files), rsync)


def _upload(cluster_path: Path, root: Path, subset: Sequence[SourceFile], label: str) -> None:
    """Put ``subset`` of the current release under ``label/`` (unshaped: setup, not timed)."""
    with connect(cluster=cluster_path) as client:
        for f in subset:
            client.put(f"{label}/{f.rel}", root / f.rel)


def _one_run(
    cluster_path: Path,
    workdir: Path,
    spec: str,
    label: str,
    home: Path | None,
    store_root: Path | None,
    config: Config,
) -> RunResult:
    """One cold build: restart the node, drop page caches, mount, compile, unmount."""
    cluster = ClusterFile.load(cluster_path)
    local.down(cluster)
    cluster = local.up(cluster.root, cluster_path=cluster_path)
    for entry in cluster.nodes:
        _drop_page_cache(Path(entry.data_dir))
    if store_root is not None:
        _drop_page_cache(store_root)
    mnt = workdir / "mnt"
    args = ["--cluster", str(cluster_path), "--link", spec, "--validation", config.validation]
    args += ["--attr-timeout", str(config.attr_timeout_s)]
    env: dict[str, str] = {}
    if home is not None:
        args.append("--lookaside")
        env["SHUTTLE_HOME"] = str(home)
    else:
        args.append("--no-lookaside")
    pyc = workdir / "pyc"
    shutil.rmtree(pyc, ignore_errors=True)
    mount = Mount(mnt, args, env)
    try:
        argv = [sys.executable, "-m", "compileall", "-q", "-j", str(config.jobs), str(mnt / label)]
        t0 = time.perf_counter()
        done = subprocess.run(
            argv,
            env={**os.environ, "PYTHONPYCACHEPREFIX": str(pyc)},
            capture_output=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
        seconds = time.perf_counter() - t0
    finally:
        counters = mount.stop()
    compiled = sum(1 for _ in pyc.rglob("*.pyc")) if pyc.exists() else 0
    if compiled == 0:
        raise ExternalToolError(
            f"the build over the mount compiled nothing (exit {done.returncode}): "
            f"{done.stderr.decode(errors='replace')[-800:]}; see {mount.log}"
        )
    counters["pyc_files"] = compiled
    counters["node"] = _node_requests(cluster_path)
    return RunResult(seconds, done.returncode, counters)


def _node_requests(cluster_path: Path) -> dict[str, Any]:
    """What the node served in this run (it was restarted for it): requests by
    operation, errors by code, bytes in and out, so a table cell can be explained."""
    with connect(cluster=cluster_path) as client:
        out: dict[str, Any] = {}
        for node in client.nodes:
            server = client.node_stats(node).get("server", {})
            for name in ("requests", "bytes_in", "bytes_out"):
                out[name] = out.get(name, 0) + server.get(name, 0)
            for group in ("by_op", "errors_by_code"):
                merged = out.setdefault(group, {})
                for op, count in server.get(group, {}).items():
                    merged[op] = merged.get(op, 0) + count
        return out


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _report(
    config: Config,
    subdir: str,
    specs: dict[str, str],
    trees: dict[str, dict[str, Any]],
    stores_info: dict[str, Any],
    cells: list[Cell],
    total_bytes: int,
    total_files: int,
    rsync: dict[str, dict[str, dict[str, int]]] | None = None,
) -> dict[str, Any]:
    columns = ["none", *config.releases]
    rows: dict[str, dict[str, Any]] = {}
    for bw in config.bandwidths:
        base = next(c for c in cells if c.bandwidth == bw and c.store == "none").mean_s
        row: dict[str, Any] = {}
        for c in cells:
            if c.bandwidth != bw:
                continue
            row[c.store] = {
                "mean_s": round(c.mean_s, 3),
                "stdev_s": round(c.stdev_s, 3),
                "win_pct": round(100.0 * (base - c.mean_s) / base, 1),
                "runs": [_jsonable(asdict(r)) for r in c.runs],
            }
            found = (rsync or {}).get(trees[bw]["label"], {}).get(c.store)
            if found is not None:
                supplied = statistics.fmean(
                    r.counters.get("lookaside", {}).get("bytes_from_stores", 0) for r in c.runs
                )
                row[c.store]["rsync"] = {
                    **found,
                    "supplied_bytes": round(supplied),
                    "supplied_over_matched_pct": round(
                        100.0 * supplied / max(1, found["matched"]), 1
                    ),
                }
        rows[bw] = row
    return {
        "benchmark": "lookaside",
        "config": {
            "project": "tiny (generated)" if config.tiny else config.project,
            "releases": config.releases,
            "current": config.releases[0],
            "bandwidths": config.bandwidths,
            "links": specs,
            "latency_ms": LATENCY_S * 1e3,
            "runs": config.runs,
            "target_s": config.target_s,
            "jobs": config.jobs,
            "subdir": subdir,
            "validation": config.validation,
            "attr_timeout_s": config.attr_timeout_s,
            "build": f"python -m compileall -q -j {config.jobs} of {subdir or 'every .py'} "
            f"over `shuttle mount --validation {config.validation} --attr-timeout "
            f"{config.attr_timeout_s:g}`, .pyc to a local PYTHONPYCACHEPREFIX",
            "cold": "node restarted, node data and store files evicted from the page cache, "
            "a fresh mount (empty client cache) per run",
            "source_files": total_files,
            "source_bytes": total_bytes,
            "python": sys.version.split()[0],
        },
        "columns": columns,
        "trees": trees,
        "stores": stores_info,
        "rows": rows,
        "paper": PAPER,
        "targets": targets(config, rows),
    }


def targets(config: Config, rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets, checked against the rows that were run."""
    out: dict[str, Any] = {}
    cur = config.releases[0]
    bits = {bw: parse_link_profile(link_spec(bw)).bandwidth_bits_per_s for bw in rows}
    paper_win = {"1Mbit": 63.0, "100kbit": 90.5}
    for bw, paper in paper_win.items():
        if bw in rows and cur in rows[bw]:
            ours = rows[bw][cur]["win_pct"]
            out[f"current wins >= paper at {bw}"] = {
                "ours": ours,
                "paper": paper,
                "met": ours >= paper,
            }
    if "10Mbit" in rows and len(config.releases) > 1:
        ours = rows["10Mbit"][config.releases[1]]["win_pct"]
        out["one back wins >= 20% at 10Mbit"] = {"ours": ours, "paper": 6.1, "met": ours >= 20.0}
    if len(config.releases) > 2:
        # Judged at the slowest link, where the stores are never skipped for speed.
        slowest = min(rows, key=lambda bw: bits[bw] or float("inf"))
        found = rows[slowest][config.releases[2]].get("rsync")
        if found is not None:
            out["two back supplies >= 70% of rsync's unchanged bytes"] = {
                "ours": found["supplied_over_matched_pct"],
                "paper": None,
                "met": found["supplied_over_matched_pct"] >= 70.0,
            }
    fast = [bw for bw in rows if bits[bw] is None or (bits[bw] or 0) >= 100e6]
    if fast:
        worst = min(rows[bw][s]["win_pct"] for bw in fast for s in config.releases)
        out["never loses > 2% at >= 100Mbit"] = {
            "ours": worst,
            "paper": -26.1,
            "met": worst >= -2.0,
        }
    return out
