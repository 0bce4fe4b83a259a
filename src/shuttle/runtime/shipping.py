"""A user's class shipped to a node by value: :func:`ship_class` pickles it with
cloudpickle, its own module by value and Shuttle's (and other installed modules) by
reference, so a node that has never seen the class can run it.

Only a sandbox worker loads shipped code (:func:`shuttle.runtime.sandbox_worker.load_class`,
in its jail): unpickling runs the code, so the node itself never unpickles it
(:mod:`shuttle.runtime.sandbox`, docs/security.md "The jail").
"""

from __future__ import annotations

import pickle
import sys
import threading

import cloudpickle

from shuttle.errors import InvalidArgumentError
from shuttle.runtime.mobile import MobileObject

#: cloudpickle's registry of modules pickled by value is global: one thread ships at a
#: time, so a module registered for one class is not unregistered under another.
_ship_lock = threading.Lock()


def ship_class(cls: type[MobileObject]) -> bytes:
    """``cls`` pickled by value, so a node without its module can load it.

    The class's own module is pickled by value (its helper functions and classes
    with it); Shuttle's modules and other imported modules travel by reference, so a
    helper from another module of the user's must be registered with
    ``cloudpickle.register_pickle_by_value`` (or installed on the nodes).
    :class:`InvalidArgumentError` if ``cls`` is not a :class:`MobileObject` subclass
    or is anchored."""
    if not (isinstance(cls, type) and issubclass(cls, MobileObject)):
        raise InvalidArgumentError(
            f"only MobileObject subclasses can be shipped to a node, got {cls!r:.80}"
        )
    if cls.anchored:
        raise InvalidArgumentError(
            f"{cls.__qualname__} is anchored (a storage object or a console) and cannot be shipped"
        )
    module = sys.modules.get(cls.__module__)
    name = cls.__module__
    by_value = (
        module is not None
        and name != "__main__"  # cloudpickle ships __main__ by value anyway
        and name != "shuttle"
        and not name.startswith("shuttle.")  # every node has Shuttle
    )
    with _ship_lock:  # the registry is global: another thread may be shipping too
        register = by_value and name not in cloudpickle.list_registry_pickle_by_value()
        if register:
            cloudpickle.register_pickle_by_value(module)
        try:
            return cloudpickle.dumps(cls, protocol=pickle.HIGHEST_PROTOCOL)  # type: ignore[no-any-return]
        finally:
            if register:
                cloudpickle.unregister_pickle_by_value(module)
