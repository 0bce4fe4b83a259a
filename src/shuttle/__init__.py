"""Shuttle: an active storage system.

Layout (see docs/architecture.md):

* ``shuttle.wire``    frame codec and message schema, sans-I/O (no sockets)
* ``shuttle.net``     connections, RPC server/client plumbing, link profiles and shaping
* ``shuttle.store``   storage node: object store on disk, attributes, chunk hashes, block cache
* ``shuttle.client``  the file client: sync and async APIs, client cache and validation
* ``shuttle.cluster`` local clusters of node processes and the cluster file
* ``shuttle.sim``     the discrete-event simulator of a file server hosting mobile code
* ``shuttle.traces``  trace records, readers and recorders
* ``shuttle.bench``   the papers' experiments on the live system
* ``shuttle.runtime`` mobile objects: binding, migration, monitor, placement, sandbox
* ``shuttle.objects`` built-in mobile objects (storage, grep, count, filter)
* ``shuttle.apps``    commands over the run-time (grep, objects, placement log)
* ``shuttle.faces``   programs over the client: ``shuttle mount`` (FUSE), ``shuttle://`` (fsspec)
* ``shuttle.node``    the storage-node process: config, operations, main loop
* ``shuttle.blockcache``  the block cache policy (CLOCK) the store and the client share
* ``shuttle.cdc``     content-defined chunking and blake3 hashes the store and the client share
* ``shuttle.rendezvous``  which node holds a key (rendezvous hashing; client and file system)
* ``shuttle.errors``  every error Shuttle raises, by whose fault it is, with its exit code
* ``shuttle.compiled``  which hot modules run compiled (mypyc); their pure Python fallback
* ``shuttle.testing`` test doubles: fake clock, in-memory streams, an in-memory node
* ``shuttle.demo``    ``shuttle demo``: a tour on a throwaway local cluster
* ``shuttle.cli``     the ``shuttle`` command (``python -m shuttle``: ``shuttle.__main__``)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shuttle import compiled as _compiled

__version__ = "0.1.0"

# Compiled hot modules or their pure Python, decided before any of them is imported.
_compiled.install()

if TYPE_CHECKING:
    from shuttle.client import Client, ObjectInfo, connect

__all__ = ["Client", "ObjectInfo", "__version__", "connect"]


def __getattr__(name: str) -> Any:
    # The client is imported on first use, not with the package: a shipped object's
    # sandbox worker imports ``shuttle.runtime`` and must not pay for the client.
    if name in ("Client", "ObjectInfo", "connect"):
        import shuttle.client

        return getattr(shuttle.client, name)
    raise AttributeError(f"module 'shuttle' has no attribute {name!r}")
