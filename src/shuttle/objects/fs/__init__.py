"""The object-based file system of ABACUS section 4.3.1, on Shuttle's run-time.

A file is a stack of mobile objects (``file`` over ``cache`` over an optional
``raid5`` over storage); a directory is a ``directory`` object over the node's
``isolation`` object (callbacks, optimistic concurrency control) over its
``atomicity`` object (a shared log). The isolation and atomicity objects are node
services, anchored beside the storage object; the others move. docs/objectfs.md
explains it all.

Layout:

* ``file``         the top of a file's stack: the interface applications call
* ``cache``        a file's blocks, cached wherever the object runs
* ``promises``     copies held under callback promises: expiry, revalidation and the
  race guard, for the cache and directory objects alike
* ``raid``         ``raid5``: a file striped with rotating parity over N nodes
* ``raid_stripe_steps``  the steps a ``raid5`` object takes at its columns' nodes
  (intents, stripe state, parity, snapshots), their retries and their errors
* ``raid_layout``  where a RAID 5 file's bytes and parity live (pure)
* ``raid_node``    RAID 5's node half: the parity primitives a column's storage object
  offers (intents, stripe versions, conditional parity writes)
* ``directory``    hierarchical names over directory blocks
* ``dirblocks``    directory blocks and the blocks an update writes (pure)
* ``dirturns``     the locks that make one run-time's updates of a directory take turns
* ``isolation``    the node service: callbacks and optimistic concurrency control
* ``holders``      which holders hold promises on which keys, on disk (the isolation
  object's durable part)
* ``atomicity``    the node service: all-or-nothing updates through a shared log
* ``volume``       the file system as an application uses it: :class:`Volume`, a face
  that does everything through the run-time
"""

from __future__ import annotations

from pathlib import Path

from shuttle.objects.fs.atomicity import AtomicityObject
from shuttle.objects.fs.cache import CacheObject
from shuttle.objects.fs.directory import DirectoryObject
from shuttle.objects.fs.file import FileObject
from shuttle.objects.fs.holders import HolderLog
from shuttle.objects.fs.isolation import IsolationObject
from shuttle.objects.fs.raid import Raid5Object
from shuttle.runtime.mobile import MobileObject
from shuttle.store.interface import Store

#: Where a node keeps the file system's own files, under its data directory.
FS_STATE_DIR = Path(".shuttle") / "fs"


def node_services(store: Store, data_dir: Path) -> dict[str, MobileObject]:
    """The anchored objects a node hosts for the file system, by name. Recovery of
    updates a crash cut short happens here, before the node serves anything."""
    atomicity = AtomicityObject(store, data_dir / FS_STATE_DIR / "atomicity.log")
    holders = HolderLog(data_dir / FS_STATE_DIR / "promises.log")
    return {"atomicity": atomicity, "isolation": IsolationObject(store, atomicity, holders)}


def recover_services(services: dict[str, MobileObject]) -> None:
    """Once the node's run-time runs (a thread): the isolation object calls back the
    holders of promises from before a restart, then lets writes through."""
    isolation = services.get("isolation")
    if isinstance(isolation, IsolationObject):
        isolation.recover()


__all__ = [
    "AtomicityObject",
    "CacheObject",
    "DirectoryObject",
    "FileObject",
    "IsolationObject",
    "Raid5Object",
    "node_services",
    "recover_services",
]
