"""Streaming over TLS, by cipher: plain, TLS with OpenSSL's default suite (AES-256-GCM)
and TLS with AES-128-GCM, three nodes streamed from in the same run, interleaved.

    .venv/bin/python benchmarks/tls_stream.py --json benchmarks/results/tls-stream-ciphers.json

Python 3.11's :mod:`ssl` cannot choose TLS 1.3 suites (``set_ciphers`` covers TLS 1.2
only). OpenSSL's own configuration can: the AES-128 node is started with
``OPENSSL_CONF`` naming a file whose ``system_default`` section says ``Ciphersuites =
TLS_AES_128_GCM_SHA256``; the client offers OpenSSL's default list (AES-256-GCM,
ChaCha20-Poly1305, AES-128-GCM) and that node can only agree to the last. The suite
each TLS node agreed to is checked with a handshake of its own before the runs.

Each round streams the object once from each node (the order rotates round by round),
and counts wall seconds and CPU seconds per GiB of the client (this process) and of the
node. Ratios are TLS over plain within each round; the medians and the spread over the
rounds are printed and written.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shuttle.bench.netrand import make_file
from shuttle.bench.nodes import bench_client
from shuttle.bench.stream import KEY, process_cpu_s
from shuttle.client.client import Client

AES128_CONF = """openssl_conf = openssl_init
[openssl_init]
ssl_conf = ssl_sect
[ssl_sect]
system_default = system_default_sect
[system_default_sect]
Ciphersuites = TLS_AES_128_GCM_SHA256
"""


@contextlib.contextmanager
def node_env(name: str, value: str | None) -> Iterator[None]:
    """``name`` set to ``value`` for the node processes started inside (this process's
    OpenSSL read its configuration when :mod:`ssl` was imported: it is unchanged)."""
    old = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def agreed_suite(client: Client) -> str:
    """The TLS 1.3 suite ``client``'s node agrees to, by a handshake of our own."""
    address = client.nodes[0]
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # only asking which suite; nothing is sent
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    with (
        socket.create_connection((address.host, address.port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname=address.host) as tls,
    ):
        cipher = tls.cipher()
    return cipher[0] if cipher else "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bytes", type=int, default=512 << 20, help="object size")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args()
    conf = Path(tempfile.mkdtemp(prefix="shuttle-tls-conf-")) / "aes128.cnf"
    conf.write_text(AES128_CONF)
    modes = {"plain": (False, None), "aes256": (True, None), "aes128": (True, str(conf))}
    clients: dict[str, Client] = {}
    pids: dict[str, int] = {}
    with contextlib.ExitStack() as stack:
        scratch: Path | None = None
        for mode, (tls, openssl_conf) in modes.items():
            started: list[int] = []
            with node_env("OPENSSL_CONF", openssl_conf):
                client, where = stack.enter_context(
                    bench_client(None, tls=tls, node_pids=started, cache_bytes=0)
                )
            clients[mode], pids[mode] = client, started[0]
            scratch = scratch or where
        assert scratch is not None
        suites = {m: agreed_suite(c) for m, c in clients.items() if m != "plain"}
        print(f"suites agreed: {suites}", flush=True)
        path = scratch / "stream.dat"
        make_file(path, args.bytes)
        infos = {}
        for mode, client in clients.items():
            client.put(KEY, path)
            infos[mode] = client.stat(KEY)
        gib = args.bytes / (1 << 30)

        def once(mode: str) -> dict[str, float]:
            client, pid = clients[mode], pids[mode]
            node0, client0, t0 = process_cpu_s(pid), time.process_time(), time.perf_counter()
            n = sum(len(p) for p in client.iter_read(KEY, info=infos[mode]))
            wall = time.perf_counter() - t0
            assert n == args.bytes, f"{mode}: streamed {n} of {args.bytes}"
            return {
                "wall_s": wall,
                "client_cpu_s_per_gib": (time.process_time() - client0) / gib,
                "node_cpu_s_per_gib": (process_cpu_s(pid) - node0) / gib,
            }

        for mode in clients:  # warm the page cache and the connections
            once(mode)
        order = list(clients)
        runs: dict[str, list[dict[str, float]]] = {m: [] for m in clients}
        for r in range(args.rounds):
            for mode in order[r % 3 :] + order[: r % 3]:
                runs[mode].append(once(mode))
            print(
                f"round {r + 1}: " + "  ".join(f"{m} {runs[m][-1]['wall_s']:.3f} s" for m in order),
                flush=True,
            )
    out: dict[str, Any] = {"bytes": args.bytes, "rounds": args.rounds, "suites": suites}
    print(f"\n{'mode':<8} {'MiB/s':>7} {'client s/GiB':>13} {'node s/GiB':>11} {'ratio':>6}")
    for mode in order:
        wall = [x["wall_s"] for x in runs[mode]]
        ratios = [p["wall_s"] / x["wall_s"] for p, x in zip(runs["plain"], runs[mode], strict=True)]
        row = {
            "runs": runs[mode],
            "median_wall_s": statistics.median(wall),
            "mib_per_s": args.bytes / (1 << 20) / statistics.median(wall),
            "client_cpu_s_per_gib": statistics.median(
                x["client_cpu_s_per_gib"] for x in runs[mode]
            ),
            "node_cpu_s_per_gib": statistics.median(x["node_cpu_s_per_gib"] for x in runs[mode]),
            "over_plain_median": statistics.median(ratios),
            "over_plain_range": [min(ratios), max(ratios)],
        }
        out[mode] = row
        print(
            f"{mode:<8} {row['mib_per_s']:>7.0f} {row['client_cpu_s_per_gib']:>13.2f} "
            f"{row['node_cpu_s_per_gib']:>11.2f} {row['over_plain_median']:>6.2f} "
            f"(rounds {min(ratios):.2f}-{max(ratios):.2f})"
        )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2))
    sys.exit(0)


if __name__ == "__main__":
    main()
