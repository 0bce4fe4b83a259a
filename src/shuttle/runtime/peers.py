"""Connections from one run-time to the others: storage nodes and clients' run-times.

Every run-time listens (a node on its port, a client's run-time on a port of its
own), so any of them can call any other: to invoke an object, to move one, or to ask
an object's home where it is. Connections are opened on first use and shared by all
calls to that peer; the link profile between this run-time and a peer (client-side
emulation) applies to every call on it, and the cluster key authenticates it.

A call acts for a principal (:mod:`shuttle.runtime.authority`: the owner of the
object making it) and authenticates as that principal: a node derives the
principal's key (``derive``) and keeps a connection per peer and principal, so the
peer checks the call against that principal's caps, whatever this node may do. A
client's run-time has only its own key (its principal's, or the cluster key) and
uses it for every call.

In a TLS cluster every connection is TLS: a node's certificate is checked against the
cluster's CA; an application's run-time, which has none from the CA, must prove it
holds the key over the very TLS channel instead (:mod:`shuttle.net.tls`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from shuttle.errors import NotPermittedError, RequestTimeoutError, UnreachableError
from shuttle.net.addresses import parse_address
from shuttle.net.aio import AsyncConnection
from shuttle.net.profiles import LinkProfile
from shuttle.net.shaping import Link
from shuttle.net.tls import ClientTls
from shuttle.runtime.authority import acting
from shuttle.runtime.ids import is_application
from shuttle.wire import Response
from shuttle.wire.events import Payload

#: A migration or an invocation over the slowest profile (1 Mb/s) with a 16 MiB
#: frame takes about 134 s; calls between run-times may take that long.
REQUEST_TIMEOUT_S = 180.0
#: Control messages between run-times (a migration's activate, commit and questions
#: in doubt; a durable object's lease and writes) are small and must not wait behind
#: a long call, nor for minutes on a peer that is cut off: they travel on a
#: connection of their own, and one that gets no answer in this long is dropped
#: (what it asked is then in doubt, which the protocol is built for). A round trip
#: on a loaded loopback takes milliseconds; a LAN profile's, a few.
CONTROL_TIMEOUT_S = 5.0
#: The rate a control message's payload is assumed to cross at when the link's is
#: not known (a checkpoint to install or to write at a home).
CONTROL_BYTES_PER_S_MIN = 1_000_000


class NotSent(UnreachableError):
    """No connection to the peer could be made: the request never left, so it may be
    sent elsewhere without running twice."""


class Peers:
    """Run-time id → address, link and connection."""

    def __init__(
        self,
        *,
        key: bytes | None = None,
        client_name: str = "shuttle-runtime",
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        principal: str | None = None,
        derive: Callable[[str], bytes | None] | None = None,
        tls: ClientTls | None = None,
    ) -> None:
        """``key``: this run-time's own key (the cluster key; on a client's run-time,
        possibly principal ``principal``'s). ``derive``: on a node, a principal's key by
        name (None: no such principal), for calls that act for one."""
        self.key = key
        self.principal = principal
        self.derive = derive
        self.tls = tls
        self.client_name = client_name
        self.request_timeout_s = request_timeout_s
        self._addresses: dict[str, str] = {}
        self._links: dict[str, LinkProfile | None] = {}
        #: By (run-time id, the principal the calls on it act for (None: our own key),
        #: whether it carries control messages).
        self._conns: dict[tuple[str, str | None, bool], AsyncConnection] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def learn(self, runtime_id: str, address: str, link: LinkProfile | None = None) -> None:
        """Remember where ``runtime_id`` listens (a new address replaces the connection).

        While acting for a principal (what its calls and objects say), only run-times
        not known yet are learnt: a principal may announce its own run-time, never
        send this one's calls for a known run-time elsewhere."""
        if not address:
            return
        known = self._addresses.get(runtime_id)
        if known is not None and known != address and acting() is not None:
            return
        if link is not None:
            if self._links.get(runtime_id) != link:
                self._drop(runtime_id)  # re-dialled with the new link on next use
            self._links[runtime_id] = link
        if known != address:
            self._addresses[runtime_id] = address
            self._drop(runtime_id)

    def _drop(self, runtime_id: str, *, control: bool | None = None) -> None:
        """Forget the connections to a run-time (only its control connections, or only
        its others, if ``control`` says) and close them (on the loop, once nothing uses
        them)."""
        for slot in [s for s in self._conns if s[0] == runtime_id and control in (None, s[2])]:
            self._close_later(self._conns.pop(slot))

    def drop_principal(self, principal: str) -> None:
        """Close the connections that act for ``principal`` (it was removed)."""
        for slot in [s for s in self._conns if s[1] == principal]:
            self._close_later(self._conns.pop(slot))

    def _forget(self, conn: AsyncConnection) -> None:
        """Forget and close this one connection (the next call dials again)."""
        for slot in [s for s, c in self._conns.items() if c is conn]:
            self._close_later(self._conns.pop(slot))

    def _close_later(self, conn: AsyncConnection) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop here: it closes when its reader fails or at shutdown
        task = loop.create_task(conn.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def address_of(self, runtime_id: str) -> str | None:
        return self._addresses.get(runtime_id)

    def link_of(self, runtime_id: str) -> LinkProfile | None:
        return self._links.get(runtime_id)

    def known(self) -> dict[str, str]:
        return dict(self._addresses)

    def connection(self, runtime_id: str, *, control: bool = False) -> AsyncConnection:
        """The connection to ``runtime_id`` for calls acting for the current principal
        (:func:`~shuttle.runtime.authority.acting`); ``control``: the one for control
        messages (:data:`CONTROL_TIMEOUT_S`)."""
        principal = acting() if self.derive is not None else None
        slot = (runtime_id, principal, control)
        conn = self._conns.get(slot)
        if conn is None:
            key, name = self.key, self.principal
            if principal is not None:
                assert self.derive is not None
                key, name = self.derive(principal), principal
                if key is None:
                    raise NotPermittedError(
                        f"principal {principal!r} was removed from the cluster: its objects "
                        "may no longer call other run-times"
                    )
            address = self._addresses.get(runtime_id)
            if address is None:
                raise UnreachableError(
                    f"no address known for run-time {runtime_id!r}; is it part of this "
                    "cluster (cluster file) or was it announced by a call?"
                )
            host, port = parse_address(address, f"address of {runtime_id}")
            profile = self._links.get(runtime_id)
            link = Link(profile) if profile is not None and not profile.is_unshaped else None
            conn = AsyncConnection(
                host,
                port,
                link=link,
                key=key,
                principal=name,
                client_name=self.client_name,
                request_timeout_s=self.request_timeout_s,
                tls=self.tls,
                verify=not is_application(runtime_id),
            )
            self._conns[slot] = conn
        return conn

    async def call(
        self, runtime_id: str, op: str, args: dict[str, Any], payload: Payload = b""
    ) -> Response:
        """One request to run-time ``runtime_id``; its typed error, or UnreachableError."""
        return await self.connection(runtime_id).call(op, args, payload)

    async def call_or_not_sent(
        self, runtime_id: str, op: str, args: dict[str, Any], payload: Payload = b""
    ) -> Response:
        """:meth:`call`, telling apart a request that never left (:class:`NotSent`: no
        connection could be made) from one whose answer was lost (another
        :class:`UnreachableError`: it may have run)."""
        conn = self.connection(runtime_id)
        try:
            await conn.connect()
        except UnreachableError as exc:
            raise NotSent(str(exc)) from exc
        return await conn.call(op, args, payload)

    async def control(
        self,
        runtime_id: str,
        op: str,
        args: dict[str, Any],
        payload: Payload = b"",
        *,
        timeout_s: float | None = None,
    ) -> Response:
        """A control message to ``runtime_id`` (see :data:`CONTROL_TIMEOUT_S`): its
        typed error, :class:`NotSent` (no connection: it never left),
        :class:`UnreachableError`, or :class:`RequestTimeoutError` when no answer came
        in time (the connection is then dropped: the next message dials again).
        Whether a message that left and got no answer took effect is unknown."""
        if timeout_s is None:
            timeout_s = self.control_timeout_s(runtime_id, len(payload))
        conn = self.connection(runtime_id, control=True)

        async def send() -> Response:
            try:
                await conn.connect()
            except UnreachableError as exc:
                raise NotSent(str(exc)) from exc
            return await conn.call(op, args, payload)

        task = asyncio.get_running_loop().create_task(send())
        # However it ends, its end is taken here (no "exception never retrieved"):
        # whoever awaited it may have gone (a handler cancelled with its connection).
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        try:
            done, _ = await asyncio.wait({task}, timeout=timeout_s)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if task in done:
            return task.result()
        task.cancel()
        with contextlib.suppress(BaseException):  # what it ended with is moot now
            await task
        self._forget(conn)
        raise RequestTimeoutError(
            f"run-time {runtime_id} did not answer {op} within {timeout_s:g} s"
        )

    def control_timeout_s(self, runtime_id: str, nbytes: int) -> float:
        """How long a control message carrying ``nbytes`` may take to ``runtime_id``:
        the base, plus its payload at (a quarter of) the link's rate."""
        profile = self._links.get(runtime_id)
        rate = CONTROL_BYTES_PER_S_MIN
        if profile is not None and profile.bandwidth_bits_per_s:
            rate = min(rate, int(profile.bandwidth_bits_per_s / 8))
        return CONTROL_TIMEOUT_S + 4 * nbytes / rate

    async def close(self) -> None:
        conns, self._conns = list(self._conns.values()), {}
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)
