"""Directory blocks, names and the blocks an update writes: the pure half of the
directory object (:mod:`shuttle.objects.fs.directory`; docs/objectfs.md, "Directories").

Directory ``D`` of volume ``V`` is the object ``V/.dirs/D`` made of :data:`BLOCK_BYTES`
blocks: block 0 is the *header*, blocks ``1..n`` hold *entries* (``[name, entry]``
pairs sorted by name). Each block is ``magic | version | kind | body length | crc32 |
msgpack body | zero padding``. No I/O here: the object reads, plans with these
functions and commits.
"""

from __future__ import annotations

import secrets
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgpack

from shuttle.errors import (
    AlreadyExistsError,
    InvalidArgumentError,
    LimitExceededError,
    NotFoundError,
    ServerError,
)
from shuttle.store.keys import KEY_COMPONENT_BYTES_MAX

#: A directory block: a page, and ext4's default block size.
BLOCK_BYTES = 4096
#: magic, format version, kind, body length, crc32 of the body.
_BLOCK_HEAD = struct.Struct("<4sBBHI")
BLOCK_MAGIC = b"SDIR"
FORMAT_VERSION = 1
KIND_HEADER = 1
KIND_ENTRIES = 2
BODY_BYTES_MAX = BLOCK_BYTES - _BLOCK_HEAD.size
#: NAME_MAX, as for store keys (a name is also a key component in the file layer).
NAME_BYTES_MAX = KEY_COMPONENT_BYTES_MAX
#: PATH_MAX on Linux.
PATH_BYTES_MAX = 4096
#: One entry's encoded ``[name, entry]``: at least three fit in a block.
ENTRY_BYTES_MAX = 1024
#: Entry blocks per directory (1 MiB, some 20,000 short entries): an update reads
#: them all, so a bigger directory makes every insert slower; past it, "full".
DIR_BLOCKS_MAX = 256
ROOT_ID = "root"

# --- blocks (pure) -------------------------------------------------------------------


@dataclass(frozen=True)
class Header:
    """Block 0 of a directory: ``blocks`` entry blocks follow at ``BLOCK_BYTES * i``."""

    dir_id: str
    parent_id: str
    blocks: int
    removed: bool = False


Entries = dict[str, dict[str, Any]]


def _encode(kind: int, body: Any) -> bytes:
    raw = msgpack.packb(body, use_bin_type=True)
    if len(raw) > BODY_BYTES_MAX:
        raise LimitExceededError(
            f"directory block body of {len(raw)} bytes exceeds {BODY_BYTES_MAX}"
        )
    head = _BLOCK_HEAD.pack(BLOCK_MAGIC, FORMAT_VERSION, kind, len(raw), zlib.crc32(raw))
    return (head + raw).ljust(BLOCK_BYTES, b"\0")


def encode_header(header: Header) -> bytes:
    return _encode(
        KIND_HEADER,
        {
            "id": header.dir_id,
            "parent": header.parent_id,
            "blocks": header.blocks,
            "removed": header.removed,
        },
    )


def encode_entries(entries: Mapping[str, Mapping[str, Any]]) -> bytes:
    """An entry block; :class:`LimitExceededError` if the entries do not fit."""
    return _encode(KIND_ENTRIES, [[name, dict(entries[name])] for name in sorted(entries)])


def _decode(data: bytes, kind: int, where: str) -> Any:
    if len(data) < _BLOCK_HEAD.size:
        raise ServerError(f"{where}: directory block of {len(data)} bytes is cut short")
    magic, version, got_kind, length, crc = _BLOCK_HEAD.unpack_from(data)
    body = data[_BLOCK_HEAD.size : _BLOCK_HEAD.size + length]
    if magic != BLOCK_MAGIC or version != FORMAT_VERSION or got_kind != kind:
        raise ServerError(
            f"{where}: not a directory block of kind {kind} (magic {magic!r}, version "
            f"{version}, kind {got_kind}); the volume's directory objects are damaged"
        )
    if len(body) != length or zlib.crc32(body) != crc:
        raise ServerError(f"{where}: directory block fails its checksum")
    return msgpack.unpackb(body, raw=False)


def decode_header(data: bytes, where: str = "directory") -> Header | None:
    """The header in ``data``; None for b"" (no such block: the directory was never
    made, or is a root not written yet)."""
    if not data:
        return None
    b = _decode(data, KIND_HEADER, where)
    return Header(str(b["id"]), str(b["parent"]), int(b["blocks"]), bool(b["removed"]))


def stored_body_bytes(data: bytes) -> int:
    """The body size a block's head records (0 for no block)."""
    return int(_BLOCK_HEAD.unpack_from(data)[3]) if len(data) >= _BLOCK_HEAD.size else 0


def decode_entries(data: bytes, where: str = "directory") -> Entries:
    return {str(name): dict(entry) for name, entry in _decode(data, KIND_ENTRIES, where)}


def body_bytes(entries: Mapping[str, Mapping[str, Any]]) -> int:
    """The encoded size of an entry block's body."""
    return len(msgpack.packb([[n, dict(entries[n])] for n in sorted(entries)], use_bin_type=True))


# --- names (pure) --------------------------------------------------------------------


def split_path(path: Any) -> list[str]:
    """``/a/b`` as ``["a", "b"]`` (``/`` as ``[]``), or :class:`InvalidArgumentError`."""
    if not isinstance(path, str):
        raise InvalidArgumentError(f"a path is a string, got {type(path).__name__}")
    if not path.startswith("/"):
        raise InvalidArgumentError(f"path {path!r:.80} is not absolute: start it with /")
    if len(path.encode()) > PATH_BYTES_MAX:
        raise InvalidArgumentError(f"path of {len(path.encode())} bytes is over {PATH_BYTES_MAX}")
    if path == "/":
        return []
    names = path[1:].split("/")
    for name in names:
        check_name(name, path)
    return names


def check_name(name: str, path: str) -> None:
    if not name:
        raise InvalidArgumentError(f"path {path!r:.80} has an empty component (// or a final /)")
    if name in (".", ".."):
        raise InvalidArgumentError(
            f"path {path!r:.80}: {name!r} is not allowed; give the full path"
        )
    if "\0" in name:
        raise InvalidArgumentError(f"path {path!r:.80} contains a NUL character")
    if len(name.encode()) > NAME_BYTES_MAX:
        raise InvalidArgumentError(
            f"name {name[:40]!r}… is {len(name.encode())} bytes; at most {NAME_BYTES_MAX}"
        )


def new_dir_id() -> str:
    """A new directory's id: 64 random bits, never reused in practice."""
    return secrets.token_hex(8)


def join(names: list[str]) -> str:
    return "/" + "/".join(names)


def check_entry(entry: Any, name: str) -> dict[str, Any]:
    if not isinstance(entry, dict) or not all(isinstance(k, str) for k in entry):
        raise InvalidArgumentError(f"an entry is a map with string keys, got {entry!r:.80}")
    kind = entry.get("type")
    if not isinstance(kind, str) or not kind or kind == "dir":
        raise InvalidArgumentError(
            f'an entry needs a "type" ("file", say), got {kind!r:.40}; make directories with mkdir'
        )
    try:
        size = len(msgpack.packb([name, entry], use_bin_type=True))
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidArgumentError(f"entry {entry!r:.80} cannot be encoded: {exc}") from None
    if size > ENTRY_BYTES_MAX:
        raise InvalidArgumentError(
            f"entry of {size} bytes is over {ENTRY_BYTES_MAX}; keep it short"
        )
    return dict(entry)


# --- a directory as read, and the blocks an update writes (pure) ----------------------


@dataclass
class DirView:
    """One directory's blocks as read: the header and entry blocks with timestamps."""

    key: str
    header: Header
    header_ts: int
    blocks: list[Entries]
    block_ts: list[int]
    #: Each entry block's encoded body size (from its block head), when known.
    sizes: list[int] | None = None

    def body_bytes(self, i: int) -> int:
        return self.sizes[i] if self.sizes is not None else body_bytes(self.blocks[i])

    def find(self, name: str) -> tuple[int, dict[str, Any]] | None:
        """(entry block index from 0, entry) of ``name``, or None."""
        for i, entries in enumerate(self.blocks):
            if name in entries:
                return i, entries[name]
        return None

    def listing(self) -> list[list[Any]]:
        """``[[name, entry], ...]`` by name; copies (a plain call's caller may change
        them, and these are the cache's)."""
        return sorted([n, dict(e)] for entries in self.blocks for n, e in entries.items())

    def reads(self) -> list[list[Any]]:
        """The read set: every block, at the timestamp it was read at."""
        return [[self.key, 0, self.header_ts]] + [
            [self.key, BLOCK_BYTES * (i + 1), ts] for i, ts in enumerate(self.block_ts)
        ]


Write = tuple[str, int, bytes]


def plan_insert(view: DirView, name: str, entry: dict[str, Any], where: str) -> list[Write]:
    """The blocks that insert ``name`` into ``view``: the first entry block with room,
    or a new one and the header's count. :class:`AlreadyExistsError` if it is there."""
    if view.find(name) is not None:
        raise AlreadyExistsError(f"{where} already exists")
    pair = len(msgpack.packb([name, entry], use_bin_type=True))
    for i, entries in enumerate(view.blocks):
        # Adding a pair adds at least its bytes: a cheap test before the exact one.
        if view.body_bytes(i) + pair <= BODY_BYTES_MAX:
            grown = {**entries, name: entry}
            if body_bytes(grown) <= BODY_BYTES_MAX:
                return [(view.key, BLOCK_BYTES * (i + 1), encode_entries(grown))]
    n = len(view.blocks)
    if n >= DIR_BLOCKS_MAX:
        raise LimitExceededError(
            f"{where}: the directory is full ({DIR_BLOCKS_MAX} blocks of {BLOCK_BYTES} "
            "bytes); use a subdirectory"
        )
    header = Header(view.header.dir_id, view.header.parent_id, n + 1, view.header.removed)
    return [
        (view.key, BLOCK_BYTES * (n + 1), encode_entries({name: entry})),
        (view.key, 0, encode_header(header)),
    ]


def plan_remove(view: DirView, name: str, where: str) -> tuple[list[Write], dict[str, Any]]:
    """The block that drops ``name`` (blocks are never freed: a later insert fills the
    hole), and the entry removed. :class:`NotFoundError` if it is not there."""
    found = view.find(name)
    if found is None:
        raise NotFoundError(f"{where}: no such file or directory")
    i, entry = found
    rest = {n: e for n, e in view.blocks[i].items() if n != name}
    return [(view.key, BLOCK_BYTES * (i + 1), encode_entries(rest))], entry


def view_of(key: str, blocks: Mapping[int, bytes], dir_id: str = ROOT_ID) -> DirView:
    """A :class:`DirView` of raw blocks by offset (timestamps 0), for tests and tools."""
    header = decode_header(blocks.get(0, b""), key) or Header(dir_id, "", 0)
    entries = [decode_entries(blocks[BLOCK_BYTES * i], key) for i in range(1, header.blocks + 1)]
    return DirView(key, header, 0, entries, [0] * len(entries))
