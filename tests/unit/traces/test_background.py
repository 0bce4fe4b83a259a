"""The synthetic background workload: determinism, windows, mix, burstiness, calibration."""

from __future__ import annotations

import functools
import itertools
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from shuttle.errors import ConfigError
from shuttle.traces.background import (
    OPS,
    BackgroundChunk,
    BackgroundConfig,
    generate,
    generate_columns,
)
from shuttle.traces.record import Op

#: A short trace keeps the tests fast; its 10 minutes sit at the 2 pm peak.
SHORT = replace(BackgroundConfig(), duration_s=600.0, start_time_of_day_s=13.9 * 3600)

#: The paper's CPU costs (Figure 1), thousands of cycles at 133 MHz.
PAPER_CYCLES = {"meta_read": 33e3, "meta_write": 64e3, "block_read": 100e3, "block_write": 199e3}
PAPER_HZ = 133e6


@functools.cache
def short_trace() -> BackgroundChunk:
    return columns(SHORT, 0)


def columns(config: BackgroundConfig, seed: int = 0, **kw: float) -> BackgroundChunk:
    chunks = list(generate_columns(config, seed, **kw))
    return BackgroundChunk(*(np.concatenate([getattr(c, f) for c in chunks]) for f in _FIELDS))


_FIELDS = ("time_s", "client", "op", "file", "offset", "size")


def test_same_seed_same_trace_other_seed_other_trace() -> None:
    a = list(generate(SHORT, seed=7, end_s=20.0))
    assert a == list(generate(SHORT, seed=7, end_s=20.0))
    assert a != list(generate(SHORT, seed=8, end_s=20.0))


def test_a_window_is_exactly_that_part_of_the_whole_trace() -> None:
    whole = columns(SHORT, 3)
    part = columns(SHORT, 3, start_s=200.0, end_s=350.0, chunk_s=17.0)
    lo, hi = np.searchsorted(whole.time_s, [200.0, 350.0])
    for f in _FIELDS:
        assert np.array_equal(getattr(part, f), getattr(whole, f)[lo:hi]), f


def test_records_and_columns_agree_and_are_time_ordered() -> None:
    cols = columns(SHORT, 1, end_s=30.0)
    records = list(generate(SHORT, 1, end_s=30.0))
    assert len(records) == len(cols)
    assert all(a.time <= b.time for a, b in itertools.pairwise(records))
    assert records[0].time >= 0.0 and records[-1].time < 30.0
    r = records[len(records) // 2]
    i = len(records) // 2
    assert (r.time, r.client, r.op, r.file) == (
        cols.time_s[i],
        cols.client[i],
        OPS[cols.op[i]],
        f"b{cols.file[i]}",
    )


def test_request_mix_matches_the_configuration() -> None:
    cols = short_trace()
    ops = Counter(OPS[o] for o in cols.op.tolist())
    n = len(cols)
    meta = sum(v for op, v in ops.items() if op.is_metadata)
    assert meta / n == pytest.approx(0.87, abs=0.01)
    blocks = ops[Op.READ] + ops[Op.WRITE]
    assert ops[Op.WRITE] / blocks == pytest.approx(SHORT.block_write_fraction, abs=0.01)
    weights = dict(SHORT.metadata_mix)
    total_w = sum(weights.values())
    for op, w in weights.items():
        assert ops[op] / meta == pytest.approx(w / total_w, abs=0.01), op


def test_rate_follows_the_configured_curve() -> None:
    cols = short_trace()
    t = np.linspace(0.0, SHORT.duration_s, 1001)
    expected = float(np.trapezoid(SHORT.rate_at(t), t))
    assert len(cols) == pytest.approx(expected, rel=0.15)


def test_block_requests_are_whole_blocks_within_their_files() -> None:
    cols = columns(SHORT, 0, end_s=120.0)
    block = np.isin(cols.op, [OPS.index(Op.READ), OPS.index(Op.WRITE)])
    assert np.all(cols.offset[block] % SHORT.request_bytes == 0)
    assert np.all((cols.size[block] >= 1) & (cols.size[block] <= SHORT.request_bytes))
    assert np.all(cols.size[~block] == 0) and np.all(cols.offset[~block] == 0)
    # A file's blocks never claim different sizes for the same offset.
    seen: dict[tuple[int, int], int] = {}
    for f, off, size in zip(cols.file[block], cols.offset[block], cols.size[block], strict=True):
        assert seen.setdefault((int(f), int(off)), int(size)) == size
    assert set(cols.client.tolist()) <= set(range(SHORT.clients))


def test_arrivals_are_burstier_than_poisson() -> None:
    cols = short_trace()
    per_s = np.bincount(cols.time_s.astype(np.int64))
    dispersion = per_s.var() / per_s.mean()
    assert dispersion > 3.0  # a Poisson process has 1


def test_files_are_private_per_client_and_popularity_is_skewed() -> None:
    cols = short_trace()
    owners: dict[int, set[int]] = {}
    for f, c in zip(cols.file.tolist(), cols.client.tolist(), strict=True):
        owners.setdefault(f, set()).add(c)
    assert all(len(c) == 1 for c in owners.values())
    counts = np.sort(np.bincount(np.unique(cols.file, return_inverse=True)[1]))[::-1]
    top = counts[: max(1, len(counts) // 10)].sum()
    assert top / counts.sum() > 0.5  # the top 10% of files take most requests


def test_bad_parameters_name_themselves() -> None:
    with pytest.raises(ConfigError, match='"metadata_fraction"'):
        BackgroundConfig(metadata_fraction=1.5)
    with pytest.raises(ConfigError, match='"session_pareto_shape"'):
        BackgroundConfig(session_pareto_shape=1.0)
    with pytest.raises(ConfigError, match='"metadata_mix"'):
        BackgroundConfig(metadata_mix=((Op.READ, 1.0),))
    with pytest.raises(ConfigError, match='"clients"'):
        BackgroundConfig(clients=0)


def _cpu_s_per_request(config: BackgroundConfig) -> float:
    meta_w = dict(config.metadata_mix)
    total = sum(meta_w.values())
    meta_write = sum(w for op, w in meta_w.items() if op.is_write) / total
    m, bw = config.metadata_fraction, config.block_write_fraction
    cycles = m * (
        (1 - meta_write) * PAPER_CYCLES["meta_read"] + meta_write * PAPER_CYCLES["meta_write"]
    )
    cycles += (1 - m) * ((1 - bw) * PAPER_CYCLES["block_read"] + bw * PAPER_CYCLES["block_write"])
    return cycles / PAPER_HZ


def test_defaults_make_the_server_busy_at_full_speed_and_saturate_at_half() -> None:
    """The calibration target, from the paper's cycle costs at the daily peak."""
    config = BackgroundConfig()
    peak_rate = config.request_rate_per_s * (1 + config.diurnal_amplitude)
    busy = peak_rate * _cpu_s_per_request(config)
    assert 0.35 < busy < 0.6  # busy, not saturated at speed 1.0
    assert busy / 0.5 > 0.8  # half speed: the mobile application's requests tip it over
    # And the generated peak hour delivers that rate.
    cols = short_trace()
    measured = len(cols) / SHORT.duration_s * _cpu_s_per_request(config)
    assert measured == pytest.approx(busy, rel=0.2)


def test_file_ids_leave_room_for_the_mobile_application_and_block_keys() -> None:
    """Ids stay below 2**28: the simulator numbers mobile files from there and builds
    block keys as file << 32 | block in 64-bit integers."""
    from shuttle.traces.background import FILE_IDS_MAX, NEW_FILE_BASE

    cols = short_trace()
    assert int(cols.file.max()) < FILE_IDS_MAX == 1 << 28
    created = cols.file[cols.file >= NEW_FILE_BASE]
    assert len(created) > 0  # sessions do create files
    owners: dict[int, set[int]] = {}
    for f, c in zip(
        created.tolist(), cols.client[cols.file >= NEW_FILE_BASE].tolist(), strict=True
    ):
        owners.setdefault(f, set()).add(c)
    assert all(len(c) == 1 for c in owners.values())  # a new file belongs to one client


def test_too_long_a_trace_is_refused() -> None:
    with pytest.raises(ConfigError, match='"duration_s"'):
        BackgroundConfig(duration_s=60 * 86_400.0)
