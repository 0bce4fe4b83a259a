"""When a primary starts a dead worker again (shuttle.node.worker_restarts): soon after
one that had served, ever later after each that died young, never beyond the cap."""

from __future__ import annotations

import signal

import pytest

from shuttle.node.worker_restarts import (
    RESTART_DELAY_S_MAX,
    RESTART_DELAY_S_MIN,
    RESTART_HEALTHY_S,
    RestartBackoff,
    exit_reason,
)


def test_a_worker_that_keeps_dying_young_waits_twice_as_long_each_time_up_to_the_cap() -> None:
    backoff = RestartBackoff()
    delays = [backoff.after_death(1.0) for _ in range(10)]
    assert delays[:4] == [
        RESTART_DELAY_S_MIN,
        2 * RESTART_DELAY_S_MIN,
        4 * RESTART_DELAY_S_MIN,
        8 * RESTART_DELAY_S_MIN,
    ]
    assert delays == sorted(delays)
    assert delays[-1] == RESTART_DELAY_S_MAX
    assert backoff.quick_deaths == 10


def test_a_worker_that_served_a_while_is_started_again_at_once() -> None:
    backoff = RestartBackoff()
    for _ in range(6):
        backoff.after_death(0.5)
    assert backoff.delay_s > RESTART_DELAY_S_MIN
    assert backoff.after_death(RESTART_HEALTHY_S) == RESTART_DELAY_S_MIN
    assert backoff.quick_deaths == 0
    assert backoff.after_death(2.0) == 2 * RESTART_DELAY_S_MIN  # young again: doubled


def test_the_policy_refuses_settings_that_would_spin() -> None:
    with pytest.raises(ValueError, match='"delay_s_min" must be > 0'):
        RestartBackoff(delay_s_min=0)
    with pytest.raises(ValueError, match='"factor" must be >= 1'):
        RestartBackoff(factor=0.5)


def test_the_log_says_how_a_worker_died() -> None:
    assert exit_reason(-signal.SIGKILL) == "killed by SIGKILL (an OOM kill or kill -9)"
    assert exit_reason(-signal.SIGSEGV) == "killed by SIGSEGV"
    assert exit_reason(1) == "exited with status 1"
