"""Validation modes: when the client may use its cached copy of an object.

One registry, one module per mode (``docs/consistency.md`` states each one's semantics).

Layout:

* ``base``         :class:`ValidationMode`, the interface, and :class:`Validated`
* ``check``        ask the node for the version before using cached data (NFS-style)
* ``callback``     the node promises to say when an object changes (AFS-style callbacks)
* ``speculative``  use the cached copy at once while the check runs alongside; the
  file's ``checkpoint()``/``close()`` raise ``StaleDataError`` if it was stale

A client picks its mode by name (``Client(validation="check")``) and may name
another per open (``client.open(key, validation=...)``); ``shuttle.connect`` takes the
default from ``$SHUTTLE_VALIDATION`` when it is set.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from shuttle.client.validation.base import Validated, ValidationMode
from shuttle.client.validation.callback import CallbackMode
from shuttle.client.validation.check import CheckMode
from shuttle.client.validation.speculative import SpeculativeMode
from shuttle.errors import InvalidArgumentError

if TYPE_CHECKING:
    from shuttle.client.client import Client

#: Builds a mode for one client.
ModeFactory = Callable[["Client"], ValidationMode]

MODES: dict[str, ModeFactory] = {}

#: What a client validates with unless told otherwise.
VALIDATION_DEFAULT = "check"
#: The environment variable that names the mode of clients built by ``shuttle.connect``.
VALIDATION_ENV = "SHUTTLE_VALIDATION"


def register(name: str, factory: ModeFactory) -> None:
    """Make ``factory`` the mode called ``name``."""
    MODES[name] = factory


def make_mode(name: str, client: Client) -> ValidationMode:
    """The mode ``name`` for ``client`` (a clear error naming the modes there are)."""
    factory = MODES.get(name)
    if factory is None:
        known = ", ".join(sorted(MODES))
        raise InvalidArgumentError(f"no validation mode {name!r}; choose one of: {known}")
    return factory(client)


register("check", CheckMode)
register("callback", CallbackMode)
register("speculative", SpeculativeMode)

__all__ = [
    "MODES",
    "VALIDATION_DEFAULT",
    "VALIDATION_ENV",
    "Validated",
    "ValidationMode",
    "make_mode",
    "register",
]
