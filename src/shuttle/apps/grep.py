"""``shuttle grep``: search objects with a grep object per node, placed as asked.

For each node holding some of the keys, the application (its console) makes a
``grep`` object reading through that node's storage object and calls ``next`` until
it is done, printing matching lines as ``key:line:text``. Where the object runs is
the placement: ``client`` and ``server`` pin it there; ``auto`` starts it at the
client and lets the node's resource manager move it when that pays. Stacks of
different nodes run concurrently, each in its own thread and console.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from shuttle.client.client import Client
from shuttle.errors import InvalidArgumentError, NotFoundError
from shuttle.objects.grep import BATCH_BYTES_DEFAULT
from shuttle.objects.lines import BLOCK_BYTES_DEFAULT
from shuttle.runtime.client import Runtime

PLACEMENTS = ("client", "server", "auto")

Match = list[Any]  # [key, line number, line bytes]


@dataclass
class GrepResult:
    """What a grep run did (``--json``)."""

    pattern: str
    placement: str
    keys: int
    matches: int = 0
    scanned_bytes: int = 0
    elapsed_s: float = 0.0
    #: Where each node's grep object ran at the start and at the end.
    initial: dict[str, str] = field(default_factory=dict)
    final: dict[str, str] = field(default_factory=dict)
    migrations: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "pattern": self.pattern,
            "placement": self.placement,
            "keys": self.keys,
            "matches": self.matches,
            "scanned_bytes": self.scanned_bytes,
            "elapsed_s": round(self.elapsed_s, 6),
            "initial_placement": self.initial,
            "final_placement": self.final,
            "migrations": self.migrations,
        }


def expand_keys(client: Client, keys: Sequence[str]) -> list[str]:
    """Keys as given, with each ``prefix/`` (ending in a slash) replaced by the keys
    under it, across all nodes, in order. A key that does not exist fails early."""
    out: list[str] = []
    for key in keys:
        if key.endswith("/"):
            found = client.list(key)
            if not found:
                raise NotFoundError(f"no objects under {key!r}; `shuttle ls {key}` lists them")
            out += found
        else:
            client.stat(key)
            out.append(key)
    return list(dict.fromkeys(out))


def _where(rt: Runtime, node: str, location: str) -> str:
    return (
        "client" if location == rt.id else f"server ({location})" if location == node else location
    )


def run_grep(
    rt: Runtime,
    pattern: str,
    keys: Sequence[str],
    *,
    placement: str = "auto",
    ignore_case: bool = False,
    block_bytes: int = BLOCK_BYTES_DEFAULT,
    batch_bytes: int = BATCH_BYTES_DEFAULT,
    on_matches: Callable[[list[Match]], None] = lambda _m: None,
) -> GrepResult:
    """Search ``keys`` for ``pattern``; ``on_matches`` gets each batch of matching
    lines (from any thread, one batch at a time)."""
    if placement not in PLACEMENTS:
        raise InvalidArgumentError(f"--placement must be one of {', '.join(PLACEMENTS)}")
    by_node: dict[str, list[str]] = {}
    for key in keys:
        by_node.setdefault(rt.node_for(key), []).append(key)
    result = GrepResult(pattern, placement, len(keys))
    lock = threading.Lock()
    failures: list[BaseException] = []
    t0 = time.monotonic()
    wall0 = time.time()
    refs = {}
    for node, node_keys in by_node.items():
        refs[node] = rt.create(
            "grep",
            at=node if placement == "server" else None,
            placement="auto" if placement == "auto" else "static",
            pattern=pattern,
            storage=rt.storage(node),
            keys=node_keys,
            ignore_case=ignore_case,
            block_bytes=block_bytes,
            batch_bytes=batch_bytes,
        )
        result.initial[node] = _where(rt, node, rt.where(refs[node]))

    def scan(node: str) -> None:
        grep = refs[node]
        try:
            with rt.console(f"grep-{node}"):
                done = False
                while not done:
                    done, matches = grep.next()
                    if matches:
                        with lock:
                            result.matches += len(matches)
                            on_matches(matches)
            progress = grep.progress()
            with lock:
                result.scanned_bytes += int(progress["scanned_bytes"])
        except BaseException as exc:  # reported to the caller below
            failures.append(exc)

    threads = [threading.Thread(target=scan, args=(node,), name=f"grep {node}") for node in refs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result.elapsed_s = time.monotonic() - t0
    if failures:
        raise failures[0]
    mine = {str(ref.rid) for ref in refs.values()}
    for node, ref in refs.items():
        result.final[node] = _where(rt, node, rt.where(ref))
    for event in rt.events:
        if event.rid in mine and event.ok:
            result.migrations.append(
                {
                    "t_s": round(event.t - wall0, 3),
                    "object": event.rid,
                    "from": event.source,
                    "to": event.target,
                    "direction": "to_client" if event.target == rt.id else "to_server",
                    "reason": event.reason,
                    "elapsed_s": round(event.elapsed_s, 4),
                }
            )
    return result
