"""The hosted objects' costs: reference objects recorded in process and run hosted at
the node and at the client, and the fit of their wall times.

Each drain's wall time at the node, less its console calls, is fitted to ``ratio x
think + reads x L_request + blocks x L_block`` over three workloads that each make one
term dominate (non-negative least squares): the hosted-object overhead and a local
read's cost at the node. At the client, the ``count``'s wall less its reads, per think
second, is the client's ratio. Wall times, because a prediction is of wall time.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

from shuttle.bench.calibrate.phases import (
    LARGE_BYTES,
    REFERENCE_PATTERN,
    THINK_PATTERN,
    drain,
)
from shuttle.bench.calibrate.result import LIVE_BLOCK_BYTES
from shuttle.bench.calibrate.timing import Timed
from shuttle.bench.objrecord import ObjectRun, record_stack
from shuttle.runtime.client import Runtime
from shuttle.traces.objtrace import ObjectTraceRecorder
from shuttle.traces.record import Op

#: A ratio below this is a measurement disturbed by the machine, not an object that
#: runs faster hosted: it is clamped (and the raw figures kept beside it).
RATIO_MIN = 0.8
#: A run of the reference grep is repeated this often; the median run counts.
RATIO_RUNS = 3


def object_think_s(rec: ObjectTraceRecorder) -> float:
    """The object's own CPU in a recording: every gap but the console's (before a call)."""
    total = 0.0
    previous = 0.0
    for r in rec.records:
        if r.op is not Op.CALL:
            total += r.time - previous
        previous = r.time
    return total


def reference_object(name: str, keys: list[str]) -> ObjectRun:
    if name == "think":
        # Counting the lines that match a pattern most lines match: Python work on
        # every line (``matching_lines``), and a few numbers as the answer.
        return ObjectRun("count", keys, {"pattern": THINK_PATTERN})
    return ObjectRun("grep", keys, {"pattern": REFERENCE_PATTERN})


def reference_runs(
    rt: Runtime,
    node: str,
    work: dict[str, list[str]],
    node_cpu: Callable[[], float],
    *,
    runs: int,
) -> dict[str, dict[str, float]]:
    """Each workload recorded in process (think, reads, blocks, calls), hosted at the
    node (wall and node CPU of its drain) and, for ``think``, hosted at the client
    (wall of its drain): the median of ``runs`` interleaved runs of each."""
    samples: dict[str, dict[str, list[float]]] = {}
    for _ in range(runs):
        for name, keys in work.items():
            run = reference_object(name, keys)
            rec = ObjectTraceRecorder(time.thread_time)
            record_stack(rt, run, node, list(keys), rec)
            blocks = sum(
                max(1, math.ceil(r.size / LIVE_BLOCK_BYTES)) for r in rec.records if r.op is Op.READ
            )
            got = samples.setdefault(name, {})
            for key, value in (
                ("think_s", object_think_s(rec)),
                ("reads", float(rec.storage_calls)),
                ("blocks", float(blocks)),
                ("calls", float(rec.console_calls)),
                ("bytes", float(rec.bytes_read)),
            ):
                got.setdefault(key, []).append(value)
            sites = ("node", "client") if name == "think" else ("node",)
            for site in sites:
                ref = rt.create(
                    run.kind,
                    at=node if site == "node" else None,
                    placement="static",
                    **run.object_params(rt.storage(node), list(keys)),
                )
                try:
                    n0, w0 = node_cpu(), time.perf_counter()
                    with rt.console("calibrate"):
                        drain(ref)
                    got.setdefault(f"{site}_wall_s", []).append(time.perf_counter() - w0)
                    got.setdefault(f"{site}_node_cpu_s", []).append(node_cpu() - n0)
                finally:
                    rt.destroy(ref)
    return {
        name: {key: statistics.median(values) for key, values in got.items()}
        for name, got in samples.items()
    }


def nnls_small(rows: list[list[float]], y: list[float]) -> list[float]:
    """Least squares with non-negative unknowns, for a handful of them: the best of
    the unconstrained solutions over every subset of unknowns left free."""
    import itertools

    import numpy as np

    a = np.asarray(rows, dtype=np.float64)
    b = np.asarray(y, dtype=np.float64)
    n = a.shape[1]
    best: tuple[float, list[float]] | None = None
    for k in range(n, 0, -1):
        for free in itertools.combinations(range(n), k):
            x_free, *_ = np.linalg.lstsq(a[:, free], b, rcond=None)
            if (x_free < 0).any():
                continue
            x = [0.0] * n
            for i, v in zip(free, x_free.tolist(), strict=True):
                x[i] = v
            residual = float(np.sum((a @ np.asarray(x) - b) ** 2))
            if best is None or residual < best[0]:
                best = (residual, x)
    return best[1] if best is not None else [0.0] * n


def fit_hosted(
    runs: dict[str, dict[str, float]],
    reads: dict[str, Timed],
    call: Timed,
    factor: float,
) -> dict[str, Any]:
    """The hosted costs from the reference runs' wall times (what a prediction is of):

    * at the node, each drain's wall less its console calls (each a loopback call's
      wall) is the object's work there: ``ratio x think + reads x L_request + blocks x
      L_block``, fitted over the three workloads (non-negative least squares);
    * at the client, the ``think`` drain's wall less its reads (each a loopback read's
      wall, by its blocks) is ``ratio x think``.

    Node figures are at the node's factor; the configuration states them at speed 1."""
    names = ("think", "requests", "bytes")
    rows, y = [], []
    for name in names:
        r = runs[name]
        rows.append([r["think_s"], r["reads"], r["blocks"]])
        y.append(r["node_wall_s"] - r["calls"] * call.wall_mean_s)
    ratio_s, l_request, l_block = nnls_small(rows, y)
    small, large = reads["small"].wall_mean_s, reads["large"].wall_mean_s
    per_block = max(0.0, (large - small) / (LARGE_BYTES // LIVE_BLOCK_BYTES - 1))
    think = runs["think"]
    read_wall = think["reads"] * (small - per_block) + think["blocks"] * per_block
    client_object_s = think["client_wall_s"] - read_wall - think["calls"] * 0.0
    return {
        "hosted_fit": {"rows": rows, "y": y},
        # What the node's work costs at its factor, per think second / read / block.
        "mobile_server_cpu_ratio_at_factor": ratio_s,
        "local_read_cpu_per_request_s": l_request,
        "local_read_cpu_per_block_s": l_block,
        "mobile_server_cpu_ratio": max(RATIO_MIN, ratio_s * factor),
        "mobile_client_cpu_ratio": max(RATIO_MIN, client_object_s / think["think_s"]),
        "client_object_wall_s": client_object_s,
    }
