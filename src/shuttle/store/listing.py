"""Listing keys by prefix, straight from the data tree, in key order, a page at a time.

Directory entries are sorted by ``name + "/"`` for directories and ``name`` for files;
walking the tree depth-first in that order yields keys in plain string order (every
key under ``d`` starts with ``d/``), so pages can resume after any key.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

from shuttle.errors import InvalidArgumentError, InvalidKeyError, ShuttleError
from shuttle.store.keys import INTERNAL_DIR_NAME, validate_key
from shuttle.store.paths import SafeRoot

#: Entries (keys plus prefixes) per page. 1,000 as in S3's ListObjects; a page of
#: maximal keys then fits the wire protocol's 1 MiB header.
LIST_PAGE_ENTRIES_MAX = 1000

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class Listing:
    """One page of a listing.

    Attributes:
        keys: object keys, in string order.
        prefixes: with a delimiter, the "directories" directly under the prefix that hold
            at least one object, each ending in ``/``.
        next_start_after: pass it as ``start_after`` to get the next page; None when this
            page is the last.
    """

    keys: list[str]
    prefixes: list[str]
    next_start_after: str | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "keys": self.keys,
            "prefixes": self.prefixes,
            "next_start_after": self.next_start_after,
        }


def list_page(
    root: SafeRoot, prefix: str, delimiter: str | None, start_after: str | None, limit: int
) -> Listing:
    """A page of keys (and, with ``delimiter="/"``, prefixes) that start with ``prefix``."""
    if delimiter not in (None, "/"):
        raise InvalidArgumentError(
            f"delimiter {delimiter!r} is not supported; use '/' (directories) or none."
        )
    if not 1 <= limit <= LIST_PAGE_ENTRIES_MAX:
        raise InvalidArgumentError(f'"limit" must be in 1..{LIST_PAGE_ENTRIES_MAX}, got {limit}')
    dir_key, _, name_prefix = prefix.rpartition("/")
    keys: list[str] = []
    prefixes: list[str] = []
    dir_fd = _open_dir(root, dir_key)
    if dir_fd is None:
        return Listing(keys, prefixes, None)
    base = dir_key + "/" if dir_key else ""
    after = start_after or ""
    count = 0
    last = None
    walker = _walk(dir_fd, base, name_prefix, delimiter is not None, after)
    try:
        for kind, name in walker:
            if count == limit:
                return Listing(keys, prefixes, last)
            (keys if kind == "key" else prefixes).append(name)
            last = name
            count += 1
    finally:
        walker.close()  # closes the directory descriptors of an unfinished walk
    return Listing(keys, prefixes, None)


def _open_dir(root: SafeRoot, dir_key: str) -> int | None:
    if not dir_key:
        return os.dup(root.fd)
    try:
        fd, _leaf = root.open_parent(dir_key + "/_", create=False)
    except (ShuttleError, OSError):
        return None  # missing, a file, or a symlink: nothing to list
    return fd


def _entries(dir_fd: int, at_root: bool) -> list[tuple[str, str, bool]]:
    """``(sort_name, name, is_dir)`` for the regular files and directories in ``dir_fd``."""
    out = []
    with os.scandir(dir_fd) as it:
        for entry in it:
            if at_root and entry.name == INTERNAL_DIR_NAME:
                continue
            if entry.is_dir(follow_symlinks=False):
                out.append((entry.name + "/", entry.name, True))
            elif entry.is_file(follow_symlinks=False):
                out.append((entry.name, entry.name, False))
    out.sort()
    return out


def _walk(
    dir_fd: int, base: str, name_prefix: str, delimit: bool, after: str
) -> Generator[tuple[str, str], None, None]:
    """Yield ``("key", k)`` / ``("prefix", p)`` under ``dir_fd`` in order; closes ``dir_fd``."""
    try:
        for _sort, name, is_dir in _entries(dir_fd, at_root=(base == "")):
            if not name.startswith(name_prefix):
                continue
            full = base + name
            if not is_dir:
                if full > after and _valid(full):
                    yield ("key", full)
                continue
            sub = full + "/"
            if after >= sub and not after.startswith(sub):
                continue  # the whole subtree sorts before the resume point
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
            except OSError:
                continue  # vanished or replaced meanwhile
            if delimit:
                try:
                    if sub > after and _has_object(child, sub):
                        yield ("prefix", sub)
                finally:
                    os.close(child)
            else:
                yield from _walk(child, sub, "", False, after)
    finally:
        os.close(dir_fd)


def _has_object(dir_fd: int, base: str) -> bool:
    """True if the tree under ``dir_fd`` holds at least one object (stops at the first)."""
    for _sort, name, is_dir in _entries(dir_fd, at_root=False):
        if not is_dir:
            if _valid(base + name):
                return True
            continue
        try:
            child = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        except OSError:
            continue
        try:
            if _has_object(child, base + name + "/"):
                return True
        finally:
            os.close(child)
    return False


def _valid(key: str) -> bool:
    """Files whose names are not valid keys (an operator's ``notes\\n.txt``) are not listed."""
    with contextlib.suppress(InvalidKeyError):
        validate_key(key)
        return True
    return False


#: ``Store.list`` as a function: ``(prefix, delimiter, start_after, limit) -> Listing``.
ListFn = Callable[[str, str | None, str | None, int], Listing]


def list_within(
    list_fn: ListFn,
    prefix: str,
    roots: Sequence[str],
    delimiter: str | None,
    start_after: str | None,
    limit: int,
) -> Listing:
    """A page of the listing of ``prefix`` restricted to keys under ``roots`` (each
    starting with ``prefix``, none covering another): what a principal that may read
    only under ``roots`` sees of ``prefix`` (docs/security.md). It is the page the
    whole listing would give with every other key removed, so it reveals nothing of
    those keys, not even in ``next_start_after``; it costs one ``list_fn`` call per
    root (a probe of one entry for a root deeper than the delimiter groups).

    With ``delimiter="/"`` a root such as ``data/x/`` listed under ``""`` shows as the
    prefix ``data/`` if any key lies under the root, so a principal can walk down to
    what it may read."""
    if not 1 <= limit <= LIST_PAGE_ENTRIES_MAX:
        raise InvalidArgumentError(f'"limit" must be in 1..{LIST_PAGE_ENTRIES_MAX}, got {limit}')
    after = start_after or ""
    found: dict[str, bool] = {}  # entry -> is a key (else a prefix)
    # Where the first root's page stopped short: entries past it may miss that root's
    # next ones, so the merged page ends there too.
    cutoff: str | None = None
    for root in roots:
        rest = root[len(prefix) :]
        cut = rest.find("/") if delimiter == "/" else -1
        if cut >= 0:
            # Every key under the root groups into one prefix of the listing.
            group = prefix + rest[: cut + 1]
            if group > after and group not in found and list_fn(root, None, None, 1).keys:
                found[group] = False
            continue
        page = list_fn(root, delimiter, start_after, limit)
        found.update(dict.fromkeys(page.keys, True))
        found.update(dict.fromkeys(page.prefixes, False))
        stop = page.next_start_after
        if stop is not None and (cutoff is None or stop < cutoff):
            cutoff = stop
    entries = sorted(e for e in found if cutoff is None or e <= cutoff)
    taken = entries[:limit]
    keys = [e for e in taken if found[e]]
    prefixes = [e for e in taken if not found[e]]
    more = cutoff is not None or len(entries) > limit
    return Listing(keys, prefixes, taken[-1] if more and taken else None)
