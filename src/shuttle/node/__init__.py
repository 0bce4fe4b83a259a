"""The storage node process: its configuration, its operations, its main loop.

Layout:

* ``config``    :class:`NodeConfig`, the one source of truth for a node's settings
* ``handlers``  the storage operations (stat, read, write, ...) as registry handlers
* ``callbacks`` the promise table of the ``callback`` validation mode (AFS-style)
* ``callback_ops`` the callback operations, and the step that makes writes break promises
* ``principal_store`` where a node keeps its principals (a file, or the RADOS pool),
  and the operations that change them
* ``principal_peers`` a node that missed a change of principals takes it from its peers
* ``full_collections`` ``--scheduled-gc``: the node's full garbage collections on a
  thread of their own, never inside a call
* ``main``      ``shuttle serve``: open the store, serve it, stop cleanly on SIGTERM
* ``worker_pool`` ``--workers N``: the primary's side (its worker processes, started
  again when they die, the change hook that keeps the shared change generations)
* ``worker_restarts`` the delay before a dead worker is started again (no I/O)
* ``worker``    a worker process: the node's port shared, small reads and stats answered
  itself, everything else sent to the primary on a connection per client connection
* ``worker_reads`` a worker's reads and stats, checked by the change generations
* ``cli``       the ``shuttle serve`` command's flags, turned into a :class:`NodeConfig`
"""
