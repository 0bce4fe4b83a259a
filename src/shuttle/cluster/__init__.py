"""Local clusters of storage-node processes, and the cluster file that names them.

Layout:

* ``clusterfile``  :class:`ClusterFile`: nodes, their addresses and link profiles (TOML)
* ``local``        ``cluster up|down|status``: start, stop and check node processes
* ``cli``          the ``shuttle cluster ...`` commands (``--cluster FILE`` or ``--root DIR``)
* ``principals``   principals and their caps on every node: gather, change, sync, keys
* ``user_cli``     the ``shuttle cluster user ...`` commands
* ``ceph``         :class:`LocalCeph`: a single-host Ceph (one mon, N OSDs) for tests and demos
* ``cephclient``   :class:`CephInfo` and ``connect``: reach a Ceph with bounded waits
* ``cephconf``     the local Ceph's conf, cephx keys and keyrings
* ``cephprocs``    the local Ceph's daemons as processes: pid checks, waits, their logs
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shuttle.cluster.clusterfile import ClusterFile, NodeEntry

# The names below are imported on first use, not with the package: the ``shuttle``
# command imports this package's ``cli`` module to build its help and must not pay
# for the rest (tests/unit/test_cli_start.py).
_LAZY: dict[str, str] = {
    "ClusterFile": "shuttle.cluster.clusterfile",
    "NodeEntry": "shuttle.cluster.clusterfile",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = ["ClusterFile", "NodeEntry"]
