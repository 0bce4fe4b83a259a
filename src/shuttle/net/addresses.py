"""Where a node listens: ``HOST:PORT`` text and the :class:`NodeAddress` clients dial.

Every layer names nodes this way (the client, the cluster file, the node's own
``--listen``, the run-time's peers), so the parser and the type live here, below
all of them, and there is one definition of each.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from shuttle.errors import ConfigError
from shuttle.net.profiles import LinkProfile


def parse_address(text: str, where: str = "--listen") -> tuple[str, int]:
    """``HOST:PORT`` → (host, port), with a message naming ``where`` on error.

    IPv6 hosts may be bracketed (``[::1]:7400``); the brackets are dropped.
    Raises :class:`ConfigError` for a missing host or port or a port outside 0..65535.
    """
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ConfigError(f"{where}: expected HOST:PORT (e.g. 127.0.0.1:7400), got {text!r}")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"{where}: port must be a number, got {port_text!r}") from None
    if not 0 <= port <= 65535:
        raise ConfigError(f"{where}: port must be in 0..65535, got {port}")
    return host.strip("[]"), port


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only (127.0.0.0/8, ::1,
    localhost): where a node may serve, and a client dial, without TLS by default."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


@dataclass(frozen=True, slots=True)
class NodeAddress:
    """Where a node listens, and the link profile between this client and it."""

    node_id: str
    host: str
    port: int
    link: LinkProfile | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"
