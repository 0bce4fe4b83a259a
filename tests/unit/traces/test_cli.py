"""``shuttle trace ...`` and ``shuttle sim cache`` end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from shuttle.cli import app
from shuttle.traces import io
from shuttle.traces.record import Op

from .conftest import CLOUDPHYSICS_VSCSI, NFS_LAIR

runner = CliRunner()


def shuttle(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the real command in a child process (errors map to exit codes there)."""
    return subprocess.run(
        [sys.executable, "-m", "shuttle.cli", *args], capture_output=True, text=True, check=False
    )


def test_convert_and_info(tmp_path: Path) -> None:
    out = tmp_path / "lair.csv.gz"
    result = runner.invoke(app, ["trace", "convert", str(NFS_LAIR), str(out)])
    assert result.exit_code == 0, result.output
    records = list(io.read_csv(out))
    assert len(records) == 159
    summary = tmp_path / "info.json"
    result = runner.invoke(app, ["trace", "info", str(out), "--json-out", str(summary)])
    assert result.exit_code == 0, result.output
    assert "access" in result.output
    data = json.loads(summary.read_text())
    assert data["records"] == 159 and data["format"] == "csv"


def test_record_a_real_command(tmp_path: Path) -> None:
    target = tmp_path / "data.txt"
    target.write_text("hello\n" * 1000)
    out = tmp_path / "cat.csv"
    result = runner.invoke(
        app,
        ["trace", "record", "--under", str(tmp_path), "--out", str(out), "--", "cat", str(target)],
    )
    assert result.exit_code == 0, result.output
    records = list(io.read_csv(out))
    # GNU cat: open, fstat (getattr), read 6,000 bytes, read 0 (skipped), close.
    assert [r.op for r in records] == [Op.OPEN, Op.GETATTR, Op.READ, Op.CLOSE]
    assert records[2].size == 6000 and records[0].file == str(target)


def test_generate_background_writes_trace_and_sidecar(tmp_path: Path) -> None:
    out = tmp_path / "bg.csv"
    result = runner.invoke(app, ["trace", "generate-background", "--hours", "0.005", str(out)])
    assert result.exit_code == 0, result.output
    records = list(io.read_csv(out))
    assert records and records[-1].time < 18.0
    meta = json.loads((tmp_path / "bg.json").read_text())
    assert meta["records"] == len(records) and meta["config"]["clients"] == 236


def test_sim_cache_prints_and_writes_json(tmp_path: Path) -> None:
    head = tmp_path / "head.vscsi"
    head.write_bytes(CLOUDPHYSICS_VSCSI.read_bytes()[: 5000 * 32])
    out = tmp_path / "cache.json"
    result = runner.invoke(
        app,
        [
            "sim",
            "cache",
            str(head),
            "--size",
            "64",
            "--size",
            "1024",
            "-b",
            "4096",
            "--json-out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["sizes"]
    assert [r["shuttle"]["size_blocks"] for r in rows] == [64, 1024]
    assert rows[0]["shuttle"]["hits"] <= rows[1]["shuttle"]["hits"]


def test_malformed_trace_is_a_clear_error_with_exit_code_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("time,client,op,file,offset,size\n0,0,read,f,0,1\n1,0,peek,f,0,1\n")
    done = shuttle("trace", "info", str(bad))
    assert done.returncode == 2
    assert "trace_format" in done.stderr and ":3:" in done.stderr and "peek" in done.stderr


def test_unknown_policy_is_a_clear_error(tmp_path: Path) -> None:
    done = shuttle("sim", "cache", str(NFS_LAIR), "--size", "8", "--policy", "mru")
    assert done.returncode == 2
    assert "unknown cache policy 'mru'" in done.stderr
