"""Kernel-shaped links: nodes in network namespaces, joined to a hub by veth pairs.

:class:`NetnsLab` builds, for N nodes::

    hub namespace (the client side)          node namespaces
      n0  198.18.1.1/24  <== veth ==>  eth0 198.18.1.2/24   (shuttle-<pid>-<lab>-n0)
      n1  198.18.2.1/24  <== veth ==>  eth0 198.18.2.2/24   (shuttle-<pid>-<lab>-n1)

Each link is shaped in both directions with ``tc qdisc ... tbf`` on the egress of
its two ends (hub end: client to node; node end: node to client), with the rate and
bucket depth of the link's :class:`~shuttle.net.profiles.LinkProfile`.

**Latency is not added by the kernel here.** Linux delays packets with ``netem``, or
with ``fq`` honouring timestamps set by a BPF program; this kernel has neither
(``CONFIG_NET_SCH_NETEM`` and ``CONFIG_NET_SCH_FQ`` are off, and ``tbf``'s
``latency`` option only bounds its queue). So in a lab the kernel shapes the
bandwidth and the client adds the one-way latency with the emulated shaper on top:
wrap each connection in a :class:`~shuttle.net.shaping.Link` built from
:meth:`NetnsLab.client_profile` (the profile without its bandwidth).
:attr:`NetnsLab.kernel_latency` says which of the two applies.

Addresses come from 198.18.0.0/15, the range RFC 2544 sets aside for benchmarking
network devices, so they can never be anyone's real host. With the hub in its own
namespace (the default) nothing in the root namespace changes; with
``hub_in_namespace=False`` the hub ends sit in the root namespace, so any process on
the machine (the test runner, ``shuttle get``) reaches the nodes directly; only one
such lab should exist at a time, since their routes would overlap.

Teardown is reliable: leaving the ``with`` block (normally or by an exception) kills
every process the lab started and any other process still inside its namespaces,
and deletes the namespaces (which deletes the veth pairs). A process killed before
it could tear down leaves namespaces named after its pid; :func:`cleanup_stale`
(called by every new lab) removes those of dead processes. A lab meant to outlive
its process (``persistent=True``, named ``shuttle-keep-<token>-...``) is ended by
:func:`destroy_lab` with its tag, from any process.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from shuttle.errors import ExternalToolError, NetnsUnavailableError
from shuttle.net.profiles import LinkProfile

log = logging.getLogger(__name__)

#: Prefix of every namespace Shuttle creates; names are ``<prefix>-<pid>-<lab>-<role>``.
NETNS_PREFIX = "shuttle"
#: Nodes per lab: one /24 each out of 198.18.0.0/15's second octet 18.
NODES_MAX = 200
#: tbf queue in bytes: at least Linux's TCP small-queues cap per socket
#: (``net.ipv4.tcp_limit_output_bytes``, 4 MiB here), so one TCP flow never loses
#: packets in the shaper; losses would add retransmission noise to the comparison
#: with the emulated shaper, which never drops.
TBF_QUEUE_BYTES = 4 * 1024 * 1024
#: How long teardown waits for a process to exit after SIGTERM before SIGKILL.
TERMINATE_WAIT_S = 2.0
#: Time allowed for one ``ip``/``tc`` command (they return in milliseconds).
COMMAND_TIMEOUT_S = 10.0

_lab_sequence = itertools.count()
_NAME = re.compile(rf"^{NETNS_PREFIX}-(\d+)-")
_KEPT = re.compile(rf"^{NETNS_PREFIX}-keep-[0-9a-f]+-")


def _run(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except FileNotFoundError as exc:
        raise NetnsUnavailableError(
            f"{argv[0]!r} is not installed; install iproute2 (apt-get install iproute2)"
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise ExternalToolError(
            f"{' '.join(argv)} did not finish within {COMMAND_TIMEOUT_S:g} s"
        ) from exc
    if check and done.returncode != 0:
        raise ExternalToolError(
            f"{' '.join(argv)} failed (exit {done.returncode}): {done.stderr.strip()}"
        )
    return done


def netns_unavailable_reason() -> str | None:
    """Why namespaces cannot be made here, or ``None`` when they can.

    Checks root, the ``ip`` and ``tc`` programs, and makes and deletes one namespace."""
    if os.geteuid() != 0:
        return "network namespaces need root (run as root, or skip --netns)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"{tool!r} is not installed (apt-get install iproute2)"
    probe = f"{NETNS_PREFIX}-{os.getpid()}-probe"
    done = _run(["ip", "netns", "add", probe], check=False)
    if done.returncode != 0:
        return f"'ip netns add' does not work here: {done.stderr.strip()}"
    _run(["ip", "netns", "del", probe], check=False)
    return None


def require_netns() -> None:
    """Raise :class:`NetnsUnavailableError` with the reason if namespaces cannot be made."""
    reason = netns_unavailable_reason()
    if reason is not None:
        raise NetnsUnavailableError(reason)


def list_namespaces() -> list[str]:
    """Names of all network namespaces (``ip netns list``)."""
    out = _run(["ip", "netns", "list"]).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_inside(namespace: str) -> None:
    """SIGKILL every process still inside ``namespace`` (which a lab created)."""
    done = _run(["ip", "netns", "pids", namespace], check=False)
    for word in done.stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(word), signal.SIGKILL)


def cleanup_stale() -> list[str]:
    """Delete namespaces left by Shuttle processes that died without tearing down.

    Only names ``shuttle-<pid>-...`` whose ``pid`` is no longer alive are touched.
    Returns the names deleted."""
    removed = []
    for name in list_namespaces():
        match = _NAME.match(name)
        if match is None or _pid_alive(int(match.group(1))):
            continue
        _kill_inside(name)
        if _run(["ip", "netns", "del", name], check=False).returncode == 0:
            removed.append(name)
    if removed:
        log.warning("removed %d stale namespaces: %s", len(removed), ", ".join(removed))
    return removed


def persistent_labs() -> list[str]:
    """Tags of the persistent labs that exist now (see ``NetnsLab(persistent=True)``)."""
    tags = {name.rsplit("-", 1)[0] for name in list_namespaces() if _KEPT.match(name)}
    return sorted(tags)


def destroy_lab(tag: str) -> list[str]:
    """Tear down a lab by its tag, from any process: SIGKILL what still runs inside its
    namespaces, delete them (and so their veth pairs). Returns what could not be
    removed. Only names starting with ``tag + "-"`` are touched."""
    if not tag.startswith(f"{NETNS_PREFIX}-"):
        raise NetnsUnavailableError(f"{tag!r} is not a Shuttle lab tag ({NETNS_PREFIX}-...)")
    problems = []
    for name in sorted(list_namespaces(), key=lambda n: n.endswith("-hub")):
        if not name.startswith(f"{tag}-"):
            continue
        _kill_inside(name)
        done = _run(["ip", "netns", "del", name], check=False)
        if done.returncode != 0:
            problems.append(f"namespace {name}: {done.stderr.strip()}")
    return problems


@dataclass(frozen=True)
class NetnsNode:
    """One node's end of the lab.

    ``namespace``: where to run the node; ``address``: where the client reaches it;
    ``device``: the node's veth end (in ``namespace``); ``hub_device`` and
    ``hub_address``: the hub's end of the same link; ``profile``: the link's shaping.
    """

    index: int
    namespace: str
    address: str
    device: str
    hub_device: str
    hub_address: str
    profile: LinkProfile


class NetnsLab:
    """N node namespaces joined to a hub by shaped veth pairs (a context manager).

    ``profiles`` is one profile for every link, or a mapping from node index to
    profile (missing indices get no shaping). Entering builds everything (on failure
    it tears down what it built and raises); leaving tears it all down.

    ``persistent=True`` is for labs that outlive the process (``cluster up
    --netns``): leaving the ``with`` block normally keeps the lab and its processes
    running, and any process ends it later with :func:`destroy_lab` ``(lab.tag)``;
    :func:`cleanup_stale` never touches it. An exception still tears it down.

    Raises :class:`NetnsUnavailableError` when not root or ``ip netns`` does not work,
    :class:`ExternalToolError` when an ``ip``/``tc`` command fails.
    """

    #: Whether the kernel adds the profiles' latency (see the module docstring).
    kernel_latency = False

    def __init__(
        self,
        nodes: int,
        profiles: LinkProfile | Mapping[int, LinkProfile] | None = None,
        *,
        hub_in_namespace: bool = True,
        persistent: bool = False,
    ) -> None:
        if not 1 <= nodes <= NODES_MAX:
            raise NetnsUnavailableError(
                f"a namespace lab holds 1 to {NODES_MAX} nodes, not {nodes}"
            )
        self.persistent = persistent
        # Hub-side device names must be unique in the hub's namespace; in the root
        # namespace they must also not clash with other labs (15 characters at most).
        if persistent:
            # Not named after our pid: the lab outlives this process, and
            # cleanup_stale() must leave it alone.
            token = secrets.token_hex(3)
            self.tag = f"{NETNS_PREFIX}-keep-{token}"
            root_prefix = f"s{token}n"
        else:
            sequence = next(_lab_sequence)
            self.tag = f"{NETNS_PREFIX}-{os.getpid()}-{sequence}"
            root_prefix = f"s{os.getpid():x}x{sequence:x}n"
        self.hub: str | None = f"{self.tag}-hub" if hub_in_namespace else None
        by_index: dict[int, LinkProfile] = {}
        for i in range(nodes):
            if isinstance(profiles, LinkProfile):
                by_index[i] = profiles
            elif profiles is not None and i in profiles:
                by_index[i] = profiles[i]
            else:
                by_index[i] = LinkProfile("loopback", None, 0.0)
        prefix = "n" if hub_in_namespace else root_prefix
        self.nodes = [
            NetnsNode(
                index=i,
                namespace=f"{self.tag}-n{i}",
                address=f"198.18.{i + 1}.2",
                device="eth0",
                hub_device=f"{prefix}{i}",
                hub_address=f"198.18.{i + 1}.1",
                profile=by_index[i],
            )
            for i in range(nodes)
        ]
        for node in self.nodes:
            assert len(node.hub_device) <= 15, node.hub_device
        self._processes: list[subprocess.Popen[Any]] = []
        self._created: list[str] = []
        self._up = False

    # -- building ------------------------------------------------------------------

    def up(self) -> NetnsLab:
        """Build the lab (on failure, tear down what was built and raise)."""
        require_netns()
        cleanup_stale()
        try:
            self._build()
        except BaseException:
            self.teardown()
            raise
        self._up = True
        return self

    def __enter__(self) -> NetnsLab:
        return self.up()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.persistent and exc is None:
            # Left running on purpose (e.g. by 'cluster up'); destroy_lab(tag) ends it.
            self._processes.clear()
            self._created.clear()
            return
        problems = self.teardown()
        if problems and exc is None:
            raise ExternalToolError("namespace teardown left: " + "; ".join(problems))

    def _ip(self, namespace: str | None, *args: str) -> None:
        _run(["ip", *(["-n", namespace] if namespace else []), *args])

    def _build(self) -> None:
        if self.hub is not None:
            self._ip(None, "netns", "add", self.hub)
            self._created.append(self.hub)
            self._ip(self.hub, "link", "set", "lo", "up")
        for node in self.nodes:
            self._ip(None, "netns", "add", node.namespace)
            self._created.append(node.namespace)
            self._ip(node.namespace, "link", "set", "lo", "up")
            hub_ns = ["netns", self.hub] if self.hub else []
            veth = ["type", "veth", "peer", "name", node.device, "netns", node.namespace]
            _run(["ip", "link", "add", node.hub_device, *hub_ns, *veth])
            self._ip(self.hub, "addr", "add", f"{node.hub_address}/24", "dev", node.hub_device)
            self._ip(node.namespace, "addr", "add", f"{node.address}/24", "dev", node.device)
            self._ip(self.hub, "link", "set", node.hub_device, "up")
            self._ip(node.namespace, "link", "set", node.device, "up")
            self._shape(self.hub, node.hub_device, node.profile)
            self._shape(node.namespace, node.device, node.profile)

    @staticmethod
    def _shape(namespace: str | None, device: str, profile: LinkProfile) -> None:
        if profile.bandwidth_bits_per_s is None:
            return
        rate = f"{round(profile.bandwidth_bits_per_s)}bit"
        burst = str(profile.effective_burst_bytes)
        tbf = ["tbf", "rate", rate, "burst", burst, "limit", str(TBF_QUEUE_BYTES)]
        where = ["-n", namespace] if namespace else []
        _run(["tc", *where, "qdisc", "replace", "dev", device, "root", *tbf])

    # -- using ---------------------------------------------------------------------

    @property
    def client_namespace(self) -> str | None:
        """Where clients run: the hub namespace, or ``None`` for the root namespace."""
        return self.hub

    def client_profile(self, index: int) -> LinkProfile:
        """What the client must still emulate on node ``index``'s link: the latency,
        since the kernel here shapes only the bandwidth."""
        return self.nodes[index].profile.without_bandwidth()

    @staticmethod
    def command(namespace: str | None, argv: Sequence[str]) -> list[str]:
        """``argv`` prefixed to run inside ``namespace`` (``None``: as it is)."""
        if namespace is None:
            return list(argv)
        return ["ip", "netns", "exec", namespace, *argv]

    def popen(
        self, namespace: str | None, argv: Sequence[str], **kwargs: Any
    ) -> subprocess.Popen[Any]:
        """Start ``argv`` inside ``namespace``; teardown ends it if it is still running.
        ``kwargs`` go to :class:`subprocess.Popen`."""
        if not self._up:
            raise NetnsUnavailableError("the lab is not up; use it inside 'with NetnsLab(...)'")
        process: subprocess.Popen[Any] = subprocess.Popen(self.command(namespace, argv), **kwargs)
        self._processes.append(process)
        return process

    def run(
        self, namespace: str | None, argv: Sequence[str], *, timeout_s: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside ``namespace`` to completion; returns its output (text)."""
        process = self.popen(
            namespace, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            out, err = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            process.kill()
            process.communicate()
            raise ExternalToolError(
                f"{' '.join(argv)} in {namespace or 'the root namespace'} did not finish "
                f"within {timeout_s:g} s"
            ) from exc
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)

    def qdisc_stats(self, namespace: str | None, device: str) -> str:
        """``tc -s qdisc show`` for one device (bytes sent, drops, overlimits)."""
        return _run(
            ["tc", *(["-n", namespace] if namespace else []), "-s", "qdisc", "show", "dev", device]
        ).stdout

    # -- tearing down --------------------------------------------------------------

    def teardown(self) -> list[str]:
        """End the lab's processes and delete its namespaces. Safe to call twice.

        Returns what could not be removed (empty when all went)."""
        self._up = False
        for process in self._processes:
            if process.poll() is None:
                process.terminate()
        for process in self._processes:
            try:
                process.wait(timeout=TERMINATE_WAIT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._processes.clear()
        problems = []
        for namespace in reversed(self._created):
            _kill_inside(namespace)
            done = _run(["ip", "netns", "del", namespace], check=False)
            if done.returncode != 0:
                problems.append(f"namespace {namespace}: {done.stderr.strip()}")
        self._created.clear()
        if self.hub is None:
            # Deleting a node namespace deletes its veth pair, hub end included; make
            # sure none lingers in the root namespace.
            for node in self.nodes:
                if _run(["ip", "link", "show", node.hub_device], check=False).returncode == 0:
                    done = _run(["ip", "link", "del", node.hub_device], check=False)
                    if done.returncode != 0:
                        problems.append(f"device {node.hub_device}: {done.stderr.strip()}")
        for problem in problems:
            log.warning("netns teardown: %s", problem)
        return problems
