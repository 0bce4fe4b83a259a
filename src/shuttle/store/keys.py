"""Object keys: which strings are keys, and which listing prefixes are valid.

A key names an object and is also its path under the data directory (``logs/2026/a.txt``
is the file ``ROOT/logs/2026/a.txt``), so a key must be a *relative, normalised* path
that cannot name anything outside the root or inside the store's own directory. The
check here is purely lexical; the other half of the defence (refusing symlinks on the
way down) happens at open time in :mod:`shuttle.store.paths`.
"""

from __future__ import annotations

import functools
import re

from shuttle.errors import InvalidKeyError, NotFoundError

#: S3 allows keys of up to 1,024 bytes of UTF-8; we take the same bound. It keeps the
#: full path well under Linux's PATH_MAX (4,096) even below a deep data directory.
KEY_BYTES_MAX = 1024

#: NAME_MAX on Linux file systems (ext4, xfs, btrfs): one path component.
KEY_COMPONENT_BYTES_MAX = 255

#: Directory depth. Each level costs an openat() on every uncached access; 64 is far
#: beyond real trees (the Linux source tree is 12 deep) and bounds that work.
KEY_DEPTH_MAX = 64

#: The store keeps its journal, attributes and staging files here. No key may start
#: with this component.
INTERNAL_DIR_NAME = ".shuttle"

#: C0 controls, DEL and the C1 controls. A newline or an escape code in a file name
#: breaks operators' shells and logs; a backslash is a path separator on Windows and
#: makes keys ambiguous when a tree is copied there.
_FORBIDDEN_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f\\]")

_ADVICE = "Use a relative path like 'logs/2026/a.txt'."


def no_object(key: str) -> NotFoundError:
    """The error for a key with no object, worded the same by every store."""
    return NotFoundError(f"no object {key!r}. Check the key, or list its prefix.")


def validate_key(key: object) -> str:
    """Return ``key`` unchanged if it is a valid object key, else raise (see
    :func:`_validate_key`). Valid keys are remembered, so a hot key costs a dict lookup."""
    if type(key) is str:
        return _validate_key_cached(key)
    return _validate_key(key)


#: Remembered valid keys (an LRU); a key is at most 1 KiB, so at most 16 MiB.
_VALID_KEYS_REMEMBERED = 16384


@functools.lru_cache(maxsize=_VALID_KEYS_REMEMBERED)
def _validate_key_cached(key: str) -> str:
    return _validate_key(key)  # an error is raised, and so never remembered


def _validate_key(key: object) -> str:
    """Return ``key`` unchanged if it is a valid object key, else raise.

    A valid key is a non-empty ``str`` of at most :data:`KEY_BYTES_MAX` bytes of UTF-8,
    made of ``/``-separated components that are non-empty, not ``.`` or ``..``, at most
    :data:`KEY_COMPONENT_BYTES_MAX` bytes each, at most :data:`KEY_DEPTH_MAX` of them,
    with no control characters and no backslash; the first component is not
    :data:`INTERNAL_DIR_NAME`.

    Raises:
        InvalidKeyError: naming the rule the key broke and what to do instead.
    """
    if not isinstance(key, str):
        raise InvalidKeyError(f"key must be a string, got {type(key).__name__}. {_ADVICE}")
    _check_text(key, "key")
    if key == "":
        raise InvalidKeyError(f"key is empty. {_ADVICE}")
    if key.startswith("/"):
        raise InvalidKeyError(f"key {key!r} is an absolute path; keys are relative. {_ADVICE}")
    if key.endswith("/"):
        raise InvalidKeyError(
            f"key {key!r} ends with '/', which names a directory, not an object. "
            "Drop the trailing '/' (or use it only as a listing prefix)."
        )
    _check_components(key, key.split("/"))
    return key


def validate_prefix(prefix: object) -> str:
    """Return ``prefix`` if it is a valid listing prefix, else raise InvalidKeyError.

    A prefix is ``""`` (everything) or any string that could begin a valid key: the same
    character rules as :func:`validate_key`, and every complete component (all but the
    text after the last ``/``) must be a valid component. ``"logs/"`` and ``"logs/20"``
    are both valid prefixes.
    """
    if not isinstance(prefix, str):
        raise InvalidKeyError(f"prefix must be a string, got {type(prefix).__name__}.")
    if prefix == "":
        return prefix
    _check_text(prefix, "prefix")
    if prefix.startswith("/"):
        raise InvalidKeyError(f"prefix {prefix!r} is absolute; prefixes are relative.")
    parts = prefix.split("/")
    complete, partial = parts[:-1], parts[-1]
    if complete:
        _check_components(prefix, complete)
    if partial in (".", ".."):
        raise InvalidKeyError(f"prefix {prefix!r} ends with a {partial!r} component.")
    # A partial last component such as ".shu" is fine: listings never show the
    # internal directory, so it simply matches nothing there.
    return prefix


def _check_text(text: str, what: str) -> None:
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidKeyError(
            f"{what} {text!r} is not valid Unicode (it holds a lone surrogate). {_ADVICE}"
        ) from None
    if size > KEY_BYTES_MAX:
        raise InvalidKeyError(
            f"{what} is {size} bytes of UTF-8; the limit is {KEY_BYTES_MAX}. Use a shorter {what}."
        )
    bad = _FORBIDDEN_CHARS.search(text)
    if bad is not None:
        raise InvalidKeyError(
            f"{what} {text!r} contains the character {bad.group()!r} at position {bad.start()}; "
            f"control characters and backslashes are not allowed. {_ADVICE}"
        )


def _check_components(text: str, components: list[str]) -> None:
    if len(components) > KEY_DEPTH_MAX:
        raise InvalidKeyError(
            f"key {text!r} has {len(components)} path components; the limit is "
            f"{KEY_DEPTH_MAX}. Use a flatter layout."
        )
    if components[0] == INTERNAL_DIR_NAME:
        raise InvalidKeyError(
            f"key {text!r} starts with {INTERNAL_DIR_NAME!r}, the store's own directory. "
            "Choose another first component."
        )
    for part in components:
        if part == "":
            raise InvalidKeyError(
                f"key {text!r} has an empty component ('//'). Use single slashes between names."
            )
        if part in (".", ".."):
            raise InvalidKeyError(
                f"key {text!r} has a {part!r} component; keys are normalised paths and may "
                f"not step up or stay in place. {_ADVICE}"
            )
        if len(part.encode("utf-8")) > KEY_COMPONENT_BYTES_MAX:
            raise InvalidKeyError(
                f"key {text!r} has a component of {len(part.encode('utf-8'))} bytes; the "
                f"limit is {KEY_COMPONENT_BYTES_MAX} (the file system's NAME_MAX). "
                "Split it into shorter names."
            )


def parent_keys(key: str) -> list[str]:
    """The directory prefixes above ``key``, shallowest first: ``a/b/c`` -> ``[a, a/b]``."""
    parts = key.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]
