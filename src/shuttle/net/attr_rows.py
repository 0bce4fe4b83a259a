"""The compact ("rows") form of many objects' attributes on the wire.

``stat_many`` and ``callback.promise_many`` answer, in their original form, a list
with one map per key: every entry repeats the field names, the key the client just
sent, the whole-object hash that a one-chunk object's chunk hash already is, chunk
offsets that follow from the lengths, and the promise's term, the same for every
grant. For a directory of small source files that is ~190 bytes of header per file,
of which ~50 carry information. A client that asks for ``form: "rows1"`` gets instead

    {"form": "rows1", "rows": [row or nil, ...], "term_s": float}   (term_s: promises only)

with one positional row per key asked (nil: no such object), in the order asked:

    [size, version, mtime_ns, lengths, hashes, hash?, chunks_total?, promise?]

* ``hashes``: the listed chunks' 32-byte blake3 hashes, concatenated (so the number
  of chunks listed is ``len(hashes) // 32``);
* ``lengths``: the chunks' lengths; the last one is left out when the list is complete
  (it is ``size`` minus the others). Chunks are contiguous from offset 0, so their
  offsets follow. A one-chunk object sends ``[]``;
* ``hash``: the whole object's blake3, nil when it is implied: the only chunk's hash
  (a one-chunk object), or blake3 of nothing (an empty object);
* ``chunks_total``: nil when every chunk is listed;
* ``promise`` (promise replies): nil for none, the grant's ``seq`` when its term is
  the envelope's ``term_s``, else ``[seq, term_s]``.

Trailing nils are left out. The form is lossless: :func:`decode_rows` gives back the
maps of the original form, key included (the client knows the keys it asked for), so
everything above the codec sees the same attributes either way. A node that does not
know the form ignores the argument and answers the original list, which
:func:`decode_rows` takes too: old nodes and new clients, and new nodes and old
clients (who never ask), keep working together.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import blake3

#: The name a client asks for (``form`` argument) and the node answers with.
ROWS_FORM = "rows1"
#: Bytes of one chunk hash (blake3).
HASH_BYTES = 32
#: The whole-object hash of an empty object, implied by a row.
EMPTY_HASH = blake3.blake3(b"").digest()

_ROW_FIELDS = 8


def wants_rows(args: Mapping[str, Any]) -> bool:
    """Whether a request asks for the rows form (``form: "rows1"``); another value is
    refused, so a client never takes an answer for a form it did not ask for."""
    form = args.get("form")
    if form is None:
        return False
    if form != ROWS_FORM:
        raise ValueError(f"form must be {ROWS_FORM!r} or absent, got {form!r}")
    return True


def encode_rows(
    entries: Sequence[Mapping[str, Any] | None], *, promises: bool = False
) -> dict[str, Any]:
    """The rows form of ``entries`` (maps as ``stat`` answers them; with ``promises``,
    each with its ``promise``: None or ``{seq, term_s}``)."""
    term_s: float | None = None
    if promises:
        terms = [e["promise"]["term_s"] for e in entries if e is not None and e["promise"]]
        term_s = max(set(terms), key=terms.count) if terms else 0.0
    rows = [None if e is None else _row(e, promises, term_s) for e in entries]
    out: dict[str, Any] = {"form": ROWS_FORM, "rows": rows}
    if promises:
        out["term_s"] = term_s
    return out


def _row(e: Mapping[str, Any], promises: bool, term_s: float | None) -> list[Any]:
    size: int = e["size"]
    chunks: Sequence[Sequence[Any]] = e["chunks"]
    total: int = e.get("chunks_total", len(chunks))
    offset = 0
    for c in chunks:
        if c[0] != offset or len(c[2]) != HASH_BYTES:
            raise ValueError(f"chunks of {e['key']!r} are not contiguous blake3 chunks from 0")
        offset += c[1]
    lengths = [c[1] for c in chunks]
    if total == len(chunks) and chunks and offset == size:
        lengths.pop()  # implied: size minus the others
    whole: bytes = e["hash"]
    implied = (len(chunks) == 1 == total and chunks[0][2] == whole) or (
        size == 0 and total == 0 and whole == EMPTY_HASH
    )
    row: list[Any] = [
        size,
        e["version"],
        e["mtime_ns"],
        lengths,
        b"".join(bytes(c[2]) for c in chunks),
        None if implied else whole,
        None if total == len(chunks) else total,
    ]
    if promises:
        p = e["promise"]
        if p is None:
            row.append(None)
        else:
            row.append(p["seq"] if p["term_s"] == term_s else [p["seq"], p["term_s"]])
    while row and row[-1] is None:
        row.pop()
    return row


def decode_rows(result: Any, keys: Sequence[str]) -> list[dict[str, Any] | None]:
    """The maps of the original form from an answer in either form, for ``keys`` (the
    keys asked, in order). Raises ValueError on an answer that fits neither."""
    if isinstance(result, list):  # the original form (a node that ignored ``form``)
        if len(result) != len(keys):
            raise ValueError(f"{len(result)} entries answered for {len(keys)} keys")
        if not all(e is None or isinstance(e, dict) for e in result):
            raise ValueError(f"an attribute entry that is not a map: {result!r:.120}")
        return result
    if not isinstance(result, dict) or result.get("form") != ROWS_FORM:
        raise ValueError(f"not an attribute list nor the {ROWS_FORM} form: {result!r:.120}")
    rows = result["rows"]
    if not isinstance(rows, list) or len(rows) != len(keys):
        raise ValueError(f"{len(rows)} rows answered for {len(keys)} keys")
    promises = "term_s" in result
    if promises and not _is_number(result["term_s"]):
        raise ValueError(f"term_s must be a number, got {result['term_s']!r:.60}")
    return [
        None if row is None else _entry(row, key, promises, result.get("term_s"))
        for row, key in zip(rows, keys, strict=True)
    ]


def _entry(row: list[Any], key: str, promises: bool, term_s: Any) -> dict[str, Any]:
    if not isinstance(row, list) or not 5 <= len(row) <= _ROW_FIELDS:
        raise ValueError(f"malformed attribute row for {key!r}: {row!r:.120}")
    size, version, mtime_ns, lengths, hashes, whole, total, grant = row + [None] * (
        _ROW_FIELDS - len(row)
    )
    if not (
        _is_count(size)
        and _is_count(version)
        and type(mtime_ns) is int  # before 1970 in a lookaside store: negative
        and isinstance(lengths, list)
        and all(_is_count(n) for n in lengths)
        and isinstance(hashes, bytes)
        and (whole is None or (isinstance(whole, bytes) and len(whole) == HASH_BYTES))
        and (total is None or _is_count(total))
        and (
            grant is None
            or _is_count(grant)
            or (
                isinstance(grant, list)
                and len(grant) == 2
                and _is_count(grant[0])
                and _is_number(grant[1])
            )
        )
    ):
        raise ValueError(f"malformed attribute row for {key!r}: {row!r:.120}")
    n, rest = divmod(len(hashes), HASH_BYTES)
    if rest or len(lengths) not in (n, n - 1):
        raise ValueError(f"chunk lengths and hashes of {key!r} do not agree")
    if len(lengths) == n - 1:
        if total is not None:  # a first page lists every length
            raise ValueError(f"chunk lengths of {key!r} are missing from a partial list")
        if sum(lengths) > size:
            raise ValueError(f"chunk lengths of {key!r} exceed its size")
        lengths = [*lengths, size - sum(lengths)]
    chunks: list[list[Any]] = []
    offset = 0
    for i, length in enumerate(lengths):
        chunks.append([offset, length, hashes[i * HASH_BYTES : (i + 1) * HASH_BYTES]])
        offset += length
    total = n if total is None else total
    if total < n:
        raise ValueError(f"{key!r} lists more chunks than its chunks_total")
    if whole is None:
        if n == 1 == total:
            whole = chunks[0][2]
        elif size == 0 and total == 0:
            whole = EMPTY_HASH
        else:
            raise ValueError(f"no whole-object hash for {key!r} and none implied")
    out: dict[str, Any] = {
        "key": key,
        "size": size,
        "version": version,
        "mtime_ns": mtime_ns,
        "hash": whole,
        "chunks": chunks,
        "chunks_total": total,
    }
    if promises:
        if grant is None:
            out["promise"] = None
        elif isinstance(grant, list):
            out["promise"] = {"seq": grant[0], "term_s": grant[1]}
        else:
            out["promise"] = {"seq": grant, "term_s": term_s}
    return out


def _is_count(v: Any) -> bool:
    return type(v) is int and v >= 0


def _is_number(v: Any) -> bool:
    return type(v) in (int, float)
