"""Counting what principals hold against their shares (net/principal_limits.py)."""

from __future__ import annotations

import pytest

from shuttle.errors import ConfigError, NodeBusyError
from shuttle.net.principal_limits import (
    PRINCIPAL_CONNECTIONS_MAX,
    PrincipalLimits,
    PrincipalLoad,
)


def test_a_principal_past_its_share_is_refused_and_others_are_not() -> None:
    load = PrincipalLoad(PrincipalLimits(requests=2, requests_total=3), "n1", 100)
    load.take("requests", "alice")
    load.take("requests", "alice")
    with pytest.raises(NodeBusyError, match=r"principal 'alice'.*--principal-requests-max"):
        load.take("requests", "alice")
    load.take("requests", "bob")
    assert load.held("requests", "alice") == 2 and load.refused["requests"] == 1
    with pytest.raises(NodeBusyError, match=r"all principals together \(3, --requests-max\)"):
        load.take("requests", "carol")
    load.give_back("requests", "alice")
    load.take("requests", "carol")


def test_what_was_not_taken_cannot_be_given_back() -> None:
    load = PrincipalLoad(PrincipalLimits(), "n1", 100)
    load.take("connections", "alice")
    load.give_back("connections", "alice")
    with pytest.raises(AssertionError, match="given back twice"):
        load.give_back("connections", "alice")


def test_counted_elsewhere_is_checked_against_the_same_bounds() -> None:
    load = PrincipalLoad(PrincipalLimits(objects=2, objects_total=3), "n1", 100)
    load.check("objects", "alice", 1, 1)
    with pytest.raises(NodeBusyError, match="--principal-objects-max"):
        load.check("objects", "alice", 2, 2)
    with pytest.raises(NodeBusyError, match="--objects-max"):
        load.check("objects", "bob", 0, 3)


def test_the_connection_share_is_fitted_to_the_connection_cap() -> None:
    assert PrincipalLimits().connections_for(16_384) == PRINCIPAL_CONNECTIONS_MAX
    assert PrincipalLimits().connections_for(64) == 16
    assert PrincipalLimits().connections_for(2) == 1
    assert PrincipalLimits(connections=10).connections_for(8) == 8
    load = PrincipalLoad(PrincipalLimits(), "n1", 64)
    assert load.connections_max == 16
    load.fit(8)
    assert load.connections_max == 2


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"connections": 0}, "--principal-connections-max"),
        ({"requests": 0}, "--principal-requests-max"),
        ({"objects_total": 0}, "--objects-max"),
        ({"requests": 10, "requests_total": 5}, "cannot be above the node's"),
    ],
)
def test_bad_limits_say_which_flag(kwargs: dict[str, int], flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        PrincipalLimits(**kwargs)
