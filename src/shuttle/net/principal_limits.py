"""How much of one node each principal may hold: connections, requests in flight and
hosted objects (docs/security.md, "Principals and capabilities", *Load*).

Caps say what a principal may touch, not how much. Without these limits one principal
(one key, however many client processes hold it) could take every connection the node
serves, every request slot and every object the run-time hosts, and keep every other
principal out. So each principal has its own share of each, and principals together
have a node-wide bound for the two resources that had none (requests in flight and
hosted objects; connections already have ``--connections-max``):

* a principal at its own limit is refused with ``busy`` (:class:`NodeBusyError`,
  exit 8) naming the limit, the flag that sets it and what to do; the other
  principals are not affected;
* principals together past the node-wide bound are refused the same way.

The cluster key's connections (the administrator's and the nodes' own work) are
neither limited nor counted: the administrator must always get through to remove a
principal that misbehaves, and a node's run-time must reach its peers. Counting costs
a principal's request one dictionary update each way; the cluster key's none.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any, Final

from shuttle.errors import ConfigError, NodeBusyError

#: Connections one principal may hold on a node, at most (fitted to a quarter of the
#: connection cap, :meth:`PrincipalLimits.connections_for`). A client process keeps a
#: pool of a few connections per node, so 1,024 serve hundreds of one principal's
#: processes at once; a quarter of the cap leaves three quarters for the others.
PRINCIPAL_CONNECTIONS_MAX: Final = 1024

#: Requests of one principal in flight on a node at once (taken and not yet answered,
#: over all its connections; answered-at-once reads from the block cache never count).
#: A client in callback mode keeps one long poll (``callback.wait``) in flight per node
#: all the time, so this is also how many of one principal's clients may hold callback
#: sessions on a node: as many as its connections (1,024); a stream keeps 8 in flight.
PRINCIPAL_REQUESTS_MAX: Final = 1024

#: Requests of all principals in flight on a node at once: one long poll per connection
#: the node serves (16,384), with room for streams. A store request beyond the two a
#: connection runs waits in its socket, not here; what waits here is a task and its
#: arguments (a write's payload while it waits on a callback break).
REQUESTS_MAX: Final = 32_768

#: Mobile objects one principal may have hosted on a node (made there or moved there).
#: A shipped object is a worker process in a jail, a built-in one a few KB to MBs of
#: state: 64 is a long pipeline of filters per application and several applications.
PRINCIPAL_OBJECTS_MAX: Final = 64

#: Mobile objects of all principals hosted on a node. A jailed worker costs a process
#: and its memory limit (``--sandbox-memory``); 1,024 is what a node can run at all.
OBJECTS_MAX: Final = 1024


@dataclass(frozen=True, slots=True)
class PrincipalLimits:
    """The limits one node enforces per principal (flags of ``shuttle serve``)."""

    #: Connections per principal (None: fitted to a quarter of the connection cap).
    connections: int | None = None
    requests: int = PRINCIPAL_REQUESTS_MAX
    requests_total: int = REQUESTS_MAX
    objects: int = PRINCIPAL_OBJECTS_MAX
    objects_total: int = OBJECTS_MAX

    def __post_init__(self) -> None:
        for flag, value in (
            ("--principal-connections-max", self.connections),
            ("--principal-requests-max", self.requests),
            ("--requests-max", self.requests_total),
            ("--principal-objects-max", self.objects),
            ("--objects-max", self.objects_total),
        ):
            if value is not None and value < 1:
                raise ConfigError(f"{flag} must be ≥ 1, got {value}")
        if self.requests > self.requests_total or self.objects > self.objects_total:
            raise ConfigError(
                "a principal's limit cannot be above the node's: --principal-requests-max "
                f"{self.requests} ≤ --requests-max {self.requests_total} and "
                f"--principal-objects-max {self.objects} ≤ --objects-max {self.objects_total}"
            )

    def connections_for(self, connections_max: int) -> int:
        """Connections one principal may hold on a node serving ``connections_max``."""
        if self.connections is not None:
            return max(1, min(self.connections, connections_max))
        return max(1, min(PRINCIPAL_CONNECTIONS_MAX, connections_max // 4))


class PrincipalLoad:
    """What the principals hold on one node, counted against :class:`PrincipalLimits`.

    :meth:`take` raises :class:`NodeBusyError` (nothing taken) past a limit;
    :meth:`give_back` returns what :meth:`take` gave. Thread-safe: objects are made on
    the pool's threads, connections and requests are counted on the event loop.
    """

    def __init__(self, limits: PrincipalLimits, node_id: str, connections_max: int) -> None:
        self.limits = limits
        self.node_id = node_id
        self._lock = threading.Lock()
        #: What each principal holds, by kind (plain dicts: a request's count is two
        #: lookups and a store, a few hundred nanoseconds).
        self._held: dict[str, dict[str, int]] = {k: {} for k in _WHAT}
        self._totals: dict[str, int] = dict.fromkeys(_WHAT, 0)
        #: Refusals by kind (``node.stats``).
        self.refused: Counter[str] = Counter()
        self._own: dict[str, int] = {}
        self._node_wide: dict[str, int | None] = {}
        self.fit(connections_max)

    def fit(self, connections_max: int) -> None:
        """Fit the connection share to the node's connection cap (known at start)."""
        lim = self.limits
        self.connections_max = lim.connections_for(connections_max)
        self._own = {
            "connections": self.connections_max,
            "requests": lim.requests,
            "objects": lim.objects,
        }
        self._node_wide = {
            "connections": None,  # the node's --connections-max counts every connection
            "requests": lim.requests_total,
            "objects": lim.objects_total,
        }

    def take(self, kind: str, name: str) -> None:
        """Count one more ``kind`` ("connections", "requests", "objects") for principal
        ``name``; :class:`NodeBusyError` if that would pass its limit or the node's."""
        held = self._held[kind]
        with self._lock:
            n = held.get(name, 0)
            total = self._totals[kind]
            self._check(kind, name, n, total)
            held[name] = n + 1
            self._totals[kind] = total + 1

    def check(self, kind: str, name: str, held: int, total: int) -> None:
        """Refuse (:class:`NodeBusyError`) one more ``kind`` for principal ``name``, who
        holds ``held`` of the ``total`` all principals hold, if that passes a limit:
        for what is counted elsewhere (hosted objects: the run-time's table)."""
        self._check(kind, name, held, total)

    def _check(self, kind: str, name: str, held: int, total: int) -> None:
        own = self._own[kind]
        if held >= own:
            self.refused[kind] += 1
            raise NodeBusyError(_refusal(kind, name, own, _FLAGS[kind][0], self.node_id))
        node_wide = self._node_wide[kind]
        if node_wide is not None and total >= node_wide:
            self.refused[kind] += 1
            raise NodeBusyError(
                _refusal_total(kind, name, node_wide, _FLAGS[kind][1], held, self.node_id)
            )

    def give_back(self, kind: str, name: str) -> None:
        held = self._held[kind]
        with self._lock:
            n = held.get(name, 0)
            if n <= 0:
                raise AssertionError(f"{kind} of principal {name!r} given back twice")
            if n == 1:
                del held[name]
            else:
                held[name] = n - 1
            self._totals[kind] -= 1

    def held(self, kind: str, name: str) -> int:
        return self._held[kind].get(name, 0)

    def stats(self) -> dict[str, Any]:
        lim = self.limits
        with self._lock:
            top = {k: dict(Counter(c).most_common(5)) for k, c in self._held.items()}
            totals = dict(self._totals)
        return {
            "limits": {
                "connections": self.connections_max,
                "requests": lim.requests,
                "requests_total": lim.requests_total,
                "objects": lim.objects,
                "objects_total": lim.objects_total,
            },
            "held_total": totals,
            "held_top": top,
            "refused": dict(self.refused),
        }


_WHAT: Final = {
    "connections": "connections",
    "requests": "requests in flight",
    "objects": "hosted objects",
}

_FLAGS: Final = {
    "connections": ("--principal-connections-max", "--connections-max"),
    "requests": ("--principal-requests-max", "--requests-max"),
    "objects": ("--principal-objects-max", "--objects-max"),
}

_ADVICE: Final = {
    "connections": "close idle connections (or share one client's pool among threads)",
    "requests": "wait for answers before sending more",
    "objects": "end objects it no longer needs",
}


def _refusal(kind: str, name: str, limit: int, flag: str, node_id: str) -> str:
    return (
        f"principal {name!r} holds its most {_WHAT[kind]} on node {node_id} ({limit}, "
        f"{flag}); {_ADVICE[kind]}, or ask the node's operator to raise {flag}. Other "
        "principals are not affected"
    )


def _refusal_total(
    kind: str, name: str, limit: int, flag: str | None, held: int, node_id: str
) -> str:
    return (
        f"node {node_id} holds its most {_WHAT[kind]} of all principals together "
        f"({limit}, {flag}); principal {name!r} holds {held} of them. Retry shortly, or ask "
        f"the node's operator to raise {flag}"
    )
