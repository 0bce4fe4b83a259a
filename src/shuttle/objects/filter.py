"""``filter``: ABACUS's synthetic filter (section 6.3), with its two knobs as parameters.

Each :meth:`SyntheticFilter.next` reads one block of its object through the storage
reference, spends ``cpu_s_per_mb`` CPU seconds per MiB of it (a busy loop on the
thread's CPU clock, so it costs a core exactly as real work would, and a slower node
multiplies it), and passes the first ``pass_fraction`` of the block up. The paper's
*selectivity* is ``1 - pass_fraction``: a filter of high selectivity passes 20 %.

It declares ``memory_bytes`` of memory, which the placement model counts against a
node's memory for hosted objects (the competition experiment allows one filter).

With ``wrap=True`` it starts again at the object's first byte when it reaches the end,
so a client can call it as an endless stream (``shuttle bench abacus mix``: many
clients, each calling its filters for as long as a pass lasts).
"""

from __future__ import annotations

from shuttle.errors import InvalidArgumentError
from shuttle.net.cpu import burn_cpu
from shuttle.objects.lines import BLOCK_BYTES_DEFAULT, check_block_bytes
from shuttle.runtime.mobile import MobileObject, builtin
from shuttle.runtime.refs import Ref

#: Memory a filter declares by default (its buffers in the paper's setting).
MEMORY_BYTES_DEFAULT = 8 << 20


@builtin("filter")
class SyntheticFilter(MobileObject):
    """Pass ``pass_fraction`` of ``key``'s bytes, burning ``cpu_s_per_mb`` per MiB read."""

    def __init__(
        self,
        storage: Ref,
        key: str,
        *,
        pass_fraction: float = 0.2,
        cpu_s_per_mb: float = 0.0,
        block_bytes: int = BLOCK_BYTES_DEFAULT,
        memory_bytes: int = MEMORY_BYTES_DEFAULT,
        wrap: bool = False,
    ) -> None:
        if not 0.0 <= pass_fraction <= 1.0:
            raise InvalidArgumentError(f"pass_fraction must be in 0..1, got {pass_fraction!r}")
        if not cpu_s_per_mb >= 0.0:
            raise InvalidArgumentError(f"cpu_s_per_mb must be ≥ 0, got {cpu_s_per_mb!r}")
        self.storage = storage
        self.key = key
        self.pass_fraction = float(pass_fraction)
        self.cpu_s_per_mb = float(cpu_s_per_mb)
        self.block_bytes = check_block_bytes(block_bytes)
        self.footprint_bytes = int(memory_bytes)
        self.wrap = bool(wrap)
        self.offset = 0
        self.blocks = 0
        self.passed_bytes = 0

    def next(self) -> bytes:
        """The passed part of the next block; ``b""`` at the end of the object (with
        ``wrap``: the first block again, and ``b""`` only for an empty object)."""
        data: bytes = self.storage.read(self.key, self.offset, self.block_bytes)
        if not data and self.wrap and self.offset:
            self.offset = 0
            data = self.storage.read(self.key, 0, self.block_bytes)
        if not data:
            return b""
        self.offset += len(data)
        self.blocks += 1
        if self.cpu_s_per_mb:
            burn_cpu(self.cpu_s_per_mb * len(data) / (1 << 20))
        keep = round(len(data) * self.pass_fraction)
        if keep == 0 and self.pass_fraction > 0:
            keep = 1  # a filter that passes anything passes something of every block
        self.passed_bytes += keep
        return data[:keep]

    def progress(self) -> dict[str, int]:
        return {"offset": self.offset, "blocks": self.blocks, "passed_bytes": self.passed_bytes}

    def memory_bytes(self) -> int:
        return self.footprint_bytes
