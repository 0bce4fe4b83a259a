"""Allocator tuning for processes that move large buffers.

A large payload is received into a fresh buffer of its own (handed to the
application without a copy). glibc serves allocations above its mmap threshold
(128 KiB at start) with a fresh ``mmap`` and returns them with ``munmap``, so every
1 MiB piece of a stream costs 256 page faults of freshly zeroed memory: measured here,
0.5–2 ms per MiB, against 0.1 ms for filling memory the process already has. Raising
the mmap threshold (and the trim threshold with it) keeps such buffers on the heap,
where freed pieces are reused.

The cost is memory: up to :data:`TRIM_THRESHOLD_BYTES` of freed heap may stay with
the process instead of returning to the system. Set ``SHUTTLE_MALLOC_TUNING=0`` to
leave the allocator alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

#: Allocations below this come from the heap (glibc's own cap for the dynamic
#: threshold is 32 MiB; frames are at most 16 MiB).
MMAP_THRESHOLD_BYTES = 64 << 20
#: Freed heap kept before glibc trims it back to the system.
TRIM_THRESHOLD_BYTES = 256 << 20

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_done = False


def tune_allocator() -> bool:
    """Apply the tuning once per process (glibc only). Returns whether it applied."""
    global _done
    if _done:
        return True
    if os.environ.get("SHUTTLE_MALLOC_TUNING", "1") == "0":
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune
        return False
    ok = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
    _done = ok
    return ok
