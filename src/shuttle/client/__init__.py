"""The Shuttle client: a file API over the storage nodes of a cluster.

Layout:

* ``model``    what calls return: :class:`ObjectInfo`, :class:`WriteInfo`, :class:`NodeAddress`
* ``routing``  which node holds a key (rendezvous hashing)
* ``namespace``  a name is an object or a directory, cluster-wide: the check before a create
* ``cache``    the client block cache and the versions its blocks belong to
* ``validation``  when cached data may be used: one module per mode behind one registry
* ``lookaside``  local stores that supply missed chunks by hash before the node is asked
* ``speculation``  ``client.speculate``: work runs on the cached copy while the check is out
* ``speculation_costs``  the paper's cost model (T_f < (1 - p)·T_c) over online estimates
* ``branches`` the optimistic branch of a speculation: a thread or a forked child
* ``calls``    what each call sends and how its answer reads (sans-I/O, shared by both APIs)
* ``integrity``  end-to-end checks: payload hashes on writes, chunk hashes on reads
* ``connections``  one client's connections to its nodes: one per thread and node, counted
* ``uploads``  one streamed upload over one connection: begin, pipelined writes, commit
* ``downloads``  one streamed download over one connection: pipelined reads of one
  version, each piece checked; into a local file atomically
* ``client``   :class:`Client`, the synchronous API (no asyncio needed)
* ``gateways`` :class:`GatewayClient`: fails over between nodes that share one store (RADOS)
* ``locality`` which gateway node sits beside a key's primary OSD (learned in the background)
* ``rados_direct``  a RADOS node's misses read from the OSDs with the user's own Ceph key
* ``files``    file objects over remote objects (``client.open``)
* ``aio``      :class:`AsyncClient`, the asyncio API (same calls, limits, retry, cache)
* ``connect``  :func:`connect`: a client from an address, a cluster file or the environment
* ``cli``      the client commands of ``shuttle`` (put, get, cat, ls, stat, rm, stats)
"""

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shuttle.client.cache import ClientCache
    from shuttle.client.client import Client
    from shuttle.client.connect import connect
    from shuttle.client.model import Chunk, NodeAddress, ObjectInfo, WriteInfo

# The names below are imported on first use, not with the package: the ``shuttle``
# command imports this package's ``cli`` module to build its help and must not pay
# for the rest (tests/unit/test_cli_start.py).
_LAZY: dict[str, str] = {
    "ClientCache": "shuttle.client.cache",
    "Client": "shuttle.client.client",
    "connect": "shuttle.client.connect",
    "Chunk": "shuttle.client.model",
    "NodeAddress": "shuttle.client.model",
    "ObjectInfo": "shuttle.client.model",
    "WriteInfo": "shuttle.client.model",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


class _Package(types.ModuleType):
    """This package, keeping ``shuttle.client.connect`` the function.

    Importing the submodule ``shuttle.client.connect`` sets the package's attribute
    ``connect`` to that module; when this package imported it eagerly it rebound the
    name to the function right after. Imported lazily, the rebinding is refused here
    instead, so ``from shuttle.client import connect`` is the function, always.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "connect" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

__all__ = ["Chunk", "Client", "ClientCache", "NodeAddress", "ObjectInfo", "WriteInfo", "connect"]
