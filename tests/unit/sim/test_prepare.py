"""Two passes over a trace in pieces give what one pass over the whole trace gives."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from shuttle.errors import ConfigError
from shuttle.sim import prepcache
from shuttle.sim.config import ExperimentConfig, ServerConfig
from shuttle.sim.prepare import ChunkSource, columns_source, plan_intervals, prepare_intervals
from shuttle.sim.run import simulate_interval, warm_state_for
from shuttle.sim.workload import Columns, choose_windows, window_counts

from .synthetic import background, search

TRACE = Columns.from_records(background(duration_s=1200.0, rate_per_s=80.0, seed=4))
MOBILE = Columns.from_records(search(files=10, blocks_per_file=3))
EXPERIMENT = ExperimentConfig(
    intervals=3, interval_s=60.0, warmup_s=300.0, warmup_timed_s=15.0, overrun_s_max=60.0
)


def in_pieces(columns: Columns, piece_s: float) -> ChunkSource:
    """``columns`` cut into ``piece_s`` pieces, file ids made large and sparse (as a
    generator's are)."""

    def chunks(start_s: float, end_s: float) -> Iterator[Columns]:
        t = start_s
        last = min(end_s, float(columns.time_s[-1]) + 1.0)
        while t < last:
            piece = columns.window(t, min(t + piece_s, end_s))
            yield piece.with_files(piece.file * 7919 + (1 << 40), 0)
            t += piece_s

    return chunks


def test_the_intervals_are_the_busiest_windows_of_the_whole_trace() -> None:
    chosen, records = plan_intervals(in_pieces(TRACE, 45.0), EXPERIMENT)
    assert records == len(TRACE)
    counts = window_counts(TRACE.time_s, 0.0, 60.0)
    assert chosen == choose_windows(counts, 0.0, float(TRACE.time_s[-1]), 60.0, 3, 300.0)


def test_pieces_and_renumbered_files_simulate_the_same() -> None:
    whole, _ = prepare_intervals(columns_source(TRACE), EXPERIMENT, 8192)
    pieces, _ = prepare_intervals(in_pieces(TRACE, 45.0), EXPERIMENT, 8192)
    config = ServerConfig(cache_blocks=300)
    for a, b in zip(whole, pieces, strict=True):
        assert a.interval == b.interval
        assert a.warm.records == b.warm.records
        results = [
            simulate_interval(
                config, EXPERIMENT, "server", d.interval, d.background, d.warm, MOBILE
            ).to_json()
            for d in (a, b)
        ]
        assert json.dumps(results[0]) == json.dumps(results[1])


def test_the_warm_caches_hold_what_the_direct_warm_up_holds() -> None:
    """Same blocks and files (renumbered per interval, so compared by count)."""
    prepared, _ = prepare_intervals(columns_source(TRACE), EXPERIMENT, 8192)
    for data in prepared:
        direct = warm_state_for(TRACE, data.interval, EXPERIMENT, 8192)
        assert direct.records == data.warm.records
        assert len(direct.blocks_lru_first) == len(data.warm.blocks_lru_first)
        assert len(direct.metadata_files) == len(data.warm.metadata_files)


def test_an_empty_trace_is_refused() -> None:
    with pytest.raises(ConfigError, match="empty"):
        plan_intervals(columns_source(Columns.from_records([])), EXPERIMENT)


def test_prepared_intervals_survive_a_round_trip_through_the_disk_cache(tmp_path: Path) -> None:
    prepared, records = prepare_intervals(columns_source(TRACE), EXPERIMENT, 8192)
    path = tmp_path / "p.npz"
    prepcache.save(path, prepared, records)
    loaded = prepcache.load(path)
    assert loaded is not None
    again, again_records = loaded
    assert again_records == records
    config = ServerConfig(cache_blocks=300)
    for a, b in zip(prepared, again, strict=True):
        assert a.interval == b.interval
        results = [
            simulate_interval(
                config, EXPERIMENT, "client", d.interval, d.background, d.warm, MOBILE
            ).to_json()
            for d in (a, b)
        ]
        assert results[0] == results[1]
    assert prepcache.load(tmp_path / "missing.npz") is None
    (tmp_path / "broken.npz").write_bytes(b"not an npz")
    assert prepcache.load(tmp_path / "broken.npz") is None


def test_the_cache_key_changes_with_what_the_intervals_depend_on() -> None:
    background = {"source": "generated", "seed": 1}
    key = prepcache.cache_key(background, EXPERIMENT, 8192)
    assert key == prepcache.cache_key(dict(background), EXPERIMENT, 8192)
    assert key != prepcache.cache_key({"source": "generated", "seed": 2}, EXPERIMENT, 8192)
    assert key != prepcache.cache_key(background, EXPERIMENT, 4096)
    longer = ExperimentConfig(
        intervals=3, interval_s=60.0, warmup_s=600.0, warmup_timed_s=15.0, overrun_s_max=60.0
    )
    assert key != prepcache.cache_key(background, longer, 8192)
    # The seed of the runs themselves does not change the prepared intervals.
    reseeded = ExperimentConfig(
        intervals=3,
        interval_s=60.0,
        warmup_s=300.0,
        warmup_timed_s=15.0,
        overrun_s_max=60.0,
        seed=99,
    )
    assert key == prepcache.cache_key(background, reseeded, 8192)
