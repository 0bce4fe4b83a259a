"""``shuttle bench ceph filter``: the run-time's filter experiment with the OSD as a
third site, on a shaped link (issue 12).

A selective ``grep`` (a fixed string found on few lines) over a text in Ceph runs
statically at each site, and once where the placement model
(:mod:`shuttle.runtime.sites`) puts it:

* **client**: a ``grep`` object in this process reads every byte from the node over
  the link;
* **node**: a ``grep`` object on the node reads through its storage object (the RADOS
  store when this build has it, else local files: the report says which);
* **osd**: an ``osdgrep`` object on the node sends ``cls_lua`` calls to the OSD
  holding the bytes (the node's own RADOS object for the key: the RADOS store keeps
  each key as one object named by it); only the matching lines come back.

**The link.** With root and network namespaces (``--shaping kernel``, the default
when available) Ceph and the node run in a namespace of their own, joined to this one
by a veth pair that ``tc tbf`` shapes (:class:`shuttle.net.netns.NetnsLab`): the
link really carries the bytes, and only its latency is added by the client (this
kernel has no netem). ``--shaping emulated`` keeps everything on loopback and shapes
in the client's transport instead.

**The model's run.** It starts where ABACUS starts, at the client: it reads a probe
(``probe_bytes``, 8 KiB) over the link, times Python's ``re`` on it and counts the matching
bytes; that gives the filter's CPU per byte and selectivity. With the link's profile
(the node–OSD link is loopback) and the OSD's implementation at ``osd_cpu_ratio`` of
Python's CPU (measured in issue 12: ``string.find`` over the buffer 19-40 ms against
26-42 ms for ``re`` on 16 MB), :func:`shuttle.runtime.sites.choose_site` picks a site,
and the whole search runs there. Its time includes the probe and the decision. Later
runs decide from the first run's measurements (``history``, the monitor's record of
the filter) without probing again; the report gives the first run's ratio apart.
Target: on a 10 Mb/s link the model puts the grep at the OSD or the node and finishes
within 10 % of the best static site.
"""

from __future__ import annotations

import contextlib
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from shuttle.bench.ceph_stand import has_rados_store
from shuttle.bench.session import scratch_dir
from shuttle.client.client import Client
from shuttle.cluster import local
from shuttle.cluster.ceph import LocalCeph
from shuttle.cluster.clusterfile import NodeEntry
from shuttle.errors import ConfigError
from shuttle.net.addresses import NodeAddress
from shuttle.net.auth import load_key_file, write_key_file
from shuttle.net.netns import NetnsLab, netns_unavailable_reason
from shuttle.net.profiles import parse_link_profile
from shuttle.objects.grep import BATCH_BYTES_DEFAULT
from shuttle.objects.lines import BLOCK_BYTES_DEFAULT
from shuttle.runtime.client import Runtime
from shuttle.runtime.config import RuntimeConfig
from shuttle.runtime.osd import literal_of
from shuttle.runtime.site_probe import OSD_CPU_RATIO, choose, probe_grep
from shuttle.runtime.sites import FilterView

KEY = "bench/ceph-filter.txt"
OID = "bench-ceph-filter"
NODE_ID = "n1"
SITES = ("client", "node", "osd")
#: The target: the model's run within this factor of the best static site.
TARGET_RATIO = 1.10
SHAPINGS = ("auto", "kernel", "emulated")

Progress = Callable[[str], None]


@dataclass
class FilterSettings:
    """Everything ``shuttle bench ceph filter`` takes as a flag."""

    size_bytes: int = 16 << 20
    link: str = "bw=10Mbit,lat=0.5ms"
    pattern: str = "ERROR 4242"
    #: Fraction of lines holding the pattern (selective: few lines come back).
    match_fraction: float = 0.001
    runs: int = 2
    #: Bytes the model reads at the client to measure the filter: small, since on a
    #: slow link the probe itself costs (8 KiB: 6.6 ms at 10 Mbit/s).
    probe_bytes: int = 8 << 10
    osd_cpu_ratio: float = OSD_CPU_RATIO
    shaping: str = "auto"
    osds: int = 3
    sites: tuple[str, ...] = SITES
    seed: int = 1
    #: Later model runs decide from what the first measured (the monitor's history)
    #: instead of probing again.
    history: bool = True

    def __post_init__(self) -> None:
        if self.shaping not in SHAPINGS:
            raise ConfigError(f"--shaping must be one of {', '.join(SHAPINGS)}")
        if literal_of(self.pattern) is None:
            raise ConfigError(f"--pattern must be a fixed string for the OSD, not {self.pattern!r}")
        if not 0 < self.match_fraction < 1:
            raise ConfigError("--match-fraction must be between 0 and 1")
        unknown = set(self.sites) - set(SITES)
        if unknown:
            raise ConfigError(f"--sites: pick from {', '.join(SITES)}; got {sorted(unknown)}")


def make_text(size: int, pattern: str, fraction: float, seed: int) -> bytes:
    """A log-like text of ``size`` bytes; about ``fraction`` of its lines hold ``pattern``."""
    rnd = random.Random(seed)
    words = [
        w.encode()
        for w in [
            "alpha",
            "beta",
            "gamma",
            "delta",
            "info",
            "warn",
            "debug",
            "request",
            "user",
            "disk",
        ]
    ]
    needle = pattern.encode()
    out = bytearray()
    n = 0
    while len(out) < size:
        line = b" ".join(rnd.choice(words) for _ in range(rnd.randrange(4, 16)))
        if rnd.random() < fraction:
            line += b" " + needle
        out += b"%08d " % n + line + b"\n"
        n += 1
    return bytes(out[:size])


@dataclass
class Setup:
    """The running benchmark: where the node is and how to reach Ceph from it."""

    node: NodeAddress
    key: bytes
    conf_path: Path
    keyring_path: Path
    pool: str
    shaping: str
    store: str
    listen_host: str
    #: The RADOS object the OSD site searches: the node's own object for the key on
    #: the RADOS store, else a copy of the same bytes.
    oid: str
    notes: list[str] = field(default_factory=list)


def _shaping(requested: str) -> tuple[str, str | None]:
    reason = netns_unavailable_reason()
    if requested == "kernel" and reason is not None:
        raise ConfigError(f"--shaping kernel needs network namespaces: {reason}")
    if requested == "auto":
        return ("emulated", reason) if reason is not None else ("kernel", None)
    return requested, None


@contextlib.contextmanager
def setup(
    settings: FilterSettings, text_path: Path, progress: Progress, workdir: Path | None = None
) -> Iterator[Setup]:
    """Ceph and a node beside it, the text loaded into both; torn down afterwards."""
    link = parse_link_profile(settings.link)
    shaping, why = _shaping(settings.shaping)
    scratch = scratch_dir("shuttle-bench-cephf-", workdir)
    rados_store = has_rados_store()
    key_file = scratch / "cluster.key"
    key = write_key_file(key_file)
    ceph_root = scratch / "ceph"
    notes = [] if why is None else [f"kernel shaping unavailable ({why}); emulated instead"]
    if not rados_store:
        notes.append(
            "this build's `shuttle serve` has no RADOS store yet: the node reads local files "
            "(client and node sites), the OSD site reads the same bytes from RADOS"
        )
    try:
        with contextlib.ExitStack() as stack:
            lab: NetnsLab | None = None
            prefix: list[str] = []
            if shaping == "kernel":
                lab = NetnsLab(1, link, hub_in_namespace=False).up()
                stack.callback(_teardown, lab, notes)
                ns = lab.nodes[0]
                prefix = NetnsLab.command(ns.namespace, [])
                host, listen_host, client_link = ns.address, ns.hub_address, lab.client_profile(0)
            else:
                host, listen_host, client_link = "127.0.0.1", "127.0.0.1", link
            progress(f"starting a local Ceph ({settings.osds} OSDs, {shaping} shaping)")
            # Before the start: a start killed at its timeout leaves daemons to stop.
            stack.callback(lambda: LocalCeph(ceph_root).down())
            _run([*prefix, sys.executable, "-m", "shuttle.cluster.ceph", "up", str(ceph_root),
                  str(settings.osds)], timeout_s=300)  # fmt: skip
            info = LocalCeph(ceph_root, osds=settings.osds).info()
            if not rados_store:
                progress(f"writing the {settings.size_bytes >> 20} MiB text to RADOS ({OID})")
                _run([*prefix, "rados", "-c", str(info.conf_path), "-p", info.pool, "put", OID,
                      str(text_path)], timeout_s=300)  # fmt: skip
            args = ["--window", "1"] + (info.store_args() if rados_store else [])
            entry = NodeEntry(NODE_ID, host, 0, scratch / "node", netns=lab.nodes[0].namespace
                              if lab else None, args=tuple(args))  # fmt: skip
            progress("starting the node")
            started = local.start_node(entry, scratch / "run", key_file)
            stack.callback(lambda: _stop(started.pid))
            node = NodeAddress(NODE_ID, host, started.port, client_link)
            progress(f"putting the text into the node over the link ({settings.link})")
            with Client([node], key=load_key_file(key_file)) as client:
                client.put(KEY, text_path)
            yield Setup(
                node, key, info.conf_path, info.keyring_path, info.pool, shaping,
                f"rados:{info.pool}" if rados_store else "files", listen_host,
                # The RADOS store keeps each key as one RADOS object named by the key.
                KEY if rados_store else OID, notes,
            )  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _teardown(lab: NetnsLab, notes: list[str]) -> None:
    """End the lab; what it could not remove is noted, not raised (the measurements
    are made by then)."""
    problems = lab.teardown()
    notes += [f"namespace teardown: {p}" for p in problems]


def _run(argv: list[str], timeout_s: float) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise ConfigError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-2000:]}")


def _stop(pid: int | None) -> None:
    import os
    import signal

    if pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


# --- one run at one site -----------------------------------------------------------------


def run_site(rt: Runtime, s: Setup, settings: FilterSettings, site: str) -> dict[str, Any]:
    """Drain the search at ``site``; its time, matches and bytes scanned."""
    t0 = time.monotonic()
    if site == "osd":
        ref = rt.create(
            "osdgrep",
            at=NODE_ID,
            placement="static",
            pattern=settings.pattern,
            conf_path=str(s.conf_path),
            keyring_path=str(s.keyring_path),
            pool=s.pool,
            oid=s.oid,
            key=KEY,
        )
    else:
        ref = rt.create(
            "grep",
            at=NODE_ID if site == "node" else None,
            placement="static",
            pattern=re.escape(settings.pattern),
            storage=rt.storage(NODE_ID),
            keys=[KEY],
        )
    matches = 0
    with rt.console(f"grep-{site}"):
        done = False
        while not done:
            done, found = ref.next()
            matches += len(found)
    elapsed = time.monotonic() - t0
    progress = ref.progress()
    rt.destroy(ref)
    return {"elapsed_s": elapsed, "matches": matches, "progress": progress}


def probe(rt: Runtime, settings: FilterSettings) -> FilterView:
    """The model's measurements, as the run-time takes them with the filter at the
    client (:func:`shuttle.runtime.site_probe.probe_grep`)."""
    return probe_grep(
        rt,
        NODE_ID,
        KEY,
        settings.pattern,  # a fixed string (checked above): as a regex it means itself
        size_bytes=settings.size_bytes,
        block_bytes=BLOCK_BYTES_DEFAULT,
        batch_bytes=BATCH_BYTES_DEFAULT,
        probe_bytes=settings.probe_bytes,
        osd_cpu_ratio=settings.osd_cpu_ratio,
    )


def run_model(
    rt: Runtime, s: Setup, settings: FilterSettings, history: FilterView | None = None
) -> tuple[dict[str, Any], FilterView]:
    """Measure (a probe, or ``history``: what an earlier run measured), decide, run."""
    t0 = time.monotonic()
    f = probe(rt, settings) if history is None else history
    plan = choose(f, parse_link_profile(settings.link))
    decided_s = time.monotonic() - t0
    run = run_site(rt, s, settings, plan.best)
    run["elapsed_s"] += decided_s
    run["decision_s"] = round(decided_s, 4)
    run["site"] = plan.best
    run["plan"] = plan.to_json()
    run["measured"] = {
        "cpu_s": round(f.cpu_s, 5),
        "output_bytes": round(f.output_bytes),
        "osd_cpu_ratio": f.osd_cpu_ratio,
        "from": "probe" if history is None else "history",
    }
    return run, f


def run_filter(settings: FilterSettings, progress: Progress) -> dict[str, Any]:
    """Each site static, then the model's choice, ``runs`` times, interleaved."""
    text = make_text(settings.size_bytes, settings.pattern, settings.match_fraction, settings.seed)
    expected = sum(1 for line in text.split(b"\n") if settings.pattern.encode() in line)
    times: dict[str, list[float]] = {site: [] for site in (*settings.sites, "model")}
    model_runs: list[dict[str, Any]] = []
    history: FilterView | None = None
    with tempfile.TemporaryDirectory(prefix="shuttle-bench-cephf-") as tmp:
        path = Path(tmp) / "text"
        path.write_bytes(text)
        with setup(settings, path, progress) as s:
            config = RuntimeConfig(window_s=1.0)
            progress("warming up: the node's Ceph connection and caches (not timed)")
            with Runtime([s.node], key=s.key, config=config, listen_host=s.listen_host) as rt:
                for site in ("node", "osd"):
                    run_site(rt, s, settings, site)
            for i in range(settings.runs):
                for site in (*settings.sites, "model"):
                    progress(f"run {i + 1}/{settings.runs}: {site}")
                    with Runtime([s.node], key=s.key, config=config,
                                 listen_host=s.listen_host) as rt:  # fmt: skip
                        if site == "model":
                            run, view = run_model(rt, s, settings, history)
                            history = view if settings.history else None
                        else:
                            run = run_site(rt, s, settings, site)
                    if run["matches"] != expected:
                        raise AssertionError(
                            f"{site}: {run['matches']} matching lines, expected {expected}"
                        )
                    times[site].append(run["elapsed_s"])
                    if site == "model":
                        model_runs.append(run)
            shaping, store, notes = s.shaping, s.store, s.notes
    means = {site: statistics.fmean(ts) for site, ts in times.items()}
    static = {site: means[site] for site in settings.sites}
    best = min(static, key=lambda k: static[k])
    chosen = [r["site"] for r in model_runs]
    ratio = means["model"] / static[best]
    return {
        "experiment": "ceph-filter",
        "settings": asdict(settings),
        "shaping": shaping,
        "node_store": store,
        "notes": notes,
        "matching_lines": expected,
        "sites": {
            site: {"mean_s": round(statistics.fmean(ts), 4), "runs_s": [round(t, 4) for t in ts]}
            for site, ts in times.items()
        },
        "best_static": best,
        "model_sites": chosen,
        "model_plan": model_runs[-1]["plan"] if model_runs else None,
        "model_measured": model_runs[-1]["measured"] if model_runs else None,
        "model_over_best_static": round(ratio, 4),
        "model_first_over_best_static": round(times["model"][0] / static[best], 4),
        "target": {
            "model_at_osd_or_node": all(c in ("osd", "node") for c in chosen),
            "within": TARGET_RATIO,
            "met": ratio <= TARGET_RATIO and all(c in ("osd", "node") for c in chosen),
        },
    }
