"""A short smoke run of ``shuttle bench speculate``: every case, slowdown and method
runs end to end (each result checked against the last write by the benchmark itself)
and the report and the plot appear. Figures are measured, never asserted here."""

from __future__ import annotations

import json
from pathlib import Path

from tests.integration.nodeproc import shuttle_cli


def test_speculate_smoke_writes_the_report_and_the_plot(tmp_path: Path) -> None:
    out, png = tmp_path / "speculate.json", tmp_path / "speculate.png"
    result = shuttle_cli(
        "bench",
        "speculate",
        "--iterations",
        "3",
        "--slowdowns",
        "1,4",
        "--cases",
        "10:0,10:0.5",
        "--json-out",
        str(out),
        "--plot",
        str(png),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr.decode()
    report = json.loads(out.read_text())
    assert [c["label"] for c in report["cases"]] == ["10ms p=0", "10ms p=0.5"]
    for case in report["cases"]:
        assert [pt["slowdown"] for pt in case["points"]] == [1, 4]
        for point in case["points"]:
            assert set(point["methods"]) == {"normal", "thread", "fork", "auto"}
            for figures in point["methods"].values():
                assert figures["total_s"] > 0 and figures["stale_reads"] <= 3
    fork = report["cases"][0]["points"][0]["methods"]["fork"]
    assert fork["speculated"]["fork"] == 3 and fork["confirmed"] == 3
    summary = report["summary"]
    assert isinstance(summary["target_speculation_beats_normal_at_lan_p0"], bool)
    assert "auto_over_better_total_worst" in summary
    assert png.stat().st_size > 10_000
    assert report["paper"]["normal_over_speculative_reads_at_32x"] == 3.0


def test_speculate_rejects_a_bad_case() -> None:
    result = shuttle_cli("bench", "speculate", "--cases", "30ms", timeout=60)
    assert result.returncode != 0
    assert b"LOCAL_MS:P" in result.stderr + result.stdout
