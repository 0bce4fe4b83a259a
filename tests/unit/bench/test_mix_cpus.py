"""The mix benchmark's check that the node and the clients kept to their own CPUs (the
emulation of separate machines), and the refusals of CPU settings that would not
separate them."""

from __future__ import annotations

import os
import threading

import pytest

from shuttle.bench.mix_cpus import cpu_busy, parse_cpu_list, partition, threads_allowed
from shuttle.bench.mix_settings import MixSettings
from shuttle.bench.placement import PROC_STAT_FIELDS
from shuttle.errors import ConfigError

ZERO, ONE, BOTH = frozenset({0}), frozenset({1}), frozenset({0, 1})


def test_a_kernel_cpu_list_reads_as_its_cpus() -> None:
    assert parse_cpu_list("1") == ONE
    assert parse_cpu_list("0-1") == BOTH
    assert parse_cpu_list(" 0-2,5,7-8\n") == frozenset({0, 1, 2, 5, 7, 8})
    with pytest.raises(ConfigError, match="not a CPU list"):
        parse_cpu_list("0-x")
    with pytest.raises(ConfigError, match="runs backwards"):
        parse_cpu_list("3-1")


def test_the_partition_holds_when_every_thread_keeps_to_its_side() -> None:
    node = {10: {10: ONE, 11: ONE}}
    clients = {20: {20: ZERO}, 21: {21: ZERO, 22: ZERO}}
    got = partition(node, clients, ONE, ZERO)
    assert got["held"] and got["mode"] == "partitioned"
    assert got["node"] == {
        "cpus": "1",
        "processes": 1,
        "threads": 2,
        "allowed": "1",
        "threads_outside": 0,
    }
    assert got["clients"]["threads"] == 3 and got["clients"]["processes"] == 2


def test_one_thread_allowed_the_other_side_breaks_the_partition() -> None:
    # A pool thread the node started before it was pinned, say: it may run anywhere.
    node = {10: {10: ONE, 11: BOTH}}
    clients = {20: {20: ZERO}}
    got = partition(node, clients, ONE, ZERO)
    assert not got["held"]
    assert got["node"]["threads_outside"] == 1 and got["node"]["allowed"] == "0,1"
    # And on the clients' side.
    got = partition({10: {10: ONE}}, {20: {20: ZERO}, 21: {21: ONE}}, ONE, ZERO)
    assert not got["held"] and got["clients"]["threads_outside"] == 1


def test_no_pinning_or_nothing_seen_is_no_partition() -> None:
    seen = partition({10: {10: BOTH}}, {20: {20: BOTH}}, None, None)
    assert seen["mode"] == "shared" and not seen["held"]
    # Processes gone before the check (no threads read) prove nothing.
    assert not partition({10: {}}, {20: {20: ZERO}}, ONE, ZERO)["held"]
    # Overlapping sides are not separate machines even if every thread keeps to them.
    assert not partition({10: {10: ONE}}, {20: {20: ONE}}, ONE, BOTH)["held"]


def test_threads_allowed_reads_every_thread_of_a_live_process() -> None:
    started, stop = threading.Event(), threading.Event()

    def idle() -> None:
        started.set()
        stop.wait()

    t = threading.Thread(target=idle)
    t.start()
    started.wait()
    try:
        got = threads_allowed(os.getpid())
        assert t.native_id in got and threading.get_native_id() in got
        assert all(cpus == frozenset(os.sched_getaffinity(0)) for cpus in got.values())
    finally:
        stop.set()
        t.join()
    assert threads_allowed(2**22 + 7) == {}  # no such process: nothing, no error


def test_cpu_busy_is_each_cpus_share_of_the_wall_time() -> None:
    n = os.sysconf("SC_CLK_TCK")  # one second of ticks
    fields = len(PROC_STAT_FIELDS)
    before = {"cpu0": [0] * fields, "cpu1": [0] * fields}
    # cpu0: half a second user, a quarter system; cpu1: a tenth in softirq.
    after = {
        "cpu0": [n // 2, 0, n // 4, 0, 0, 0, 0, 0],
        "cpu1": [0, 0, 0, 0, 0, 0, n // 10, 0],
    }
    got = cpu_busy(before, after, 1.0)
    assert got["cpu0"]["busy"] == pytest.approx(0.75, abs=0.02)
    assert got["cpu1"] == {"busy": 0.0, "irq": pytest.approx(0.1, abs=0.02)}
    assert cpu_busy(before, after, 0.0) == {}


def test_cpu_settings_that_would_not_separate_the_node_from_the_clients_are_refused() -> None:
    usable = sorted(os.sched_getaffinity(0))
    with pytest.raises(ConfigError, match="--no-pin leaves the node"):
        MixSettings(pin=False, node_cpu=usable[0]).check()
    with pytest.raises(ConfigError, match="may use CPUs"):
        MixSettings(client_cpu=max(usable) + 1).check()
    MixSettings(pin=False).check()  # the scheduler's placement, asked for
    if len(usable) < 2:
        pytest.skip("one usable CPU: nothing to separate")
    with pytest.raises(ConfigError, match="both run on CPU"):
        MixSettings(client_cpu=usable[0], node_cpu=usable[0]).check()
    # Only one given: the other's default (the highest usable for the node) collides.
    with pytest.raises(ConfigError, match="both run on CPU"):
        MixSettings(client_cpu=usable[-1]).check()
    with pytest.raises(ConfigError, match="both run on CPU"):
        MixSettings(node_cpu=usable[0]).check()  # the clients' default, the lowest
    MixSettings(client_cpu=usable[-1], node_cpu=usable[0]).check()  # swapped: fine
