"""Location-transparent references to mobile objects.

A :class:`Ref` names an object by its :class:`~shuttle.runtime.ids.ObjectId` and
the address of its home run-time; it never says where the object runs. Calling a
method on it (``ref.read(key, 0, 4096)``) goes through the run-time it is bound to,
which finds the object (a plain call on the same node, RPC otherwise), and the
resource monitor sees the call and its return. A reference travels inside
arguments, results and checkpoints; on arrival it is bound to the receiving
run-time, so an object that migrates keeps working references.
"""

from __future__ import annotations

from typing import Any, Protocol

from shuttle.errors import LocalProtocolError
from shuttle.runtime.ids import ObjectId


class Invoker(Protocol):
    """What a reference calls through: a run-time (or a sandbox worker's proxy of one)."""

    def invoke(self, ref: Ref, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Call ``method`` of the object ``ref`` names and return its result (blocking)."""
        ...


class Ref:
    """A reference to mobile object ``rid``, whose home run-time listens at
    ``home_address`` (``HOST:PORT``). Equal references name the same object."""

    __slots__ = ("_invoker", "home_address", "rid")

    def __init__(self, rid: ObjectId, home_address: str, invoker: Invoker | None = None) -> None:
        self.rid = rid
        self.home_address = home_address
        self._invoker = invoker

    def bind(self, invoker: Invoker) -> Ref:
        """The same reference, calling through ``invoker``."""
        return Ref(self.rid, self.home_address, invoker)

    @property
    def bound(self) -> bool:
        return self._invoker is not None

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Invoke ``method`` with ``args``; the result, or the callee's typed error."""
        invoker = self._invoker
        if invoker is None:
            raise LocalProtocolError(
                f"reference to {self.rid} is not bound to a run-time; references are "
                "bound when the run-time hands them to an object (or use Runtime.ref)"
            )
        return invoker.invoke(self, method, args, kwargs)

    def __getattr__(self, method: str) -> Any:
        # ref.read(...) is ref.call("read", ...). Dunder and private names are never
        # remote methods (copy, pickle and friends probe for them).
        if method.startswith("_"):
            raise AttributeError(method)

        def remote_method(*args: Any, **kwargs: Any) -> Any:
            return self.call(method, *args, **kwargs)

        remote_method.__name__ = method
        return remote_method

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Ref) and other.rid == self.rid

    def __hash__(self) -> int:
        return hash(self.rid)

    def __repr__(self) -> str:
        return f"Ref({self.rid}, home at {self.home_address})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled references (cloudpickle ships object classes and states) drop their
        # binding: the receiving side binds them again.
        return (Ref, (self.rid, self.home_address))
