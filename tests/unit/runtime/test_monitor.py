"""The resource monitor against objects whose costs are known, through the binding
manager's local call path (no network: every object runs in this process)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from shuttle.net.cpu import burn_cpu
from shuttle.runtime.binding import BindingManager
from shuttle.runtime.config import RuntimeConfig
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.mobile import MobileObject
from shuttle.runtime.monitor import ResourceMonitor
from shuttle.runtime.peers import Peers
from shuttle.runtime.refs import Ref
from shuttle.testing import FakeClock

BLOCK = 10_000
CPU_PER_BYTE_S = 2e-6  # 20 ms per block


class Source(MobileObject):
    """Returns blocks of BLOCK bytes and uses (almost) no CPU."""

    def __init__(self) -> None:
        self.sent = 0

    def block(self) -> bytes:
        self.sent += 1
        return b"x" * BLOCK


class KnownFilter(MobileObject):
    """Burns CPU_PER_BYTE_S per byte read from ``source`` and passes ``fraction``."""

    def __init__(self, source: Ref, fraction: float) -> None:
        self.source = source
        self.fraction = fraction

    def next(self) -> bytes:
        data: bytes = self.source.block()
        burn_cpu(CPU_PER_BYTE_S * len(data))
        return data[: int(len(data) * self.fraction)]


@pytest.fixture
def bm() -> Any:
    clock = FakeClock()
    monitor = ResourceMonitor(window_s=1.0, clock=clock)
    with ThreadPoolExecutor(2) as pool:
        manager = BindingManager(
            "c1", config=RuntimeConfig(), peers=Peers(), monitor=monitor, executor=pool
        )
        manager.clock = clock  # type: ignore[attr-defined]
        yield manager


def make(bm: BindingManager, cls: type[MobileObject], **params: Any) -> Ref:
    rid = bm.new_id()
    bm.host_new(rid, "", cls, "", None, params, "auto")
    return bm.ref(rid, "127.0.0.1:1")


def test_cpu_and_bytes_of_a_filter_with_known_costs(bm: BindingManager) -> None:
    source = make(bm, Source)
    filt = make(bm, KnownFilter, source=source, fraction=0.25)
    console = str(ObjectId("c1", "console-t"))
    with bm.monitor.console(console):
        for _ in range(5):
            assert len(filt.next()) == BLOCK // 4
    window = bm.monitor.window()
    f = window.objects[str(filt.rid)]
    s = window.objects[str(source.rid)]
    assert f.calls == 5 and s.calls == 5
    # The filter burned 5 × 20 ms of its own CPU; the source's time is not charged to it.
    assert f.cpu_s >= 0.8 * 5 * BLOCK * CPU_PER_BYTE_S
    assert s.cpu_s < 0.25 * f.cpu_s
    # Edges: console -> filter carries the passed quarter up; filter -> source the blocks.
    up = window.edges[(console, str(filt.rid))]
    down = window.edges[(str(filt.rid), str(source.rid))]
    assert (up.calls, up.bytes_up, up.remote) == (5, 5 * BLOCK // 4, False)
    assert (down.calls, down.bytes_up) == (5, 5 * BLOCK)


def test_a_slower_node_burns_in_proportion_and_the_monitor_sees_it(bm: BindingManager) -> None:
    bm.burn_ratio = 1.0  # a node at half speed
    source = make(bm, Source)
    filt = make(bm, KnownFilter, source=source, fraction=0.5)
    filt.next()
    cpu = bm.monitor.window().objects[str(filt.rid)].cpu_s
    assert cpu >= 0.8 * 2 * BLOCK * CPU_PER_BYTE_S


def test_the_window_forgets_what_is_older_than_h(bm: BindingManager) -> None:
    clock: FakeClock = bm.clock  # type: ignore[attr-defined]
    source = make(bm, Source)
    with bm.monitor.console("c1/console-w"):
        source.block()
        bm.monitor.tick()
        clock.jump(0.6)
        bm.monitor.tick()
        source.block()
        clock.jump(0.6)  # the first call is now 1.2 s old, older than H = 1 s
        window = bm.monitor.window()
    # The window starts at the newest snapshot at least H old (taken at 0 s, after the
    # first call): it covers 1.2 s and holds only the second call.
    assert window.objects[str(source.rid)].calls == 1
    assert window.span_s == pytest.approx(1.2)


def test_a_call_that_raises_is_still_counted_and_the_error_names_the_object(
    bm: BindingManager,
) -> None:
    class Broken(MobileObject):
        def boom(self) -> None:
            raise ValueError("bad block")

    broken = make(bm, Broken)
    from shuttle.errors import ObjectFailedError

    with pytest.raises(ObjectFailedError, match=r"\.boom raised ValueError: bad block"):
        broken.boom()
    assert bm.monitor.window().objects[str(broken.rid)].calls == 1


def test_an_object_younger_than_the_window_is_observed_only_since_it_appeared(
    bm: BindingManager,
) -> None:
    clock: FakeClock = bm.clock  # type: ignore[attr-defined]
    old = make(bm, Source)
    with bm.monitor.console("c1/console-a"):
        old.block()
        bm.monitor.tick()
        clock.jump(0.7)
        young = make(bm, Source)
        young.block()
        clock.jump(0.3)
        old.block()
        window = bm.monitor.window()
    assert window.span_s == pytest.approx(1.0)
    assert window.active_s[str(young.rid)] == pytest.approx(0.3)
    assert str(old.rid) not in window.active_s  # there the whole window


def test_forgotten_counters_start_again_from_zero(bm: BindingManager) -> None:
    """An object that moves away and comes back must not show the counts it had
    before it left subtracted from new ones (negative calls, negative bytes)."""
    clock: FakeClock = bm.clock  # type: ignore[attr-defined]
    source = make(bm, Source)
    for _ in range(5):
        source.block()
    bm.monitor.tick()  # this snapshot (5 calls) becomes the window's base...
    clock.jump(1.5)
    bm.monitor.forget(str(source.rid))  # ...and must forget the object too
    source.block()
    counts = bm.monitor.window().objects[str(source.rid)]
    assert counts.calls == 1 and counts.bytes_out == BLOCK
