"""The guards operations register (net/principals.py): which keys of a request they
check, and the verb and key each refusal names. Whole messages, golden bytes and
limits at exactly their value are here because mutation testing of net/principals.py
asked for them: each failed against a mutant every other test let through
(docs/testing.md).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from shuttle.errors import NotPermittedError
from shuttle.net.principals import (
    Caps,
    Guard,
    admin_only,
    all_of,
    new_principal,
    reads,
    reads_each,
    writes,
    writes_each,
)


def test_guards_check_the_keys_a_request_names() -> None:
    p = new_principal("p", Caps.of(read=["r/"], write=["w/"]))
    reads()(p, {"key": "r/x"})
    writes()(p, {"key": "w/x"})
    reads_each()(p, {"keys": ["r/a", "r/b"]})
    writes_each()(p, {"keys": ["w/a"]})
    reads()(p, {"key": 3})  # not a key: the operation refuses it, touching nothing
    for guard, args in [
        (reads(), {"key": "w/x"}),
        (writes(), {"key": "r/x"}),
        (reads_each(), {"keys": ["r/a", "w/b"]}),
        (writes_each(), {"keys": ["w/a", "r/b"]}),
        (admin_only("node.stats"), {}),
    ]:
        with pytest.raises(NotPermittedError):
            guard(p, args)
    admin_only("node.stats")(new_principal("root", Caps.of(admin=True)), {})


# Guards are made inside the test (by these functions), not when the module is
# collected: a guard made then would keep the code it was made with.
GUARDS: list[tuple[Callable[[], Guard], dict[str, object], str]] = [
    (lambda: reads(), {"key": "w/x"}, "principal 'p' may not read 'w/x' (the read capability)"),
    (lambda: writes(), {"key": "r/x"}, "principal 'p' may not write 'r/x' (the write capability)"),
    (lambda: reads("src", "copy"), {"src": "w/x"}, "principal 'p' may not copy 'w/x' (the read"),
    (lambda: writes("dst", "move"), {"dst": "r/x"}, "principal 'p' may not move 'r/x' (the write"),
    (
        lambda: reads_each(),
        {"keys": ["r/a", 3, "w/b"]},
        "principal 'p' may not read 'w/b' (the read capability)",
    ),
    (
        lambda: reads_each("paths", "stat"),
        {"paths": ["w/b"]},
        "principal 'p' may not stat 'w/b' (the read",
    ),
    (
        lambda: writes_each(),
        {"keys": ["w/a", "r/b"]},
        "principal 'p' may not write 'r/b' (the write capability)",
    ),
    (
        lambda: writes_each("items", "remove"),
        {"items": ["r/b"]},
        "principal 'p' may not remove 'r/b' (the write",
    ),
    (
        lambda: admin_only("node.stats"),
        {},
        "principal 'p' may not call node.stats, a cluster operation (the admin capability)",
    ),
    (
        lambda: all_of(reads("src"), writes("dst")),
        {"src": "r/x", "dst": "r/y"},
        "principal 'p' may not write 'r/y' (the write capability)",
    ),
    (
        lambda: all_of(reads("src"), writes("dst")),
        {"src": "w/x", "dst": "w/y"},
        "principal 'p' may not read 'w/x' (the read capability)",
    ),
]


@pytest.mark.parametrize(("make", "args", "message"), GUARDS)
def test_a_guard_names_the_verb_and_key_it_refuses(
    make: Callable[[], Guard], args: dict[str, object], message: str
) -> None:
    p = new_principal("p", Caps.of(read=["r/"], write=["w/"]))
    with pytest.raises(NotPermittedError) as info:
        make()(p, dict(args))
    assert str(info.value).startswith(message)


def test_a_guard_of_several_checks_passes_when_each_does() -> None:
    p = new_principal("p", Caps.of(read=["r/"], write=["w/"]))
    all_of(reads("src"), writes("dst"))(p, {"src": "r/x", "dst": "w/y"})
    all_of()(p, {})
    writes_each()(p, {"keys": "w/not-a-list"})  # the handler refuses it, touching nothing
