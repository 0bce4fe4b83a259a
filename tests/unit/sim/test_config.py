"""Server and experiment configuration: the paper's defaults, TOML, flags, errors."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from shuttle.errors import ConfigError
from shuttle.sim.config import (
    ExperimentConfig,
    ServerConfig,
    from_mapping,
    load_tables,
    parse_overrides,
    to_dict,
)


def test_defaults_are_the_papers() -> None:
    config = ServerConfig()
    assert config.block_size_bytes == 8192
    assert config.mobile_blocks == 100  # 800 KB of 8 KB blocks
    assert config.disk_s(8192) == pytest.approx(0.008 + 8192 / 10e6)
    assert config.network_s(0) == pytest.approx(20e-6 + 128 * 8 / 100e6)
    assert config.cpu_cost_s(33_000) == pytest.approx(33_000 / 133e6)
    experiment = ExperimentConfig()
    assert (experiment.intervals, experiment.interval_s, experiment.warmup_s) == (6, 180, 10800)


def test_an_infinitely_fast_cpu_costs_nothing() -> None:
    assert ServerConfig(server_speed=math.inf).cpu_cost_s(199_000) == 0.0


def test_toml_tables_and_flag_overrides(tmp_path: Path) -> None:
    path = tmp_path / "sim.toml"
    path.write_text(
        "[server]\ncache_blocks = 1024\ndisk_seek_s = 0.01\n[experiment]\nintervals = 2\n"
    )
    tables = load_tables(path, ["server.cache_blocks=2048", "server.server_speed=inf"])
    server = from_mapping(ServerConfig, tables["server"], "[server]")
    experiment = from_mapping(ExperimentConfig, tables["experiment"], "[experiment]")
    assert server.cache_blocks == 2048  # the flag wins over the file
    assert server.disk_seek_s == 0.01
    assert math.isinf(server.server_speed)
    assert experiment.intervals == 2
    assert to_dict(server)["server_speed"] == "inf"


def test_an_integer_is_accepted_where_a_float_is_expected() -> None:
    assert from_mapping(ServerConfig, {"disk_seek_s": 0}, "[server]").disk_seek_s == 0.0


def test_unknown_parameters_are_named_with_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown parameter 'cache_size'.*cache_blocks"):
        from_mapping(ServerConfig, {"cache_size": 5}, "[server]")


def test_a_value_of_the_wrong_type_is_refused() -> None:
    with pytest.raises(ConfigError, match="'cache_blocks' must be a int"):
        from_mapping(ServerConfig, {"cache_blocks": "big"}, "[server]")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"cache_blocks": 0}, '"cache_blocks" must be > 0'),
        ({"disk_seek_s": -1.0}, '"disk_seek_s" must be >= 0'),
        ({"local_request_cpu_fraction": 2.0}, '"local_request_cpu_fraction" must be in'),
        ({"cache_blocks": 100}, "must exceed the mobile application's footprint"),
    ],
)
def test_bad_server_values_name_the_parameter(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        from_mapping(ServerConfig, changes, "[server]")


def test_the_timed_warm_up_cannot_exceed_the_warm_up() -> None:
    with pytest.raises(ConfigError, match='"warmup_timed_s"'):
        ExperimentConfig(warmup_s=10.0, warmup_timed_s=20.0)


def test_malformed_overrides_say_what_they_should_look_like() -> None:
    with pytest.raises(ConfigError, match=r"table\.key=value"):
        parse_overrides(["cache_blocks=5"])
    assert parse_overrides(["background.path=traces/x.csv"]) == {
        "background": {"path": "traces/x.csv"}
    }


def test_a_broken_config_file_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[server\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_tables(path)
    with pytest.raises(ConfigError, match="cannot read config"):
        load_tables(tmp_path / "missing.toml")
