"""Nodes in network namespaces on one bridge, any of which can be cut off.

::

    root namespace: bridge sfb<pid>  198.19.<lab>.1/24   (the tier and its run-time;
                                                         <lab> a /24 no other lab uses)
      └─ veth sf<pid>x<i> ── eth0 198.19.<lab>.<10+i>    namespace shuttle-<pid>-faults<lab>-n<i>

Every node reaches every other node and the root namespace through the bridge.
:meth:`FaultLab.cut` takes a node's bridge port down: its packets go nowhere, in
both directions, while its process and its connections live on (a partition, not
a crash: the other side sees silence, not a refused connection);
:meth:`FaultLab.heal` brings the port back. Names follow :mod:`shuttle.net.netns`
(``shuttle-<pid>-...``), so a lab whose process died is removed by the next one's
:func:`~shuttle.net.netns.cleanup_stale`; so is its bridge.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import subprocess
from types import TracebackType

from shuttle.net.netns import NETNS_PREFIX, cleanup_stale, require_netns

_labs = itertools.count(1)
_BRIDGE = re.compile(r"^sfb([0-9a-f]+)x")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=10)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_bridges() -> None:
    """Bridges of labs whose process died (their namespaces go with cleanup_stale)."""
    for line in _ip("-o", "link", "show", "type", "bridge", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        match = _BRIDGE.match(name)
        if match is not None and not _alive(int(match.group(1), 16)):
            _ip("link", "del", name, check=False)


def _labs_in_use() -> set[int]:
    """The third octets of the 198.19.X.0/24 networks the root namespace has now."""
    out = _ip("-o", "-4", "addr", "show", check=False).stdout
    return {int(m) for m in re.findall(r"inet 198\.19\.(\d+)\.", out)}


def _free_lab(turn: int) -> int:
    """A /24 no other lab is using: two fault runs at once (a ``make test-faults`` beside
    a ``make test``) otherwise both took 198.19.1.0/24 and refused each other's
    connections. Tried from a place set by this process and its turn, so two labs
    starting together rarely try the same one first."""
    used = _labs_in_use()
    start = (os.getpid() * 7 + turn) % 250
    for step in range(250):
        lab = (start + step) % 250 + 1
        if lab not in used:
            return lab
    raise RuntimeError("every 198.19.X.0/24 is in use: remove stale fault labs (ip netns list)")


class FaultLab:
    """``nodes`` namespaces on one bridge (a context manager; root only)."""

    def __init__(self, nodes: int) -> None:
        if not 1 <= nodes <= 200:
            raise ValueError(f"a fault lab holds 1 to 200 nodes, not {nodes}")
        self.count = nodes
        self.lab = _free_lab(next(_labs))
        pid = os.getpid()
        self.bridge = f"sfb{pid:x}x{self.lab:x}"[:15]
        self.bridge_address = f"198.19.{self.lab}.1"
        self.tag = f"{NETNS_PREFIX}-{pid}-faults{self.lab}"
        self.namespaces = [f"{self.tag}-n{i}" for i in range(nodes)]
        self.ports = [f"sf{pid:x}x{self.lab:x}{i:x}"[:15] for i in range(nodes)]
        self.addresses = [f"198.19.{self.lab}.{10 + i}" for i in range(nodes)]
        self.cut_off: set[int] = set()
        self._made: list[str] = []

    def __enter__(self) -> FaultLab:
        require_netns()
        cleanup_stale()
        remove_stale_bridges()
        try:
            self._build()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.teardown()

    def _build(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        self._made.append(f"link:{self.bridge}")
        _ip("addr", "add", f"{self.bridge_address}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for ns, port, address in zip(self.namespaces, self.ports, self.addresses, strict=True):
            _ip("netns", "add", ns)
            self._made.append(f"netns:{ns}")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", port, "master", self.bridge)
            _ip("link", "set", port, "up")
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")

    def prefix(self, index: int) -> list[str]:
        """The command prefix that runs a program inside node ``index``'s namespace."""
        return ["ip", "netns", "exec", self.namespaces[index]]

    def cut(self, index: int) -> None:
        """Node ``index`` is cut off from everyone (its process runs on)."""
        _ip("link", "set", self.ports[index], "down")
        self.cut_off.add(index)

    def heal(self, index: int) -> None:
        _ip("link", "set", self.ports[index], "up")
        self.cut_off.discard(index)

    def teardown(self) -> None:
        for made in reversed(self._made):
            kind, name = made.split(":", 1)
            if kind == "netns":
                pids = _ip("netns", "pids", name, check=False).stdout.split()
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid), 9)
                _ip("netns", "del", name, check=False)
            else:
                _ip("link", "del", name, check=False)
        self._made.clear()
