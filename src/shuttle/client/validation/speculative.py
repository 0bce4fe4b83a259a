"""``speculative``: use the cached copy at once; the check runs alongside.

For a plain ``client.open`` (which cannot be re-run): when the client holds a cached
copy of the object, ``open`` returns at once, pinned to that copy's version, and a
version check goes out on a pool thread. Reads serve the cached blocks without
waiting for it. The file's ``checkpoint()`` waits for the check and raises
:class:`~shuttle.errors.StaleDataError` if the copy was stale; ``close()`` does the
same (after closing). A program that acts on what it read only after ``checkpoint()``
(or a clean ``close()``) never acts on stale data. With no cached copy, ``open``
checks first, as ``check`` does.

The mode also owns the client's speculation engine
(:class:`~shuttle.client.speculation.Speculator`): ``client.speculate`` runs through
it, sharing its record of which versions the cache holds and its cost estimates.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from shuttle.client.model import ObjectInfo
from shuttle.client.speculation import Speculator
from shuttle.client.validation.base import Validated, ValidationMode
from shuttle.errors import StaleDataError

if TYPE_CHECKING:
    from shuttle.client.client import Client


class SpeculativeCheck:
    """The check of one speculative open (a :class:`~.base.PendingCheck`)."""

    def __init__(self, cached: ObjectInfo, future: Future[tuple[ObjectInfo, bool]]) -> None:
        self.cached = cached
        self._future = future

    def confirm(self) -> None:
        info, stale = self._future.result()
        if stale:
            raise StaleDataError(
                f"{self.cached.key!r}: this file was opened on the cached copy at version "
                f"{self.cached.version}, but the node holds version {info.version}; what was "
                "read from it is stale and must not be used: open the object again"
            )


class SpeculativeMode(ValidationMode):
    name = "speculative"

    def __init__(self, client: Client) -> None:
        super().__init__(client)
        self.engine = Speculator(client)

    def open(self, key: str) -> Validated:
        cached = self.engine.cached_info(key)
        if cached is None:
            info, _ = self.engine.check(key, None)
            return Validated(info, self.engine.remember(info))
        check = SpeculativeCheck(cached, self.engine.check_async(key, cached))
        return Validated(cached, True, check)

    def forget(self, key: str) -> None:
        self.engine.forget(key)

    def close(self) -> None:
        self.engine.close()

    def stats(self) -> dict[str, Any]:
        return self.engine.stats()
