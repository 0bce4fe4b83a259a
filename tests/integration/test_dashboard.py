"""``shuttle dashboard`` in a real headless browser (Debian's chromium, driven by
Playwright; no browser is downloaded): the page loads, shows the cluster's nodes, and
a grep object that moves from the client to a node shows up as a move, with its
reason, within a few seconds."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shuttle.client.connect import connect
from shuttle.cluster import local
from shuttle.cluster.clusterfile import ClusterFile

CHROMIUM = "/usr/bin/chromium"
#: Chromium as the brief asks: headless, no sandbox (root in a container), nothing
#: fetched in the background, a fresh profile (the temporary user-data-dir).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
#: How long a move may take to show on the page after the grep reported it: the page
#: polls every 0.5 s here; the rest is room for a loaded machine.
SHOWN_WITHIN_S = 10.0

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (make setup-dev)")
pytestmark = pytest.mark.skipif(
    shutil.which(CHROMIUM) is None, reason=f"no {CHROMIUM} (scripts/setup.sh --dev installs it)"
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("dashboard")
    made = local.up(root / "c", nodes=2)
    assert made.path is not None
    try:
        yield made.path
    finally:
        local.down(ClusterFile.load(made.path))


@pytest.fixture(scope="module")
def dashboard(cluster: Path) -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "shuttle", "dashboard", "--port", "0", "--interval", "0.5"],
        env={**os.environ, "SHUTTLE_CLUSTER": str(cluster)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("dashboard: http://127.0.0.1:"), line + proc.stderr.read()
        yield line.split()[1]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def page(dashboard: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            tab = context.new_page()
            tab.goto(dashboard)
            yield tab
        finally:
            context.close()


def test_the_page_shows_the_clusters_nodes(page: object, cluster: Path) -> None:
    tab: sync_api.Page = page  # type: ignore[assignment]
    for node in ("n1", "n2"):
        tab.wait_for_selector(f"#nodes tr[data-node='{node}']", timeout=15_000)
    text = tab.inner_text("#nodes")
    addresses = [n.address for n in ClusterFile.load(cluster).nodes]
    assert all(a in text for a in addresses)
    assert "connecting" not in tab.inner_text("#status")


def test_a_grep_moving_from_the_client_to_a_node_shows_as_a_move(
    page: object, cluster: Path, tmp_path: Path
) -> None:
    tab: sync_api.Page = page  # type: ignore[assignment]
    rng = random.Random(2)
    words = ["alpha", "beta", "gamma", "delta", "omega"]
    text = "".join(" ".join(rng.choices(words, k=8)) + "\n" for _ in range(200_000))
    with connect(cluster=cluster) as client:
        client.put("logs/words.txt", text.encode())
    report = tmp_path / "grep.json"
    # A slow link: the grep object at the client waits on every block, so moving it
    # next to the data pays after the first window and the run-time moves it.
    argv = [sys.executable, "-m", "shuttle", "grep", "--placement", "auto", "-c"]
    argv += ["--link", "bw=4Mbit,lat=1ms", "--json-out", str(report), "needle", "logs/words.txt"]
    grep = subprocess.run(
        argv,
        env={**os.environ, "SHUTTLE_CLUSTER": str(cluster)},
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert grep.returncode == 1, grep.stderr  # as grep: 1 when nothing matched
    moved = json.loads(report.read_text())["migrations"]
    assert moved and moved[0]["direction"] == "to_server", grep.stdout + grep.stderr
    rid, target = moved[0]["object"], moved[0]["to"]
    row = tab.wait_for_selector(f"#moves tr[data-object='{rid}']", timeout=SHOWN_WITHIN_S * 1000)
    assert row is not None
    cells = [c.inner_text() for c in row.query_selector_all("td")]
    assert cells[2].startswith("client ") and cells[3] == f"node {target}"
    assert "B_thresh" in cells[4]  # the reason the run-time gave
