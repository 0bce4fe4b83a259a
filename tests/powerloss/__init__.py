"""The power-loss tier: a node on LazyFS, power cuts, and checks (``make test-powerloss``).

* ``lazyfs.py``: find or build LazyFS, mount it, drop its unsynced data, unmount.
* ``harness.py``: the node, the writers, the crash points and the checks (``run_points``).
* ``__main__.py``: the command line (``python -m tests.powerloss --points N``).
* ``test_powerloss.py``: a few crash points inside ``make test``.
"""
