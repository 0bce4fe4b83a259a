"""One suite for every registered validation mode: readers against a concurrent writer.

Each mode states how fresh an open is (``ValidationMode.staleness_s``,
docs/consistency.md): the data an open returns is no older than the version the
node had ``staleness_s`` before the open began (0: at the moment it began). The writer
puts versions whose contents carry their number; before each open a reader notes the
newest version whose put had returned, and every read that completes (no typed
"it changed" error) must return one whole version no older than that. A mode
registered later joins the suite by being in ``MODES``.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

import shuttle
from shuttle.client.validation import MODES
from shuttle.errors import VersionMismatchError
from tests.integration.nodeproc import NodeProcess

#: Versions the writer puts: enough for reads to overlap many writes.
VERSIONS = 80
#: Object size: several client cache blocks (64 KiB), so a read spans blocks.
OBJECT_BYTES = 200 << 10
READERS = 3
#: Bound on the whole run (the writer normally finishes well before).
RUN_S_MAX = 20.0


def _contents(version: int) -> bytes:
    stamp = f"{version:08d}".encode()
    return stamp * (OBJECT_BYTES // len(stamp))


def _version_of(data: bytes) -> int:
    stamp = data[:8]
    assert data == stamp * (len(data) // 8), "a read mixed two versions"
    return int(stamp)


@dataclass
class History:
    """When each put returned (monotonic seconds), in order."""

    times: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def completed(self, version: int) -> None:
        with self.lock:
            self.times.append(time.monotonic())
            self.versions.append(version)

    def floor(self, at: float) -> int:
        """The newest version whose put had returned by time ``at`` (0: none)."""
        with self.lock:
            i = bisect.bisect_right(self.times, at)
            return self.versions[i - 1] if i else 0


@pytest.fixture(params=sorted(MODES))
def mode(request: pytest.FixtureRequest) -> Iterator[str]:
    yield request.param


@pytest.mark.parametrize("shared", [False, True], ids=["client-per-reader", "shared-client"])
def test_no_read_is_older_than_the_mode_allows(node: NodeProcess, mode: str, shared: bool) -> None:
    """Readers in clients of their own, or threads of one client (sharing its cache)."""
    setup = shuttle.connect(node=node.address)
    setup.put("obj", _contents(1))
    history = History()
    history.completed(1)
    done = threading.Event()
    failures: list[str] = []
    reads: list[int] = []
    reported: list[int] = []

    def writer() -> None:
        client = shuttle.connect(node=node.address)
        try:
            for version in range(2, VERSIONS + 1):
                client.put("obj", _contents(version))
                history.completed(version)
        finally:
            done.set()
            client.close()

    common = shuttle.connect(node=node.address, validation=mode)

    def reader() -> None:
        client = common if shared else shuttle.connect(node=node.address, validation=mode)
        staleness_s = client.validation_mode().staleness_s
        n = stale_reported = 0
        try:
            while not done.is_set():
                began = time.monotonic()
                floor = history.floor(began - staleness_s)
                try:
                    with client.open("obj") as f:
                        data = f.read()
                except VersionMismatchError:  # the mode said the copy changed: allowed
                    stale_reported += 1
                    continue
                got = _version_of(data)
                n += 1
                if got < floor:
                    failures.append(f"{mode}: read version {got} after {floor} was written")
        except Exception as exc:
            failures.append(f"{mode}: reader failed: {exc!r}")
        finally:
            reads.append(n)
            reported.append(stale_reported)
            if client is not common:
                client.close()

    threads = [threading.Thread(target=writer)]
    threads += [threading.Thread(target=reader) for _ in range(READERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(RUN_S_MAX)
    setup.close()
    common.close()
    assert not any(t.is_alive() for t in threads), "the run did not finish"
    assert not failures, failures[:5]
    assert sum(reads) >= READERS, f"{mode}: too few reads to judge ({reads})"
