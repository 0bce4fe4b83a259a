"""A fault lab takes a network no other lab uses, so two fault runs at once (a
``make test-faults`` beside a ``make test``) do not answer each other's addresses."""

from __future__ import annotations

import os
import subprocess

import pytest

from shuttle.net.netns import netns_unavailable_reason
from tests.faults import lab

pytestmark = pytest.mark.netns


def test_a_lab_skips_a_network_another_lab_holds() -> None:
    reason = netns_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    first = lab._free_lab(5)
    # Another run's lab on that network: a bridge holding its address, as a lab's does.
    bridge = f"sfb{os.getpid():x}t"[:15]
    subprocess.run(["ip", "link", "add", bridge, "type", "bridge"], check=True)
    try:
        subprocess.run(["ip", "addr", "add", f"198.19.{first}.1/24", "dev", bridge], check=True)
        assert first in lab._labs_in_use()
        assert lab._free_lab(5) != first
    finally:
        subprocess.run(["ip", "link", "del", bridge], check=False)
