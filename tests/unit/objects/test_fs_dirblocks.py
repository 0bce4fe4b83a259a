"""The directory block format pinned byte for byte, and every limit at its exact edge.

test_fs_directory_format.py checks that blocks round-trip and that updates keep a
directory's names; these tests check what round trips cannot see: the bytes on disk (a
directory written by this version must read in the next), and the limits exactly at
(not only far past) their values: a body of BODY_BYTES_MAX bytes, a path of
PATH_BYTES_MAX, a name of NAME_BYTES_MAX, an entry of ENTRY_BYTES_MAX. Each test names
the mutants of ``objects/fs/dirblocks.py`` it was seen to fail against (docs/testing.md).
"""

from __future__ import annotations

import re
import zlib
from typing import Any

import msgpack
import pytest

from shuttle.errors import (
    AlreadyExistsError,
    InvalidArgumentError,
    LimitExceededError,
    NotFoundError,
    ServerError,
)
from shuttle.objects.fs import dirblocks as d

KEY = "v/.dirs/d1"


def exactly(message: str) -> str:
    """``message``, whole, as a pattern for ``pytest.raises(match=...)``."""
    return "^" + re.escape(message) + "$"


# --- golden blocks ----------------------------------------------------------------------

#: The header block of directory ``0123456789abcdef`` (parent ``root``, 3 entry blocks),
#: as written on disk: head (magic, version 1, kind 1, body length, crc32, little-endian)
#: and msgpack body; zero padding to 4,096 bytes follows. If this fails, the on-disk
#: format changed and volumes written before would not read: change FORMAT_VERSION and
#: docs/objectfs.md deliberately, never by accident.
GOLDEN_HEADER = bytes.fromhex(
    "53444952"
    "01"
    "01"
    "3200"
    "c5155616"  # SDIR, version 1, header, 50 bytes, crc32
    "84a26964b030313233343536373839616263646566a6706172656e74a4726f6f74"
    "a6626c6f636b7303a772656d6f766564c2"
)
GOLDEN_HEADER_VALUE = d.Header("0123456789abcdef", "root", 3, False)

#: An entry block with two entries, sorted by name, one holding bytes (msgpack bin, not
#: str: the difference between use_bin_type=True and False).
GOLDEN_ENTRIES = bytes.fromhex(
    "53444952"
    "01"
    "02"
    "4400"
    "24e7aed0"  # SDIR, version 1, entries, 68 bytes, crc32
    "9292a16182a474797065a46c696e6ba2746fa22f62"
    "92a96e6f7465732e74787483a474797065a466696c65a36b6579ab762f6e6f7465732e747874"
    "a468617368c40200ff"
)
GOLDEN_ENTRIES_VALUE = {
    "notes.txt": {"type": "file", "key": "v/notes.txt", "hash": b"\x00\xff"},
    "a": {"type": "link", "to": "/b"},
}


def test_a_header_block_is_the_documented_bytes() -> None:
    # Mutants: the body's msgpack options, the padding byte, the head's fields.
    raw = d.encode_header(GOLDEN_HEADER_VALUE)
    assert raw == GOLDEN_HEADER.ljust(d.BLOCK_BYTES, b"\0")
    assert d.decode_header(raw) == GOLDEN_HEADER_VALUE
    assert (d.BLOCK_BYTES, d.BLOCK_MAGIC, d.FORMAT_VERSION) == (4096, b"SDIR", 1)
    assert (d.KIND_HEADER, d.KIND_ENTRIES, d.DIR_BLOCKS_MAX) == (1, 2, 256)


def test_an_entry_block_is_the_documented_bytes() -> None:
    # Mutants: msgpack.packb(..., use_bin_type=False) (bytes written as str),
    # msgpack.unpackb(..., raw=True), the sort by name.
    raw = d.encode_entries(GOLDEN_ENTRIES_VALUE)
    assert raw == GOLDEN_ENTRIES.ljust(d.BLOCK_BYTES, b"\0")
    decoded = d.decode_entries(raw)
    assert decoded == GOLDEN_ENTRIES_VALUE
    assert list(decoded) == ["a", "notes.txt"]
    assert type(decoded["notes.txt"]["hash"]) is bytes
    assert zlib.crc32(GOLDEN_ENTRIES[12:]) == int.from_bytes(GOLDEN_ENTRIES[8:12], "little")


def test_the_stored_body_size_is_read_from_the_head() -> None:
    # Mutants: stored_body_bytes's field index ([3] -> [4]), its length test (>= -> >),
    # its default (0 -> 1), the conditional forced either way.
    raw = d.encode_entries(GOLDEN_ENTRIES_VALUE)
    assert d.stored_body_bytes(raw) == 68 == d.body_bytes(GOLDEN_ENTRIES_VALUE)
    assert d.stored_body_bytes(raw[:12]) == 68  # the head alone says it
    assert d.stored_body_bytes(raw[:11]) == 0
    assert d.stored_body_bytes(b"") == 0


# --- damage is reported, whole, with where it was found -------------------------------------


def _damaged(raw: bytes, at: int, value: int) -> bytes:
    out = bytearray(raw)
    out[at] = value
    return bytes(out)


@pytest.mark.parametrize(
    ("at", "value", "message"),
    [
        (0, ord("X"), "not a directory block of kind 1 (magic b'XDIR', version 1, kind 1)"),
        (4, 2, "not a directory block of kind 1 (magic b'SDIR', version 2, kind 1)"),
        (5, 2, "not a directory block of kind 1 (magic b'SDIR', version 1, kind 2)"),
    ],
)
def test_each_field_of_the_head_is_checked_on_its_own(at: int, value: int, message: str) -> None:
    # Mutants: `magic != BLOCK_MAGIC or version != ...` turned into `and` (a block with a
    # wrong magic but the right version was read as a directory block).
    raw = _damaged(d.encode_header(GOLDEN_HEADER_VALUE), at, value)
    with pytest.raises(
        ServerError, match=exactly(f"{KEY}: {message}; the volume's directory objects are damaged")
    ):
        d.decode_header(raw, KEY)


def test_damage_names_the_directory_or_says_directory() -> None:
    # Mutants: the default `where` ("directory") changed, `where` not passed on.
    raw = _damaged(d.encode_entries({"a": {"type": "file"}}), 12, 0x80)
    with pytest.raises(ServerError, match=exactly(f"{KEY}: directory block fails its checksum")):
        d.decode_entries(raw, KEY)
    with pytest.raises(ServerError, match=exactly("directory: directory block fails its checksum")):
        d.decode_entries(raw)
    header = _damaged(d.encode_header(GOLDEN_HEADER_VALUE), 12, 0x80)
    with pytest.raises(ServerError, match=exactly("directory: directory block fails its checksum")):
        d.decode_header(header)
    with pytest.raises(
        ServerError, match=exactly(f"{KEY}: directory block of 11 bytes is cut short")
    ):
        d.decode_header(header[:11], KEY)


def test_a_head_without_its_body_is_damage() -> None:
    # Exactly the 12 bytes of a head: its body is missing, so it fails its checksum.
    # Mutant: `len(data) < _BLOCK_HEAD.size` turned into <= (another message).
    with pytest.raises(ServerError, match=exactly(f"{KEY}: directory block fails its checksum")):
        d.decode_entries(d.encode_entries({"a": {"type": "file"}})[:12], KEY)


# --- limits at their edges -----------------------------------------------------------------


def _entries_of_body(size: int) -> dict[str, dict[str, Any]]:
    """Entries whose encoded block body is exactly ``size`` bytes."""
    for pad in range(size, 0, -1):
        entries = {"a": {"type": "file", "key": "k" * pad}}
        if d.body_bytes(entries) == size:
            return entries
        if d.body_bytes(entries) < size:
            break
    raise AssertionError(f"no padding gives a body of {size} bytes")


def test_a_block_filled_to_exactly_the_body_limit_is_written() -> None:
    # Mutants: `len(raw) > BODY_BYTES_MAX` turned into `>=`; the error message replaced.
    assert d.BODY_BYTES_MAX == d.BLOCK_BYTES - 12 == 4084
    full = _entries_of_body(d.BODY_BYTES_MAX)
    raw = d.encode_entries(full)
    assert len(raw) == d.BLOCK_BYTES and raw[-1] != 0  # no padding left
    assert d.decode_entries(raw) == full
    over = _entries_of_body(d.BODY_BYTES_MAX + 1)
    with pytest.raises(
        LimitExceededError, match=exactly("directory block body of 4085 bytes exceeds 4084")
    ):
        d.encode_entries(over)


def test_an_insert_that_fills_a_block_exactly_goes_into_it() -> None:
    # Mutants: the cheap test `+ pair <=` turned into `<`, the exact test `<=` into `<`
    # (either sent an insert that fits exactly into a new block).
    name, entry = "z", {"type": "file"}
    pair = len(msgpack.packb([name, entry]))
    base = _entries_of_body(d.BODY_BYTES_MAX - pair)
    view = d.DirView(KEY, d.Header("d1", "root", 1), 0, [base], [0])
    writes = d.plan_insert(view, name, entry, "/z")
    assert [(k, off) for k, off, _ in writes] == [(KEY, d.BLOCK_BYTES)]
    assert d.stored_body_bytes(writes[0][2]) == d.BODY_BYTES_MAX
    # One byte more and it takes a new block (and the header's count).
    base = _entries_of_body(d.BODY_BYTES_MAX - pair + 1)
    view = d.DirView(KEY, d.Header("d1", "root", 1), 0, [base], [0])
    writes = d.plan_insert(view, name, entry, "/z")
    assert [(k, off) for k, off, _ in writes] == [(KEY, 2 * d.BLOCK_BYTES), (KEY, 0)]


def test_a_new_block_keeps_the_header_it_extends() -> None:
    # Mutants: the new header built without the directory's id, parent or removed flag.
    full = _entries_of_body(d.BODY_BYTES_MAX)
    header = d.Header("d1", "parent-id", 1, removed=True)
    view = d.DirView(KEY, header, 0, [full], [0])
    writes = d.plan_insert(view, "new", {"type": "file"}, "/new")
    assert d.decode_header(writes[1][2]) == d.Header("d1", "parent-id", 2, removed=True)
    assert d.decode_entries(writes[0][2]) == {"new": {"type": "file"}}


def test_a_full_directory_says_what_to_do() -> None:
    full = _entries_of_body(d.BODY_BYTES_MAX)
    n = d.DIR_BLOCKS_MAX
    view = d.DirView(KEY, d.Header("d1", "", n), 0, [full] * n, [0] * n)
    with pytest.raises(
        LimitExceededError,
        match=exactly("/x: the directory is full (256 blocks of 4096 bytes); use a subdirectory"),
    ):
        d.plan_insert(view, "x", {"type": "file"}, "/x")


def _path_of(total: int) -> str:
    """An absolute path of exactly ``total`` bytes made of names of at most 255 bytes."""
    names = []
    left = total
    while left > 0:
        n = min(255, left - 1)
        if left - 1 - n == 1:  # never leave room for just the "/" of an empty name
            n -= 1
        names.append("p" * n)
        left -= n + 1
    path = "/" + "/".join(names)
    assert len(path.encode()) == total
    return path


def test_a_path_of_exactly_path_max_is_valid() -> None:
    # Mutant: `len(path.encode()) > PATH_BYTES_MAX` turned into `>=`.
    assert d.PATH_BYTES_MAX == 4096
    assert len(d.split_path(_path_of(4096))) == 16  # 16 names of 255 bytes
    with pytest.raises(InvalidArgumentError, match=exactly("path of 4097 bytes is over 4096")):
        d.split_path(_path_of(4097))
    # Bytes, not characters: a path of 2,057 characters, most of them two bytes long.
    wide = "/" + "/".join(["é" * 127] * 16) + "/" + "é" * 7 + "a"
    assert (len(wide), len(wide.encode())) == (2057, 4096)
    assert len(d.split_path(wide)) == 17
    with pytest.raises(InvalidArgumentError, match=exactly("path of 4097 bytes is over 4096")):
        d.split_path(wide + "a")


def test_a_name_of_exactly_name_max_is_valid() -> None:
    # Mutants: `len(name.encode()) > NAME_BYTES_MAX` turned into `>=`; the message's
    # name shortened to another length.
    assert d.NAME_BYTES_MAX == 255
    assert d.split_path("/" + "n" * 255) == ["n" * 255]
    with pytest.raises(
        InvalidArgumentError,
        match=exactly(f"name {'n' * 40!r}… is 256 bytes; at most 255"),
    ):
        d.split_path("/" + "n" * 256)


def test_bad_paths_are_named_in_the_error() -> None:
    # Mutants: check_name(name, None) (the message lost the path), the type's name.
    with pytest.raises(InvalidArgumentError, match=exactly("a path is a string, got int")):
        d.split_path(7)
    with pytest.raises(
        InvalidArgumentError,
        match=exactly("path '/a/../b': '..' is not allowed; give the full path"),
    ):
        d.split_path("/a/../b")
    with pytest.raises(
        InvalidArgumentError, match=exactly("path '/a\\x00b' contains a NUL character")
    ):
        d.split_path("/a\0b")


def _entry_of(size: int) -> dict[str, Any]:
    for pad in range(size, 0, -1):
        entry = {"type": "file", "key": "k" * pad}
        got = len(msgpack.packb(["name", entry], use_bin_type=True))
        if got == size:
            return entry
        if got < size:
            break
    raise AssertionError(f"no padding gives an entry of {size} bytes")


def test_an_entry_of_exactly_entry_max_is_valid() -> None:
    # Mutant: `size > ENTRY_BYTES_MAX` turned into `>=`; the message replaced.
    assert d.ENTRY_BYTES_MAX == 1024
    entry = _entry_of(1024)
    assert d.check_entry(entry, "name") == entry
    with pytest.raises(
        InvalidArgumentError, match=exactly("entry of 1025 bytes is over 1024; keep it short")
    ):
        d.check_entry(_entry_of(1025), "name")


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({1: "x"}, "an entry is a map with string keys, got {1: 'x'}"),
        ("file", "an entry is a map with string keys, got 'file'"),
        (
            {"type": ""},
            'an entry needs a "type" ("file", say), got \'\'; make directories with mkdir',
        ),
        ({"type": 5}, 'an entry needs a "type" ("file", say), got 5; make directories with mkdir'),
        (
            {"type": "dir"},
            'an entry needs a "type" ("file", say), got \'dir\'; make directories with mkdir',
        ),
    ],
)
def test_bad_entries_say_what_is_wrong(entry: Any, message: str) -> None:
    # Mutants: `not isinstance(entry, dict) or not all(...)` turned into `and`, the same
    # for the type test (an empty or non-string type was accepted), messages replaced.
    with pytest.raises(InvalidArgumentError, match=exactly(message)):
        d.check_entry(entry, "name")


def test_an_entry_that_cannot_be_encoded_says_so() -> None:
    entry = {"type": "file", "x": {1, 2}}
    with pytest.raises(
        InvalidArgumentError,
        match=exactly(
            "entry {'type': 'file', 'x': {1, 2}} cannot be encoded: can not serialize 'set' object"
        ),
    ):
        d.check_entry(entry, "name")


# --- views, names, ids ------------------------------------------------------------------------


def test_recorded_block_sizes_are_used_as_recorded() -> None:
    # The directory object passes each block's stored body size so an update need not
    # re-encode every block. Mutant: the recorded size ignored.
    view = d.DirView(KEY, d.Header("d1", "", 1), 0, [{"a": {"type": "file"}}], [0], sizes=[4000])
    assert view.body_bytes(0) == 4000
    view.sizes = None
    assert view.body_bytes(0) == d.body_bytes({"a": {"type": "file"}})


def test_a_view_of_raw_blocks_reads_every_block_at_its_offset() -> None:
    # Mutants: BLOCK_BYTES * i turned into / (block 2 looked up at offset 2048), the
    # timestamps (0) changed, the id of a directory without a header, the key not passed.
    blocks = {
        0: d.encode_header(d.Header("d1", "root", 2)),
        d.BLOCK_BYTES: d.encode_entries({"a": {"type": "file"}}),
        2 * d.BLOCK_BYTES: d.encode_entries({"b": {"type": "file"}}),
    }
    view = d.view_of(KEY, blocks)
    assert view.listing() == [["a", {"type": "file"}], ["b", {"type": "file"}]]
    assert view.reads() == [[KEY, 0, 0], [KEY, 4096, 0], [KEY, 8192, 0]]
    assert (view.header_ts, view.block_ts) == (0, [0, 0])
    empty = d.view_of(KEY, {}, "d7")
    assert empty.header == d.Header("d7", "", 0) and empty.blocks == []
    assert d.view_of(KEY, {}).header.dir_id == d.ROOT_ID == "root"
    blocks[2 * d.BLOCK_BYTES] = _damaged(blocks[2 * d.BLOCK_BYTES], 20, 0)
    with pytest.raises(ServerError, match=exactly(f"{KEY}: directory block fails its checksum")):
        d.view_of(KEY, blocks)
    with pytest.raises(ServerError, match=f"^{KEY}: not a directory block of kind 1"):
        d.view_of(KEY, {0: blocks[d.BLOCK_BYTES]})


def test_inserting_a_name_twice_and_removing_a_missing_one_say_so() -> None:
    view = d.view_of(
        KEY,
        {
            0: d.encode_header(d.Header("d1", "", 1)),
            4096: d.encode_entries({"a": {"type": "file"}}),
        },
    )
    with pytest.raises(AlreadyExistsError, match=exactly("/a already exists")):
        d.plan_insert(view, "a", {"type": "file"}, "/a")
    with pytest.raises(NotFoundError, match=exactly("/b: no such file or directory")):
        d.plan_remove(view, "b", "/b")


def test_new_directory_ids_are_64_random_bits() -> None:
    # Mutants: token_hex(8) changed to another length.
    ids = {d.new_dir_id() for _ in range(64)}
    assert len(ids) == 64
    assert all(re.fullmatch("[0-9a-f]{16}", i) for i in ids)
