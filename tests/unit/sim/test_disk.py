"""The storage device: the paper's disk by default, parallel units and write costs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shuttle.errors import ConfigError
from shuttle.sim.config import ServerConfig
from shuttle.sim.disk import Disk

#: (gap before the access in ms, size in blocks, write?)
accesses = st.lists(
    st.tuples(st.integers(0, 30), st.integers(0, 4), st.booleans()), min_size=1, max_size=60
)


def run(disk: Disk, sequence: list[tuple[int, int, bool]]) -> list[tuple[float, float, float]]:
    """(arrival, start, end) of each access, offered in order."""
    now = 0.0
    out = []
    for gap_ms, blocks, write in sequence:
        now += gap_ms / 1000.0
        start, service = disk.access(now, blocks * 8192, write)
        out.append((now, start, start + service))
    return out


@settings(max_examples=200, deadline=None)
@given(sequence=accesses)
def test_the_default_is_the_papers_disk(sequence: list[tuple[int, int, bool]]) -> None:
    """One FIFO server, every access seek + size / bandwidth, reads and writes alike."""
    config = ServerConfig()
    busy = 0.0
    for arrival, start, end in run(Disk(config), sequence):
        assert start == max(arrival, busy)
        busy = end
    served = run(Disk(config), sequence)
    for (_, blocks, _write), (_, start, end) in zip(sequence, served, strict=True):
        assert end - start == pytest.approx(0.008 + blocks * 8192 / 10e6)


@settings(max_examples=200, deadline=None)
@given(sequence=accesses, units=st.integers(1, 5))
def test_parallel_units_serve_fifo_without_idling_while_work_waits(
    sequence: list[tuple[int, int, bool]], units: int
) -> None:
    config = ServerConfig(disk_parallelism=units)
    served = run(Disk(config), sequence)
    starts = [start for _, start, _ in served]
    assert starts == sorted(starts), "FIFO: accesses start in arrival order"
    for arrival, start, end in served:
        assert arrival <= start < end
        # Never more than ``units`` in service at once.
        at_start = sum(1 for _, s, e in served if s <= start < e)
        assert at_start <= units
        # While it waited, every unit was busy: at its arrival and at every moment a
        # unit freed before it started.
        moments = [arrival] + [e for _, _, e in served if arrival <= e < start]
        for t in moments if start > arrival else []:
            assert sum(1 for _, s, e in served if s <= t < e) >= units


@settings(max_examples=100, deadline=None)
@given(sequence=accesses)
def test_enough_units_mean_no_queueing(sequence: list[tuple[int, int, bool]]) -> None:
    served = run(Disk(ServerConfig(disk_parallelism=len(sequence))), sequence)
    assert all(start == arrival for arrival, start, _ in served)


def test_writes_can_cost_more_than_reads() -> None:
    """An SSD-like device: 0.1 ms reads at 500 MB/s, 1 ms writes at 100 MB/s."""
    config = ServerConfig(
        disk_seek_s=0.0001,
        disk_bandwidth_bytes_per_s=500e6,
        disk_write_seek_s=0.001,
        disk_write_bandwidth_bytes_per_s=100e6,
    )
    disk = Disk(config)
    assert disk.service_s(8192, write=False) == pytest.approx(0.0001 + 8192 / 500e6)
    assert disk.service_s(8192, write=True) == pytest.approx(0.001 + 8192 / 100e6)
    assert config.disk_s(8192, write=True) == disk.service_s(8192, write=True)


def test_bad_device_values_name_the_parameter() -> None:
    with pytest.raises(ConfigError, match='"disk_parallelism" must be > 0'):
        ServerConfig(disk_parallelism=0)
    with pytest.raises(ConfigError, match='"disk_write_seek_s" must be >= 0'):
        ServerConfig(disk_write_seek_s=-1.0)
