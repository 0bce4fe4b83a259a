"""A principal's listing (``list_within``) against a model: listing only the keys the
principal may read must give exactly the pages a listing of those keys alone gives,
page boundaries and resume points included, so nothing of the other keys shows."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shuttle.net.principals import Caps
from shuttle.store.listing import Listing, list_within

SEGMENTS = st.sampled_from(["a", "ab", "b", "data", "dat", "x", "sub", "s"])
KEYS = st.lists(st.lists(SEGMENTS, min_size=1, max_size=4).map("/".join), max_size=40)
#: Read prefixes: at a boundary (``data/``), inside a name (``dat``), or everything ("").
PREFIXES = st.lists(
    st.lists(SEGMENTS, min_size=0, max_size=3)
    .map("/".join)
    .flatmap(lambda p: st.sampled_from([p, p + "/" if p else p, p[:-1]])),
    max_size=4,
)


def model_list(
    keys: set[str], prefix: str, delimiter: str | None, start_after: str | None, limit: int
) -> Listing:
    """S3's listing (what every store promises): entries in order after ``start_after``,
    keys directly under ``prefix`` and, with a delimiter, one prefix per group; a page
    of ``limit`` with its last entry as ``next`` only if more follow."""
    entries: dict[str, bool] = {}
    for k in sorted(keys):
        if not k.startswith(prefix):
            continue
        cut = k.find("/", len(prefix)) if delimiter == "/" else -1
        if cut >= 0:
            entries[k[: cut + 1]] = False
        else:
            entries[k] = True
    after = [e for e in sorted(entries) if start_after is None or e > start_after]
    page = after[:limit]
    return Listing(
        [e for e in page if entries[e]],
        [e for e in page if not entries[e]],
        page[-1] if len(after) > limit else None,
    )


def pages(list_page: object, prefix: str, delimiter: str | None, limit: int) -> list[Listing]:
    out, after = [], None
    while True:
        page: Listing = list_page(prefix, delimiter, after, limit)  # type: ignore[operator]
        out.append(page)
        if page.next_start_after is None:
            return out
        after = page.next_start_after


@settings(max_examples=300, deadline=None)
@given(
    keys=KEYS,
    reads=PREFIXES,
    prefix=st.sampled_from(["", "d", "data", "data/", "data/s", "a/", "x/sub/"]),
    delimiter=st.sampled_from([None, "/"]),
    limit=st.integers(1, 5),
)
def test_a_principal_s_pages_are_the_pages_of_the_keys_it_may_read(
    keys: list[str], reads: list[str], prefix: str, delimiter: str | None, limit: int
) -> None:
    stored = set(keys)
    caps = Caps.of(read=reads)
    readable = {k for k in stored if caps.may_read(k)}
    roots = caps.list_roots(prefix)
    calls = []

    def store_list(p: str, d: str | None, after: str | None, n: int) -> Listing:
        calls.append(p)
        return model_list(stored, p, d, after, n)

    def restricted(p: str, d: str | None, after: str | None, n: int) -> Listing:
        if roots is None:
            return model_list(stored, p, d, after, n)
        return list_within(store_list, p, roots, d, after, n)

    got = pages(restricted, prefix, delimiter, limit)
    want = pages(lambda p, d, a, n: model_list(readable, p, d, a, n), prefix, delimiter, limit)
    assert got == want
    assert all(any(c.startswith(r) for r in (roots or [""])) for c in calls)  # never beside


def test_a_deep_prefix_shows_as_the_directory_that_leads_to_it() -> None:
    stored = {"data/sub/c.txt", "data/zz.txt", "secret/b.txt", "secretive.txt"}
    page = list_within(
        lambda p, d, a, n: model_list(stored, p, d, a, n), "", ["data/sub/"], "/", None, 10
    )
    assert page == Listing([], ["data/"], None)
    # An empty deep prefix does not show the way to nothing.
    page = list_within(
        lambda p, d, a, n: model_list(stored, p, d, a, n), "", ["data/none/"], "/", None, 10
    )
    assert page == Listing([], [], None)
