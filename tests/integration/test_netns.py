"""Network namespaces joined by tbf-shaped veth pairs: build, use, tear down.

Each test makes and removes its own namespaces; all skip (with the reason) where
namespaces cannot be made (not root, no ``ip netns``)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from shuttle.errors import NetnsUnavailableError
from shuttle.net.netns import (
    NETNS_PREFIX,
    NetnsLab,
    cleanup_stale,
    destroy_lab,
    list_namespaces,
    netns_unavailable_reason,
    persistent_labs,
)
from shuttle.net.profiles import BUILTIN_PROFILES, LinkProfile

REASON = netns_unavailable_reason()
pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(REASON is not None, reason=f"network namespaces unavailable: {REASON}"),
]

# A sink: accepts one connection, reads to EOF, prints the byte count and the time
# from first to last byte.
SINK = """
import json, socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(); print("ready", flush=True)
c, _ = s.accept(); n = 0; first = None
while data := c.recv(1 << 16):
    first = first or time.monotonic(); n += len(data)
print(json.dumps({"bytes": n, "seconds": time.monotonic() - first}), flush=True)
"""
SEND = """
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
s.sendall(b"x" * int(sys.argv[3])); s.close()
"""


def _ours(lab: NetnsLab) -> list[str]:
    return [n for n in list_namespaces() if n.startswith(lab.tag + "-")]


def _transfer(lab: NetnsLab, nbytes: int) -> dict[str, float]:
    node = lab.nodes[0]
    sink = lab.popen(
        node.namespace, [sys.executable, "-c", SINK, "9100"], stdout=subprocess.PIPE, text=True
    )
    assert sink.stdout is not None
    assert sink.stdout.readline().strip() == "ready"
    sent = lab.run(
        lab.client_namespace, [sys.executable, "-c", SEND, node.address, "9100", str(nbytes)]
    )
    assert sent.returncode == 0, sent.stderr
    result: dict[str, float] = json.loads(sink.stdout.readline())
    sink.wait(timeout=10)
    return result


def test_a_shaped_link_carries_data_at_about_its_rate() -> None:
    profile = LinkProfile("t", 8e6, 0.0)  # 1 MB/s
    with NetnsLab(1, profile) as lab:
        assert len(_ours(lab)) == 2  # the hub and one node
        result = _transfer(lab, 400_000)
        assert result["bytes"] == 400_000
        # 0.4 s of payload plus ~4.5% of TCP/IP/Ethernet headers the kernel also
        # counts; generous bounds for a shared machine.
        assert 0.3 <= result["seconds"] <= 0.9, result
        stats = lab.qdisc_stats(lab.hub, lab.nodes[0].hub_device)
        assert "tbf" in stats and "rate 8Mbit" in stats
    assert _ours(lab) == []


def test_unshaped_links_are_fast_and_the_root_namespace_can_be_the_hub() -> None:
    with NetnsLab(2, {1: BUILTIN_PROFILES["wan"]}, hub_in_namespace=False) as lab:
        assert lab.client_namespace is None
        start = time.monotonic()
        result = _transfer(lab, 2_000_000)  # node 0 is unshaped
        assert result["bytes"] == 2_000_000
        assert time.monotonic() - start < 5.0
        assert "tbf" not in lab.qdisc_stats(None, lab.nodes[0].hub_device)
        assert "rate 1Mbit" in lab.qdisc_stats(None, lab.nodes[1].hub_device)
        devices = [n.hub_device for n in lab.nodes]
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    assert not any(d in links for d in devices)
    assert _ours(lab) == []


def test_a_failing_body_still_tears_everything_down() -> None:
    lab = NetnsLab(2, BUILTIN_PROFILES["lan"])
    with pytest.raises(RuntimeError, match="boom"), lab:
        sleeper = lab.popen(lab.nodes[1].namespace, ["sleep", "60"])
        assert len(_ours(lab)) == 3
        raise RuntimeError("boom")
    assert sleeper.poll() is not None  # the lab ended the process it started
    assert _ours(lab) == []


def test_a_lab_is_usable_only_while_up() -> None:
    lab = NetnsLab(1)
    with pytest.raises(NetnsUnavailableError, match="not up"):
        lab.popen(None, ["true"])
    with pytest.raises(NetnsUnavailableError, match="1 to"):
        NetnsLab(0)


def test_namespaces_of_dead_processes_are_cleaned_up() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    name = f"{NETNS_PREFIX}-{dead.pid}-0-n0"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        assert name in cleanup_stale()
        assert name not in list_namespaces()
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_a_persistent_lab_outlives_its_block_until_destroyed_by_tag() -> None:
    lab = NetnsLab(1, BUILTIN_PROFILES["lan"], hub_in_namespace=False, persistent=True)
    try:
        with lab:
            sleeper = lab.popen(lab.nodes[0].namespace, ["sleep", "60"])
        assert lab.tag in persistent_labs()
        assert not any(n.startswith(lab.tag) for n in cleanup_stale())
        assert len(_ours(lab)) == 1 and sleeper.poll() is None
        links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
        assert lab.nodes[0].hub_device in links
    finally:
        assert destroy_lab(lab.tag) == []
    assert sleeper.wait(timeout=10) == -9  # SIGKILLed inside the namespace
    assert _ours(lab) == []
    assert lab.tag not in persistent_labs()
    with pytest.raises(NetnsUnavailableError, match="not a Shuttle lab tag"):
        destroy_lab("other")
