"""One rule for the whole cluster: a name is a key or a directory, never both.

Keys are flat strings, and every face (the mount, ``shuttle://``, ``shuttle ls``)
shows ``/`` as a directory separator, so ``csv`` (an object) and ``csv/part1.csv``
(an object in directory ``csv``) cannot both be shown. A node refuses the second of
such a pair when both keys are its own (``key_conflict``: its objects are files, and
a path cannot be a file and a directory). Keys are spread over the nodes by a hash
of the whole key, though, so ``csv`` and ``csv/part1.csv`` usually live on two
nodes, and neither node sees the clash.

So the rule is checked where it can be:

* a node, for the keys it holds (always, atomically);
* a client that creates a key through the CLI (``shuttle put``) or a face
  (``shuttle://``, ``mkdir``) first asks the cluster with :meth:`Namespace.check_new_key`:
  is any parent of the key an object, or is any key under ``key/``? One round trip
  to every node, in parallel. The mount needs no extra question: the kernel looks
  every name of a path up before it creates one, and a lookup answers exactly that.

Two clients creating ``a`` and ``a/b`` at the same instant on two nodes can still
both succeed (the check and the create are two steps, and there is no cluster-wide
lock). Readers then see the object and not the directory (:data:`OBJECT_WINS`), so
a listing never fails: ``shuttle get a`` or ``rm a`` resolves it. The library's own
``Client.put`` does not ask (it would cost every small put a round trip to every
node); programs that build directory trees call :meth:`check_new_key` first.

A principal (docs/security.md) that may not read a parent's name cannot learn whether
it is an object, and the check skips that parent rather than refuse a put the
principal may make: it sees what its read capability shows, as every listing does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, TypeVar

from shuttle.client.model import NodeAddress
from shuttle.errors import KeyConflictError, NotFoundError, NotPermittedError

if TYPE_CHECKING:
    from shuttle.client.client import Client

_T = TypeVar("_T")

#: When a name is both an object and a directory (two clients raced, or keys written
#: by a program that skipped the check), readers show the object: a lookup asks the
#: key's node first and stops there, so a listing that showed the directory would
#: name something a lookup cannot reach.
OBJECT_WINS = True


def parent_keys(key: str) -> list[str]:
    """Every proper prefix of ``key`` at a ``/``: ``a/b/c`` has parents ``a`` and ``a/b``."""
    parts = key.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


class Namespace:
    """Questions about names that every node must answer, asked of all nodes at once
    (one thread per node, each with its own connections, so the answer costs one
    round trip however many nodes there are)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def close(self) -> None:
        """Stop the threads that ask the nodes (the client stays usable)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def on_every_node(self, ask: Callable[[NodeAddress], _T]) -> list[_T]:
        """``ask(node)`` for every node of the cluster, in parallel; results in node order."""
        nodes = self.client.nodes
        if len(nodes) == 1:
            return [ask(nodes[0])]
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(len(nodes), thread_name_prefix="shuttle-names")
            pool = self._pool
        return list(pool.map(ask, nodes))

    def first_keys(self, prefix: str, limit: int) -> list[list[str]]:
        """Up to ``limit`` keys under ``prefix`` from each node, asked all at once."""

        def ask(node: NodeAddress) -> list[str]:
            args = {"prefix": prefix, "limit": limit}
            return [str(k) for k in self.client.call(node, "list", args).result["keys"]]

        return self.on_every_node(ask)

    def check_new_key(self, key: str) -> None:
        """Raise :class:`KeyConflictError` if creating ``key`` would break the rule: a
        parent of ``key`` is an object (``a`` when creating ``a/b``), or ``key`` is a
        directory (some key starts with ``key/``). One round trip to every node, in
        parallel: each is asked for its first key under ``key/`` and about those of
        ``key``'s parents it holds."""
        parents = parent_keys(key)
        by_node = self.client.by_node(parents)

        def ask(node: NodeAddress) -> tuple[list[str], list[str]]:
            under = self.client.call(node, "list", {"prefix": f"{key}/", "limit": 1})
            objects: list[str] = []
            for i in by_node.get(node.node_id, []):
                # One stat per parent (a path is a few levels deep): stat_many refuses a
                # batch with a key that is a directory on its node, which is the usual case.
                try:
                    self.client.call(node, "stat", {"key": parents[i]})
                except NotFoundError:
                    continue  # absent, or a directory there: either way not an object
                except NotPermittedError:
                    # A principal may write under ``scratch/`` without reading the
                    # name ``scratch``: it cannot see that parent, so it cannot know.
                    # Refusing would refuse every put it is allowed to make; the node
                    # still checks its write capability, and a clash is a race's.
                    continue
                objects.append(parents[i])
            return [str(k) for k in under.result["keys"]], objects

        answers = self.on_every_node(ask)
        objects = sorted(k for _, found in answers for k in found)
        if objects:
            raise KeyConflictError(
                f"{key!r} cannot be created: {objects[0]!r} is an object, so it cannot also "
                f"be a directory. Use another key, or move {objects[0]!r} away first."
            )
        below = sorted(k for keys, _ in answers for k in keys)
        if below:
            raise KeyConflictError(
                f"{key!r} cannot be created: it is a directory (it holds {below[0]!r}), so "
                "it cannot also be an object. Use another key (say a name inside it)."
            )
