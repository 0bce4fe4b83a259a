"""Cache policies for block keys: a registry of interchangeable strategies.

:data:`POLICIES` (``lru``, ``fifo``, ``clock``) share one constructor shape and one
test suite (``tests/unit/sim/test_replay.py``, against textbook reference models,
access by access). Each has a per-access :meth:`CachePolicy.access` and a tight
:meth:`CachePolicy.replay` loop over many accesses; both must give the same hits.

Which LRUs in Shuttle are this one (``docs/simulator.md``, "One LRU"): cache replay
and the mobile application's client cache use :class:`LRU`; the server model's
block cache keeps its own ordered dict because it also locks blocks during I/O and
its loop is the simulator's hottest (tested to give exactly this LRU's hits when no
requests overlap); the warm-up computes the same contents for every size at once
as an LRU stack in numpy (tested against this LRU).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Sequence
from typing import ClassVar

from shuttle.errors import ConfigError


class CachePolicy(ABC):
    """A cache of ``capacity_blocks`` blocks keyed by int. Subclasses set ``name``."""

    name: ClassVar[str]
    description: ClassVar[str]

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 1:
            raise ConfigError(f'"size" must be at least 1 block, got {capacity_blocks}')
        self.capacity_blocks = capacity_blocks

    @abstractmethod
    def access(self, key: int) -> bool:
        """Access one block; True on a hit. A miss inserts it (evicting if full)."""

    @abstractmethod
    def replay(self, keys: Sequence[int], reads: Sequence[bool]) -> tuple[int, int]:
        """Access every key in order; return (hits, hits among accesses that are reads)."""

    @abstractmethod
    def contents(self) -> list[int]:
        """The cached blocks, in the policy's eviction order (next victim first)."""

    def __len__(self) -> int:
        return len(self.contents())


POLICIES: dict[str, type[CachePolicy]] = {}


def register(cls: type[CachePolicy]) -> type[CachePolicy]:
    """Class decorator: make a policy available by its ``name``."""
    POLICIES[cls.name] = cls
    return cls


def make_policy(name: str, capacity_blocks: int) -> CachePolicy:
    """A fresh policy; :class:`ConfigError` lists the known names."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ConfigError(
            f"unknown cache policy {name!r}; expected one of {', '.join(sorted(POLICIES))}"
        ) from None
    return cls(capacity_blocks)


@register
class LRU(CachePolicy):
    """Least recently used: a hit moves the block to the most recently used end."""

    name = "lru"
    description = "least recently used"

    def __init__(self, capacity_blocks: int) -> None:
        super().__init__(capacity_blocks)
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def access(self, key: int) -> bool:
        blocks = self._blocks
        if key in blocks:
            blocks.move_to_end(key)
            return True
        blocks[key] = None
        if len(blocks) > self.capacity_blocks:
            blocks.popitem(last=False)
        return False

    def replay(self, keys: Sequence[int], reads: Sequence[bool]) -> tuple[int, int]:
        # The loop is the whole cost of a replay: bound methods in locals, a counter
        # instead of len() (about 4 M accesses/s here; see benchmarks/README.md).
        blocks = self._blocks
        touch = blocks.move_to_end
        evict = blocks.popitem
        room = self.capacity_blocks - len(blocks)
        hits = read_hits = 0
        for key, read in zip(keys, reads, strict=True):
            if key in blocks:
                touch(key)
                hits += 1
                if read:
                    read_hits += 1
            else:
                blocks[key] = None
                if room > 0:
                    room -= 1
                else:
                    evict(False)
        return hits, read_hits

    def contents(self) -> list[int]:
        return list(self._blocks)


@register
class FIFO(CachePolicy):
    """First in, first out: hits do not change the eviction order."""

    name = "fifo"
    description = "first in, first out"

    def __init__(self, capacity_blocks: int) -> None:
        super().__init__(capacity_blocks)
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def access(self, key: int) -> bool:
        blocks = self._blocks
        if key in blocks:
            return True
        blocks[key] = None
        if len(blocks) > self.capacity_blocks:
            blocks.popitem(last=False)
        return False

    def replay(self, keys: Sequence[int], reads: Sequence[bool]) -> tuple[int, int]:
        blocks = self._blocks
        evict = blocks.popitem
        room = self.capacity_blocks - len(blocks)
        hits = read_hits = 0
        for key, read in zip(keys, reads, strict=True):
            if key in blocks:
                hits += 1
                if read:
                    read_hits += 1
            else:
                blocks[key] = None
                if room > 0:
                    room -= 1
                else:
                    evict(False)
        return hits, read_hits

    def contents(self) -> list[int]:
        return list(self._blocks)


@register
class Clock(CachePolicy):
    """CLOCK (second chance): a hit sets the block's reference bit; the hand clears
    set bits as it passes and evicts the first block whose bit is clear. A block
    enters with its bit clear (libCacheSim's ``Clock`` with its defaults)."""

    name = "clock"
    description = "CLOCK / second chance, one reference bit"

    def __init__(self, capacity_blocks: int) -> None:
        super().__init__(capacity_blocks)
        self._slot: dict[int, int] = {}
        self._keys: list[int] = []
        self._ref = bytearray(capacity_blocks)
        self._hand = 0

    def access(self, key: int) -> bool:
        hits, _ = self.replay((key,), (False,))
        return hits == 1

    def replay(self, keys: Sequence[int], reads: Sequence[bool]) -> tuple[int, int]:
        slot, ring, ref = self._slot, self._keys, self._ref
        cap = self.capacity_blocks
        hand = self._hand
        hits = read_hits = 0
        for key, read in zip(keys, reads, strict=True):
            at = slot.get(key)
            if at is not None:
                ref[at] = 1
                hits += 1
                if read:
                    read_hits += 1
            elif len(ring) < cap:
                slot[key] = len(ring)
                ring.append(key)
            else:
                while ref[hand]:
                    ref[hand] = 0
                    hand = hand + 1 if hand + 1 < cap else 0
                del slot[ring[hand]]
                ring[hand] = key
                slot[key] = hand
                hand = hand + 1 if hand + 1 < cap else 0
        self._hand = hand
        return hits, read_hits

    def contents(self) -> list[int]:
        ring = self._keys
        if len(ring) < self.capacity_blocks:
            return list(ring)
        return ring[self._hand :] + ring[: self._hand]
