"""Every error Shuttle raises, split by whose fault it is.

* :class:`UsageError` and its children: the caller asked for something invalid
  (a bad key, a bad config, an oversized request). Fix the call.
* :class:`RemoteError` and its children: something outside the caller failed or
  refused (a node is unreachable, an object is missing, the peer broke the
  protocol). See the message and ``__cause__``.

Each error has a stable ``code`` (a short string) so that a storage node can send it
back as a typed error response and the client can raise the same class again
(:func:`error_from_code`). Messages say what was wrong and what to do about it.
"""

from __future__ import annotations

from typing import ClassVar


class ShuttleError(Exception):
    """Base of every Shuttle error. ``code`` travels on the wire."""

    code: ClassVar[str] = "error"
    #: Exit status the CLI uses for this error (scripts can rely on it).
    exit_code: ClassVar[int] = 1


# --- the caller's fault --------------------------------------------------------------


class UsageError(ShuttleError):
    """The request itself is invalid; retrying it unchanged will fail again."""

    code = "usage"
    exit_code = 2


class ConfigError(UsageError):
    """A configuration file or flag is malformed or out of range."""

    code = "config"


class InvalidKeyError(UsageError):
    """An object key is malformed or tries to escape the node's data directory."""

    code = "invalid_key"


class KeyConflictError(InvalidKeyError):
    """A key clashes with another object's path (``a`` is an object, so ``a/b`` cannot be)."""

    code = "key_conflict"


class LimitExceededError(UsageError):
    """A named limit (frame size, header size, in-flight requests, ...) was crossed."""

    code = "limit_exceeded"


class UnknownOperationError(UsageError):
    """The peer does not implement the requested operation."""

    code = "unknown_operation"


class InvalidArgumentError(UsageError):
    """An operation was called with missing or mistyped arguments."""

    code = "invalid_argument"


class LocalProtocolError(UsageError):
    """We were about to break the wire protocol (a programming error on our side)."""

    code = "local_protocol"


class TraceFormatError(UsageError):
    """A trace file is malformed (the message names the line or byte offset)."""

    code = "trace_format"


class NetnsUnavailableError(UsageError):
    """Network namespaces were asked for where they cannot be made (not root, no
    ``ip netns``, no ``tc``)."""

    code = "netns_unavailable"


class ClosedFileError(UsageError, ValueError):
    """A read or write on a remote file object that was closed. A ``ValueError`` too:
    that is what :mod:`io` raises for closed files, and what its callers catch."""

    code = "closed_file"


class SpeculationError(UsageError):
    """A speculated function's branch could not deliver its outcome (a forked branch
    that exited without a result, or whose result cannot be pickled)."""

    code = "speculation"


# --- something outside the caller ----------------------------------------------------


class RemoteError(ShuttleError):
    """Something outside the caller failed; see the message and ``__cause__``."""

    code = "remote"
    exit_code = 3


class NotFoundError(RemoteError):
    """The object (or prefix) does not exist on the node."""

    code = "not_found"
    exit_code = 4


class AlreadyExistsError(RemoteError):
    """``create`` with ``exclusive`` found an object already there."""

    code = "exists"
    exit_code = 5


class DirectoryNotEmptyError(AlreadyExistsError):
    """A directory of the FUSE mount or the fsspec filesystem still holds entries
    (``rmdir``, or a rename onto it)."""

    code = "dir_not_empty"


class VersionMismatchError(RemoteError):
    """A conditional operation found a different version than the caller expected."""

    code = "version_mismatch"
    exit_code = 5


class StaleDataError(VersionMismatchError):
    """Data read from a speculatively validated file came from a cached copy that the
    node had since replaced; nothing read from that open may be acted on. Open the
    object again to read its current version."""

    code = "stale_data"


class RemoteProtocolError(RemoteError):
    """The peer broke the wire protocol (garbage bytes, bad header, wrong version)."""

    code = "protocol"


class UnreachableError(RemoteError):
    """A node could not be reached or the connection dropped."""

    code = "unreachable"
    exit_code = 6


class RequestTimeoutError(RemoteError):
    """A request did not complete within its timeout."""

    code = "timeout"
    exit_code = 6


class ExternalToolError(RemoteError):
    """A program Shuttle runs (strace, tre-agrep) is missing or failed."""

    code = "external_tool"


class AuthenticationError(RemoteError):
    """The handshake failed: a missing or wrong cluster key, or a proof that does not
    answer this connection's challenge (a replayed HELLO)."""

    code = "unauthenticated"
    exit_code = 7


class TlsError(AuthenticationError):
    """A TLS connection could not be made or was broken: the node's certificate does
    not chain to the cluster's CA or names another host, one side speaks TLS and the
    other does not, or a record failed its authentication (bytes changed on the way).
    Never retried: the same connection would fail the same way."""

    code = "tls"


class NotPermittedError(RemoteError):
    """The node refuses this request: the principal the connection authenticated as
    lacks the capability it needs (the message names the capability, the key and the
    principal), or the node refuses it to everyone in its configuration (shipped code on
    a node started without a cluster key). Nothing was changed."""

    code = "not_permitted"
    exit_code = 10


class IntegrityError(RemoteError):
    """Bytes did not match their content hash: what a node stored is not what this
    client sent, or what it read is not what the node holds. They were changed on the
    way (or on the node); the message says which and what to do. Bytes read that fail
    are never returned; a payload that fails at the node is never stored."""

    code = "integrity"


class ObjectNotFoundError(NotFoundError):
    """No mobile object has this id (it was never created, or it was destroyed)."""

    code = "no_such_object"


class ObjectFailedError(RemoteError):
    """A mobile object's method raised; the message names the object, the method and
    the exception. The object itself is still alive unless the message says so."""

    code = "object_failed"


class ObjectLimitError(ObjectFailedError):
    """A shipped object went over its memory, CPU or time limit and was stopped."""

    code = "object_limit"


class ObjectBusyError(RemoteError):
    """The object is moving, arriving or in a long call; try again shortly."""

    code = "object_busy"


class MigrationError(RemoteError):
    """A migration did not happen; the object still runs where it was, state intact."""

    code = "migration_failed"


class ObjectInDoubtError(RemoteError):
    """The object's place or state is in doubt for longer than a caller waits: a
    migration awaits its home's answer, or a durable object could not reach its home
    to make a call's change durable (the call may or may not have taken effect).
    Nothing was guessed; try again once the home is reachable."""

    code = "object_in_doubt"
    exit_code = 6


class NodeBusyError(RemoteError):
    """The node is out of a shared resource for now (connections, upload sessions,
    file descriptors); nothing was changed. Retry later, or raise the node's limit."""

    code = "busy"
    exit_code = 8


class ServerError(RemoteError):
    """The node failed while handling a valid request (a bug or an I/O error there)."""

    code = "server"


class StorageIOError(ServerError):
    """The node's disk returned an error (full, read-only, I/O error)."""

    code = "storage_io"


class DiskFullError(StorageIOError):
    """The node's disk is full (or would be after this change): nothing was changed.
    Removes and shrinking truncates still work (the node keeps a reserve for them);
    remove objects or give the data directory's file system more space, then retry."""

    code = "disk_full"
    exit_code = 9


_BY_CODE: dict[str, type[ShuttleError]] = {}


def _register(cls: type[ShuttleError]) -> None:
    _BY_CODE[cls.code] = cls
    for sub in cls.__subclasses__():
        _register(sub)


_register(ShuttleError)


def error_from_code(code: str, message: str) -> ShuttleError:
    """Rebuild the error a peer sent as ``(code, message)``.

    Unknown codes (a newer peer) become a plain :class:`RemoteError` that keeps the
    code in its message, so nothing is silently lost.
    """
    cls = _BY_CODE.get(code)
    if cls is None:
        return RemoteError(f"[{code}] {message}")
    return cls(message)


def all_error_codes() -> dict[str, type[ShuttleError]]:
    """The registry of wire error codes (for docs and tests)."""
    return dict(_BY_CODE)
