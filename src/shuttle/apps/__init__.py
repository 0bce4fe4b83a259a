"""Applications built on the run-time: console programs over stacks of mobile objects.

Layout:

* ``grep``  ``shuttle grep``: a grep object per node over the keys it holds
* ``cli``   the commands ``shuttle grep``, ``shuttle objects``, ``shuttle placement``,
  ``shuttle dashboard``
* ``dashboard``  ``shuttle dashboard``: a live web page of nodes, objects, edges and moves
* ``fs_cli``  ``shuttle fs ...``: the object-based file system from the command line
"""
