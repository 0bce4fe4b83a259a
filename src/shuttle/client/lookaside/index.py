"""The persistent index of one lookaside store: chunk hash → file, offset, length.

Every regular file under the store's root is chunked exactly as the node chunks
objects (:mod:`shuttle.cdc`: FastCDC cut points, blake3 of each chunk), and each
distinct chunk of a file is written down in SQLite with the file's size and
``mtime_ns`` as they were when it was indexed::

    files(id, path, size, mtime_ns, indexed)     -- path relative to the root
    chunks(hash, file -> files.id, offset, length)

:meth:`LookasideIndex.refresh` walks the root and re-indexes a file only if its size
or mtime changed (or it is new), and forgets files that are gone. The database is in
WAL mode, so a client can look chunks up while ``shuttle lookaside index`` re-indexes
in another process.

An entry can still go stale between refreshes (a file edited in place, even to the
same size within the same mtime tick): the reader verifies every chunk it takes from
a store against its hash and calls :meth:`LookasideIndex.drop_file` when one does not
match or the file's size or mtime moved; a dropped file keeps a row with size -1, so
the next refresh indexes it again.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from shuttle.cdc import CHUNKING_ID, ChunkRef, chunk_file

#: Bump when the schema changes: an index of another version is rebuilt from scratch.
SCHEMA_VERSION = 1
#: What the hashes in an index mean. An index made with other chunking parameters (an
#: older Shuttle's: one size class for every file) would never match, so it is rebuilt,
#: not consulted. A file is chunked in its own size's class, as the node chunks an
#: object of that size; a file that moved to another class between two releases
#: matches nothing (indexing every file in the neighbouring class too doubled the index
#: and supplied 0.6 points more of sympy 1.14.0 from 1.12.1: docs/lookaside.md).
CHUNKING = CHUNKING_ID
#: Hashes per ``IN (...)`` query: well under SQLite's smallest variable limit (999).
LOOKUP_BATCH_MAX = 500
#: Files indexed per transaction: a commit per file would make a tree of 70,000 small
#: files (a kernel source tree) spend its time in fsyncs; this bounds the work a
#: crash loses to a few hundred files.
FILES_PER_COMMIT = 256
#: A busy database (another process re-indexing) is waited for this long.
BUSY_TIMEOUT_S = 10.0
#: ... except by a read dropping a stale entry: it must not stall behind an index run.
DROP_WAIT_S = 0.05

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS files(
    id INTEGER PRIMARY KEY,
    path TEXT NOT NULL UNIQUE,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    indexed REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS chunks(
    hash BLOB NOT NULL,
    file INTEGER NOT NULL REFERENCES files(id) ON DELETE CASCADE,
    offset INTEGER NOT NULL,
    length INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS chunks_by_hash ON chunks(hash);
CREATE INDEX IF NOT EXISTS chunks_by_file ON chunks(file);
"""

#: ``progress(bytes_indexed_now)`` while a refresh chunks files.
IndexProgress = Callable[[int], None]


def _no_progress(_: int) -> None:
    pass


@dataclass(frozen=True, slots=True)
class Location:
    """Where a store holds a chunk: ``length`` bytes at ``offset`` of ``path`` (relative
    to the store's root), in the file as it was indexed (``size``, ``mtime_ns``)."""

    path: str
    offset: int
    length: int
    size: int
    mtime_ns: int


@dataclass(slots=True)
class IndexReport:
    """What one :meth:`LookasideIndex.refresh` did."""

    files_indexed: int = 0
    files_unchanged: int = 0
    files_removed: int = 0
    bytes_indexed: int = 0
    chunks_indexed: int = 0
    #: ``(relative path, why)`` for files that could not be read (left out).
    skipped: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class IndexSummary:
    """What an index holds (``shuttle lookaside ls``)."""

    files: int
    chunks: int
    bytes: int
    last_indexed: float | None


class LookasideIndex:
    """The SQLite index of the store rooted at ``root``, kept in ``db_path``.

    Thread-safe (one connection behind a lock). Raises ``sqlite3.Error`` only for a
    database that cannot be opened or written at all.
    """

    def __init__(self, db_path: Path, root: Path) -> None:
        self.db_path = db_path
        self.root = root
        db_path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(
            db_path, timeout=BUSY_TIMEOUT_S, check_same_thread=False, isolation_level=None
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at checkpoints
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(_SCHEMA)
        self._check_meta()

    def _check_meta(self) -> None:
        want = {"schema": str(SCHEMA_VERSION), "chunking": CHUNKING, "root": str(self.root)}
        have = dict(self._db.execute("SELECT name, value FROM meta").fetchall())
        if have == want:
            return
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                if have:  # another schema, chunking or root: start over
                    self._db.execute("DELETE FROM chunks")
                    self._db.execute("DELETE FROM files")
                self._db.execute("DELETE FROM meta")
                self._db.executemany("INSERT INTO meta VALUES (?, ?)", want.items())
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # --- indexing ----------------------------------------------------------------------

    def refresh(self, progress: IndexProgress = _no_progress) -> IndexReport:
        """Bring the index up to date with the files under the root: index new files
        and files whose size or mtime changed, forget removed ones. Unreadable files
        are left out and listed in the report's ``skipped``."""
        report = IndexReport()
        known = self._known_files()
        seen: set[str] = set()
        pending: list[tuple[str, os.stat_result]] = []
        for rel, st in self._walk(report):
            seen.add(rel)
            old = known.get(rel)
            if old is not None and old == (st.st_size, st.st_mtime_ns):
                report.files_unchanged += 1
            else:
                pending.append((rel, st))
        gone = [rel for rel in known if rel not in seen]
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany("DELETE FROM files WHERE path = ?", ((g,) for g in gone))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        report.files_removed = len(gone)
        for start in range(0, len(pending), FILES_PER_COMMIT):
            self._index_batch(pending[start : start + FILES_PER_COMMIT], report, progress)
        return report

    def pending_bytes(self) -> int:
        """Bytes a :meth:`refresh` would chunk now (for a progress bar's total)."""
        known = self._known_files()
        return sum(
            st.st_size
            for rel, st in self._walk(IndexReport())
            if known.get(rel) != (st.st_size, st.st_mtime_ns)
        )

    def _known_files(self) -> dict[str, tuple[int, int]]:
        with self._lock:
            rows = self._db.execute("SELECT path, size, mtime_ns FROM files").fetchall()
        return {path: (size, mtime) for path, size, mtime in rows}

    def _walk(self, report: IndexReport) -> Iterable[tuple[str, os.stat_result]]:
        """``(relative path, lstat)`` of every regular file under the root. Symbolic
        links are not followed (a link could lead out of the store or into a loop)."""

        def failed(exc: OSError) -> None:
            where = Path(exc.filename) if exc.filename else self.root
            report.skipped.append((_rel(where, self.root), exc.strerror or str(exc)))

        for dirpath, dirnames, filenames in os.walk(self.root, onerror=failed):
            dirnames.sort()
            for name in sorted(filenames):
                full = os.path.join(dirpath, name)
                try:
                    st = os.lstat(full)
                except OSError as exc:
                    report.skipped.append((_rel(Path(full), self.root), exc.strerror or str(exc)))
                    continue
                if stat.S_ISREG(st.st_mode):
                    yield _rel(Path(full), self.root), st

    def _index_batch(
        self,
        batch: list[tuple[str, os.stat_result]],
        report: IndexReport,
        progress: IndexProgress,
    ) -> None:
        chunked: list[tuple[str, int, int, list[ChunkRef]]] = []
        for rel, st in batch:
            try:
                size, mtime_ns, refs = chunk_one_file(self.root / rel)
            except OSError as exc:
                report.skipped.append((rel, exc.strerror or str(exc)))
                continue
            chunked.append((rel, size, mtime_ns, refs))
            progress(st.st_size)
        now = time.time()
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for rel, size, mtime_ns, refs in chunked:
                    self._db.execute("DELETE FROM files WHERE path = ?", (rel,))
                    cur = self._db.execute(
                        "INSERT INTO files(path, size, mtime_ns, indexed) VALUES (?, ?, ?, ?)",
                        (rel, size, mtime_ns, now),
                    )
                    file_id = cur.lastrowid
                    rows = _distinct(refs)
                    self._db.executemany(
                        "INSERT INTO chunks(hash, file, offset, length) VALUES (?, ?, ?, ?)",
                        ((r.hash, file_id, r.offset, r.length) for r in rows),
                    )
                    report.files_indexed += 1
                    report.bytes_indexed += size
                    report.chunks_indexed += len(rows)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    # --- lookups -----------------------------------------------------------------------

    def lookup(self, hashes: Iterable[bytes]) -> dict[bytes, Location]:
        """Where this store holds each of ``hashes`` (those it does not hold are absent)."""
        wanted = list(dict.fromkeys(hashes))
        out: dict[bytes, Location] = {}
        with self._lock:
            for start in range(0, len(wanted), LOOKUP_BATCH_MAX):
                part = wanted[start : start + LOOKUP_BATCH_MAX]
                marks = ",".join("?" * len(part))
                rows = self._db.execute(
                    "SELECT c.hash, f.path, c.offset, c.length, f.size, f.mtime_ns "
                    f"FROM chunks c JOIN files f ON f.id = c.file WHERE c.hash IN ({marks})",
                    part,
                ).fetchall()
                for h, path, offset, length, size, mtime_ns in rows:
                    out.setdefault(bytes(h), Location(path, offset, length, size, mtime_ns))
        return out

    def drop_file(self, path: str) -> bool:
        """Forget the chunks of ``path`` (they proved stale) until the next refresh
        indexes it again. A read calls this: if another process is writing the index
        (``shuttle lookaside index``), it gives up after :data:`DROP_WAIT_S` and
        returns False rather than stall the read (the entry stays, and is caught again
        by the same check next time)."""
        with self._lock:
            self._db.execute(f"PRAGMA busy_timeout = {int(DROP_WAIT_S * 1000)}")
            try:
                self._db.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError:
                return False
            finally:
                self._db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            try:
                row = self._db.execute("SELECT id FROM files WHERE path = ?", (path,)).fetchone()
                if row is not None:
                    self._db.execute("DELETE FROM chunks WHERE file = ?", (row[0],))
                    self._db.execute("UPDATE files SET size = -1 WHERE id = ?", (row[0],))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return True

    def summary(self) -> IndexSummary:
        with self._lock:
            files, total, last = self._db.execute(
                "SELECT COUNT(*), COALESCE(SUM(MAX(size, 0)), 0), MAX(indexed) FROM files"
            ).fetchone()
            (chunks,) = self._db.execute("SELECT COUNT(*) FROM chunks").fetchone()
        return IndexSummary(files=files, chunks=chunks, bytes=total, last_indexed=last)


def chunk_one_file(path: Path) -> tuple[int, int, list[ChunkRef]]:
    """``(size, mtime_ns, chunks)`` of the file at ``path``, chunked as the node would.

    Raises ``OSError`` if it cannot be read, or if it changed while being chunked (its
    chunks would describe no version of it)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    try:
        before = os.fstat(fd)
        refs = chunk_file(fd, before.st_size)
        after = os.fstat(fd)
    finally:
        os.close(fd)
    if (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns):
        raise OSError(0, "changed while being indexed; run `shuttle lookaside index` again")
    return before.st_size, before.st_mtime_ns, refs


def _distinct(refs: list[ChunkRef]) -> list[ChunkRef]:
    """The first occurrence of each hash: one place to read a chunk from is enough
    (and a sparse file's thousands of zero chunks become one row)."""
    seen: set[bytes] = set()
    out = []
    for r in refs:
        if r.hash not in seen:
            seen.add(r.hash)
            out.append(r)
    return out


def _rel(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)
