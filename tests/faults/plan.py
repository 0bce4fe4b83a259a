"""What the fault tier runs (:mod:`tests.faults.harness`): its size, the steps of the
protocol by who performs them, the faults and their victims, and the rotation that
takes every (step, fault, victim) once per round in a seeded order.
"""

from __future__ import annotations

import random

NODES = 4
#: A short lease: a dead host is waited out in about two seconds (docs/runtime.md).
DURABLE_LEASE_S = 1.0

#: Steps by who performs them.
SOURCE_STEPS = ("quiesce", "checkpoint", "install", "activate", "switch")
TARGET_STEPS = ("staged", "commit", "open")
HOME_STEPS = ("home-commit", "home-committed")
HOST_STEPS = ("persist",)
VICTIMS = ("source", "target", "home")
KINDS = ("kill", "cut")


def rotation(seed: int) -> list[tuple[str, str, str]]:
    """Every (step, fault, victim) once, in a shuffled order (persist has no target)."""
    combos = [
        (step, kind, victim)
        for step in (*SOURCE_STEPS, *TARGET_STEPS, *HOME_STEPS, *HOST_STEPS)
        for kind in KINDS
        for victim in VICTIMS
        if not (step in HOST_STEPS and victim == "target")
    ]
    random.Random(seed).shuffle(combos)
    return combos
