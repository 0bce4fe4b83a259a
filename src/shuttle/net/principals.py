"""Principals and their capabilities, as Ceph's cephx caps: who may do what on a node.

A *principal* is a named client identity with *capabilities* (:class:`Caps`):

* ``read``: key prefixes it may read, stat and list under;
* ``write``: key prefixes it may write, create, truncate, remove and upload under;
* ``ship``: whether it may ship code (a Python class run on a node in the jail);
* ``admin``: whether it may run cluster operations (principal management, a node's
  counters, the run-time's tables, dropping caches; docs/security.md lists them).

The cluster key stays the administrator's: a connection that proves it holds the
cluster key is *unrestricted* (it is not a principal; nodes use it between
themselves too). Everything here is pure: no sockets, no files.

**Keys are derived, not stored.** A principal's key is a blake3 keyed hash of its
name and a random salt under the cluster key (:func:`derive_key`). Nodes hold the
cluster key, so they recompute a principal's key when it connects; the table they
store (:class:`PrincipalTable`: names, caps, salts) holds no secret. Removing a
principal and adding it again draws a new salt, so the old key file stops working.
Changing the cluster key changes every principal's key.

**Prefixes are plain string prefixes** of keys: ``data/`` covers ``data/x`` but not
``data`` or ``database``; ``data`` covers all three. The empty prefix covers every
key. Keys are validated by the store (no ``..``, no empty components), so a key that
starts with a prefix really lies under it.
"""

from __future__ import annotations

import hmac
import json
import os
import re
import shlex
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

import blake3

from shuttle.errors import ConfigError, InvalidArgumentError, NotPermittedError

#: Bytes of a principal's random salt: 128 bits, so two additions of the same name
#: never derive the same key.
SALT_BYTES: Final = 16
#: Bytes of a derived principal key (a cluster key's size: blake3's keyed mode).
PRINCIPAL_KEY_BYTES: Final = 32
#: Principal names: short identifiers that are safe in logs, file names and messages.
NAME_PATTERN: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
#: Prefixes one capability may list: a principal is a handful of directories, and every
#: restricted listing asks the store once per prefix it covers.
PREFIXES_MAX: Final = 64
#: Bytes of one prefix (a key is at most 1,024 bytes of UTF-8).
PREFIX_BYTES_MAX: Final = 1024
#: Principals one table may hold: the table is sent whole to every node at each change
#: and held in each node's memory (a few hundred bytes a principal).
PRINCIPALS_MAX: Final = 10_000
#: The format number of a stored table (refused if it does not match).
TABLE_FORMAT: Final = 1

# Domain separation for derived keys: the cluster key also keys the handshake's
# proofs, which start with their own prefixes (shuttle.net.auth).
_KEY_DOMAIN: Final = b"shuttle principal key v1\x00"


def check_name(name: object) -> str:
    """``name`` if it is a valid principal name, else :class:`InvalidArgumentError`."""
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise InvalidArgumentError(
            f"principal name {name!r:.80} is not valid: 1 to 64 letters, digits, '.', '_', "
            "'@' or '-', starting with a letter or digit"
        )
    return name


def _check_prefixes(prefixes: Iterable[object], what: str) -> tuple[str, ...]:
    out: list[str] = []
    for p in prefixes:
        if not isinstance(p, str):
            raise InvalidArgumentError(f"{what} prefixes must be strings, got {p!r:.40}")
        if len(p.encode()) > PREFIX_BYTES_MAX or any(ord(c) < 32 or ord(c) == 127 for c in p):
            raise InvalidArgumentError(
                f"{what} prefix {p!r:.60} is not valid: at most {PREFIX_BYTES_MAX} bytes, "
                "no control characters"
            )
        if p.startswith("/"):
            raise InvalidArgumentError(
                f"{what} prefix {p!r:.60} starts with '/': keys never do (write 'data/', "
                "not '/data/'; '' covers every key)"
            )
        if p not in out:
            out.append(p)
    if len(out) > PREFIXES_MAX:
        raise InvalidArgumentError(f"at most {PREFIXES_MAX} {what} prefixes, got {len(out)}")
    return tuple(sorted(out))


def _minimal(prefixes: Iterable[str]) -> list[str]:
    """The prefixes not covered by another one of them (``a/`` covers ``a/b/``)."""
    ordered = sorted(set(prefixes))
    out: list[str] = []
    for p in ordered:
        if not any(p.startswith(q) for q in out):
            out.append(p)
    return out


def _show(prefixes: Sequence[str]) -> str:
    return ", ".join(repr(p) if p else "'' (every key)" for p in prefixes) or "nothing"


@dataclass(frozen=True, slots=True)
class Caps:
    """What a principal may do (see the module docstring)."""

    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    ship: bool = False
    admin: bool = False

    @classmethod
    def of(
        cls,
        read: Iterable[object] = (),
        write: Iterable[object] = (),
        ship: object = False,
        admin: object = False,
    ) -> Caps:
        """Checked caps (prefixes deduplicated and sorted); InvalidArgumentError."""
        if not isinstance(ship, bool) or not isinstance(admin, bool):
            raise InvalidArgumentError("ship and admin are true or false")
        return cls(_check_prefixes(read, "read"), _check_prefixes(write, "write"), ship, admin)

    def may_read(self, key: str) -> bool:
        return key.startswith(self.read)  # a tuple: one C call, on the read lane too

    def may_write(self, key: str) -> bool:
        return key.startswith(self.write)

    def list_roots(self, prefix: str) -> list[str] | None:
        """What a listing under ``prefix`` may show: None for all of it (a read prefix
        covers ``prefix``), else the read prefixes that lie under ``prefix`` (only keys
        under them may be listed; empty: nothing may be)."""
        if prefix.startswith(self.read):
            return None
        return _minimal(p for p in self.read if p.startswith(prefix))

    def describe(self) -> str:
        """One line: ``read 'data/'; write 'scratch/'; ship; admin``."""
        parts = []
        if self.read:
            parts.append(f"read {_show(self.read)}")
        if self.write:
            parts.append(f"write {_show(self.write)}")
        if self.ship:
            parts.append("ship")
        if self.admin:
            parts.append("admin")
        return "; ".join(parts) or "no capabilities"

    def as_flags(self) -> str:
        """These caps as ``shuttle cluster user caps`` flags (quoted for a shell)."""
        flags = [f"--read {shlex.quote(p)}" for p in self.read]
        flags += [f"--write {shlex.quote(p)}" for p in self.write]
        flags += ["--ship"] * self.ship + ["--admin"] * self.admin
        return " ".join(flags)

    def to_json(self) -> dict[str, Any]:
        return {
            "read": list(self.read),
            "write": list(self.write),
            "ship": self.ship,
            "admin": self.admin,
        }


@dataclass(frozen=True, slots=True)
class Principal:
    """A named identity with its caps; ``salt`` makes its derived key its own."""

    name: str
    caps: Caps
    salt: bytes
    created_ns: int = 0
    #: True for a stand-in of a principal no longer in the table: it may do nothing.
    removed: bool = False

    # --- checks: each raises NotPermittedError naming what is missing ------------

    def require_read(self, key: str, what: str = "read", via: str = "") -> None:
        """The read capability on ``key`` (``what``: the verb for the message, ``via``:
        what the attempt went through)."""
        if not self.caps.may_read(key):
            raise self.refusal(f"{what} {key!r:.200}{via}", "read", key)

    def require_write(self, key: str, what: str = "write", via: str = "") -> None:
        if not self.caps.may_write(key):
            raise self.refusal(f"{what} {key!r:.200}{via}", "write", key)

    def require_ship(self, what: str = "ship code") -> None:
        if not self.caps.ship:
            raise self.refusal(what, "ship")

    def require_admin(self, what: str) -> None:
        if not self.caps.admin:
            raise self.refusal(what, "admin")

    def refusal(self, what: str, cap: str, key: str | None = None) -> NotPermittedError:
        """The error for an attempt to ``what`` without capability ``cap``."""
        if self.removed:
            return NotPermittedError(
                f"principal {self.name!r} may not {what}: it was removed from the cluster "
                "(its objects and connections have no rights left)"
            )
        have = {"read": self.caps.read, "write": self.caps.write}.get(cap)
        holds = (
            f"it may {cap} under {_show(have)} only"
            if have is not None
            else (f"it lacks the {cap} capability ({self.caps.describe()})")
        )
        c = self.caps
        parent = (key or "").rpartition("/")[0]
        wanted = parent + "/" if parent else key or ""
        wider = Caps(
            tuple(sorted({*c.read, wanted})) if cap == "read" else c.read,
            tuple(sorted({*c.write, wanted})) if cap == "write" else c.write,
            c.ship or cap == "ship",
            c.admin or cap == "admin",
        )
        return NotPermittedError(
            f"principal {self.name!r} may not {what} (the {cap} capability): {holds}; "
            f"an admin can grant it: shuttle cluster user caps {self.name} {wider.as_flags()}"
        )

    def to_json(self) -> dict[str, Any]:
        return {**self.caps.to_json(), "salt": self.salt.hex(), "created_ns": self.created_ns}


def new_principal(name: str, caps: Caps, *, now_ns: int | None = None) -> Principal:
    """A principal with a fresh random salt (so a fresh key)."""
    return Principal(
        check_name(name),
        caps,
        os.urandom(SALT_BYTES),
        time.time_ns() if now_ns is None else now_ns,
    )


def derive_key(cluster_key: bytes, principal: Principal) -> bytes:
    """The principal's key: blake3 keyed by the cluster key over a domain prefix, the
    name (with its length) and the salt. Only holders of the cluster key (nodes, the
    administrator) can compute it; the principal gets it once, in its key file."""
    name = principal.name.encode()
    message = b"".join((_KEY_DOMAIN, len(name).to_bytes(4, "big"), name, principal.salt))
    return blake3.blake3(message, key=cluster_key).digest()


# Domain separation of the key wrap's mask and tag (both keyed by the caller's key).
_WRAP_DOMAIN: Final = b"shuttle principal key wrap v1\x00"
_TAG_DOMAIN: Final = b"shuttle principal key tag v1\x00"
#: Bytes of a wrap's nonce and tag.
WRAP_NONCE_BYTES: Final = 16
WRAP_TAG_BYTES: Final = 16


def _wrap_parts(wrapping: bytes, nonce: bytes, name: str, key: bytes) -> tuple[bytes, bytes]:
    encoded = name.encode()
    head = nonce + len(encoded).to_bytes(4, "big") + encoded
    mask = blake3.blake3(_WRAP_DOMAIN + head, key=wrapping).digest(length=len(key))
    tag = blake3.blake3(_TAG_DOMAIN + head + key, key=wrapping).digest(length=WRAP_TAG_BYTES)
    return mask, tag


def wrap_key(wrapping: bytes, name: str, key: bytes) -> dict[str, Any]:
    """Principal ``name``'s ``key``, for a caller holding ``wrapping`` (its own key):
    XORed with a mask only a holder of ``wrapping`` can compute (a blake3 keyed hash
    over a fresh nonce: a one-time pad), with a tag that detects any change on the
    way. A node answers ``principal.key`` so: the key never crosses the wire in clear,
    whether or not the connection is encrypted."""
    nonce = os.urandom(WRAP_NONCE_BYTES)
    mask, tag = _wrap_parts(wrapping, nonce, name, key)
    return {
        "principal": name,
        "nonce": nonce,
        "wrapped": bytes(a ^ b for a, b in zip(key, mask, strict=True)),
        "tag": tag,
    }


def unwrap_key(wrapping: bytes, name: str, reply: Mapping[str, Any]) -> bytes:
    """The key in :func:`wrap_key`'s ``reply``; :class:`InvalidArgumentError` if it was
    not wrapped for ``wrapping`` or was changed on the way."""
    nonce, wrapped, tag = reply.get("nonce"), reply.get("wrapped"), reply.get("tag")
    if not (
        isinstance(nonce, bytes)
        and len(nonce) == WRAP_NONCE_BYTES
        and isinstance(wrapped, bytes)
        and len(wrapped) == PRINCIPAL_KEY_BYTES
        and isinstance(tag, bytes)
    ):
        raise InvalidArgumentError("malformed wrapped key in the node's answer")
    mask, _ = _wrap_parts(wrapping, nonce, name, wrapped)
    key = bytes(a ^ b for a, b in zip(wrapped, mask, strict=True))
    _, expected = _wrap_parts(wrapping, nonce, name, key)
    if not hmac.compare_digest(expected, tag):
        raise InvalidArgumentError(
            f"the key of principal {name!r} did not arrive intact (its tag does not match): "
            "nothing was written; run the command again"
        )
    return key


# --- the table -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PrincipalTable:
    """Every principal of a cluster, at ``epoch`` (it grows by one with each change;
    nodes accept a change only over the epoch they have, see ``principals.put``)."""

    epoch: int = 0
    principals: Mapping[str, Principal] = field(default_factory=dict)

    def get(self, name: str) -> Principal | None:
        return self.principals.get(name)

    def names(self) -> list[str]:
        return sorted(self.principals)

    def with_principal(self, principal: Principal) -> PrincipalTable:
        """A new epoch with ``principal`` added or replaced."""
        table = {**self.principals, principal.name: principal}
        if len(table) > PRINCIPALS_MAX:
            raise InvalidArgumentError(f"a cluster holds at most {PRINCIPALS_MAX} principals")
        return PrincipalTable(self.epoch + 1, table)

    def without(self, name: str) -> PrincipalTable:
        """A new epoch without ``name``."""
        return PrincipalTable(
            self.epoch + 1, {n: p for n, p in self.principals.items() if n != name}
        )

    def to_wire(self) -> dict[str, Any]:
        """The table as a msgpack/JSON map (what nodes store and send)."""
        return {
            "format": TABLE_FORMAT,
            "epoch": self.epoch,
            "principals": {n: self.principals[n].to_json() for n in sorted(self.principals)},
        }

    def encode(self) -> bytes:
        """Canonical JSON bytes (sorted keys): equal tables encode equal."""
        return json.dumps(self.to_wire(), sort_keys=True, separators=(",", ":")).encode()

    def digest(self) -> str:
        """A short hash of :meth:`encode`: two nodes at one epoch hold the same table iff
        their digests match."""
        return blake3.blake3(self.encode()).hexdigest()[:16]

    @classmethod
    def from_wire(cls, value: object, where: str) -> PrincipalTable:
        """Parse :meth:`to_wire`'s form; :class:`ConfigError` naming ``where`` if it is
        malformed (a stored table), so nothing half-read is ever used."""
        try:
            return cls._parse(value)
        except (InvalidArgumentError, KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: malformed principal table ({exc})") from None

    @classmethod
    def decode(cls, data: bytes, where: str) -> PrincipalTable:
        try:
            value = json.loads(data)
        except ValueError as exc:
            raise ConfigError(f"{where}: malformed principal table ({exc})") from None
        return cls.from_wire(value, where)

    @classmethod
    def _parse(cls, value: object) -> PrincipalTable:
        if not isinstance(value, dict):
            raise TypeError("not a map")
        if value.get("format") != TABLE_FORMAT:
            raise ValueError(f"format {value.get('format')!r}, this build reads {TABLE_FORMAT}")
        epoch = value["epoch"]
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ValueError(f"epoch must be an integer ≥ 0, got {epoch!r:.40}")
        entries = value["principals"]
        if not isinstance(entries, dict) or len(entries) > PRINCIPALS_MAX:
            raise ValueError(f"principals must be a map of at most {PRINCIPALS_MAX} entries")
        out: dict[str, Principal] = {}
        for name, entry in entries.items():
            if not isinstance(entry, dict):
                raise TypeError(f"principal {name!r:.40} is not a map")
            caps = Caps.of(entry["read"], entry["write"], entry["ship"], entry["admin"])
            salt = bytes.fromhex(entry["salt"])
            if len(salt) != SALT_BYTES:
                raise ValueError(f"principal {name!r:.40}: a salt is {SALT_BYTES} bytes")
            created = entry.get("created_ns", 0)
            if not isinstance(created, int):
                raise TypeError(f"principal {name!r:.40}: created_ns must be an integer")
            out[check_name(name)] = Principal(name, caps, salt, created)
        return cls(epoch, out)


# --- a node's live view --------------------------------------------------------------


Listener = Callable[["PrincipalTable"], None]


class PrincipalBook:
    """A node's current :class:`PrincipalTable` and the keys derived from it.

    The node's server looks a HELLO's principal up here; operations and the run-time
    resolve a principal by name at each request, so a change of caps applies to the
    next request and a removal to the next call. :meth:`replace` installs a new table
    (after the node stored it) and tells the listeners (the server closes the
    connections of removed principals)."""

    def __init__(self, cluster_key: bytes, table: PrincipalTable | None = None) -> None:
        self._cluster_key = cluster_key
        self.table = table or PrincipalTable()
        self._keys: dict[tuple[str, bytes], bytes] = {}
        self.listeners: list[Listener] = []

    def get(self, name: str) -> Principal | None:
        return self.table.get(name)

    def resolve(self, name: str) -> Principal:
        """The principal called ``name``, or a stand-in that may do nothing (it was
        removed: the objects it made keep running, with no rights left)."""
        found = self.table.get(name)
        if found is None:
            return Principal(name, Caps(), b"", removed=True)
        return found

    def key_for(self, principal: Principal) -> bytes:
        """The principal's derived key (cached by name and salt)."""
        cache_key = (principal.name, principal.salt)
        key = self._keys.get(cache_key)
        if key is None:
            if len(self._keys) > 2 * PRINCIPALS_MAX:  # removed ones pile up otherwise
                self._keys.clear()
            key = self._keys[cache_key] = derive_key(self._cluster_key, principal)
        return key

    def key_of(self, name: str) -> bytes | None:
        """The key of principal ``name`` now, or None if there is no such principal."""
        found = self.table.get(name)
        return None if found is None else self.key_for(found)

    def replace(self, table: PrincipalTable) -> None:
        """Install ``table`` (stored already) and tell the listeners."""
        self.table = table
        for listener in list(self.listeners):
            listener(table)


# --- guards: what an operation needs of a principal ------------------------------------

#: Checks a request of a principal before it runs: raises NotPermittedError.
Guard = Callable[[Principal, dict[str, Any]], None]


def anyone(principal: Principal, args: dict[str, Any]) -> None:
    """Every authenticated principal may (the operation checks keys itself, or touches
    none)."""


def reads(name: str = "key", what: str = "read") -> Guard:
    """The read capability on the key in ``args[name]``."""

    def guard(principal: Principal, args: dict[str, Any]) -> None:
        key = args.get(name)
        if isinstance(key, str):  # anything else the handler refuses, touching nothing
            principal.require_read(key, what)

    return guard


def writes(name: str = "key", what: str = "write") -> Guard:
    """The write capability on the key in ``args[name]``."""

    def guard(principal: Principal, args: dict[str, Any]) -> None:
        key = args.get(name)
        if isinstance(key, str):
            principal.require_write(key, what)

    return guard


def reads_each(name: str = "keys", what: str = "read") -> Guard:
    """The read capability on every key of the list ``args[name]``."""

    def guard(principal: Principal, args: dict[str, Any]) -> None:
        keys = args.get(name)
        if isinstance(keys, list):
            for key in keys:
                if isinstance(key, str):
                    principal.require_read(key, what)

    return guard


def writes_each(name: str = "keys", what: str = "write") -> Guard:
    """The write capability on every key of the list ``args[name]``."""

    def guard(principal: Principal, args: dict[str, Any]) -> None:
        keys = args.get(name)
        if isinstance(keys, list):
            for key in keys:
                if isinstance(key, str):
                    principal.require_write(key, what)

    return guard


def admin_only(op_name: str) -> Guard:
    """The admin capability (what an operation registered without a guard needs)."""

    def guard(principal: Principal, args: dict[str, Any]) -> None:
        principal.require_admin(f"call {op_name}, a cluster operation")

    return guard


def all_of(*guards: Guard) -> Guard:
    def guard(principal: Principal, args: dict[str, Any]) -> None:
        for g in guards:
            g(principal, args)

    return guard


def with_caps(principal: Principal, caps: Caps) -> Principal:
    """``principal`` with ``caps`` instead of its own (same name, salt: same key)."""
    return replace(principal, caps=caps)
