"""How a client reaches a Ceph cluster: :class:`CephInfo` (conf, keyring, pool, user)
and :func:`connect`, a ``rados.Rados`` every wait of which is bounded.

The ``rados`` module is Debian's (python3-rados, linked into the virtualenv by
scripts/setup-ceph.sh): there is no usable binding on PyPI.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shuttle.errors import ConfigError, ExternalToolError, RequestTimeoutError

SETUP_HINT = (
    "install Ceph with `scripts/setup.sh --ceph` (or scripts/setup-ceph.sh: Debian's "
    "ceph-mon, ceph-osd, ceph-common, python3-rados)"
)

#: Client bounds written to a local Ceph's conf: I/O to a PG that is not active
#: hangs instead of failing, so every client operation needs a bound.
CLIENT_OP_TIMEOUT_S = 30


@dataclass(frozen=True)
class CephInfo:
    """How to reach a Ceph cluster: what a client (or ``shuttle serve``) needs."""

    conf_path: Path
    keyring_path: Path
    pool: str
    #: The cephx user, as a client name (``client.admin``).
    user: str = "client.admin"
    mon_address: str = ""
    osds: int = 0

    def store_args(self, namespace: str = "") -> list[str]:
        """The ``shuttle serve`` flags that put a node's objects in this pool (and
        ``namespace`` of it, if given)."""
        return [
            "--store",
            f"rados:{self.pool}/{namespace}" if namespace else f"rados:{self.pool}",
            "--ceph-conf",
            str(self.conf_path),
            "--ceph-keyring",
            str(self.keyring_path),
        ]


def connect(
    conf_path: Path,
    keyring_path: Path | None = None,
    *,
    user: str = "client.admin",
    timeout_s: float = 10.0,
    op_timeout_s: float | None = None,
) -> Any:
    """A connected ``rados.Rados``, every wait of which is bounded: connecting by
    ``timeout_s``, each mon and OSD operation by ``op_timeout_s`` (default: the conf's).

    Raises :class:`ConfigError` if the ``rados`` module is missing, and
    :class:`RequestTimeoutError` if no mon answers in time.
    """
    rados = import_rados()
    conf: dict[str, str] = {"client_mount_timeout": str(max(1, round(timeout_s)))}
    if keyring_path is not None:
        conf["keyring"] = str(keyring_path)
    if op_timeout_s is not None:
        conf["rados_osd_op_timeout"] = conf["rados_mon_op_timeout"] = str(op_timeout_s)
    cluster = rados.Rados(conffile=str(conf_path), name=user, conf=conf)
    try:
        cluster.connect(timeout=max(1, round(timeout_s)))
    except rados.Error as exc:
        cluster.shutdown()
        raise RequestTimeoutError(
            f"could not connect to Ceph with {conf_path} as {user} within {timeout_s:g} s "
            f"({exc}); check that the mon in the conf's `mon host` runs (`ceph -c "
            f"{conf_path} -s`) and that the keyring holds {user}'s key"
        ) from exc
    return cluster


def import_rados() -> Any:
    """Debian's ``rados`` module (python3-rados; there is no usable one on PyPI)."""
    try:
        import rados  # type: ignore[import-not-found]
    except ImportError as exc:
        raise ConfigError(
            f"the Python module `rados` is missing ({exc}); {SETUP_HINT}, which links "
            "Debian's python3-rados into the virtualenv"
        ) from exc
    return rados


def mon_command(cluster: Any, timeout_s: float = 10.0, inbuf: bytes = b"", **cmd: Any) -> str:
    """Run a mon command (``prefix=...`` plus its arguments) and return its output;
    raises :class:`ExternalToolError` with Ceph's message if it fails."""
    cmd.setdefault("format", "json")
    ret, out, errs = cluster.mon_command(json.dumps(cmd), inbuf, timeout=round(timeout_s))
    if ret != 0:
        raise ExternalToolError(f"ceph {cmd['prefix']} failed ({ret}): {errs}")
    return out.decode() if isinstance(out, bytes) else str(out)
