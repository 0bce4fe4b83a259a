"""``shuttle serve``: run one storage node until SIGTERM or SIGINT.

Opening the store runs its recovery (redo of the journal), so a node killed with
SIGKILL comes back with every acknowledged write and no torn object. On SIGTERM the
node stops accepting connections, lets running requests finish, says goodbye to
its clients, closes the store and exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from dataclasses import asdict, replace
from pathlib import Path

import uvloop

from shuttle.errors import ConfigError
from shuttle.net.auth import load_key_file
from shuttle.net.cpu import CpuSpeed
from shuttle.net.memory import tune_allocator
from shuttle.net.principals import PrincipalBook
from shuttle.net.registry import OperationRegistry
from shuttle.net.server import RpcServer
from shuttle.net.tls import ClientTls, ServerTls
from shuttle.node.callback_ops import register_callback_ops
from shuttle.node.callbacks import PromiseTable
from shuttle.node.config import NodeConfig
from shuttle.node.full_collections import FullCollections
from shuttle.node.handlers import register_locality_ops, register_storage_ops
from shuttle.node.principal_peers import PeerCatchUp
from shuttle.node.principal_store import (
    PrincipalStore,
    backend_for,
    refresh_forever,
    register_principal_ops,
)
from shuttle.node.worker_pool import GenerationHook, PrincipalRelay, WorkerPool
from shuttle.objects.fs import node_services, recover_services
from shuttle.objects.storage import StorageObject
from shuttle.runtime.host import NodeRuntime
from shuttle.store import ObjectStore, StoreConfig
from shuttle.store.generations import ChangeGenerations
from shuttle.store.interface import Store
from shuttle.store.rados_locality import PrimaryLocator
from shuttle.store.registry import open_store

log = logging.getLogger("shuttle.node")

#: An upload session idle this long belongs to a client that went away: its staged
#: bytes are dropped (a live client sends a piece at least every request timeout).
UPLOAD_IDLE_S = 600.0
#: How often the node looks for such sessions.
UPLOAD_SWEEP_INTERVAL_S = 30.0

#: Reads up to this size go through the node's block cache; larger ones go to disk.
CACHED_READ_BYTES_MAX = 64 << 10


def _write_ready_file(path: Path, host: str, port: int, node_id: str) -> None:
    """Atomically publish where the node listens (a reader never sees half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"host": host, "port": port, "pid": os.getpid(), "node_id": node_id}))
    os.replace(tmp, path)


async def serve(config: NodeConfig) -> None:
    """Open the store, listen, and serve until a stop signal; then shut down cleanly.

    Raises :class:`ConfigError` (before anything is opened) if the key file is bad.
    """
    key = load_key_file(config.key_file) if config.key_file is not None else None
    server_tls: ServerTls | None = None
    peer_tls: ClientTls | None = None
    if config.tls_enabled:
        assert config.tls_cert is not None and config.tls_key is not None
        server_tls = ServerTls(config.tls_cert, config.tls_key)
        peer_tls = ClientTls(config.ca_file)
    store = open_store(
        config.store_spec(),
        config.data_dir,
        StoreConfig(
            cache_capacity_bytes=config.cache_bytes,
            cache_block_size_bytes=config.cache_block_bytes,
            # Streaming reads (the client asks for 1 MiB pieces) bypass the block cache:
            # data read once would only evict the pages that random reads reuse.
            cache_read_bytes_max=CACHED_READ_BYTES_MAX,
            object_bytes_max=config.object_bytes_max,
        ),
        config.ceph_options(),
    )
    # The file system's node services; recovery of updates cut by a crash happens
    # here, before the node listens.
    services = node_services(store, config.data_dir)
    cpu = CpuSpeed(config.cpu_factor)
    registry = OperationRegistry()
    locator: PrimaryLocator | None = None
    register_storage_ops(registry, store)
    # Callback promises: every change to an object breaks them first (docs/consistency.md).
    promises = PromiseTable(config.callback_term_s)
    register_callback_ops(registry, store, promises)
    # Workers (docs/architecture.md, "Workers") read the store's files themselves: every
    # change brackets its key's slot in the generations they check their reads by.
    generations: ChangeGenerations | None = None
    if config.workers > 1:
        assert isinstance(store, ObjectStore)  # the config refuses workers on RADOS
        generations = ChangeGenerations.create()
        store.change_hook = GenerationHook(store.change_hook, generations)
    if config.store_spec().kind == "rados":  # gateways: where each key's primary OSD is
        from shuttle.store.rados import RadosStore

        assert isinstance(store, RadosStore)
        locator = PrimaryLocator(
            store.conn.cluster,
            store.conn.pool,
            store.conn.namespace,
            host=config.ceph_host,
            timeout_s=store.conn.op_timeout_s,
        )
        register_locality_ops(registry, locator)
    # Principals (a node with a cluster key only: their keys derive from it). A stored
    # table that cannot be read stops the node here, before it serves anyone.
    principals: PrincipalStore | None = None
    relay: PrincipalRelay | None = None
    rados = config.store_spec().kind == "rados"
    if key is not None:
        backend = backend_for(store, config.data_dir, rados)
        principals = PrincipalStore(PrincipalBook(key), backend)
        principals.book.replace(principals.load())
        # A node with workers hands its table to them, and a change answers only once
        # every worker installed it (docs/architecture.md, "Workers").
        relay = PrincipalRelay(principals.book) if config.workers > 1 else None
        if relay is not None:
            relay.register(registry)
        register_principal_ops(
            registry,
            principals,
            key,
            after_install=relay.settle if relay is not None else None,
        )
    # A node that missed a change of principals (down, cut off) takes the newest table
    # from its peers before it listens, and checks again at an interval.
    catch_up: PeerCatchUp | None = None
    if principals is not None and key is not None and config.cluster_file is not None:
        catch_up = PeerCatchUp(
            principals,
            config.cluster_file,
            config.name,
            key,
            peer_tls,
            interval_s=config.principals_check_s,
        )
        await catch_up.catch_up()
    # At factor 1 the node does no accounting at all (two clock reads per request).
    account = cpu.section if cpu.burn_ratio else contextlib.nullcontext
    server = RpcServer(
        registry,
        config.name,
        executor_threads=config.executor_threads(),
        cpu_account=account,
        key=key,
        admission=config.admission(),
        principals=principals.book if principals is not None else None,
        tls=server_tls,
        principal_limits=config.principal_limits(),
    )
    server.add_stats_source("store", store.stats)
    server.add_stats_source("callbacks", promises.stats)
    if locator is not None:
        server.add_stats_source("locality", locator.stats)
    if catch_up is not None:
        server.add_stats_source("principals", catch_up.stats)
    server.add_stats_source("cpu", lambda: {"factor": cpu.factor, **asdict(cpu.counters)})
    runtime: NodeRuntime | None = None
    pool: WorkerPool | None = None
    full_collections: FullCollections | None = None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        try:
            host, port = await server.start(config.host, config.port, reuse_port=config.workers > 1)
        except OSError as exc:
            raise ConfigError(
                f"cannot listen on {config.host}:{config.port} ({exc.strerror or exc}); "
                "is another node using that port? choose another with --listen"
            ) from exc
        if not config.node_id:
            server.node_id = f"{host}:{port}"
        if config.ready_file is not None and config.workers == 1:
            _write_ready_file(config.ready_file, host, port, server.node_id)
        runtime = NodeRuntime(
            server.node_id,
            registry,
            StorageObject(store),
            services=services,
            config=config.runtime_config(),
            key=key,
            speed=cpu.factor,
            sandbox_limits=config.sandbox_limits(),
            principals=principals.book if principals is not None else None,
            tls=peer_tls,
            load=server.load,
        )
        runtime.start(f"{host}:{port}")
        interval = config.full_collections_s()
        if interval is not None:
            # Up and serving: full collections from now on on their own thread (this,
            # the primary, process's: --workers processes keep the interpreter's own).
            full_collections = FullCollections(interval).start()
        # Holders of promises from before a restart are called back (writes wait).
        recovering = loop.run_in_executor(None, recover_services, services)
        server.add_stats_source("runtime", runtime.stats)
        if generations is not None:
            assert isinstance(store, ObjectStore)
            # After the run-time registered its operations: a worker serves those the
            # primary lists when it starts.
            private = await server.listen_private()
            pool = WorkerPool(
                replace(config, host=host, port=port),
                server.node_id,
                private,
                generations,
                store.lock_fd,
                on_death=relay.forget if relay is not None else lambda index: None,
            )
            if relay is not None:
                relay.pool = pool
            await pool.start()
            server.add_stats_source("workers", pool.stats)
            if config.ready_file is not None:
                _write_ready_file(config.ready_file, host, port, server.node_id)
        if key is None:
            log.info("no cluster key: any client may read and write data; shipped code is refused")
        else:
            log.info("cluster key from %s: clients must prove they hold it", config.key_file)
            _log_jail(config)
        if principals is not None:
            log.info(
                "principals: epoch %d, %d principal(s), stored in %s",
                principals.book.table.epoch,
                len(principals.book.table.names()),
                principals.backend.where,
            )
        if server_tls is not None:
            log.info("TLS 1.3 with certificate %s; CA %s", config.tls_cert, config.ca_file)
        elif config.insecure:
            log.warning("serving %s without TLS (--insecure): the network path is trusted", host)
        print(
            f"shuttle node {server.node_id} serving "
            f"{config.data_dir if config.store == 'local' else config.store} on {host}:{port}"
            + (" (cluster key required)" if key is not None else "")
            + (" (TLS)" if server_tls is not None else ""),
            flush=True,
        )
        sweeper = loop.create_task(_expire_uploads(store))
        # Gateways of one pool share its table: reload it now and then.
        refresher = (
            loop.create_task(refresh_forever(principals))
            if principals is not None and rados
            else None
        )
        asker = loop.create_task(catch_up.run_forever()) if catch_up is not None else None
        await stop.wait()
        if asker is not None:
            asker.cancel()
        recovering.cancel()
        log.info("stop signal received; shutting down")
        sweeper.cancel()
        if refresher is not None:
            refresher.cancel()
    finally:
        if pool is not None:
            # First: their clients' requests still need the primary to answer them.
            await pool.stop()
        promises.close_all()  # long polls answer now: clients drop their promises and hang up
        await server.close()
        if runtime is not None:
            await runtime.close()
        store.close()
        if generations is not None:
            generations.close()
        if full_collections is not None:
            full_collections.stop()  # the interpreter's own collections back


async def _expire_uploads(store: Store) -> None:
    """Drop upload sessions abandoned by their clients, now and then."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(UPLOAD_SWEEP_INTERVAL_S)
        expired = await loop.run_in_executor(None, store.expire_uploads, UPLOAD_IDLE_S)
        if expired:
            log.info("dropped %d upload session(s) idle for over %.0f s", expired, UPLOAD_IDLE_S)


def run(config: NodeConfig) -> None:
    """Run a node in this process (blocks until it stops)."""
    tune_allocator()  # large request and reply buffers: keep them off mmap
    logging.basicConfig(
        level=config.log_level.upper(),
        format=f"%(asctime)s %(levelname)s node[{config.name}] %(message)s",
        stream=sys.stderr,
    )
    uvloop.run(serve(config))


def _log_jail(config: NodeConfig) -> None:
    """Say how this node runs shipped code (docs/security.md, *The jail*)."""
    from shuttle.runtime import jail

    if config.unsafe_code:
        log.warning(
            "--unsafe-code: shipped code runs WITHOUT the jail, as this node's user, with "
            "its files, key and network"
        )
        return
    missing = jail.unavailable()
    if missing is None:
        log.info("shipped code runs in a jail (namespaces, its own uid, seccomp)")
        for path in jail.sweep_stale_cgroups():
            log.info("removed the cgroup of a jail whose node is gone: %s", path)
    else:
        log.warning("this node cannot jail shipped code and refuses it: %s", missing)
