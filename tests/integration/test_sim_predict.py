"""``shuttle trace record-object``, ``shuttle sim calibrate`` and ``shuttle sim predict``
against a real node process (short runs: the figures' accuracy is a benchmark's
business, benchmarks/README.md; here every command runs end to end and says what it
measured)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shuttle.bench.corpus import CorpusSpec, generate_corpus
from shuttle.cli import app
from shuttle.client.connect import connect
from shuttle.cluster import local
from shuttle.sim.config import ServerConfig
from shuttle.sim.sources import load_trace_file
from shuttle.sim.workload import BLOCK_READ, CALL, RETURN
from shuttle.traces.objtrace import read_sidecar

CORPUS = CorpusSpec(files=30, median_bytes=4096, sigma=1.5, seed=11)
runner = CliRunner()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("simpredict")
    made = local.up(root, nodes=1)
    assert made.path is not None
    try:
        with connect(cluster=made.path) as client:
            for key, data in generate_corpus(CORPUS):
                client.put(key, data)
        yield made.path
    finally:
        local.down(made)


@pytest.fixture(scope="module")
def corpus_bytes() -> int:
    return sum(len(d) for _, d in generate_corpus(CORPUS))


def shuttle(*args: str) -> str:
    result = runner.invoke(app, list(args), env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output


def test_record_object_writes_every_read_and_console_call(
    cluster: Path, corpus_bytes: int, tmp_path: Path
) -> None:
    out = tmp_path / "grep.csv.gz"
    shuttle("trace", "record-object", "grep", "ab[cd]", "corpus/", "--out", str(out),
            "--cluster", str(cluster))  # fmt: skip
    trace = load_trace_file(out)
    kinds = trace.kind.tolist()
    reads = [s for k, s in zip(kinds, trace.size.tolist(), strict=True) if k == BLOCK_READ]
    assert sum(reads) == corpus_bytes
    assert len(reads) >= CORPUS.files  # every file read to its end
    # create, the next() calls, progress: each a call and its answer
    assert kinds.count(CALL) == kinds.count(RETURN) >= 3
    assert kinds[0] == CALL and kinds[-1] == RETURN
    assert float(trace.time_s[-1]) > 0.0  # the thread's CPU between calls
    side = read_sidecar(out)
    assert side["object"] == "grep" and side["params"]["pattern"] == "ab[cd]"
    assert side["bytes_read"] == corpus_bytes and side["host"]["cpu_mhz"] > 0
    assert side["stacks"][0]["keys"] == CORPUS.files


def test_record_object_count_and_filter(cluster: Path, tmp_path: Path) -> None:
    count = tmp_path / "count.csv"
    shuttle("trace", "record-object", "count", "corpus/", "--pattern", "ab", "--out", str(count),
            "--cluster", str(cluster))  # fmt: skip
    assert read_sidecar(count)["object"] == "count"
    filtered = tmp_path / "filter.csv"
    shuttle("trace", "record-object", "filter", "corpus/00.txt", "--block-bytes", "1024",
            "--pass-fraction", "0.5", "--out", str(filtered),
            "--cluster", str(cluster))  # fmt: skip
    trace = load_trace_file(filtered)
    answers = [s for k, s in zip(trace.kind.tolist(), trace.size.tolist(), strict=True)
               if k == RETURN]  # fmt: skip
    assert answers[1] == 512  # half of each 1 KiB block, raw
    bad = runner.invoke(app, ["trace", "record-object", "filter", "corpus/00.txt", "corpus/01.txt",
                              "--out", str(filtered), "--cluster", str(cluster)])  # fmt: skip
    assert bad.exit_code != 0 and "filter reads one object" in str(bad.exception)


def test_calibrate_then_predict_with_live_runs(cluster: Path, tmp_path: Path) -> None:
    config_path = tmp_path / "cal.toml"
    measured = tmp_path / "cal.json"
    output = shuttle("sim", "calibrate", "--cluster", str(cluster), "--out", str(config_path),
                     "--calls", "10", "--json-out", str(measured), "--link", "lan",
                     "--no-disk")  # fmt: skip
    assert "node CPU per read request" in output
    cal = json.loads(measured.read_text())
    assert cal["measured"]["read_node_cpu_per_request_s"] > 0
    assert cal["link"]["name"] == "lan" and "link rate achieved" in output
    # The per-call cost: the calibration's small reads in 2 fresh processes (a quick
    # calibration), each with its console calls to a grep at the node.
    fresh = cal["measured"]["fresh_reads"]
    assert (fresh["source"], fresh["processes"], fresh["spots"]) == ("calibration", 2, 11)
    assert cal["measured"]["rpc_overhead_s"] == fresh["residual_s"]
    calls = cal["measured"]["fresh_calls"]
    assert len(calls["per_process"]) == 2
    # The dial as shuttle grep's timer holds it: the first making less the second.
    assert cal["measured"]["connect_s"] == calls["connect_s"] > 0
    assert all(p["made_s"] > p["create_s"] for p in calls["per_process"])
    assert cal["server"]["call_overhead_s"] >= 0.0 and "connecting" in output
    # The model's link is the rate the live shaper achieved: at most the profile's.
    achieved = cal["measured"]["link_bandwidth_bits_per_s"]
    assert 0.2 * 10e6 <= achieved <= 10e6
    assert cal["server"]["network_bandwidth_bits_per_s"] == achieved
    from shuttle.bench.predict import load_calibration

    config = load_calibration(config_path)
    assert isinstance(config, ServerConfig) and config.request_cycles > 0

    report = tmp_path / "predict.json"
    output = shuttle("sim", "predict", "grep", "ab[cd]", "corpus/", "--cluster", str(cluster),
                     "--link", "lan", "--calibration", str(config_path), "--live", "--runs", "1",
                     "--runs-max", "1", "--json-out", str(report))  # fmt: skip
    assert "break-even link bandwidth" in output and "simulator error" in output
    data = json.loads(report.read_text())
    assert data["predicted"]["faster"] in ("client", "server")
    assert data["predicted"]["client_s"] > 0 and data["predicted"]["server_s"] > 0
    assert data["live"]["client_s"] > 0 and data["live"]["server_s"] > 0
    assert set(data["error"]) >= {"client", "server"}
    assert data["runtime_model"]["faster"] in ("client", "server")
    assert data["trace"]["keys"] == CORPUS.files
    # Both sides of the server placement's timer: the live run's and the model's.
    live, model = data["live"]["phases"]["server"], data["predicted"]["phases"]["server"]
    assert live["calls"] == model["calls"] >= 2
    assert live["made_s"] > 0 and model["made_s"] > 0


def test_live_runs_refuse_a_cpu_factor_the_nodes_do_not_have(cluster: Path) -> None:
    result = runner.invoke(app, ["sim", "predict", "grep", "x", "corpus/", "--cluster",
                                 str(cluster), "--cpu-factor", "0.5", "--live"])  # fmt: skip
    assert result.exit_code != 0
    message = str(result.exception)
    assert "runs at CPU factor 1" in message and "--cpu-factor 0.5" in message


def test_the_validation_command_runs_a_row_per_speed_and_link(tmp_path: Path) -> None:
    """``shuttle bench sim-predict`` at its smallest (the long run: ``make sim-validate``):
    a node started at the row's CPU factor, the generated corpus, both models' tables."""
    report, table = tmp_path / "v.json", tmp_path / "v.md"
    output = shuttle("bench", "sim-predict", "--links", "san", "--speeds", "0.5", "--runs", "1",
                     "--runs-max", "2", "--files", "12", "--calls", "5", "--quiet-wait", "0",
                     "--json-out", str(report), "--markdown", str(table))  # fmt: skip
    data = json.loads(report.read_text())
    (row,) = data["rows"]
    assert (row["link"], row["speed"], row["files"]) == ("san", 0.5, 12)
    assert row["calibration"]["n1"]["node_cpu_factor"] == 0.5
    # The per-call cost was timed on the recorded grep's own reads: a spot a read.
    fresh = row["calibration"]["n1"]["measured"]["fresh_reads"]
    assert fresh["source"] == "program" and fresh["spots"] == row["trace"]["storage_calls"]
    assert row["live"]["client_s"] > 0 and row["predicted"]["server_s"] > 0
    assert data["corpus"]["files"] == 12 and data["summary"]["simulator"]["predictions"] == 2
    text = table.read_text()
    assert "**The simulator" in text and "**The run-time's placement model" in text
    assert "**The server placement's timer" in text
    # The program's grep drained at the node: its work there, measured.
    measured = row["calibration"]["n1"]["measured"]
    assert measured["program_work_node_cpu_s"] > 0 and measured["program_think_s"] > 0
    assert text.count("| san | 0.5 |") == 3  # both models, and the timer's phases
    # A median of fewer than 3 runs is never stable: 2 runs of each (--runs-max), a
    # drain at the node after each server run, the prediction made again with them.
    live = row["live"]
    assert len(live["runs"]["client_s"]) == len(live["runs"]["server_s"]) == 2
    assert measured["drains_between"] == 2 and len(measured["fresh_calls"]["per_process"]) == 4
    assert row["predicted_before_live"]["server_s"] > 0 and "server" in row["error_before_live"]
    assert "simulator: worst error" in output and "runtime_model: worst error" in output
