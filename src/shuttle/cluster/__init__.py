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
"""

from shuttle.cluster.clusterfile import ClusterFile, NodeEntry

__all__ = ["ClusterFile", "NodeEntry"]
