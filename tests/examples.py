"""How many examples a property test runs: its usual count, times
``SHUTTLE_EXAMPLES_SCALE`` (default 1). ``make sanitize`` runs the native code's property
tests with ten times as many, under AddressSanitizer and UBSan (docs/testing.md);
``make test`` keeps the counts that fit its time."""

from __future__ import annotations

import os

#: The environment variable that multiplies every property test's example count.
SCALE_ENV = "SHUTTLE_EXAMPLES_SCALE"


def examples(usual: int) -> int:
    """``usual`` times the scale in the environment; a bad value says what to set."""
    raw = os.environ.get(SCALE_ENV, "1")
    try:
        scale = int(raw)
    except ValueError:
        raise ValueError(f"{SCALE_ENV} must be a whole number ≥ 1, got {raw!r}") from None
    if scale < 1:
        raise ValueError(f"{SCALE_ENV} must be a whole number ≥ 1, got {raw!r}")
    return usual * scale
