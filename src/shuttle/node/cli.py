"""``shuttle serve``: the storage node command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

# The command tree is built whenever ``shuttle`` starts: the node's configuration (and
# with it the store, the run-time and the wire) comes in when ``serve`` runs
# (tests/unit/test_cli_start.py). So the defaults are written here, as
# ``shuttle.node.config`` defines them (the same test checks they agree):
CACHE_BYTES_DEFAULT = 64 << 20
CACHE_BLOCK_BYTES_DEFAULT = 4096


def serve(
    data: Annotated[
        Path | None, typer.Option("--data", help="Data directory (created if missing).")
    ] = None,
    listen: Annotated[
        str, typer.Option(help="HOST:PORT to listen on (port 0: any free port).")
    ] = "127.0.0.1:7400",
    node_id: Annotated[str, typer.Option(help="Name of this node (default: HOST:PORT).")] = "",
    cache_bytes: Annotated[
        int, typer.Option(help="Server block cache size in bytes (0 disables it).")
    ] = CACHE_BYTES_DEFAULT,
    cache_block_bytes: Annotated[
        int, typer.Option(help="Block size of the server cache (a power of two).")
    ] = CACHE_BLOCK_BYTES_DEFAULT,
    cpu_factor: Annotated[
        float,
        typer.Option(
            help="CPU speed relative to this machine; 0.5 burns twice the CPU per request."
        ),
    ] = 1.0,
    ready_file: Annotated[
        Path | None, typer.Option(help="Write host, port and pid here (JSON) once listening.")
    ] = None,
    key_file: Annotated[
        Path | None,
        typer.Option(
            "--key-file",
            help="Cluster key file (hex, mode 0600; `shuttle cluster up` writes one): serve "
            "only clients that prove they hold the key, or the key of a principal made with "
            "`shuttle cluster user add` (checked against its caps; kept in "
            "DATA/.shuttle/principals.json, or in the pool). Without it, any client may read "
            "and write data, and shipped code is refused.",
        ),
    ] = None,
    window: Annotated[
        float | None,
        typer.Option(help="Run-time: the observation window H, seconds (default 1)."),
    ] = None,
    threshold: Annotated[
        float | None,
        typer.Option(
            help="Run-time: B_thresh, the fraction of H a migration must save (default 0.3)."
        ),
    ] = None,
    threshold_share: Annotated[
        bool | None,
        typer.Option(
            "--threshold-share/--no-threshold-share",
            help="Run-time: scale each stack's B_thresh by its share of its client's time "
            "(for clients that run several stacks in turn; default off).",
        ),
    ] = None,
    settle_calls: Annotated[
        bool | None,
        typer.Option(
            "--settle-calls/--no-settle-calls",
            help="Run-time: leave a stack undecided while its top calls have not returned "
            "(their CPU is counted when they do; default off).",
        ),
    ] = None,
    aggregate_clients: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Run-time: from this many clients with stacks at the node, decide for "
            "their aggregate throughput: the node's CPU allocated like its memory, the "
            "moves of an evaluation judged together (default 5; 0: never).",
        ),
    ] = None,
    arrivals_max: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Run-time: with many clients, the stacks that may be on their way to the "
            "node and not yet observed there for a window (or as many as it hosts, if "
            "more); more are admitted as these are, at the wait per call the stacks there "
            "measure (default 8; 0: no limit).",
        ),
    ] = None,
    arrivals_max_saturated: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Run-time: with many clients, the same limit while the clients' digests "
            "say their CPUs are saturated (the budget raised): the node's CPU budget, not "
            "the batch, then stops the arrivals (default 32; never fewer than "
            "--arrivals-max).",
        ),
    ] = None,
    cpu_budget: Annotated[
        float | None,
        typer.Option(
            min=0.01,
            max=1.0,
            help="Run-time: with many clients, the share of its CPU the node lets stacks "
            "arriving fill; past 0.9 (or this, if more) it sends a share back "
            "(default 0.7).",
        ),
    ] = None,
    cpu_budget_saturated: Annotated[
        float | None,
        typer.Option(
            min=0.01,
            max=1.0,
            help="Run-time: with many clients, the share of its CPU arriving stacks may "
            "fill instead while the clients' digests say their CPUs are saturated (median "
            "0.9 busy or more): work the node takes off them is throughput (default 0.85; "
            "never less than --cpu-budget: set it to that to turn the raise off).",
        ),
    ] = None,
    raise_hold: Annotated[
        bool | None,
        typer.Option(
            "--raise-hold/--no-raise-hold",
            help="Run-time: with many clients, keep the raised share (--cpu-budget-saturated) "
            "while the node's use is above --cpu-budget once its clients read saturated: "
            "they read less busy then because they wait on it (default on; off: the "
            "raise lapses at the first evaluation they read under 0.9).",
        ),
    ] = None,
    rank_by_node_cpu: Annotated[
        bool | None,
        typer.Option(
            "--rank-by-node-cpu/--no-rank-by-node-cpu",
            help="Run-time: with many clients, admit arrivals in order of what they save "
            "their clients per second of the node's CPU, and while the clients are "
            "saturated none that saves less than that CPU (default on; off: the paper's "
            "score, client-load weighted).",
        ),
    ] = None,
    shed_by_freed_cpu: Annotated[
        bool | None,
        typer.Option(
            "--shed-by-freed-cpu/--no-shed-by-freed-cpu",
            help="Run-time: with many clients, a node over its CPU sends back only "
            "stacks whose leaving frees it: their CPU there more than serving their "
            "reads over the link would cost (default on; off: any hosted stack, as "
            "before).",
        ),
    ] = None,
    log_as_text: Annotated[
        bool | None,
        typer.Option(
            "--log-as-text/--log-as-dicts",
            help="Run-time: keep the decision log in memory as JSON lines, which no "
            "garbage collection traverses (default); --log-as-dicts: as dicts, as before "
            "(a full collection then walks every record's objects).",
        ),
    ] = None,
    scheduled_gc: Annotated[
        float | None,
        typer.Option(
            "--scheduled-gc",
            min=0.0,
            help="Make the node's full garbage collections on a thread of their own every "
            "this many seconds, never inside a call (on a slow node a collection inside a "
            "call is burned with it); 0: the interpreter's own; default: 10 on a node of "
            "--cpu-factor < 1, the interpreter's own otherwise. The primary process's "
            "only: --workers processes keep the interpreter's own.",
        ),
    ] = None,
    cpu_climb: Annotated[
        bool | None,
        typer.Option(
            "--cpu-climb/--no-cpu-climb",
            help="Run-time: with many clients, raise the share arrivals may fill from "
            "--cpu-budget a step at a time while the clients' calls a second do not "
            "fall, and take back a step after which they fell (default off: the fixed "
            "budget).",
        ),
    ] = None,
    residence: Annotated[
        float | None,
        typer.Option(help="Run-time: seconds an object stays put after it moved (default 5 H)."),
    ] = None,
    object_memory: Annotated[
        int | None,
        typer.Option(
            help="Run-time: bytes of memory lent to hosted mobile objects (default: no limit)."
        ),
    ] = None,
    lease: Annotated[
        float | None,
        typer.Option(
            help="Run-time: drop the objects of an application not heard from for this "
            "many seconds (default 30)."
        ),
    ] = None,
    durable_lease: Annotated[
        float | None,
        typer.Option(
            help="Run-time: seconds a node serves another home's durable object without "
            "word from that home; as a home, how long it waits before bringing back one "
            "whose node went silent (default 4)."
        ),
    ] = None,
    adapt: Annotated[
        bool,
        typer.Option(
            "--adapt/--no-adapt",
            help="Run-time: move objects (--no-adapt: only measure and log the decisions).",
        ),
    ] = True,
    sandbox_memory: Annotated[
        int | None,
        typer.Option(
            help="Shipped objects: address space of each worker, bytes (default 512 MiB)."
        ),
    ] = None,
    sandbox_cpu: Annotated[
        float | None,
        typer.Option(help="Shipped objects: CPU seconds one call may use (default 30)."),
    ] = None,
    sandbox_wall: Annotated[
        float | None,
        typer.Option(help="Shipped objects: seconds one call may take (default 300)."),
    ] = None,
    unsafe_code: Annotated[
        bool,
        typer.Option(
            "--unsafe-code",
            help="Run shipped code WITHOUT the jail: as this node's user, able to read its "
            "data directory and cluster key, reach the network, and signal or trace the "
            "node. Only for a machine whose kernel cannot build the jail (without this "
            "flag such a node refuses shipped code) and whose key holders are all trusted.",
        ),
    ] = False,
    insecure: Annotated[
        bool,
        typer.Option(
            "--insecure",
            help="Allow listening beyond loopback without TLS (--no-tls) or without "
            "--key-file. Without TLS, anyone on the network path reads every byte and can "
            "change requests and replies (content hashes catch changed object data, not "
            "changed keys or operations) or take over a connection after its handshake; "
            "without a key, any host that reaches the node may read, write and remove all "
            "data. Only where every host and link is trusted.",
        ),
    ] = False,
    tls: Annotated[
        bool | None,
        typer.Option(
            "--tls/--no-tls",
            help="Serve every connection over TLS 1.3 (default: on beyond loopback or when "
            "--tls-cert is given, off on loopback). Needs --tls-cert, --tls-key, --ca-file.",
        ),
    ] = None,
    tls_cert: Annotated[
        Path | None,
        typer.Option(
            "--tls-cert",
            help="This node's certificate (PEM, issued for the address clients dial; "
            "`shuttle cluster up --tls` makes one per node under ROOT/tls/).",
        ),
    ] = None,
    tls_key: Annotated[
        Path | None,
        typer.Option("--tls-key", help="The certificate's private key (PEM, mode 0600)."),
    ] = None,
    ca_file: Annotated[
        Path | None,
        typer.Option(
            "--ca-file",
            help="The cluster's CA certificate (PEM): the node checks other nodes with it.",
        ),
    ] = None,
    cluster_file: Annotated[
        Path | None,
        typer.Option(
            "--cluster-file",
            help="A cluster file naming the other nodes (`shuttle cluster up` gives its own): "
            "a node that missed a change of principals (it was down or cut off) takes the "
            "newest table from them before it listens and every --principals-check seconds.",
        ),
    ] = None,
    principals_check: Annotated[
        float | None,
        typer.Option(
            help="With --cluster-file: seconds between asking the other nodes for a newer "
            "principal table (default 10): the longest a node that was cut off keeps a "
            "removed principal's key once it is reachable again."
        ),
    ] = None,
    handshake_timeout: Annotated[
        float | None,
        typer.Option(
            help="Seconds a connection has to finish its handshake (TLS, HELLO) before it "
            "is closed (default 10)."
        ),
    ] = None,
    unauthenticated_max: Annotated[
        int | None,
        typer.Option(
            help="Connections in their handshake at once; a new one past it closes the one "
            "that waited longest (default: a quarter of --connections-max, at most 1024)."
        ),
    ] = None,
    connections_max: Annotated[
        int | None,
        typer.Option(
            help="Connections served at once; more are refused as 'busy' (default 16384, "
            "lowered to fit the descriptor limit)."
        ),
    ] = None,
    principal_connections_max: Annotated[
        int | None,
        typer.Option(
            help="Connections one principal may hold; more are refused as 'busy' naming this "
            "limit (default: a quarter of --connections-max, at most 1024). The cluster key's "
            "are not limited."
        ),
    ] = None,
    principal_requests_max: Annotated[
        int | None,
        typer.Option(
            help="Requests of one principal in flight at once, over all its connections; "
            "more are answered 'busy' (default 1024)."
        ),
    ] = None,
    requests_max: Annotated[
        int | None,
        typer.Option(help="Requests of all principals in flight at once (default 32768)."),
    ] = None,
    principal_objects_max: Annotated[
        int | None,
        typer.Option(
            help="Mobile objects one principal may have on this node, made here or moved "
            "here (default 64)."
        ),
    ] = None,
    objects_max: Annotated[
        int | None,
        typer.Option(help="Mobile objects of all principals on this node (default 1024)."),
    ] = None,
    frame_timeout: Annotated[
        float | None,
        typer.Option(help="Seconds a request frame may take to arrive whole (default 60)."),
    ] = None,
    idle_timeout: Annotated[
        float | None,
        typer.Option(help="Close connections idle this many seconds (default 300)."),
    ] = None,
    object_bytes_max: Annotated[
        int | None,
        typer.Option(
            help="Largest object the node stores, bytes (default 64 GiB, at most 1 TiB); "
            "bigger puts, writes and truncates are refused."
        ),
    ] = None,
    callback_term: Annotated[
        float | None,
        typer.Option(
            help="Seconds a callback promise holds unless broken (default 30): the longest "
            "a client that stopped without closing its connection holds up writers."
        ),
    ] = None,
    store: Annotated[
        str | None,
        typer.Option(
            "--store",
            help="Where objects live: 'local' (files under --data; the default) or "
            "'rados:POOL' or 'rados:POOL/NAMESPACE' (a Ceph RADOS pool that several nodes "
            "may serve; --data then holds only this node's local state). See docs/ceph.md.",
        ),
    ] = None,
    ceph_conf: Annotated[
        Path | None,
        typer.Option(
            "--ceph-conf",
            help="With --store rados: the Ceph configuration file (default: $CEPH_CONF or "
            "/etc/ceph/ceph.conf).",
        ),
    ] = None,
    ceph_keyring: Annotated[
        Path | None,
        typer.Option(
            "--ceph-keyring",
            help="With --store rados: the keyring holding the user's key (default: the one "
            "the configuration names, /etc/ceph/$cluster.$name.keyring).",
        ),
    ] = None,
    ceph_user: Annotated[
        str | None,
        typer.Option("--ceph-user", help="With --store rados: the cephx user (client.admin)."),
    ] = None,
    ceph_host: Annotated[
        str | None,
        typer.Option(
            "--ceph-host",
            help="With --store rados: this node's CRUSH host (default: the machine's short "
            "host name, as Ceph names OSD hosts). Clients send a key to the node on the host "
            "of its primary OSD. Set it when that name differs, or to test on one machine.",
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            help="Processes serving the node's port (default 1). With N > 1, N-1 worker "
            "processes share the port (SO_REUSEPORT) and answer small reads and stats "
            "themselves, checked against the primary's changes; everything else goes to "
            "the primary process, which owns the store. A worker that dies is started "
            "again (after 0.25 s, backing off to 30 s if it keeps dying). Works with "
            '--tls. A local store only. See docs/operations.md, "More than one process", '
            "and benchmarks/README.md for what a second process gives on this machine.",
        ),
    ] = None,
    config: Annotated[
        Path | None, typer.Option(help="TOML file with a [node] table; flags given win.")
    ] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR.")] = "INFO",
) -> None:
    """Run a storage node: keep objects under --data (or, with --store rados:POOL, in a
    Ceph pool that several nodes serve) and serve them over TCP.

    Writes are durable before they are acknowledged; a node killed at any instant
    comes back (run it again on the same --data) with every acknowledged write and no
    torn object. SIGTERM or Ctrl-C stops it cleanly.
    """
    from shuttle.net.addresses import parse_address
    from shuttle.node.config import NodeConfig
    from shuttle.node.main import run

    host, port = parse_address(listen)
    runtime: dict[str, Any] = {
        "window_s": window,
        "threshold": threshold,
        "threshold_share": threshold_share,
        "settle_calls": settle_calls,
        "aggregate_clients": aggregate_clients,
        "arrivals_max": arrivals_max,
        "arrivals_max_saturated": arrivals_max_saturated,
        "cpu_budget": cpu_budget,
        "cpu_budget_saturated": cpu_budget_saturated,
        "cpu_climb": cpu_climb,
        "raise_hold": raise_hold,
        "rank_by_node_cpu": rank_by_node_cpu,
        "shed_by_freed_cpu": shed_by_freed_cpu,
        "log_as_text": log_as_text,
        "scheduled_gc_s": scheduled_gc,
        "residence_s": residence,
        "object_memory_bytes": object_memory,
        "adaptive": None if adapt else False,
        "lease_s": lease,
        "durable_lease_s": durable_lease,
        "sandbox_memory_bytes": sandbox_memory,
        "sandbox_cpu_s": sandbox_cpu,
        "sandbox_wall_s": sandbox_wall,
        "object_bytes_max": object_bytes_max,
        "insecure": insecure or None,
        "unsafe_code": unsafe_code or None,
        "tls": tls,
        "tls_cert": tls_cert,
        "tls_key": tls_key,
        "ca_file": ca_file,
        "cluster_file": cluster_file,
        "principals_check_s": principals_check,
        "handshake_timeout_s": handshake_timeout,
        "unauthenticated_max": unauthenticated_max,
        "connections_max": connections_max,
        "principal_connections_max": principal_connections_max,
        "principal_requests_max": principal_requests_max,
        "requests_max": requests_max,
        "principal_objects_max": principal_objects_max,
        "objects_max": objects_max,
        "frame_timeout_s": frame_timeout,
        "idle_timeout_s": idle_timeout,
        "callback_term_s": callback_term,
        "store": store,
        "ceph_conf": ceph_conf,
        "ceph_keyring": ceph_keyring,
        "ceph_user": ceph_user,
        "ceph_host": ceph_host,
        "workers": workers,
    }
    if config is not None:
        cfg = NodeConfig.from_toml(
            config,
            data_dir=data,
            node_id=node_id or None,
            ready_file=ready_file,
            key_file=key_file,
            **runtime,
        )
    else:
        if data is None:
            raise typer.BadParameter(
                "--data DIR is required (or --config FILE)", param_hint="--data"
            )
        cfg = NodeConfig(
            data_dir=data,
            host=host,
            port=port,
            node_id=node_id,
            cache_bytes=cache_bytes,
            cache_block_bytes=cache_block_bytes,
            cpu_factor=cpu_factor,
            ready_file=ready_file,
            key_file=key_file,
            log_level=log_level,
            **{k: v for k, v in runtime.items() if v is not None},
        )
    run(cfg)
