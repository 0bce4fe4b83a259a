"""The mount's inode numbers: stable while referenced, never reused, moved by rename."""

from __future__ import annotations

from shuttle.faces.inodes import ROOT_INODE, InodeTable


def test_a_path_keeps_its_number_while_the_kernel_holds_it() -> None:
    table = InodeTable()
    ino = table.bind("a/b", is_dir=False)
    table.looked_up(ino)
    assert table.bind("a/b", is_dir=False) == ino and table.path(ino) == "a/b"
    table.forget(ino, 1)
    assert table.entry(ino) is None and table.ino("a/b") is None
    assert table.bind("a/b", is_dir=False) > ino  # numbers are never reused
    table.forget(ROOT_INODE, 5)
    assert table.path(ROOT_INODE) == ""


def test_unlink_detaches_but_the_open_number_lives_until_forgotten() -> None:
    table = InodeTable()
    old = table.bind("f", is_dir=False)
    table.looked_up(old)
    table.detach("f")
    assert table.path(old) is None and table.entry(old) is not None
    assert table.bind("f", is_dir=False) != old
    table.forget(old, 1)
    assert table.entry(old) is None


def test_rename_moves_a_directory_and_everything_below_it() -> None:
    table = InodeTable()
    d = table.bind("src", is_dir=True)
    f = table.bind("src/x/f", is_dir=False)
    other = table.bind("srcfile", is_dir=False)
    replaced = table.bind("dst", is_dir=True)
    table.rename("src", "dst")
    assert (table.path(d), table.path(f), table.path(other)) == ("dst", "dst/x/f", "srcfile")
    assert table.entry(replaced) is None  # what dst named before is gone
    assert table.ino("src") is None and table.ino("dst") == d


def test_a_file_replaced_by_a_directory_gets_a_new_number() -> None:
    table = InodeTable()
    f = table.bind("p", is_dir=False)
    d = table.bind("p", is_dir=True)
    entry = table.entry(d)
    assert d != f and entry is not None and entry.is_dir
