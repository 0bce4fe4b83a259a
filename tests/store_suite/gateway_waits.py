"""Waiting on RADOS gateways in the store suite: a condition polled to a deadline,
and whether a gateway trusts its cache (so warm reads need no ``stat``)."""

from __future__ import annotations

import time
from collections.abc import Callable

from shuttle.store.rados import RadosStore


def wait_until(cond: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """Poll ``cond`` until it holds; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {timeout_s:g} s")
        time.sleep(0.02)


def trusting(s: RadosStore) -> bool:
    """Its watch is healthy and its probation over: warm reads need no stat."""
    return s.coherence.trusted() and time.monotonic() > s.coherence.trust_from
