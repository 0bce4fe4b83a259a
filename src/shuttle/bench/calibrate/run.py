"""Measure on a live node what the simulator needs to predict it (``shuttle sim calibrate``).

The simulator's server model (``shuttle.sim``) prices a request by server CPU cycles,
a message by a link, and a mobile program by its recorded think time. This module
fills those prices in for one node of a live cluster, by measuring the real thing:

* **Node CPU per read and per request.** Reads of a small and a 64 KiB object through
  the run-time's storage reference, as a grep at the client makes them; the node's
  process CPU clock (the node runs on this machine) over many reads: the part per
  block (``block_read_cycles``) from their difference; the part per request is the
  program's (below).
* **A console call** to an object at the node (``progress`` of a grep there): node
  CPU per call (``call_cycles``).
* **The objects' work at the node and at the client.** Three reference objects, each
  recorded in process (as ``record-object`` does) and run hosted at the node (and
  the first at the client): a ``count`` over small files (Python work per byte), a
  grep over many tiny objects (a local read each), a grep over one large object
  (64 KiB reads). Each hosted drain's wall time, less its console calls, is fitted
  to ``ratio x think + reads x L_request + blocks x L_block`` (non-negative least
  squares): the hosted-object overhead and a local read's cost at the node
  (``mobile_server_cpu_ratio``, ``local_request_cycles``, ``local_block_read_cycles``),
  and at the client the ``count``'s wall less its reads, per think second
  (``mobile_client_cpu_ratio``). Wall times, because a prediction is of wall time: on
  a shared machine they hold the waiting for a core that CPU clocks leave out.
* **The per-call cost a run pays** (:mod:`.fresh`): the program's own reads (the
  recorded grep's keys, offsets and lengths, in its order; without them, small reads
  of the calibration's objects) replayed back to back over the link in force in
  several fresh processes, as each live run is a process of its own. Per process:
  the node's CPU per read (``request_cycles``, less the blocks' share), each read's
  wall less its link time (replayed through the link's token buckets,
  :mod:`shuttle.sim.link`, at the instant it was made) and its node CPU
  (``rpc_overhead_s``: the client's and the node's own time per call); the median
  over the processes of each.
* **What the server placement's timer holds**, in the same processes, as ``shuttle
  grep --placement server`` does it: the grep made at the node from a run-time that
  has not dialled, and again over the open connection (the one less the other is the
  dial, ``connect_s``; the second beyond the model's call for it, ``server_setup_s``);
  then the program's grep drained there, ``next`` until done and ``progress``: each
  call's wall less the link and the node's CPU (``call_overhead_s``), and the node's
  CPU over the drain less the calls' own, per second of the object's recorded CPU
  (``mobile_server_cpu_ratio``, local reads included, when the program is given).
* **The link** as the live shaping has it: latency and bucket depth of the profile
  (``shuttle.net.profiles``); the bandwidth the shaper achieved for back-to-back
  64 KiB reads (:func:`achieved_bandwidth_bits_per_s`: at most the profile's); and
  the header bytes a request and a reply carry, counted on a shaped connection.
* **The disk**: reads of an object dropped from the page cache
  (``posix_fadvise(DONTNEED)`` on its file) against the same reads warm; recorded,
  and used when a prediction is asked for a cold start.

All CPU figures are stated at speed 1 (this machine): a node of CPU factor ``f``
burns ``1/f`` times its work (``shuttle.net.cpu``), so its measured costs are
multiplied by ``f``, and ``server_speed`` (``--cpu-factor``, default the node's own
factor) scales them back. The cycle counts are at ``cpu_reference_hz`` = this host's
clock, the speed of the machine the object traces are recorded on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from shuttle.bench.calibrate.fresh import (
    FRESH_CONSOLE_CALLS,
    FRESH_PROCESSES,
    FRESH_PROCESSES_QUICK,
    QUICK_CALLS,
    ProcessReads,
    ProgramGrep,
    Spot,
    console_call_cost,
    fresh_reads,
    mean_blocks,
    node_cpu_per_call_s,
    per_call_cost,
    program_work,
    read_blocks,
    small_spots,
)
from shuttle.bench.calibrate.hosted import RATIO_RUNS, fit_hosted, reference_runs
from shuttle.bench.calibrate.link import achieved_bandwidth_bits_per_s, link_residual_s
from shuttle.bench.calibrate.phases import (
    COUNTING_LINK,
    DISK_BYTES,
    LARGE_BYTES,
    SMALL_BYTES,
    TINY_BYTES,
    calibration_objects,
    connect_s,
    disk_figures,
    header_bytes,
    link_large_bytes,
    read_sources,
    timed_console_calls,
    timed_reads,
    workloads,
)
from shuttle.bench.calibrate.result import LIVE_BLOCK_BYTES, Calibration
from shuttle.bench.calibrate.timing import CALLS, node_cpu_clock
from shuttle.client.connect import connect
from shuttle.cluster.clusterfile import ClusterFile
from shuttle.errors import ConfigError
from shuttle.net.profiles import LinkProfile, parse_link_profile
from shuttle.runtime.client import Runtime
from shuttle.traces.objtrace import host_info


def calibrate(
    cluster: Path,
    *,
    node: str | None = None,
    link: str | None = None,
    cpu_factor: float | None = None,
    disk: bool = True,
    calls: int = CALLS,
    ratio_runs: int = RATIO_RUNS,
    reads: Sequence[Spot] | None = None,
    processes: int | None = None,
    console_calls: int | None = None,
    program: ProgramGrep | None = None,
    progress: Callable[[str], None] = lambda _m: None,
) -> Calibration:
    """Measure node ``node`` (default: the cluster's first) of ``cluster`` over
    ``link`` (default: the cluster file's link for it); model it at ``cpu_factor``
    (default: the node's own factor). ``calls``: repetitions of each timed call;
    ``ratio_runs``: runs of the hosted-overhead reference (fewer: quicker, noisier).

    ``reads``: the program's reads ``(key, offset, length)`` in its order (``shuttle
    sim predict`` passes the recorded grep's); the per-call cost is timed on them, in
    ``processes`` fresh processes (default :data:`~.fresh.FRESH_PROCESSES`, or
    :data:`~.fresh.FRESH_PROCESSES_QUICK` when ``calls`` is under
    :data:`~.fresh.QUICK_CALLS`); without ``reads``, on small reads of the
    calibration's own objects. ``processes=0`` times them in this process instead
    (the way before; what the benchmark compares against). ``console_calls``: the
    most ``next`` calls each fresh process makes to the grep it drains at the node
    (default :data:`~.fresh.FRESH_CONSOLE_CALLS`). ``program``: the program's grep
    (its options and its object's recorded CPU): each fresh process drains that grep
    at the node, and the object's work there per second of its recording
    (``mobile_server_cpu_ratio``) is the node's CPU over the drain less its calls'
    own, measured rather than fitted.

    Raises :class:`ConfigError` for a node not in the cluster or not on this machine,
    a negative ``processes``, or a link the cluster does not know."""
    if processes is None:
        processes = FRESH_PROCESSES if calls >= QUICK_CALLS else FRESH_PROCESSES_QUICK
    if processes < 0:
        raise ConfigError(
            f"processes must be 0 (time the reads in this process) or more, not {processes}"
        )
    n_processes = processes
    info = ClusterFile.load(cluster)
    entries = {e.id: e for e in info.nodes}
    node_id = node or info.nodes[0].id
    if node_id not in entries:
        raise ConfigError(f"no node {node_id!r} in {cluster}; its nodes: {', '.join(entries)}")
    entry = entries[node_id]
    node_cpu = node_cpu_clock(entry.pid, node_id)
    measured: dict[str, Any] = {"host": host_info()}
    mhz = float(measured["host"]["cpu_mhz"]) or 1000.0
    measured["cpu_reference_hz"] = mhz * 1e6

    with connect(cluster=cluster, link=link) as shaped:
        target = next(n for n in shaped.nodes if n.node_id == node_id)
        profile = target.link or parse_link_profile("loopback")
    # Objects are put and the disk is timed over loopback: the link is measured apart.
    with connect(cluster=cluster, link="loopback") as client:
        target = next(n for n in client.nodes if n.node_id == node_id)
        factor = float(client.node_stats(target).get("cpu", {}).get("factor", entry.cpu_factor))
        speed = factor if cpu_factor is None else cpu_factor
        measured["node_cpu_factor"] = factor
        sizes = {"small": SMALL_BYTES, "large": LARGE_BYTES, "blocks": DISK_BYTES}
        progress("writing the calibration objects")
        with (
            calibration_objects(client, node_id, sizes) as keys,
            workloads(client, node_id) as work,
        ):
            work["bytes"] = [keys["blocks"]]
            # The node's CPU and the run-time's costs: over loopback, where the link
            # adds nothing.
            with Runtime.connect(cluster, link="loopback") as rt:
                progress("remote reads (loopback): node CPU per request and per block")
                sources = read_sources(work, keys, LARGE_BYTES)
                cpu_reads = timed_reads(rt, node_id, sources, node_cpu, link=None, calls=calls)
                progress("console calls to an object at the node (loopback)")
                cpu_call = timed_console_calls(rt, node_id, node_cpu, link=None, calls=calls)
                progress("reference objects in process, at the client and at the node")
                runs = reference_runs(rt, node_id, work, node_cpu, runs=ratio_runs)
            measured["reads_loopback"] = {k: v.to_json() for k, v in cpu_reads.items()}
            measured["call_loopback"] = cpu_call.to_json()
            measured["reference_runs"] = runs
            per_block = (cpu_reads["large"].node_cpu_s - cpu_reads["small"].node_cpu_s) / (
                LARGE_BYTES // LIVE_BLOCK_BYTES - 1
            )
            measured["read_node_cpu_per_block_s"] = max(0.0, per_block)
            measured["read_node_cpu_per_request_s"] = cpu_reads["small"].node_cpu_s - per_block
            measured["call_node_cpu_loopback_s"] = cpu_call.node_cpu_s
            measured.update(fit_hosted(runs, cpu_reads, cpu_call, factor))
            # Header bytes, counted on a shaped connection that adds no delay.
            with Runtime.connect(cluster, link=COUNTING_LINK) as rt:
                progress("header bytes of a request and a reply")
                measured.update(header_bytes(rt, node_id, keys))
            # The link in force: what a message costs beyond the model's link time.
            request, reply = measured["request_header_bytes"], measured["reply_header_bytes"]
            per_block = measured["read_node_cpu_per_block_s"]
            link_large = link_large_bytes(profile)
            sources = read_sources(work, keys, link_large)
            if n_processes:
                del sources["small"]  # timed in fresh processes (below)
            with Runtime.connect(cluster, link=link) as rt:
                progress(f"large reads on {profile.name}")
                on_link = timed_reads(rt, node_id, sources, node_cpu, link=profile, calls=calls)
                if not n_processes:
                    progress(f"console calls on {profile.name}")
                    call_on_link = timed_console_calls(
                        rt, node_id, node_cpu, link=profile, calls=calls
                    )
                    measured["call_link"] = call_on_link.to_json()
            measured["reads_link"] = {k: v.to_json() for k, v in on_link.items()}
            call_request = request + measured["call_request_bytes"]
            call_reply = reply + measured["call_reply_bytes"]
            fresh: list[ProcessReads] = []
            if n_processes:
                # The per-call cost as the live runs pay it: the program's reads (else
                # the calibration's small ones) in fresh processes, the median of them.
                spots = list(reads) if reads else small_spots(work["requests"], calls)
                what = "the program's" if reads else "small"
                progress(f"{what} reads in {n_processes} fresh processes over {profile.name}")
                fresh = fresh_reads(
                    cluster, link, node_id, entry.pid, spots,
                    processes=n_processes,
                    console_calls=FRESH_CONSOLE_CALLS if console_calls is None else console_calls,
                    program=None if program is None else program.options,
                )  # fmt: skip
                measured["read_node_cpu_per_request_loopback_s"] = measured[
                    "read_node_cpu_per_request_s"
                ]
                per_request = max(0.0, node_cpu_per_call_s(fresh) - per_block * mean_blocks(fresh))
                measured["read_node_cpu_per_request_s"] = per_request
                cost = per_call_cost(
                    fresh, profile, request, reply,
                    lambda size: per_request + per_block * read_blocks(size),
                )  # fmt: skip
                measured["fresh_reads"] = {
                    "source": "program" if reads else "calibration",
                    "spots": len(spots),
                    **cost.to_json(),
                }
                measured["rpc_overhead_s"] = cost.residual_s
                # What shuttle grep --placement server pays inside its timer, in the
                # same processes: the dial, the making, the drain's calls.
                if program is not None and program.think_s > 0.0:
                    server_fit = (
                        "mobile_server_cpu_ratio", "local_read_cpu_per_request_s",
                        "local_read_cpu_per_block_s",
                    )  # fmt: skip
                    measured["hosted_fit_server"] = {k: measured[k] for k in server_fit}
                console_figures(measured, fresh, profile, program, factor)
            else:
                # In this process (the way before fresh processes; the benchmark's
                # anchor): the small reads on the link, a connection from fresh
                # run-times. Only the small reads count: a large one's client work
                # overlaps the transfer (the link is busy meanwhile), which the
                # model's bucket has.
                progress(f"opening a connection over {profile.name}")
                measured["connect_s"] = connect_s(cluster, link, node_id, keys["small"])
                small_node_s = measured["read_node_cpu_per_request_s"] + per_block
                measured["rpc_overhead_s"] = link_residual_s(
                    on_link["small"], profile, request, reply + TINY_BYTES, small_node_s
                )
                # A console call's node CPU as the link paces it (calls spaced by the
                # link cost the node more than back-to-back ones on loopback).
                measured["call_node_cpu_s"] = call_on_link.node_cpu_s
                measured["call_overhead_s"] = link_residual_s(
                    call_on_link, profile, call_request, call_reply, measured["call_node_cpu_s"]
                )
            large_node_s = measured["read_node_cpu_per_request_s"] + per_block * read_blocks(
                link_large
            )
            large = (on_link["large"], profile, request, reply + link_large, large_node_s)
            measured["rpc_overhead_large_s"] = link_residual_s(*large)
            # What the large reads took beyond a small one's residual is the shaper
            # moving fewer bytes a second than its profile: the model gets the rate
            # achieved (lan on a loaded machine: 13-30 % slow, issue 24).
            achieved = achieved_bandwidth_bits_per_s(*large, measured["rpc_overhead_s"])
            if achieved is not None:
                measured["link_bandwidth_bits_per_s"] = achieved
            if disk:
                progress("disk: cold reads against warm")
                measured["disk"] = disk_figures(client, keys["blocks"])
    return Calibration(node_id, profile, factor, speed, measured, drains=tuple(fresh))


def console_figures(
    measured: dict[str, Any],
    drains: Sequence[ProcessReads],
    profile: LinkProfile,
    program: ProgramGrep | None,
    factor: float,
) -> None:
    """Set in ``measured`` what ``shuttle grep --placement server`` pays inside its
    timer, from ``drains`` (fresh processes, each the program's grep made at the node
    and drained): the dial, the making, each console call's residual, and with
    ``program`` the object's work at the node (``mobile_server_cpu_ratio``). Needs
    the header bytes and a light call's node CPU in ``measured`` already.

    Raises :class:`ConfigError` when no process drained a grep."""
    request, reply = measured["request_header_bytes"], measured["reply_header_bytes"]
    call_request = request + measured["call_request_bytes"]
    call_cpu = measured["call_node_cpu_loopback_s"]
    calls_cost = console_call_cost(drains, profile, call_request, reply, request, call_cpu)
    if calls_cost is None:
        raise ConfigError(
            "the fresh processes drained no grep at the node; give console_calls >= 1"
        )
    measured["fresh_calls"] = calls_cost.to_json()
    measured["connect_s"] = calls_cost.connect_s
    # A call's own node CPU (the dispatch, the answer): a light call's, on loopback; the
    # rest of the drain's is the object's work (below).
    measured["call_node_cpu_s"] = call_cpu
    measured["call_overhead_s"] = calls_cost.residual_s
    measured["server_setup_s"] = calls_cost.server_setup_s
    measured["client_setup_s"] = calls_cost.client_setup_s
    if program is not None and program.think_s > 0.0:
        measured.update(program_work(calls_cost, call_cpu, program, factor))


def with_drains(
    cal: Calibration, more: Sequence[ProcessReads], program: ProgramGrep | None
) -> Calibration:
    """``cal`` with its console-call figures taken over its own drains and ``more``
    (drains of the same grep made later on the same node, e.g. between live runs, so
    the figures are of the node as the live runs found it; ``measured["drains_between"]``
    counts them). Raises :class:`ConfigError` for a calibration that drained nothing
    (one read from a file, or timed in process)."""
    if not cal.drains:
        raise ConfigError(
            f"the calibration of node {cal.node} drained no grep in fresh processes "
            "(read from a file, or timed with processes=0): it has no drains to add to"
        )
    drains = (*cal.drains, *more)
    measured = dict(cal.measured)
    console_figures(measured, drains, cal.link, program, cal.node_cpu_factor)
    measured["drains_between"] = len(more)
    return replace(cal, measured=measured, drains=drains)
