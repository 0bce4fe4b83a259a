"""``bench abacus mix``'s client processes set a pass up again when setting it up
failed (a starved node's handshakes timing out), and give up after
``SETUP_ATTEMPTS``, saying why. Real forked clients; the node they dial is a port
nobody listens on, so every setup that makes a filter there fails at once."""

from __future__ import annotations

import socket

import pytest

from shuttle.bench.mix_clients import SETUP_ATTEMPTS, ClientSetup, client_processes
from shuttle.bench.mix_settings import MixSettings
from shuttle.client.model import NodeAddress


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again as the block ends


def test_a_setup_that_keeps_failing_is_tried_again_then_reported() -> None:
    node = NodeAddress("n1", "127.0.0.1", _closed_port())
    settings = MixSettings(clients=2, duration_s=1.0, warmup_s=0.0)
    setup = ClientSetup((node,), None, ("bench/mix-0", "bench/mix-0"), settings)
    starts: list[float] = []
    with client_processes(setup) as (run_pass, pids):
        assert len(pids) == 2
        with pytest.raises(RuntimeError, match=f"while setting it up, {SETUP_ATTEMPTS} times") as e:
            run_pass("server", 0, starts.append)  # making the filters at the node fails
        assert "2 of 2 mix clients failed in the server pass" in str(e.value)
        assert "quieter machine" in str(e.value)
        # The clients stayed for the next order (a failed setup does not end them):
        # the next pass is set up (and fails) again rather than finding them gone.
        with pytest.raises(RuntimeError, match="while setting it up"):
            run_pass("split", 0, starts.append)
        assert starts == []  # no pass started
        # Filters made at the clients: each client connects to the node while setting
        # up too (a 1-byte read), not on its first call at the start's instant, when
        # 48 clients' handshakes at once met a saturated node and timed out.
        with pytest.raises(RuntimeError, match="while setting it up"):
            run_pass("client", 0, starts.append)
        assert starts == []  # no pass started
