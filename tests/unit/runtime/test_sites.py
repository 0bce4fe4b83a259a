"""The three-site model (client, node, OSD) against hand-worked numbers, against the
two-site model it extends, and by properties (hypothesis)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shuttle.errors import ConfigError
from shuttle.runtime.placement import (
    EdgeView,
    NodeView,
    ObjectView,
    PlacementConfig,
    StackView,
    predict_single,
)
from shuttle.runtime.placement import response_time_s as two_site_response_s
from shuttle.runtime.sites import (
    CLIENT,
    NODE,
    OSD,
    SITES,
    FilterView,
    LinkView,
    SiteView,
    choose_site,
    feasible_sites,
    move_cost_s,
    network_s,
    predict_sites,
    response_time_s,
    site_load,
)

MB16 = 16e6
LINK_10MBIT = LinkView(10e6 / 8, 0.0005)
LOOPBACK = LinkView(None, 0.0)
CONFIG = PlacementConfig(window_s=1.0, threshold_fraction=0.3)


def idle_sites(*, osd_load: float = 0.0, osd_speed: float = 1.0) -> list[SiteView]:
    return [SiteView("client"), SiteView("node"), SiteView("osd", osd_speed, osd_load)]


def selective_grep(**kw: object) -> FilterView:
    """A grep over 16 MB that returns 16 KB: 0.03 s of Python, Lua at 0.7 of that."""
    args: dict[str, object] = {
        "filter_id": "g",
        "cpu_s": 0.03,
        "input_bytes": MB16,
        "output_bytes": 16e3,
        "input_calls": 64,
        "output_calls": 4,
        "site": None,
        "osd_capable": True,
        "osd_cpu_ratio": 0.7,
    }
    args.update(kw)
    return FilterView(**args)  # type: ignore[arg-type]


def test_a_selective_grep_on_a_10_mbit_link_runs_at_the_osd() -> None:
    # client: 0.03 + 16e6 / 1.25e6 (12.8) + 2·0.0005·64 (0.064)  = 12.894
    # node:   0.03 + 16e3 / 1.25e6 (0.0128) + 2·0.0005·4 (0.004)  = 0.0468
    # osd:    0.021 + 0.0128 + 0.004                               = 0.0378
    # (node and OSD idle: the filter's load stays under 1, which counts as 1.)
    f = selective_grep()
    times, _loads = predict_sites(f, idle_sites(), [LINK_10MBIT, LOOPBACK])
    assert times["client"] == pytest.approx(12.894)
    assert times["node"] == pytest.approx(0.0468)
    assert times["osd"] == pytest.approx(0.0378)
    plan = choose_site(f, idle_sites(), [LINK_10MBIT, LOOPBACK], CONFIG)
    assert plan.best == "osd" and plan.execute and plan.target == "osd"


def test_a_busy_osd_sends_the_grep_to_the_node() -> None:
    # The OSD at load 3 (its op threads busy with other clients): the grep's 0.021 s
    # becomes 3·0.021 = 0.063 at least, over the node's 0.0468.
    plan = choose_site(selective_grep(), idle_sites(osd_load=3.0), [LINK_10MBIT, LOOPBACK], CONFIG)
    assert plan.best == "node"
    assert plan.response_s["osd"] > 3 * 0.021


def test_a_pattern_lua_cannot_run_never_goes_to_the_osd() -> None:
    f = selective_grep(osd_capable=False, osd_cpu_ratio=0.01)
    assert feasible_sites(f) == (CLIENT, NODE)
    plan = choose_site(f, idle_sites(), [LINK_10MBIT, LOOPBACK], CONFIG)
    assert "osd" not in plan.response_s and plan.best == "node"


def test_the_node_osd_link_counts_for_the_client_and_the_node_but_not_the_osd() -> None:
    # A 100 Mbit/s link between the node and the OSD: 16e6 / 12.5e6 = 1.28 s for the
    # client and the node, which read the bytes over it; nothing for the OSD.
    f = selective_grep(input_calls=0, output_calls=0)
    slow = [LinkView(None), LinkView(100e6 / 8)]
    assert network_s(f, CLIENT, slow) == pytest.approx(1.28)
    assert network_s(f, NODE, slow) == pytest.approx(1.28)
    # The OSD's output crosses both links: 16e3 / 12.5e6.
    assert network_s(f, OSD, slow) == pytest.approx(16e3 / 12.5e6)


def test_a_move_within_b_thresh_is_not_made() -> None:
    # At the node now; the OSD saves 0.009 s per window, far under B_thresh (0.3 s).
    f = selective_grep(site="node")
    plan = choose_site(f, idle_sites(), [LINK_10MBIT, LOOPBACK], CONFIG)
    assert plan.best == "osd" and not plan.execute and plan.target == "node"
    assert plan.benefit_s == pytest.approx(0.009)
    assert "≤ B_thresh" in plan.reason


def test_a_move_over_b_thresh_is_made_and_costs_the_links_between() -> None:
    f = selective_grep(site="client", checkpoint_bytes=1000, quiesce_s=0.01)
    links = [LINK_10MBIT, LOOPBACK]
    plan = choose_site(f, idle_sites(), links, CONFIG)
    assert plan.execute and plan.target == "osd"
    # quiesce + (1000 B / 1.25e6 + 2 · 0.0005) on link 0 + 0 on the loopback link 1.
    assert move_cost_s(f, CLIENT, OSD, links) == pytest.approx(0.01 + 0.0008 + 0.001)
    assert plan.cost_s == pytest.approx(0.0118)


def test_sites_must_be_the_path_in_order() -> None:
    with pytest.raises(ConfigError, match="sites must be"):
        predict_sites(selective_grep(), list(reversed(idle_sites())), [LOOPBACK, LOOPBACK])
    with pytest.raises(ConfigError, match="needs 2 links"):
        predict_sites(selective_grep(), idle_sites(), [LOOPBACK])
    with pytest.raises(ConfigError, match="speed R must be > 0"):
        SiteView("osd", 0.0)
    with pytest.raises(ConfigError, match="osd_cpu_ratio"):
        selective_grep(osd_cpu_ratio=0.0)


# --- the same numbers as the two-site model ----------------------------------------

positive = st.floats(min_value=1e-4, max_value=1e3, allow_nan=False, allow_infinity=False)
nbytes = st.floats(min_value=0, max_value=1e9, allow_nan=False, allow_infinity=False)
calls = st.floats(min_value=0, max_value=1e4, allow_nan=False, allow_infinity=False)
loads = st.floats(min_value=0, max_value=8, allow_nan=False, allow_infinity=False)
bandwidths = st.one_of(st.none(), st.floats(min_value=1e3, max_value=1e10))
latencies = st.floats(min_value=0, max_value=0.1)


@settings(max_examples=200, deadline=None)
@given(
    cpu=positive,
    inb=nbytes,
    outb=nbytes,
    inc=calls,
    outc=calls,
    bw=bandwidths,
    lat=latencies,
    client_load=loads,
    node_load=loads,
    node_speed=st.floats(min_value=0.1, max_value=4),
)
def test_client_and_node_match_the_two_site_model(
    cpu: float,
    inb: float,
    outb: float,
    inc: float,
    outc: float,
    bw: float | None,
    lat: float,
    client_load: float,
    node_load: float,
    node_speed: float,
) -> None:
    """With the node's storage on the node (an unlimited, latency-free link 1), the
    client and node sites are the two-site model's splits 1 and 0, equation 5 included."""
    stack = StackView(
        "s",
        "c",
        "n",
        (
            ObjectView("c/console", 0.0, migratable=False),
            ObjectView("c/grep", cpu),
            ObjectView("n/storage", 0.0, migratable=False),
        ),
        (EdgeView(outb, outc), EdgeView(inb, inc)),
        split=1,
        bandwidth_bytes_per_s=bw,
        latency_s=lat,
    )
    nodes = {"c": NodeView("c", 1.0, client_load), "n": NodeView("n", node_speed, node_load)}
    f = FilterView("g", cpu, inb, outb, inc, outc, site="client")
    sites = [
        SiteView("client", 1.0, client_load),
        SiteView("node", node_speed, node_load),
        SiteView("osd"),
    ]
    links = [LinkView(bw, lat), LinkView(None, 0.0)]
    times, _ = predict_sites(f, sites, links)
    assert times["client"] == pytest.approx(
        two_site_response_s(stack, 1, nodes["c"], nodes["n"], node_load), rel=1e-9
    )
    assert times["node"] == pytest.approx(predict_single(stack, 0, nodes, 1.0), rel=1e-6)


# --- properties -----------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    cpu=positive,
    inb=nbytes,
    frac=st.floats(0, 1),
    bw0=bandwidths,
    bw1=bandwidths,
    lat=latencies,
    c=calls,
)
def test_nearer_the_data_never_loses_when_output_is_smaller_and_cpus_are_alike(
    cpu: float,
    inb: float,
    frac: float,
    bw0: float | None,
    bw1: float | None,
    lat: float,
    c: float,
) -> None:
    """Idle sites of equal speed, the same program everywhere, output no larger than
    input and no more calls: each step toward the OSD takes no longer."""
    f = FilterView("g", cpu, inb, inb * frac, c, c, osd_capable=True, osd_cpu_ratio=1.0)
    times, _ = predict_sites(f, idle_sites(), [LinkView(bw0, lat), LinkView(bw1, lat)])
    slack = 1e-9 * max(1.0, times["client"])
    assert times["osd"] <= times["node"] + slack <= times["client"] + 2 * slack


@settings(max_examples=200, deadline=None)
@given(
    cpu=positive,
    inb=nbytes,
    outb=nbytes,
    base=loads,
    speed=st.floats(0.1, 4),
    bw=bandwidths,
    lat=latencies,
    site=st.sampled_from([NODE, OSD]),
)
def test_the_load_solves_equation_5(
    cpu: float,
    inb: float,
    outb: float,
    base: float,
    speed: float,
    bw: float | None,
    lat: float,
    site: int,
) -> None:
    """L' = L + (W / R) / T(L'), and it lies between L and L + 1."""
    f = FilterView("g", cpu, inb, outb, 1, 1, site="client", osd_capable=True, osd_cpu_ratio=0.5)
    sites = [SiteView("client"), SiteView("node", speed, base), SiteView("osd", speed, base)]
    links = [LinkView(bw, lat), LinkView(bw, lat)]
    load, ok = site_load(f, site, sites, links)
    assert ok and base <= load <= base + 1 + 1e-9
    t = response_time_s(f, site, sites, links, load)
    assert load == pytest.approx(base + f.work_s(site) / speed / t, rel=1e-9, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(
    cpu=positive,
    inb=nbytes,
    outb=nbytes,
    bw=bandwidths,
    lat=latencies,
    osd_load=loads,
    capable=st.booleans(),
    current=st.sampled_from([None, *SITES]),
    threshold=st.floats(0, 1),
)
def test_the_choice_is_the_fastest_site_and_moves_only_over_b_thresh(
    cpu: float,
    inb: float,
    outb: float,
    bw: float | None,
    lat: float,
    osd_load: float,
    capable: bool,
    current: str | None,
    threshold: float,
) -> None:
    if current == "osd" and not capable:
        current = "node"
    f = FilterView("g", cpu, inb, outb, 2, 2, site=current, osd_capable=capable, osd_cpu_ratio=0.7)
    config = PlacementConfig(window_s=1.0, threshold_fraction=threshold)
    plan = choose_site(f, idle_sites(osd_load=osd_load), [LinkView(bw, lat), LOOPBACK], config)
    assert plan.response_s[plan.best] == min(plan.response_s.values())
    assert ("osd" in plan.response_s) == capable
    if current is None:
        assert plan.execute and plan.target == plan.best
    elif plan.execute:
        assert plan.benefit_s - plan.cost_s > threshold and plan.target == plan.best
    else:
        assert plan.target == current
        assert plan.best == current or plan.benefit_s - plan.cost_s <= threshold
    assert all(math.isfinite(t) for t in plan.response_s.values())


def test_the_site_it_runs_at_already_counts_its_work_in_its_load() -> None:
    # At the node, measured load 1.5 (the grep's own thread among others): T(node) uses
    # 1.5 as measured, 1.5·0.03 + 0.0128 + 0.004; moving it to the OSD (load 1.5 there
    # too) adds its work by equation 5, so the OSD's load comes out above 1.5.
    f = selective_grep(site="node")
    sites = [SiteView("client"), SiteView("node", 1.0, 1.5), SiteView("osd", 1.0, 1.5)]
    links = [LINK_10MBIT, LOOPBACK]
    times, loads = predict_sites(f, sites, links)
    assert loads["node"] == 1.5
    assert times["node"] == pytest.approx(1.5 * 0.03 + 0.0128 + 0.004)
    assert loads["osd"] > 1.5
    assert site_load(f, NODE, sites, links) == (1.5, True)
