"""Small synthetic traces for the simulator's tests (the real ones come from traces/)."""

from __future__ import annotations

import random

from shuttle.traces.record import Op, TraceRecord

#: The background mix: 87% metadata requests (section 3.3.1), reads beside writes.
_OPS = [Op.GETATTR] * 60 + [Op.LOOKUP] * 20 + [Op.SETATTR] * 7 + [Op.READ] * 10 + [Op.WRITE] * 3


def background(
    duration_s: float, rate_per_s: float, seed: int, files: int = 3000
) -> list[TraceRecord]:
    """Poisson requests over ``files`` files with a skewed popularity, 8 KB blocks."""
    rng = random.Random(seed)
    records: list[TraceRecord] = []
    now = 0.0
    while True:
        now += rng.expovariate(rate_per_s)
        if now >= duration_s:
            return records
        op = rng.choice(_OPS)
        file = int(rng.paretovariate(0.8)) % files
        block = rng.randrange(8)
        records.append(TraceRecord(now, rng.randrange(20), op, f"f{file}", block * 8192, 8192))


def search(files: int, blocks_per_file: int, think_s: float = 0.001) -> list[TraceRecord]:
    """A grep-like pass: open, read every block sequentially, close; think between."""
    records: list[TraceRecord] = []
    now = 0.0
    for f in range(files):
        records.append(TraceRecord(now, 0, Op.OPEN, f"src/{f}.c"))
        for b in range(blocks_per_file):
            now += think_s
            records.append(TraceRecord(now, 0, Op.READ, f"src/{f}.c", b * 8192, 8192))
        records.append(TraceRecord(now, 0, Op.CLOSE, f"src/{f}.c"))
    return records
