"""Pinning a benchmark's processes to one CPU, and giving the caller its CPUs back."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from shuttle.bench.placement import default_cpu, pin_process, pinned, threads_of
from shuttle.errors import ConfigError


def test_pinned_runs_the_caller_on_one_cpu_and_restores_it() -> None:
    before = os.sched_getaffinity(0)
    cpu = default_cpu()
    assert cpu in before
    with pinned(cpu) as got:
        assert got == cpu
        assert os.sched_getaffinity(0) == {cpu}
    assert os.sched_getaffinity(0) == before
    with pinned(None) as got:
        assert got is None and os.sched_getaffinity(0) == before


def test_pinning_to_a_cpu_we_may_not_use_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="--no-pin"), pinned(max(os.sched_getaffinity(0)) + 64):
        pass


def test_pin_process_pins_every_thread_of_a_child() -> None:
    code = (
        "import threading, sys\n"
        "e = threading.Event()\n"
        "[threading.Thread(target=e.wait, daemon=True).start() for _ in range(3)]\n"
        "print('ready', flush=True); sys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == b"ready"
        tids = threads_of(child.pid)
        assert len(tids) >= 4
        cpu = default_cpu()
        pin_process(child.pid, cpu)
        assert all(os.sched_getaffinity(t) == {cpu} for t in tids)
    finally:
        child.kill()
        child.wait()


def test_threads_of_a_vanished_process_is_just_its_id() -> None:
    assert threads_of(2**22 + 12345) == [2**22 + 12345]
