"""``shuttle grep``, ``shuttle objects`` and ``shuttle placement log``: the run-time's
commands. Each takes ``--node``/``--cluster``/``--key-file`` like the client commands.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from shuttle.client.cli import ClusterOpt, KeyFileOpt, LinkOpt, NodeOpt, connect
from shuttle.errors import InvalidArgumentError, ShuttleError

if TYPE_CHECKING:
    from rich.console import Group

    from shuttle.client.client import Client

# The command tree is built from these signatures whenever ``shuttle`` starts: the
# run-time, the grep application and the built-in objects come in when a command runs
# (tests/unit/test_cli_start.py). So the defaults are written here, as their modules
# define them (the same test checks they agree):
#: ``shuttle.apps.grep.PLACEMENTS``
PLACEMENTS = ("client", "server", "osd", "auto")
#: ``shuttle.objects.lines.BLOCK_BYTES_DEFAULT``
BLOCK_BYTES_DEFAULT = 64 << 10
#: ``shuttle.objects.grep.BATCH_BYTES_DEFAULT``
BATCH_BYTES_DEFAULT = 256 << 10

console = Console()
err = Console(stderr=True)

placement_app = typer.Typer(
    help="The run-time's placement decisions (ABACUS's cost-benefit model).",
    no_args_is_help=True,
)


def grep(
    pattern: Annotated[str, typer.Argument(help="Regular expression (Python re syntax).")],
    keys: Annotated[
        list[str], typer.Argument(help="Object keys; a key ending in / means every key under it.")
    ],
    placement: Annotated[
        str,
        typer.Option(
            help="Where the grep objects run: client, server, osd (in the Ceph OSD that "
            "holds the bytes: nodes on --store rados:POOL, fixed strings), or auto (start "
            "at the client and let the run-time move them when that pays; on RADOS nodes "
            "a fixed string goes to the OSD when the model predicts it best)."
        ),
    ] = "auto",
    ignore_case: Annotated[bool, typer.Option("-i", "--ignore-case", help="Match either case.")] = (
        False
    ),
    count_only: Annotated[
        bool, typer.Option("-c", "--count", help="Print only the number of matching lines.")
    ] = False,
    json_path: Annotated[
        Path | None,
        typer.Option(
            "--json-out",
            help="Write a report: placements, elapsed seconds, matches, each migration.",
        ),
    ] = None,
    block_bytes: Annotated[
        int, typer.Option(help="Bytes per read from the storage object.")
    ] = BLOCK_BYTES_DEFAULT,
    batch_bytes: Annotated[
        int, typer.Option(help="Bytes the grep object reads per call from the console.")
    ] = BATCH_BYTES_DEFAULT,
    window: Annotated[
        float, typer.Option(help="The run-time's observation window H, seconds.")
    ] = 1.0,
    node: NodeOpt = None,
    cluster: ClusterOpt = None,
    key_file: KeyFileOpt = None,
    link: LinkOpt = None,
) -> None:
    """Search objects for PATTERN and print the matching lines as KEY:LINE:TEXT.

    A grep object per node reads that node's objects through its storage object;
    with --placement auto it starts at the client and the node's resource manager
    moves it next to the data when the saved transfer outweighs the cost. Exit
    status: 0 lines matched, 1 none, 2+ as the other commands.
    """
    from shuttle.apps.grep import ceph_sites, expand_keys, run_grep
    from shuttle.runtime.client import Runtime
    from shuttle.runtime.config import RuntimeConfig

    if placement not in PLACEMENTS:
        raise InvalidArgumentError(
            f"--placement must be one of {', '.join(PLACEMENTS)}, not {placement!r}"
        )
    with connect(node=node, cluster=cluster, link=link, key_file=key_file) as client:
        names = expand_keys(client, keys)
        nodes, key, principal, tls = client.nodes, client.key, client.principal, client.tls
        ceph = ceph_sites(client, names) if placement in ("osd", "auto") else {}
        sizes = None
        if any(ceph.values()):
            sizes = {
                k: (a.size if a is not None else 0)
                for k, a in zip(names, client.stat_many(names), strict=True)
            }
    out = sys.stdout.buffer

    def show(matches: list[list[Any]]) -> None:
        if count_only:
            return
        for k, lineno, line in matches:
            out.write(b"%s:%d:%s\n" % (k.encode(), lineno, line))
        out.flush()

    config = RuntimeConfig(window_s=window)
    with Runtime(nodes, key=key, principal=principal, config=config, tls=tls) as rt:
        result = run_grep(
            rt,
            pattern,
            names,
            placement=placement,
            ignore_case=ignore_case,
            block_bytes=block_bytes,
            batch_bytes=batch_bytes,
            on_matches=show,
            ceph=ceph,
            sizes=sizes,
        )
    if count_only:
        print(result.matches)
    for m in result.migrations:
        err.print(
            f"[dim]moved {m['object']} {m['from']} → {m['to']} at {m['t_s']:.2f} s: "
            f"{escape(str(m['reason']))}[/]",
            highlight=False,
        )
    if json_path is not None:
        json_path.write_text(json.dumps(result.to_json(), indent=2) + "\n")
        err.print(f"wrote {json_path}")
    if not result.matches:
        raise typer.Exit(1)


# --- shuttle objects -------------------------------------------------------------------


def _runtime_call(client: Client, node_id: str, op: str, args: dict[str, Any]) -> Any:
    from shuttle.runtime import values

    response = client.connection(client.node(node_id)).call(op, args)
    return values.unpack(response.payload)


def _gather(client: Client) -> dict[str, dict[str, Any]]:
    out = {}
    for n in client.nodes:
        try:
            out[n.node_id] = _runtime_call(client, n.node_id, "runtime.objects", {})
        except ShuttleError as exc:
            out[n.node_id] = {"error": str(exc)}
    return out


def _rate(count: float, span: float) -> float:
    return count / span if span > 0 else 0.0


def _kb(x: float) -> str:
    return f"{x / 1e3:,.1f}"


def _short(rid: str) -> str:
    home, _, local = rid.rpartition("/")
    return f"{home[:18]}/{local}"


def _tables(views: dict[str, dict[str, Any]], show_all: bool) -> Group:
    from rich.console import Group
    from rich.table import Table

    from shuttle.runtime.ids import ObjectId

    objects = Table(title="objects (rates over the last window H)", title_justify="left")
    for col in (
        "object",
        "type",
        "runs at",
        "state",
        "policy",
        "cpu %",
        "calls/s",
        "in KB/s",
        "out KB/s",
        "memory KB",
        "here for",
    ):
        objects.add_column(
            col,
            justify="right"
            if col[0].isdigit() or "/" in col or col in ("cpu %", "memory KB", "here for")
            else "left",
        )
    edges = Table(title="edges (caller → callee)", title_justify="left")
    for col in ("caller", "callee", "KB/s", "calls/s", "stall ms/call", "measured at"):
        edges.add_column(
            col, justify="left" if col in ("caller", "callee", "measured at") else "right"
        )
    seen_clients: set[str] = set()
    for node_id, view in views.items():
        if "error" in view:
            objects.add_row(f"[red]{node_id}: {escape(str(view['error']))}[/]", *[""] * 10)
            continue
        span = float(view.get("span_s", 0.0))
        window = view.get("window", {})
        for o in view.get("objects", []):
            if not show_all and ObjectId.parse(o["rid"]).is_anchored:
                continue
            w = window.get(o["rid"], {})
            objects.add_row(
                _short(o["rid"]),
                o["type"],
                node_id,
                o["state"],
                o["policy"],
                f"{100 * _rate(w.get('cpu_s', 0.0), span):.1f}",
                f"{_rate(w.get('calls', 0), span):.1f}",
                _kb(_rate(w.get("bytes_in", 0), span)),
                _kb(_rate(w.get("bytes_out", 0), span)),
                _kb(o["memory_bytes"]),
                f"{o['since_s']:.1f} s",
            )
        for e in view.get("edges", []):
            edges.add_row(
                _short(e["caller"]),
                _short(e["callee"]),
                _kb(_rate(e["bytes"], span)),
                f"{_rate(e['calls'], span):.1f}",
                f"{1e3 * e['stall_s'] / e['calls']:.2f}" if e["remote"] and e["calls"] else "-",
                node_id,
            )
        for client_id, digest in view.get("clients", {}).items():
            if client_id in seen_clients:
                continue
            seen_clients.add(client_id)
            cspan = float(digest.get("span_s", 0.0))
            for o in digest.get("objects", []):
                objects.add_row(
                    _short(o["rid"]),
                    o["type"],
                    f"client {client_id[:18]}",
                    "open",
                    "auto" if o.get("movable") else "static",
                    f"{100 * _rate(o['cpu_s'], cspan):.1f}",
                    f"{_rate(o['calls'], cspan):.1f}",
                    "",
                    "",
                    _kb(o["memory_bytes"]),
                    "",
                )
            for e in digest.get("edges", []):
                edges.add_row(
                    _short(e["caller"]),
                    _short(e["callee"]),
                    _kb(_rate(e["bytes"], cspan)),
                    f"{_rate(e['calls'], cspan):.1f}",
                    f"{1e3 * e['stall_s'] / e['calls']:.2f}" if e["remote"] and e["calls"] else "-",
                    f"client {client_id[:18]}",
                )
    return Group(objects, edges)


def _events(views: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    events: dict[tuple[Any, ...], dict[str, Any]] = {}
    for view in views.values():
        for e in view.get("events", []):
            # A migration is recorded at its source and at its target; show it once.
            events.setdefault((e["rid"], e["from"], e["to"], round(e["t"])), e)
    return sorted(events.values(), key=lambda e: e["t"])


def _event_line(e: dict[str, Any]) -> str:
    stamp = datetime.fromtimestamp(e["t"]).strftime("%H:%M:%S.%f")[:-3]
    status = "[green]moved[/]" if e["ok"] else "[red]failed to move[/]"
    detail = escape(str(e["error"] if not e["ok"] else e["reason"]))  # text, not markup
    return f"{stamp} {status} {_short(e['rid'])} {e['from']} → {e['to']}: {detail}"


def objects(
    watch: Annotated[
        bool, typer.Option("--watch", help="Keep the view live; print migrations as they happen.")
    ] = False,
    interval: Annotated[float, typer.Option(help="Seconds between refreshes with --watch.")] = 0.5,
    show_all: Annotated[
        bool, typer.Option("--all", help="Show the nodes' anchored storage objects too.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw views as JSON.")] = False,
    node: NodeOpt = None,
    cluster: ClusterOpt = None,
    key_file: KeyFileOpt = None,
) -> None:
    """List live mobile objects: where each runs, its measured costs, its edges, and
    recent migrations (objects at clients as their last digest reported them)."""
    with connect(node=node, cluster=cluster, key_file=key_file) as client:
        if as_json:
            print(json.dumps(_gather(client), indent=2, default=lambda b: b.hex()))
            return
        if not watch:
            views = _gather(client)
            console.print(_tables(views, show_all))
            for e in _events(views)[-10:]:
                console.print(_event_line(e), highlight=False)
            return
        from rich.live import Live

        shown: set[tuple[Any, ...]] = set()
        with Live(console=console, refresh_per_second=max(1, int(1 / interval))) as live:
            try:
                while True:
                    views = _gather(client)
                    for e in _events(views):
                        key = (e["rid"], e["from"], e["to"], round(e["t"]))
                        if key not in shown:
                            shown.add(key)
                            live.console.print(_event_line(e), highlight=False)
                    live.update(_tables(views, show_all))
                    time.sleep(interval)
            except KeyboardInterrupt:
                pass


# --- shuttle placement log -------------------------------------------------------------


def _record_lines(r: dict[str, Any]) -> list[str]:
    stamp = datetime.fromtimestamp(r["t"]).strftime("%H:%M:%S.%f")[:-3]
    loads = ", ".join(f"{n} L={v['load']:.2f} R={v['speed']:g}" for n, v in r["nodes"].items())
    lines = [
        f"[bold]{stamp} {r['node']}[/] #{r['seq']} (digest from {r['trigger'] or '-'}): {loads}"
    ]
    for s in r["stacks"]:
        sid = s["stack"]
        now = r["current"]["response_s"].get(sid, 0.0)
        best = r["best"]["response_s"].get(sid, 0.0)
        names = " → ".join(_short(o["rid"]) for o in s["objects"])
        lines.append(
            f"  stack {names}: split {s['split']} (T {now:.3f} s/window) → best split "
            f"{r['best']['splits'].get(sid)} (T {best:.3f} s/window)"
        )
    for m in r["moves"]:
        verdict = "[green]MOVE[/]" if m["execute"] else "[yellow]stay[/]"
        lines.append(
            f"  {verdict} {', '.join(_short(o) for o in m['objects'])} {m['direction']}: "
            f"benefit {m['benefit_s']:.3f} s − cost {m['cost_s']:.3f} s = {m['net_s']:.3f} s; "
            f"{m['reason']}"
        )
    if not r["moves"]:
        lines.append("  no change")
    if r.get("pinned"):
        lines.append(f"  pinned (moved recently): {', '.join(_short(p) for p in r['pinned'])}")
    return lines


@placement_app.command("log")
def placement_log(
    limit: Annotated[int, typer.Option(help="Records per node (the most recent).")] = 20,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new records.")] = (
        False
    ),
    changes_only: Annotated[
        bool, typer.Option("--changes", help="Only evaluations that proposed a move.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines, as the nodes keep them.")] = (
        False
    ),
    node: NodeOpt = None,
    cluster: ClusterOpt = None,
    key_file: KeyFileOpt = None,
) -> None:
    """Show the placement decision log: each evaluation's inputs (loads, stacks), the
    predicted response times, and every move considered with its benefit, cost and
    verdict. Nodes also append it to DATA/.shuttle/runtime/placement.jsonl."""
    with connect(node=node, cluster=cluster, key_file=key_file) as client:
        last = {n.node_id: 0 for n in client.nodes}
        first = True
        while True:
            records: list[dict[str, Any]] = []
            for n in client.nodes:
                try:
                    got = _runtime_call(
                        client,
                        n.node_id,
                        "runtime.log",
                        {"since": last[n.node_id], "limit": limit if first else 10_000},
                    )
                except ShuttleError as exc:
                    err.print(f"[red]{n.node_id}: {escape(str(exc))}[/]")
                    continue
                if got:
                    last[n.node_id] = got[-1]["seq"]
                records += got
            first = False
            for r in sorted(records, key=lambda r: r["t"]):
                if changes_only and not r["moves"]:
                    continue
                if as_json:
                    print(json.dumps(r), flush=True)
                else:
                    for line in _record_lines(r):
                        console.print(line, highlight=False)
            if not follow:
                return
            time.sleep(0.5)


# --- shuttle dashboard ------------------------------------------------------------------

#: The dashboard's default port (any free port with --port 0).
DASHBOARD_PORT_DEFAULT = 8470


def dashboard(
    port: Annotated[
        int, typer.Option(help="Port of the page (0: any free port; the URL is printed).")
    ] = DASHBOARD_PORT_DEFAULT,
    host: Annotated[
        str,
        typer.Option(
            help="Address to listen on. The page has no login: anyone who reaches it sees "
            "the cluster's objects, so keep it on loopback unless the network is yours."
        ),
    ] = "127.0.0.1",
    interval: Annotated[
        float, typer.Option(min=0.25, help="Seconds between the page's refreshes.")
    ] = 1.0,
    node: NodeOpt = None,
    cluster: ClusterOpt = None,
    key_file: KeyFileOpt = None,
) -> None:
    """Serve a live web page of the cluster: its nodes (load, bytes in and out,
    capacity), each mobile object and where it runs, the edges between objects with
    their bytes and stall, and recent moves with their reasons. Ctrl-C stops it."""
    import signal

    from shuttle.apps.dashboard import Gatherer, make_server

    with connect(node=node, cluster=cluster, key_file=key_file) as client:
        server = make_server(Gatherer(client, poll_s=interval), host, port)
        bound_host, bound_port = str(server.server_address[0]), int(server.server_address[1])
        console.print(
            f"dashboard: http://{bound_host}:{bound_port}/ ({len(client.nodes)} node(s); "
            "Ctrl-C stops it)",
            highlight=False,
            soft_wrap=True,
        )
        sys.stdout.flush()

        def stop(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, stop)
        try:
            server.serve_forever(poll_interval=0.25)
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()


COMMANDS: tuple[Any, ...] = (grep, objects, dashboard)
