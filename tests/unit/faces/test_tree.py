"""Directories over flat keys: markers, listings that hide them, rename by copy."""

from __future__ import annotations

import pytest

from shuttle.client import Client
from shuttle.errors import AlreadyExistsError, DirectoryNotEmptyError, NotFoundError
from shuttle.faces.tree import DIR_MARKER, KeyTree


def test_mkdir_makes_an_empty_directory_that_listings_show_without_its_marker(
    client: Client,
) -> None:
    tree = KeyTree(client)
    tree.mkdir("a/empty")
    assert list(client.list("a/")) == [f"a/empty/{DIR_MARKER}"]
    assert tree.is_dir("a/empty") and tree.is_dir("a") and tree.is_empty("a/empty")
    listing = tree.listdir("a/empty")
    assert (listing.dirs, listing.files) == ([], {})
    assert tree.listdir("a").dirs == ["empty"]
    with pytest.raises(AlreadyExistsError):
        tree.mkdir("a/empty")
    with pytest.raises(NotFoundError):
        tree.listdir("nothing")


def test_listdir_gives_files_with_their_attributes(client: Client) -> None:
    client.put("d/x", b"12345")
    client.put("d/sub/y", b"1")
    listing = KeyTree(client).listdir("d")
    assert listing.dirs == ["sub"]
    assert {name: info.size for name, info in listing.files.items()} == {"x": 5}


def test_rmdir_refuses_a_directory_with_entries(client: Client) -> None:
    tree = KeyTree(client)
    client.put("full/f", b"")
    with pytest.raises(DirectoryNotEmptyError):
        tree.rmdir("full")
    tree.mkdir("gone")
    tree.rmdir("gone")
    assert not tree.is_dir("gone")
    with pytest.raises(NotFoundError):
        tree.rmdir("gone")


def test_keep_leaves_an_emptied_directory_in_place(client: Client) -> None:
    tree = KeyTree(client)
    client.put("k/only", b"x")
    client.remove("k/only")
    assert not tree.is_dir("k")  # implicit directories vanish with their last key...
    client.put("k/only", b"x")
    client.remove("k/only")
    tree.keep("k")
    assert tree.is_dir("k")  # ... unless the face keeps them


def test_rename_dir_moves_every_key_and_refuses_to_move_into_itself(client: Client) -> None:
    tree = KeyTree(client)
    client.put("s/a", b"1")
    client.put("s/b/c", b"2")
    tree.mkdir("s/empty")
    assert tree.rename_dir("s", "t") == 3
    assert sorted(client.list()) == ["t/a", "t/b/c", f"t/empty/{DIR_MARKER}"]
    with pytest.raises(Exception, match="into itself"):
        tree.rename_dir("t", "t/inner")
