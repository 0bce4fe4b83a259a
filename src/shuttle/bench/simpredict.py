"""The simulator against the live system, in the open (``shuttle bench sim-predict``).

For each node speed, a one-node cluster at that CPU factor is started on loopback and
loaded with the generated corpus (:mod:`shuttle.bench.corpus`); for each link,
``shuttle sim predict --live`` is run on it (:func:`shuttle.bench.predict.predict`):
record the grep, calibrate the node over that link, simulate both placements, and run
``shuttle grep`` at both, interleaved. The rows put the simulator's predictions and
the run-time's own placement model's beside the live run times, with the errors, the
spread of the live runs and the machine's load.

The slow link moves a smaller part of the corpus (the first ``wan_files`` files), so
its client runs take seconds rather than minutes; every row states its bytes.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shuttle.bench.corpus import CorpusSpec, corpus_digest, generate_corpus
from shuttle.bench.predict import PredictRequest, predict
from shuttle.client.connect import connect
from shuttle.cluster import local

#: The links of the table and the node speeds (the issue's).
LINKS_DEFAULT = ("loopback", "san", "lan", "wan")
SPEEDS_DEFAULT = (1.0, 0.5, 0.25)
#: A selective pattern: 0.2 % of the corpus's lines match (some 600 in 16 MB).
PATTERN_DEFAULT = "q[a-e]x"
#: Files the slowest link reads (1 Mbit/s: about 2 MB, some 17 s at the client).
WAN_FILES_DEFAULT = 150
#: Links slower than this read only the first ``wan_files`` files.
SLOW_LINK_BITS_PER_S = 5e6
#: A 2-core machine with a load average under 2 leaves our client and node a core
#: each most of the time; the wait is bounded so a busy day still ends with a table.
QUIET_LOAD_DEFAULT = 2.0
QUIET_WAIT_S_DEFAULT = 120.0
#: How often the load is looked at while waiting.
QUIET_POLL_S = 10.0


def wait_for_quiet(limit: float, wait_s: float, progress: Callable[[str], None]) -> float:
    """Wait until the 1-minute load average is below ``limit`` (at most ``wait_s``);
    return the seconds waited."""
    started = time.monotonic()
    said = False
    while os.getloadavg()[0] >= limit and time.monotonic() - started < wait_s:
        if not said:
            progress(f"load average {os.getloadavg()[0]:.2f}: waiting for it to fall below "
                     f"{limit:g} (at most {wait_s:.0f} s)")  # fmt: skip
            said = True
        time.sleep(QUIET_POLL_S)
    return time.monotonic() - started


@dataclass
class SimPredictConfig:
    links: Sequence[str] = LINKS_DEFAULT
    speeds: Sequence[float] = SPEEDS_DEFAULT
    pattern: str = PATTERN_DEFAULT
    runs: int = 3
    #: The most live runs of a placement whose median is not yet stable (None: the
    #: default, ``LIVE_RUNS_MAX_FACTOR`` x ``runs``).
    runs_max: int | None = None
    #: A drain of the program's grep after each live server run (``PredictRequest``).
    drains_between: bool = True
    corpus: CorpusSpec = field(default_factory=CorpusSpec)
    wan_files: int = WAN_FILES_DEFAULT
    calls: int = 200
    workdir: Path | None = None
    #: Before each row, wait (up to ``quiet_wait_s``) for the machine's 1-minute load
    #: average to fall below this: the live runs are timings on a shared machine.
    quiet_load: float = QUIET_LOAD_DEFAULT
    quiet_wait_s: float = QUIET_WAIT_S_DEFAULT

    def to_json(self) -> dict[str, Any]:
        return {
            "links": list(self.links),
            "speeds": list(self.speeds),
            "pattern": self.pattern,
            "runs": self.runs,
            "runs_max": self.runs_max,
            "drains_between": self.drains_between,
            "corpus": self.corpus.to_json(),
            "wan_files": self.wan_files,
            "calls": self.calls,
            "quiet_load": self.quiet_load,
            "quiet_wait_s": self.quiet_wait_s,
        }


def _slow(link: str) -> bool:
    from shuttle.net.profiles import parse_link_profile

    bw = parse_link_profile(link).bandwidth_bits_per_s
    return bw is not None and bw < SLOW_LINK_BITS_PER_S


def run_validation(
    config: SimPredictConfig,
    progress: Callable[[str], None] = lambda _m: None,
    on_row: Callable[[dict[str, Any]], None] = lambda _r: None,
) -> dict[str, Any]:
    """Every (speed, link) row; the JSON the command writes. ``on_row`` sees the result
    so far after each row (a long run keeps what it measured if stopped)."""
    digest, total = corpus_digest(config.corpus)
    corpus = list(generate_corpus(config.corpus))
    keys = [k for k, _ in corpus]
    rows: list[dict[str, Any]] = []
    started = time.time()
    scratch = Path(tempfile.mkdtemp(prefix="shuttle-simpredict-", dir=config.workdir))
    try:
        for speed in config.speeds:
            progress(f"node at CPU factor {speed:g}: starting it and loading the corpus")
            cluster = local.up(scratch / f"speed-{speed:g}", nodes=1, cpu_factors=[speed])
            assert cluster.path is not None
            try:
                with connect(cluster=cluster.path, link="loopback") as client:
                    for key, data in corpus:
                        client.put(key, data)
                for link in config.links:
                    chosen = keys[: config.wan_files] if _slow(link) else keys
                    progress(f"speed {speed:g}, {link}: {len(chosen):,} files")
                    waited = wait_for_quiet(config.quiet_load, config.quiet_wait_s, progress)
                    load_before = list(os.getloadavg())
                    t0 = time.perf_counter()
                    result = predict(
                        PredictRequest(
                            cluster=cluster.path,
                            pattern=config.pattern,
                            keys=chosen,
                            link=link,
                            live=True,
                            live_runs=config.runs,
                            live_runs_max=config.runs_max,
                            drains_between=config.drains_between,
                            calls=config.calls,
                        ),
                        progress=lambda m, s=speed, lk=link: progress(f"speed {s:g}, {lk}: {m}"),  # type: ignore[misc]
                    )
                    rows.append(
                        {
                            "speed": speed,
                            "link": link,
                            "files": len(chosen),
                            "bytes": result["bytes"],
                            "predicted": result["predicted"],
                            "runtime_model": result["runtime_model"],
                            "live": result["live"],
                            "error": result["error"],
                            "error_before_live": result.get("error_before_live"),
                            "predicted_before_live": result.get("predicted_before_live"),
                            "runtime_model_error": result["runtime_model_error"],
                            "load_average_before": load_before,
                            "waited_for_quiet_s": waited,
                            "load_average_after": result["load_average"],
                            "wall_s": time.perf_counter() - t0,
                            "calibration": result["calibration"],
                            "trace": result["trace"],
                        }
                    )
                    progress(row_summary(rows[-1]))
                    on_row(_result(config, digest, total, keys, started, rows))
            finally:
                local.down(cluster)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return _result(config, digest, total, keys, started, rows)


def _result(
    config: SimPredictConfig,
    digest: str,
    total: int,
    keys: list[str],
    started: float,
    rows: list[dict[str, Any]],
) -> dict[str, Any]:
    return {
        "config": config.to_json(),
        "corpus": {"sha256": digest, "bytes": total, "files": len(keys)},
        "started": started,
        "wall_s": time.time() - started,
        "rows": rows,
        "summary": summary(rows),
    }


def row_summary(row: dict[str, Any]) -> str:
    e, r, live = row["error"], row["runtime_model_error"], row["live"]
    before = row.get("error_before_live")
    drains = (
        f" (calibration's drains alone {before['client']:+.1%} / {before['server']:+.1%})"
        if before
        else ""
    )
    return (
        f"speed {row['speed']:g} {row['link']}: live {live['client_s']:.3f} / "
        f"{live['server_s']:.3f} s ({len(live['runs']['client_s'])} / "
        f"{len(live['runs']['server_s'])} runs); simulator {e['client']:+.1%} / "
        f"{e['server']:+.1%}{drains} ({'right' if e['faster_right'] else 'WRONG'}); "
        f"run-time model {r['client']:+.1%} / {r['server']:+.1%} "
        f"({'right' if r['faster_right'] else 'WRONG'})"
    )


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Worst errors and sides right, for each model."""
    out: dict[str, Any] = {}
    for name, key in (("simulator", "error"), ("runtime_model", "runtime_model_error")):
        errors = [abs(r[key][side]) for r in rows for side in ("client", "server")]
        out[name] = {
            "worst_error": max(errors) if errors else None,
            "within_15_percent": sum(e <= 0.15 for e in errors),
            "predictions": len(errors),
            "faster_right": sum(bool(r[key]["faster_right"]) for r in rows),
            "rows": len(rows),
        }
    return out


def markdown_table(result: dict[str, Any]) -> str:
    """The tables benchmarks/README.md shows, one per model over the same runs: the live
    medians (their spread), the model's predictions, the errors, the faster sides, and
    the load average when the row began."""
    out = []
    for title, key, error in (
        ("The simulator (`shuttle sim predict`)", "predicted", "error"),
        ("The run-time's placement model (`runtime/placement*.py`)", "runtime_model",
         "runtime_model_error"),
    ):  # fmt: skip
        out += [
            f"**{title}**",
            "",
            "| link | node speed | MB | live client s (spread, runs) "
            "| live server s (spread, runs) "
            "| predicted client / server s | error client / server | faster: live / predicted "
            "| load |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for row in result["rows"]:
            live, p, e = row["live"], row[key], row[error]
            out.append(
                f"| {row['link']} | {row['speed']:g} | {row['bytes'] / 1e6:.1f} "
                f"| {live['client_s']:.3f} ({live['spread']['client']:.0%}, "
                f"{len(live['runs']['client_s'])}) "
                f"| {live['server_s']:.3f} ({live['spread']['server']:.0%}, "
                f"{len(live['runs']['server_s'])}) "
                f"| {p['client_s']:.3f} / {p['server_s']:.3f} "
                f"| {e['client']:+.1%} / {e['server']:+.1%} "
                f"| {live['faster']} / {p['faster']}{'' if e['faster_right'] else ' ✗'} "
                f"| {row['load_average_before'][0]:.1f} |"
            )
        out.append("")
    out += phases_table(result["rows"])
    return "\n".join(out).rstrip() + "\n"


def phases_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """What the server placement's timer holds, live (the medians over its runs) beside
    the simulator's run: the object made (the dial in it; the calibrated dial beside),
    a console call's median, the calls and their total."""
    out = [
        "**The server placement's timer, live / simulated**",
        "",
        "| link | node speed | made s (dial) | console call ms | calls | calls total s |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        live = row["live"].get("phases", {}).get("server", {})
        model = row["predicted"].get("phases", {}).get("server", {})
        if not live or not model:
            continue
        dial = [c.get("measured", {}).get("connect_s") for c in row["calibration"].values()]
        dial_s = f" ({dial[0]:.3f})" if dial and isinstance(dial[0], float) else ""
        out.append(
            f"| {row['link']} | {row['speed']:g} "
            f"| {live['made_s']:.3f} / {model['made_s']:.3f}{dial_s} "
            f"| {live['call_s'] * 1e3:.1f} / {model['call_s'] * 1e3:.1f} "
            f"| {live['calls']:g} / {model['calls']:g} "
            f"| {live['calls_total_s']:.3f} / {model['calls_total_s']:.3f} |"
        )
    out.append("")
    return out
