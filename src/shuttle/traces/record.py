"""The canonical trace record every reader produces and every consumer reads.

One request as a file server sees it: when (seconds from the trace's start), who
(client id), what (operation), which file (an opaque id), where (byte offset) and
how much (bytes). Stored as CSV with the header ``time,client,op,file,offset,size``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Op(StrEnum):
    """Operations a trace can hold. Block operations are ``read`` and ``write``."""

    OPEN = "open"
    CLOSE = "close"
    READ = "read"
    WRITE = "write"
    GETATTR = "getattr"
    SETATTR = "setattr"
    LOOKUP = "lookup"
    ACCESS = "access"
    READDIR = "readdir"
    READLINK = "readlink"
    CREATE = "create"
    REMOVE = "remove"
    RENAME = "rename"
    MKDIR = "mkdir"
    RMDIR = "rmdir"
    LINK = "link"
    SYMLINK = "symlink"
    FSSTAT = "fsstat"
    COMMIT = "commit"
    OTHER = "other"
    # A mobile object's own boundary, in traces of one object (``shuttle trace
    # record-object``): the application's console calls the object (``call``, ``size``
    # = the bytes of the call's arguments) and the object answers (``return``, ``size``
    # = the bytes of its result). They reach no file server: where the object runs
    # decides whether they cross a link. Appended last, so the codes of the others
    # (``traces.background.OPS``) do not move.
    CALL = "call"
    RETURN = "return"

    @property
    def is_block(self) -> bool:
        """Reads and writes move file data through the block cache."""
        return self in (Op.READ, Op.WRITE)

    @property
    def is_console(self) -> bool:
        """A message between the application's console and its mobile object."""
        return self in (Op.CALL, Op.RETURN)

    @property
    def is_metadata(self) -> bool:
        """Every other server request is a metadata request."""
        return not self.is_block and not self.is_console

    @property
    def is_write(self) -> bool:
        """Operations that change state (cost a write, not a read, at the server)."""
        return self in _WRITES


_WRITES = frozenset(
    {
        Op.WRITE,
        Op.SETATTR,
        Op.CREATE,
        Op.REMOVE,
        Op.RENAME,
        Op.MKDIR,
        Op.RMDIR,
        Op.LINK,
        Op.SYMLINK,
        Op.COMMIT,
    }
)

#: Column order of the canonical CSV form.
CSV_COLUMNS = ("time", "client", "op", "file", "offset", "size")


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One request: ``time`` in seconds from the trace start, sizes in bytes."""

    time: float
    client: int
    op: Op
    file: str
    offset: int = 0
    size: int = 0
