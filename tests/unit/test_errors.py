"""Error codes round-trip by code so a node's typed error becomes the same class."""

from __future__ import annotations

import pytest

from shuttle import errors


def test_every_code_is_unique_and_round_trips() -> None:
    registry = errors.all_error_codes()
    assert len(registry) >= 15
    for code, cls in registry.items():
        rebuilt = errors.error_from_code(code, "what happened")
        assert type(rebuilt) is cls
        assert str(rebuilt) == "what happened"


def test_unknown_code_keeps_the_code_in_the_message() -> None:
    rebuilt = errors.error_from_code("from_the_future", "new thing")
    assert isinstance(rebuilt, errors.RemoteError)
    assert "from_the_future" in str(rebuilt)


@pytest.mark.parametrize(
    ("cls", "base"),
    [
        (errors.InvalidKeyError, errors.UsageError),
        (errors.LimitExceededError, errors.UsageError),
        (errors.NotFoundError, errors.RemoteError),
        (errors.UnreachableError, errors.RemoteError),
        (errors.StorageIOError, errors.ServerError),
    ],
)
def test_whose_fault_hierarchy(cls: type[errors.ShuttleError], base: type) -> None:
    assert issubclass(cls, base)
