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
* ``shuttle.cli``     the ``shuttle`` command
"""

from __future__ import annotations

__version__ = "0.1.0"

from shuttle.client import Client, ObjectInfo, connect

__all__ = ["Client", "ObjectInfo", "__version__", "connect"]
