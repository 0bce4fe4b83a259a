"""Connections from one run-time to the others: storage nodes and clients' run-times.

Every run-time listens (a node on its port, a client's run-time on a port of its
own), so any of them can call any other: to invoke an object, to move one, or to ask
an object's home where it is. Connections are opened on first use and shared by all
calls to that peer; the link profile between this run-time and a peer (client-side
emulation) applies to every call on it, and the cluster key authenticates it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from shuttle.errors import UnreachableError
from shuttle.net.addresses import parse_address
from shuttle.net.aio import AsyncConnection
from shuttle.net.profiles import LinkProfile
from shuttle.net.shaping import Link
from shuttle.wire import Response
from shuttle.wire.events import Payload

#: A migration or an invocation over the slowest profile (1 Mb/s) with a 16 MiB
#: frame takes about 134 s; calls between run-times may take that long.
REQUEST_TIMEOUT_S = 180.0


class Peers:
    """Run-time id → address, link and connection."""

    def __init__(
        self,
        *,
        key: bytes | None = None,
        client_name: str = "shuttle-runtime",
        request_timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self.key = key
        self.client_name = client_name
        self.request_timeout_s = request_timeout_s
        self._addresses: dict[str, str] = {}
        self._links: dict[str, LinkProfile | None] = {}
        self._conns: dict[str, AsyncConnection] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def learn(self, runtime_id: str, address: str, link: LinkProfile | None = None) -> None:
        """Remember where ``runtime_id`` listens (a new address replaces the connection)."""
        if not address:
            return
        known = self._addresses.get(runtime_id)
        if link is not None:
            if self._links.get(runtime_id) != link:
                self._drop(runtime_id)  # re-dialled with the new link on next use
            self._links[runtime_id] = link
        if known != address:
            self._addresses[runtime_id] = address
            self._drop(runtime_id)

    def _drop(self, runtime_id: str) -> None:
        """Forget a connection and close it (on the loop, once nothing uses it)."""
        conn = self._conns.pop(runtime_id, None)
        if conn is None:
            return
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

    def connection(self, runtime_id: str) -> AsyncConnection:
        conn = self._conns.get(runtime_id)
        if conn is None:
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
                key=self.key,
                client_name=self.client_name,
                request_timeout_s=self.request_timeout_s,
            )
            self._conns[runtime_id] = conn
        return conn

    async def call(
        self, runtime_id: str, op: str, args: dict[str, Any], payload: Payload = b""
    ) -> Response:
        """One request to run-time ``runtime_id``; its typed error, or UnreachableError."""
        return await self.connection(runtime_id).call(op, args, payload)

    async def close(self) -> None:
        conns, self._conns = self._conns, {}
        await asyncio.gather(*(c.close() for c in conns.values()), return_exceptions=True)
