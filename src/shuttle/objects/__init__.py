"""Shuttle's built-in mobile objects, referred to by name.

Layout:

* ``storage``  the anchored storage object of a node (reads and writes its objects)
* ``grep``     a regular-expression search returning matching lines
* ``count``    line, word, byte and match counts (an aggregation: tiny results)
* ``osd``      ``osdgrep``: grep inside the Ceph OSD holding the bytes (cls_lua), the
  third placement site
* ``lines``    a cursor over the lines of a list of objects, read block by block
* ``filter``   a synthetic filter with a set pass fraction and CPU cost per byte
  (ABACUS's filter experiments)
* ``fs``       the object-based file system (``file``, ``cache``, ``raid5``,
  ``directory``; the node services ``isolation`` and ``atomicity``)

Importing this package registers them with :func:`shuttle.runtime.mobile.builtin`.
"""

from shuttle.objects import fs
from shuttle.objects.count import CountObject
from shuttle.objects.filter import SyntheticFilter
from shuttle.objects.fs.raid import Raid5Object
from shuttle.objects.grep import GrepObject
from shuttle.objects.osd import OsdGrepObject
from shuttle.objects.storage import StorageObject

__all__ = [
    "CountObject",
    "GrepObject",
    "OsdGrepObject",
    "Raid5Object",
    "StorageObject",
    "SyntheticFilter",
    "fs",
]
