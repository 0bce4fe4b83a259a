"""Key safety: the lexical rules, and that no accepted key ever reaches outside the root."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shuttle.errors import InvalidKeyError, KeyConflictError, NotFoundError
from shuttle.store import ObjectStore
from shuttle.store.keys import (
    INTERNAL_DIR_NAME,
    KEY_BYTES_MAX,
    KEY_COMPONENT_BYTES_MAX,
    KEY_DEPTH_MAX,
    validate_key,
    validate_prefix,
)


@pytest.mark.parametrize(
    "key",
    ["a", "logs/2026/a.txt", "a b/c-d_e.f", "ünïcødé/ключ", ".hidden", "..a", "a..", "x" * 255],
)
def test_valid_keys_pass_unchanged(key: str) -> None:
    assert validate_key(key) == key


@pytest.mark.parametrize(
    ("key", "words"),
    [
        ("", "empty"),
        ("/etc/passwd", "absolute"),
        ("a/", "trailing"),
        ("a//b", "empty component"),
        ("../x", "'..'"),
        ("a/../../x", "'..'"),
        ("a/./b", "'.'"),
        (".", "'.'"),
        ("a\x00b", "character"),
        ("a\nb", "character"),
        ("a\x1bb", "character"),
        ("a\\b", "backslash"),
        ("a\x85b", "character"),
        (INTERNAL_DIR_NAME, "store's own directory"),
        (f"{INTERNAL_DIR_NAME}/journal", "store's own directory"),
        ("x" * (KEY_COMPONENT_BYTES_MAX + 1), "NAME_MAX"),
        ("a/" * KEY_DEPTH_MAX + "a", "components"),
        ("ab/" * (KEY_BYTES_MAX // 3) + "abcd", "bytes of UTF-8"),
        ("a\ud800", "surrogate"),
    ],
)
def test_invalid_keys_say_what_is_wrong(key: str, words: str) -> None:
    with pytest.raises(InvalidKeyError, match=words.replace(".", r"\.").replace("(", r"\(")):
        validate_key(key)


def test_non_string_key_is_refused() -> None:
    with pytest.raises(InvalidKeyError, match="must be a string"):
        validate_key(b"bytes")


def test_internal_dir_is_allowed_below_the_top() -> None:
    assert validate_key(f"a/{INTERNAL_DIR_NAME}") == f"a/{INTERNAL_DIR_NAME}"


@pytest.mark.parametrize("prefix", ["", "logs/", "logs/20", "l", ".shu"])
def test_valid_prefixes(prefix: str) -> None:
    assert validate_prefix(prefix) == prefix


@pytest.mark.parametrize(
    "prefix", ["/x", "a//b", "../", "a/../b", "a\x00", f"{INTERNAL_DIR_NAME}/"]
)
def test_invalid_prefixes(prefix: str) -> None:
    with pytest.raises(InvalidKeyError):
        validate_prefix(prefix)


# Keys built from hostile pieces: dots, slashes, separators, the internal name.
_PIECES = st.sampled_from(
    ["..", ".", "", "/", "a", "b", "\\", "\x00", INTERNAL_DIR_NAME, "~", "c.txt", "\n", " "]
)
_HOSTILE = st.lists(_PIECES, min_size=1, max_size=8).map("".join) | st.text(max_size=40)


@settings(max_examples=300, deadline=None)
@given(key=_HOSTILE)
def test_accepted_keys_never_resolve_outside_the_root(key: str) -> None:
    root = "/srv/data"
    try:
        validate_key(key)
    except InvalidKeyError:
        return
    resolved = os.path.normpath(os.path.join(root, key))
    assert resolved.startswith(root + "/")
    assert resolved != root
    assert not resolved.startswith(f"{root}/{INTERNAL_DIR_NAME}/")
    assert resolved != f"{root}/{INTERNAL_DIR_NAME}"
    assert os.path.normpath(key) == key  # keys are already normalised paths


@settings(max_examples=60, deadline=None)
@given(key=_HOSTILE, data=st.binary(max_size=16))
def test_store_never_writes_outside_the_root(
    tmp_path_factory: pytest.TempPathFactory, key: str, data: bytes
) -> None:
    base = tmp_path_factory.mktemp("escape")
    root = base / "root"
    with (
        ObjectStore(
            root,
        ) as store,
        contextlib.suppress(InvalidKeyError, KeyConflictError),
    ):
        store.put(key, data)
    outside = {p.name for p in base.iterdir()}
    assert outside == {"root"}


def test_symlinked_directory_leading_out_is_refused(
    store: ObjectStore, root: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"top secret")
    os.symlink(outside, root / "link")
    with pytest.raises(InvalidKeyError, match="symlink at 'link'"):
        store.read("link/secret")
    with pytest.raises(InvalidKeyError, match="symlink"):
        store.put("link/new", b"x")
    with pytest.raises(InvalidKeyError, match="symlink"):
        store.write("link/secret", 0, b"overwrite")
    assert sorted(os.listdir(outside)) == ["secret"]
    assert (outside / "secret").read_bytes() == b"top secret"


def test_symlinked_file_is_refused_even_inside_the_root(
    store: ObjectStore, root: Path, tmp_path: Path
) -> None:
    store.put("real", b"data")
    os.symlink(root / "real", root / "alias")
    with pytest.raises(InvalidKeyError, match="symlink"):
        store.read("alias")
    with pytest.raises(InvalidKeyError, match="symlink"):
        store.put("alias", b"x")
    assert os.path.islink(root / "alias")
    assert store.read("real") == b"data"


def test_symlink_deep_in_the_path_is_refused(
    store: ObjectStore, root: Path, tmp_path: Path
) -> None:
    store.put("a/b/c", b"1")
    os.symlink("/etc", root / "a" / "etc")
    with pytest.raises(InvalidKeyError, match="symlink at 'a/etc'"):
        store.stat("a/etc/passwd")
    assert store.list("a/").keys == ["a/b/c"]


def test_key_below_an_object_conflicts(store: ObjectStore) -> None:
    store.put("a", b"file")
    with pytest.raises(KeyConflictError, match="'a' is an object"):
        store.put("a/b", b"x")
    with pytest.raises(NotFoundError):
        store.read("a/b")


def test_key_naming_a_directory_conflicts(store: ObjectStore) -> None:
    store.put("d/x", b"1")
    with pytest.raises(KeyConflictError, match="directory"):
        store.put("d", b"x")
    with pytest.raises(NotFoundError, match="directory"):
        store.read("d")
