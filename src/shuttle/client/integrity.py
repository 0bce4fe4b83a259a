"""End-to-end content checks: what a node stored is what the client sent, and what the
client reads is what the node holds. No sockets; both clients call these.

A node keeps the blake3 hash of every object and of each of its content-defined chunks
(docs/storage-format.md), so a client can check bytes against them without trusting
the way between:

* **writes.** A put, a range write and every upload piece carry the hash of their
  payload (``hash``); the node refuses a payload that does not match it before
  anything is stored (:func:`payload_hash`). A put and an upload's commit answer the
  new object's attributes, whose whole-object hash the client compares with the hash
  of what it sent (:func:`check_written`), and whose key with the key it named.
* **reads.** A read of a whole object is checked against the object's hash, which
  every stat carries (:class:`RangeVerifier`): ``get``, ``read`` and ``get_to`` return
  (or rename into place) nothing before it matched, and a stream (``iter_read``) ends
  with the check, so its consumer must not act on its pieces before the stream ended.
  Where the client holds the chunk list (a client with lookaside stores asks for it),
  a read is checked chunk by chunk instead, and no byte of a chunk is handed on before
  the whole chunk matched (:class:`CheckedPieces` holds a stream's pieces until then,
  for both clients). A part of an object read without its chunk list, the
  ragged ends of a range, and small reads made without the object's attributes are
  not checked: there is no hash at hand to check them against (fetching a chunk list
  would cost a round trip per 8,192 chunks before the first byte).

A mismatch raises :class:`~shuttle.errors.IntegrityError` saying what differed; it is
never retried silently and nothing is returned. These checks catch bytes changed on
the way (or on the node's disk); they do not stop a party on the path that changes
both the bytes and the hash it forwards: that is what TLS is for (docs/security.md).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import blake3

from shuttle.client.model import Chunk, ObjectInfo
from shuttle.errors import IntegrityError

#: The argument that carries a payload's hash in ``put``, ``write`` and
#: ``upload.write`` requests (32 bytes of blake3).
HASH_ARG = "hash"


def payload_hash(data: bytes | bytearray | memoryview) -> bytes:
    """The blake3 hash a node checks a request's payload against."""
    return blake3.blake3(data).digest()


def check_written(info: ObjectInfo, key: str, size: int, digest: bytes) -> ObjectInfo:
    """``info`` (a put's or an upload commit's answer) if it is the object the client
    sent: ``key``, ``size`` bytes hashing to ``digest``; else :class:`IntegrityError`."""
    if info.key != key or info.size != size or info.hash != digest:
        raise IntegrityError(
            f"node stored {info.key!r} ({info.size} bytes, blake3 {info.hash.hex()[:16]}…) "
            f"where this client sent {key!r} ({size} bytes, blake3 {digest.hex()[:16]}…): "
            "the request was changed on the way, or the node's store is damaged. Do not "
            "rely on the object; write it again (over TLS, which refuses changed bytes)"
        )
    return info


class UploadHasher:
    """The whole-object hash of an upload, fed its pieces in order as they are sent."""

    def __init__(self) -> None:
        self._hasher = blake3.blake3()
        self.size = 0

    def update(self, piece: bytes | bytearray | memoryview) -> None:
        self._hasher.update(piece)
        self.size += memoryview(piece).nbytes

    def digest(self) -> bytes:
        return self._hasher.digest()


class RangeVerifier:
    """Checks the bytes of ``[start, end)`` of one version of ``key`` as they arrive, in
    order: against the hashes of the chunks that lie wholly inside the range, and, for
    a whole object whose chunks are not all listed, against ``whole_hash`` at the end.

    :meth:`feed` takes the next piece and returns the *safe* offset: every byte before
    it is either checked or in no whole listed chunk. A caller hands on a piece only
    once the safe offset has passed its end, so no byte of a chunk is used before the
    whole chunk matched. :meth:`finish` checks the whole-object hash. Raises
    :class:`IntegrityError` at the first chunk that does not match, at a whole object
    that does not, or if the pieces do not add up to the range.
    """

    def __init__(
        self,
        key: str,
        chunks: Sequence[Chunk],
        start: int,
        end: int,
        whole_hash: bytes | None = None,
    ) -> None:
        self.key = key
        self.start, self.end = start, end
        #: The chunks to check, in order: those wholly inside the range.
        self._chunks = [
            c for c in chunks if c.length > 0 and c.offset >= start and c.offset + c.length <= end
        ]
        self._chunks.sort(key=lambda c: c.offset)
        covered = sum(c.length for c in self._chunks)
        #: The whole object's hash, when the listed chunks do not cover the range.
        self._whole_hash = whole_hash if covered < end - start else None
        # One thread: blake3's own threads did not pay on a 2-core machine shared with
        # the node (1 MiB pieces: 200 µs with them, 166 µs without).
        self._whole: blake3.blake3 | None = blake3.blake3() if self._whole_hash else None
        self._next = 0  # index of the chunk being received (or the next one)
        self._hasher: blake3.blake3 | None = None
        #: Bytes of the range received so far end here.
        self.position = start
        #: Chunks checked so far.
        self.checked = 0

    @classmethod
    def for_object(cls, info: ObjectInfo, start: int, end: int) -> RangeVerifier:
        """A verifier of ``[start, end)`` of the object ``info`` describes: against the
        chunks it lists, and against its hash when the range is the whole object."""
        whole = info.hash if start == 0 and end == info.size else None
        return cls(info.key, info.chunks, start, end, whole)

    def feed(self, piece: bytes | bytearray | memoryview) -> int:
        """The next ``piece`` of the range (pieces in order); returns the safe offset."""
        view = memoryview(piece)
        if self._whole is not None:
            self._whole.update(view)
        pos = self.position
        at = 0
        chunks = self._chunks
        while at < len(view) and self._next < len(chunks):
            chunk = chunks[self._next]
            if pos + (len(view) - at) <= chunk.offset:
                break  # the rest of the piece ends before this chunk starts
            if pos < chunk.offset:  # bytes before the chunk (the range's ragged start)
                skip = chunk.offset - pos
                at += skip
                pos += skip
            take = min(len(view) - at, chunk.offset + chunk.length - pos)
            if self._hasher is None:
                self._hasher = blake3.blake3()
            self._hasher.update(view[at : at + take])
            at += take
            pos += take
            if pos == chunk.offset + chunk.length:
                if self._hasher.digest() != chunk.hash:
                    raise IntegrityError(
                        f"read of {self.key!r}: bytes {chunk.offset}..{pos} do not match "
                        f"their chunk's hash at the node ({chunk.hash.hex()[:16]}…): they "
                        "were changed on the way, or the node's disk returned wrong bytes. "
                        "Nothing of this read was returned; read it again (over TLS, which "
                        "refuses changed bytes)"
                    )
                self._hasher = None
                self._next += 1
                self.checked += 1
        self.position += len(view)
        if self.position > self.end:
            raise IntegrityError(
                f"read of {self.key!r}: the node sent {self.position - self.start} bytes for a "
                f"range of {self.end - self.start}"
            )
        return self.safe()

    def safe(self) -> int:
        """The offset before which every received byte is checked or uncheckable."""
        if self._next < len(self._chunks):
            return min(self.position, self._chunks[self._next].offset)
        return self.position

    def finish(self) -> int:
        """The range ended here: raises :class:`IntegrityError` if bytes of a chunk are
        still missing (the node sent fewer than the range holds)."""
        if self._next < len(self._chunks) or self.position != self.end:
            raise IntegrityError(
                f"read of {self.key!r}: the node sent {self.position - self.start} bytes of a "
                f"{self.end - self.start}-byte range of a version that holds them all"
            )
        if self._whole is not None and self._whole.digest() != self._whole_hash:
            assert self._whole_hash is not None
            raise IntegrityError(
                f"read of {self.key!r}: its {self.end} bytes do not match the object's hash "
                f"at the node ({self._whole_hash.hex()[:16]}…): they were changed on the way, "
                "or the node's disk returned wrong bytes. Do not use what this read "
                "returned; read it again (over TLS, which refuses changed bytes)"
            )
        return self.position


#: A piece of a streamed read, as the connection received it (large ones uncopied).
Piece = bytes | bytearray


class CheckedPieces:
    """The pieces of a streamed range, handed on only once ``verifier`` has checked
    every byte of them (no byte of a chunk before the whole chunk matched): what both
    clients' ``iter_read`` yields. :meth:`add` takes the next piece received and
    returns those now safe, in order; :meth:`finish`, at the stream's end, makes the
    last check and returns the rest. Raises as :class:`RangeVerifier` does."""

    def __init__(self, verifier: RangeVerifier) -> None:
        self.verifier = verifier
        self._held: deque[Piece] = deque()  # received, not yet all checked
        self._released = verifier.start  # every piece before here was handed on

    def add(self, piece: Piece) -> list[Piece]:
        held = self._held
        held.append(piece)
        safe = self.verifier.feed(piece)
        out = []
        while held and self._released + len(held[0]) <= safe:
            out.append(held.popleft())
            self._released += len(out[-1])
        return out

    def finish(self) -> list[Piece]:
        self.verifier.finish()
        out = list(self._held)
        self._held.clear()
        return out
