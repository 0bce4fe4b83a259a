"""Local clusters of storage-node processes, and the cluster file that names them.

Layout:

* ``clusterfile``  :class:`ClusterFile`: nodes, their addresses and link profiles (TOML)
* ``local``        ``cluster up|down|status``: start, stop and check node processes
* ``cli``          the ``shuttle cluster ...`` commands (``--cluster FILE`` or ``--root DIR``)
"""

from shuttle.cluster.clusterfile import ClusterFile, NodeEntry

__all__ = ["ClusterFile", "NodeEntry"]
