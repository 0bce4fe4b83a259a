"""The storage node process: its configuration, its operations, its main loop.

Layout:

* ``config``    :class:`NodeConfig`, the one source of truth for a node's settings
* ``handlers``  the storage operations (stat, read, write, ...) as registry handlers
* ``callbacks`` the promise table of the ``callback`` validation mode (AFS-style)
* ``callback_ops`` the callback operations, and the step that makes writes break promises
* ``principal_store`` where a node keeps its principals (a file, or the RADOS pool),
  and the operations that change them
* ``principal_peers`` a node that missed a change of principals takes it from its peers
* ``main``      ``shuttle serve``: open the store, serve it, stop cleanly on SIGTERM
* ``cli``       the ``shuttle serve`` command's flags, turned into a :class:`NodeConfig`
"""
