"""``shuttle bench abacus mix``'s settings: the placements a run makes (the partial
splits among them), where each client's filters start, and the refusals."""

from __future__ import annotations

import pytest

from shuttle.bench.mix_clients import at_node
from shuttle.bench.mix_report import ceiling
from shuttle.bench.mix_settings import MixSettings, parse_partial, parse_partial_heavy
from shuttle.errors import ConfigError


def test_the_partial_splits_run_between_the_split_and_adaptive() -> None:
    assert MixSettings().placements() == ("client", "server", "split", "adaptive")
    settings = MixSettings(clients=16, partial=(4, 12))
    assert settings.placements() == (
        "client",
        "server",
        "split",
        "split-4",
        "split-12",
        "adaptive",
    )
    assert MixSettings(split=False, partial=(4,)).placements() == (
        "client",
        "server",
        "split-4",
        "adaptive",
    )


def test_a_partial_split_puts_the_first_k_clients_cheap_filters_at_the_node() -> None:
    placed = [i for i in range(16) if at_node("split-4", "cheap", i)]
    assert placed == [0, 1, 2, 3]
    assert not any(at_node("split-4", "heavy", i) for i in range(16))
    assert all(at_node("split", "cheap", i) and not at_node("split", "heavy", i) for i in range(3))
    assert all(at_node("server", k, 5) for k in ("cheap", "heavy"))
    assert not any(at_node(p, "cheap", 0) for p in ("client", "adaptive"))


def test_a_partial_split_with_heavy_filters_puts_the_first_j_heavy_ones_there_too() -> None:
    # Whether any placement beats the cheap-only splits when the clients' core is the
    # bound (benchmarks/README.md, "Placement for aggregate throughput").
    settings = MixSettings(clients=16, split=False, partial=(8,), partial_heavy=((8, 2), (0, 3)))
    assert settings.placements() == (
        "client",
        "server",
        "split-8",
        "split-8+h2",
        "split-0+h3",
        "adaptive",
    )
    assert [i for i in range(16) if at_node("split-8+h2", "cheap", i)] == list(range(8))
    assert [i for i in range(16) if at_node("split-8+h2", "heavy", i)] == [0, 1]
    assert [i for i in range(16) if at_node("split-0+h3", "heavy", i)] == [0, 1, 2]
    assert not any(at_node("split-0+h3", "cheap", i) for i in range(16))
    assert parse_partial_heavy("32:2, 32:4") == ((32, 2), (32, 4))
    with pytest.raises(ConfigError, match=r"takes K:J pairs.*'32' is not one"):
        parse_partial_heavy("32")
    with pytest.raises(ConfigError, match=r"K must be 0\.\.16 and J 1\.\.15"):
        MixSettings(clients=16, partial_heavy=((8, 0),)).check()
    with pytest.raises(ConfigError, match="lists a K:J twice"):
        MixSettings(clients=16, partial_heavy=((8, 1), (8, 1))).check()


def test_partial_splits_that_are_not_partial_are_refused_saying_why() -> None:
    assert parse_partial("4, 8,12") == (4, 8, 12)
    assert parse_partial("") == ()
    with pytest.raises(ConfigError, match="'x' is not a whole number"):
        parse_partial("4,x")
    for bad in ((0,), (16,)):
        with pytest.raises(ConfigError, match=r"K must be 1\.\.15"):
            MixSettings(clients=16, partial=bad).check()
    with pytest.raises(ConfigError, match="lists a K twice"):
        MixSettings(clients=16, partial=(4, 4)).check()


def test_the_ceiling_is_the_best_split_of_each_run() -> None:
    rates = {
        "client": [70.0, 30.0],
        "server": [20.0, 10.0],
        "split": [77.0, 25.0],
        "split-8": [84.0, 33.0],
        "adaptive": [80.0, 36.0],
    }
    got = ceiling(rates, ["split", "split-8"], 2)
    assert got["placement_per_run"] == ["split-8", "split-8"]
    assert got["calls_per_s_per_run"] == [84.0, 33.0]
    assert got["over_better_static_per_run"] == [1.2, 1.1]
    assert got["adaptive_over_ceiling_per_run"] == [round(80 / 84, 3), round(36 / 33, 3)]
    rates["split"] = [90.0, 20.0]
    assert ceiling(rates, ["split", "split-8"], 2)["placement_per_run"] == ["split", "split-8"]


def test_a_negative_limit_on_arrivals_is_refused() -> None:
    with pytest.raises(ConfigError, match="--arrivals-max must be ≥ 0"):
        MixSettings(arrivals_max=-1).check()
    MixSettings(arrivals_max=0).check()  # no limit


def test_a_cpu_budget_outside_a_share_is_refused() -> None:
    for bad in (0.0, 1.5, -0.2):
        with pytest.raises(ConfigError, match=r"--cpu-budget must be in \(0, 1\]"):
            MixSettings(cpu_budget=bad).check()
    MixSettings(cpu_budget=0.85).check()


def test_the_nodes_note_on_their_arrivals_is_read_back_from_the_decision_log() -> None:
    # The note the many-clients rule writes (16 cheap filters, an idle node: 8 sent,
    # 8 held back) is what the benchmark sums per adaptive pass.
    from shuttle.bench.mix_decisions import QUEUE_NOTE
    from shuttle.runtime.placement import PlacementConfig, choose
    from tests.unit.runtime.test_placement_many import mix

    stacks, nodes = mix(16)
    plan = choose(stacks, nodes, PlacementConfig())
    found = [m for m in map(QUEUE_NOTE.search, plan.notes) if m]
    assert len(found) == 1 and found[0].groups() == ("0.0000", "0", "8")


def test_each_per_run_ratio_is_reported_with_its_spread_across_the_runs() -> None:
    from shuttle.bench.mix_report import spread

    report = {
        "adaptive_over_better_static_per_run": [1.0, 1.2, 1.1],
        "ceiling": {
            "over_better_static_per_run": [1.1, 1.1, 1.1],
            "adaptive_over_ceiling_per_run": [0.9, 1.05, 1.0],
        },
    }
    got = spread(report)
    ours = got["adaptive_over_better_static"]
    assert (ours["mean"], ours["min"], ours["max"]) == (1.1, 1.0, 1.2)
    assert ours["ci90"] == pytest.approx(0.169, abs=1e-3)  # t(2) 2.92 x 0.1 / sqrt 3
    assert got["best_split_over_better_static"]["ci90"] == 0.0
    assert got["adaptive_over_best_split"]["runs"] == [0.9, 1.05, 1.0]
    # A run without splits has no ceiling to spread.
    assert set(spread({"adaptive_over_better_static_per_run": [1.0]})) == {
        "adaptive_over_better_static"
    }
