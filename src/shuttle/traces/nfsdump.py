"""Reader for nfsdump text (format name ``nfsdump``), as in the Harvard/Ellard traces.

One line per RPC call or reply::

    TIME SRC DST PROTO C3|R3|C2|R2 XID PROCNUM PROCNAME key value key value ...

Only calls become records (a reply repeats the call's work from the server's side).
The procedure name maps to an operation (:data:`PROCEDURES`, NFSv2 and v3); the
file is the call's file handle (``fh``, or ``file`` for v3 ``commit``); the offset
and size are the call's ``off``/``offset`` and ``count``/``tcount`` (hex), so a read
is counted at the size asked for, which is what a server's block cache serves. The
client is the source host (the part of ``SRC`` before the port), numbered 0, 1, ...
in order of first appearance.

Skipped on purpose (and counted in ``skipped``): replies, ``null`` pings (no file),
and calls nfsdump marks ``SHORT PACKET`` (truncated captures, no arguments).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from shuttle.errors import TraceFormatError
from shuttle.traces import io
from shuttle.traces.formats import TraceReader, register
from shuttle.traces.record import Op, TraceRecord

#: NFS procedure names (v2 and v3) → operation. ``None``: not a file request.
PROCEDURES: dict[str, Op | None] = {
    "null": None,
    "getattr": Op.GETATTR,
    "setattr": Op.SETATTR,
    "root": Op.LOOKUP,  # v2: obsolete root-handle lookup
    "lookup": Op.LOOKUP,
    "access": Op.ACCESS,
    "readlink": Op.READLINK,
    "read": Op.READ,
    "writecache": Op.OTHER,  # v2: never implemented by servers
    "write": Op.WRITE,
    "create": Op.CREATE,
    "mkdir": Op.MKDIR,
    "symlink": Op.SYMLINK,
    "mknod": Op.CREATE,
    "remove": Op.REMOVE,
    "rmdir": Op.RMDIR,
    "rename": Op.RENAME,
    "link": Op.LINK,
    "readdir": Op.READDIR,
    "readdirp": Op.READDIR,
    "readdirplus": Op.READDIR,
    "fsstat": Op.FSSTAT,
    "statfs": Op.FSSTAT,  # v2
    "fsinfo": Op.FSSTAT,
    "pathconf": Op.GETATTR,
    "commit": Op.COMMIT,
}

_HEAD = re.compile(
    r"^(?P<time>\d+\.\d+) (?P<src>[0-9a-fA-F.:]+) (?P<dst>[0-9a-fA-F.:]+) (?P<proto>[UT]) "
    r"(?P<dir>[CR])(?P<vers>[234]) (?P<xid>[0-9a-fA-F]+) (?P<proc>[0-9a-fA-F]+) "
    r"(?P<name>\w+)(?P<rest>.*)$"
)
#: Tokens of the key/value part: quoted names (which may hold spaces) or bare words.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\S+')
_FILE_KEYS = ("fh", "file")
_OFFSET_KEYS = ("off", "offset")
_SIZE_KEYS = ("count", "tcount")
_WANTED = frozenset(_FILE_KEYS + _OFFSET_KEYS + _SIZE_KEYS)


@register
class NfsdumpReader(TraceReader):
    """nfsdump text lines (calls ``C2``/``C3``; replies are skipped)."""

    name = "nfsdump"
    description = "nfsdump text (NFSv2/v3 calls, e.g. the Harvard/Ellard traces)"

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        first = head.split(b"\n", 1)[0].decode("utf-8", "replace")
        return _HEAD.match(first) is not None

    def records(self, path: str | Path) -> Iterator[TraceRecord]:
        with io.open_text(path, "r") as stream:
            yield from self.parse(stream, name=str(path))

    def parse(self, lines: Iterable[str], name: str = "<nfsdump>") -> Iterator[TraceRecord]:
        """Parse nfsdump lines from any iterable of text lines."""
        clients: dict[str, int] = {}
        micros0: int | None = None
        for lineno, raw in enumerate(lines, start=1):
            self.position = f"line {lineno}"
            line = raw.strip()
            if not line:
                continue
            m = _HEAD.match(line)
            if m is None:
                raise TraceFormatError(
                    f"{name}:{lineno}: expected 'TIME SRC DST U|T C3|R3 XID PROC NAME ...' "
                    f"(nfsdump text), got {line[:80]!r}"
                )
            if m["dir"] == "R":
                self.skipped["reply"] += 1
                continue
            proc = m["name"].lower()
            if proc not in PROCEDURES:
                raise TraceFormatError(
                    f"{name}:{lineno}: unknown NFS procedure {m['name']!r}; expected one of "
                    f"{', '.join(sorted(PROCEDURES))}"
                )
            op = PROCEDURES[proc]
            if op is None:
                self.skipped[proc] += 1
                continue
            rest = m["rest"]
            if rest.lstrip().startswith("SHORT PACKET"):
                self.skipped["short packet"] += 1
                continue
            fields = _fields(rest)
            file = next((fields[k] for k in _FILE_KEYS if k in fields), None)
            if file is None:
                raise TraceFormatError(
                    f"{name}:{lineno}: the {proc} call has no file handle (fh or file)"
                )
            try:
                offset = int(next((fields[k] for k in _OFFSET_KEYS if k in fields), "0"), 16)
                size = int(next((fields[k] for k in _SIZE_KEYS if k in fields), "0"), 16)
            except ValueError as exc:
                raise TraceFormatError(
                    f"{name}:{lineno}: offset and count must be hex numbers ({exc})"
                ) from exc
            host = m["src"].rsplit(".", 1)[0]
            client = clients.setdefault(host, len(clients))
            # Seconds relative to the first line, from integer microseconds: epoch
            # seconds as floats would round the microseconds away.
            sec, _, frac = m["time"].partition(".")
            micros = int(sec) * 1_000_000 + int(frac.ljust(6, "0")[:6])
            if micros0 is None:
                micros0 = micros
            yield TraceRecord((micros - micros0) / 1e6, client, op, file, offset, size)


def _fields(rest: str) -> dict[str, str]:
    """The first value of each key this reader uses (``fh``, ``off``, ``count``...)."""
    tokens = _TOKEN.findall(rest)
    fields: dict[str, str] = {}
    for i in range(len(tokens) - 1):
        key = tokens[i]
        if key in _WANTED and key not in fields:
            fields[key] = tokens[i + 1]
    return fields
