"""The asyncio client against a real node: concurrent calls share one connection."""

from __future__ import annotations

import asyncio
import os

import pytest

from shuttle.client.aio import AsyncClient
from shuttle.client.model import NodeAddress
from shuttle.errors import NotFoundError, UnknownOperationError, UnreachableError
from shuttle.net.profiles import parse_link_profile
from tests.integration.nodeproc import NodeProcess


def test_async_round_trips_and_concurrency(node: NodeProcess) -> None:
    async def main() -> None:
        async with AsyncClient([NodeAddress("n", "127.0.0.1", node.port)]) as client:
            await asyncio.gather(*(client.put(f"a/{i}", f"v{i}".encode()) for i in range(50)))
            got = await asyncio.gather(*(client.get(f"a/{i}") for i in range(50)))
            assert got == [f"v{i}".encode() for i in range(50)]
            assert await client.list("a/") == sorted(f"a/{i}" for i in range(50))
            conn = client.connection(client.nodes[0])
            assert conn.requests >= 150  # all over one connection
            big = os.urandom(5 << 20)
            info = await client.put("big", big)  # an upload session, pieces in parallel
            assert info.size == len(big) and await client.get("big") == big
            assert await client.read("big", 1_000_000, 10) == big[1_000_000:1_000_010]
            w = await client.write("big", 0, b"XY")
            assert w.version > info.version
            await client.remove("a/0")
            with pytest.raises(NotFoundError):
                await client.stat("a/0")
            with pytest.raises(UnknownOperationError):
                await client.call(client.nodes[0], "nope")

    asyncio.run(main())


def test_async_client_over_an_emulated_link(node: NodeProcess) -> None:
    async def main() -> float:
        lan = parse_link_profile("lan")  # 10 Mb/s, 0.5 ms
        async with AsyncClient([NodeAddress("n", "127.0.0.1", node.port, lan)]) as client:
            await client.put("x", b"q" * 125_000)  # 1 Mbit
            loop = asyncio.get_running_loop()
            start = loop.time()
            assert await client.get("x") == b"q" * 125_000
            return loop.time() - start

    elapsed = asyncio.run(main())
    # 1 Mbit at 10 Mb/s, less the token bucket's burst, plus the one-way latency.
    assert elapsed >= parse_link_profile("lan").transfer_time_s(125_000)


def test_async_client_survives_a_node_restart(node: NodeProcess) -> None:
    async def main() -> None:
        async with AsyncClient([NodeAddress("n", "127.0.0.1", node.port)]) as client:
            await client.put("k", b"v")
            node.terminate()
            node.start()
            try:
                got = await client.get("k")
            except UnreachableError:
                # The reader had not yet seen the old connection close; this call did.
                got = await client.get("k")  # and the next one reconnects
            assert got == b"v"

    asyncio.run(main())
