"""The sweeps end to end on small synthetic traces: results, determinism, CLI, plots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shuttle.cli import app
from shuttle.errors import ConfigError
from shuttle.sim.config import ExperimentConfig, ServerConfig
from shuttle.sim.sweep import cache_size_sweep, cpu_speed_sweep, prepare, run_sweep
from shuttle.sim.workload import Columns
from shuttle.traces.io import write_csv

from .synthetic import background, search

EXPERIMENT = ExperimentConfig(
    intervals=2, interval_s=60.0, warmup_s=300.0, warmup_timed_s=20.0, overrun_s_max=120.0
)
BACKGROUND_RECORDS = background(duration_s=600.0, rate_per_s=120.0, seed=9)
MOBILE_RECORDS = search(files=30, blocks_per_file=5)
PREPARED = prepare(
    Columns.from_records(BACKGROUND_RECORDS),
    Columns.from_records(MOBILE_RECORDS),
    EXPERIMENT,
    8192,
)


def test_the_cache_size_sweep_reports_every_point_and_placement() -> None:
    sweep = cache_size_sweep([1.0, 4.0, float("inf")])
    doc, perf = run_sweep(sweep, ServerConfig(), EXPERIMENT, PREPARED)
    assert [p["x"] for p in doc["points"]] == ["1", "4", "inf"]
    assert [p["cache_blocks"] for p in doc["points"]] == [128, 512, None]
    assert perf.runs == 3 * 2 * 2 == len(doc["runs"])
    hit = [p["placements"]["client"]["background_hit_rate"] for p in doc["points"]]
    assert hit[0] < hit[1] < hit[2]  # a larger cache serves the background better
    for point in doc["points"]:
        for summary in point["placements"].values():
            assert summary["mobile_unfinished_runs"] == 0
            assert summary["mobile_server_hit_rate"] == 0.0  # one pass over its files
    assert perf.records > 0 and perf.records_per_s > 0


def test_the_cpu_speed_sweep_slows_the_mobile_program_on_a_slow_server() -> None:
    sweep = cpu_speed_sweep([0.5, 2.0])
    doc, _ = run_sweep(sweep, ServerConfig(cache_blocks=512), EXPERIMENT, PREPARED)
    slow, fast = (p["placements"]["server"]["mobile_run_time_s"] for p in doc["points"])
    assert slow > fast
    assert doc["points"][0]["server_speed"] == 0.5


def test_same_seed_same_bytes_whatever_the_number_of_workers() -> None:
    sweep = cache_size_sweep([2.0, 8.0])
    one, _ = run_sweep(sweep, ServerConfig(), EXPERIMENT, PREPARED, jobs=1)
    again, _ = run_sweep(sweep, ServerConfig(), EXPERIMENT, PREPARED, jobs=1)
    two, _ = run_sweep(sweep, ServerConfig(), EXPERIMENT, PREPARED, jobs=2)
    assert json.dumps(one) == json.dumps(again) == json.dumps(two)


def test_a_cache_smaller_than_the_mobile_program_is_refused() -> None:
    with pytest.raises(ConfigError, match="cannot hold the mobile program"):
        run_sweep(cache_size_sweep([0.5]), ServerConfig(), EXPERIMENT, PREPARED)


def test_the_command_states_its_configuration_and_writes_json_and_figures(
    tmp_path: Path,
) -> None:
    write_csv(tmp_path / "bg.csv", BACKGROUND_RECORDS)
    write_csv(tmp_path / "app.csv", MOBILE_RECORDS)
    config = tmp_path / "sim.toml"
    config.write_text(
        "[experiment]\nintervals = 1\ninterval_s = 60.0\nwarmup_s = 300.0\n"
        "warmup_timed_s = 20.0\n[sweep]\npoints = [1, 16]\n"
    )
    out = tmp_path / "out"
    args = ["sim", "sweep", "cache-size", "--config", str(config), "--jobs", "1"]
    args += ["--background", str(tmp_path / "bg.csv"), "--mobile", str(tmp_path / "app.csv")]
    args += ["--out", str(out), "--set", "server.client_cache_blocks=64"]
    args += ["--prep-cache", str(tmp_path / "prepared")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "1 busiest intervals of 60 s" in result.output
    assert "prepared intervals from" not in result.output
    first = (out / "cache-size.json").read_text()
    # A second sweep over the same background reuses the prepared intervals.
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    assert "prepared intervals from" in again.output
    assert (out / "cache-size.json").read_text() == first
    doc = json.loads((out / "cache-size.json").read_text())
    assert doc["config"]["server"]["client_cache_blocks"] == 64
    assert doc["config"]["background"]["records"] == len(BACKGROUND_RECORDS)
    assert json.loads((out / "cache-size-perf.json").read_text())["runs"] == 4
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == [
        "cache-size-breakdown.png",
        "cache-size-hit-rate.png",
        "cache-size-response-all.png",
        "cache-size-response-blocks.png",
        "cache-size-run-time.png",
    ]
    assert all((out / name).read_bytes()[:4] == b"\x89PNG" for name in pngs)


def test_the_command_rejects_an_unknown_sweep() -> None:
    result = CliRunner().invoke(app, ["sim", "sweep", "memory"])
    assert result.exit_code != 0
    assert isinstance(result.exception, ConfigError)


def test_think_times_are_scaled_from_the_machine_that_recorded_them(tmp_path: Path) -> None:
    """A 266 MHz recording is twice the 133 MHz reference: its gaps double there."""
    write_csv(tmp_path / "bg.csv", BACKGROUND_RECORDS)
    write_csv(tmp_path / "app.csv", MOBILE_RECORDS)
    (tmp_path / "app.json").write_text('{"host": {"cpu_mhz": 266.0}}')
    out = tmp_path / "out"
    args = ["sim", "sweep", "cpu-speed", "--points", "1", "--jobs", "1", "--no-plots"]
    args += ["--background", str(tmp_path / "bg.csv"), "--mobile", str(tmp_path / "app.csv")]
    args += ["--out", str(out), "--no-prep-cache", "--intervals", "1"]
    args += ["--set", "experiment.warmup_s=300", "--set", "experiment.interval_s=60"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "cpu-speed.json").read_text())
    assert doc["config"]["server"]["mobile_trace_speed"] == pytest.approx(2.0)
    assert doc["config"]["mobile"]["recording_cpu_mhz"] == 266.0
    explicit = CliRunner().invoke(app, [*args, "--set", "server.mobile_trace_speed=1.0"])
    assert explicit.exit_code == 0, explicit.output
    doc = json.loads((out / "cpu-speed.json").read_text())
    assert doc["config"]["server"]["mobile_trace_speed"] == 1.0


def _small_sweep_args(tmp_path: Path) -> list[str]:
    write_csv(tmp_path / "bg.csv", BACKGROUND_RECORDS)
    write_csv(tmp_path / "app.csv", MOBILE_RECORDS)
    args = ["sim", "sweep", "cpu-speed", "--points", "1", "--jobs", "1", "--no-plots"]
    args += ["--background", str(tmp_path / "bg.csv"), "--mobile", str(tmp_path / "app.csv")]
    args += ["--out", str(tmp_path / "out"), "--no-prep-cache", "--intervals", "1"]
    return [*args, "--set", "experiment.warmup_s=300", "--set", "experiment.interval_s=60"]


def test_named_flags_override_the_config_file(tmp_path: Path) -> None:
    """docs/simulator.md: file, then --set, then the named flags."""
    config = tmp_path / "sim.toml"
    config.write_text('[sweep]\nplacements = ["client", "server"]\npoints = [2]\n')
    args = [*_small_sweep_args(tmp_path), "--config", str(config), "--placements", "none"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "out" / "cpu-speed.json").read_text())
    assert doc["placements"] == ["none"]
    assert [p["x"] for p in doc["points"]] == ["1"]  # --points 1 over points = [2]
    # Without the flags the file's values hold.
    args = [a for a in args if a not in ("--placements", "none")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "out" / "cpu-speed.json").read_text())
    assert doc["placements"] == ["client", "server"]


def test_a_mobile_trace_without_its_speed_warns_and_takes_the_ratio_as_an_option(
    tmp_path: Path,
) -> None:
    args = _small_sweep_args(tmp_path)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "no sidecar" in " ".join(result.output.split())
    doc = json.loads((tmp_path / "out" / "cpu-speed.json").read_text())
    assert doc["config"]["server"]["mobile_trace_speed"] == 1.0
    assert doc["config"]["mobile"]["name"] == "app"
    flagged = CliRunner().invoke(app, [*args, "--mobile-trace-speed", "19.5"])
    assert flagged.exit_code == 0, flagged.output
    assert "no sidecar" not in " ".join(flagged.output.split())
    doc = json.loads((tmp_path / "out" / "cpu-speed.json").read_text())
    assert doc["config"]["server"]["mobile_trace_speed"] == 19.5
    assert doc["config"]["mobile"]["trace_speed_from"] == "configuration"


def test_plots_name_the_mobile_program(tmp_path: Path) -> None:
    import matplotlib.figure

    from shuttle.sim.plots import plot_sweep

    doc, _ = run_sweep(cpu_speed_sweep([1.0]), ServerConfig(), EXPERIMENT, PREPARED)
    doc["config"]["mobile"] = {"name": "grep"}
    titles: list[str] = []

    save = matplotlib.figure.Figure.savefig

    def spy(fig: matplotlib.figure.Figure, *a: object, **k: object) -> None:
        for ax in fig.axes:
            titles.append(ax.get_title())
            if ax.get_legend() is not None:
                titles.extend(t.get_text() for t in ax.get_legend().get_texts())
        save(fig, *a, **k)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(matplotlib.figure.Figure, "savefig", spy)
        plot_sweep(doc, tmp_path)
    assert any("grep/Server" in t for t in titles)
    assert any(t.startswith("(paper Fig. 6) grep run time") for t in titles)
    assert not any("agrep" in t for t in titles)


#: The sweeps' points and runs on the synthetic traces above, as the paper's model gave
#: them before issue 24 added the live system's parameters (computed on main at
#: 73794c5). Every new parameter's default must leave the paper's model as it was: a
#: default that changes any figure of any run changes these digests.
PAPER_MODEL_DIGESTS = {
    "cache-size": (
        "121393f1218122a7feec6e684603152966c22735a3782a302351d2ab1f9a45f8",
        "097350ac030b623c02b5e87a53be59973387a982eeb76ea62a446e9211072f71",
    ),
    "cpu-speed": (
        "24a9619b6cde2eaacb132a3686e4b6bb9c4325a3aed1150f6aafe351f375acbc",
        "bbc6a68353919ee39ebfe43fc65820922293f2416001287190bb25223addfcbb",
    ),
}


def _digest(value: object) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def test_the_papers_model_gives_the_same_figures_with_the_new_parameters_at_their_defaults() -> (
    None
):
    sweeps = {
        "cache-size": (cache_size_sweep([1.0, 4.0, float("inf")]), ServerConfig()),
        "cpu-speed": (cpu_speed_sweep([0.5, 1.0, 2.0]), ServerConfig(cache_blocks=512)),
    }
    for name, (sweep, server) in sweeps.items():
        doc, _ = run_sweep(sweep, server, EXPERIMENT, PREPARED, jobs=1)
        assert (_digest(doc["points"]), _digest(doc["runs"])) == PAPER_MODEL_DIGESTS[name], name
