"""Where a grep over a RADOS-backed node should run: a probe, then the three-site model.

:mod:`shuttle.runtime.sites` predicts a filter's time at the client, the node and the
OSD from what the filter costs; this module measures that the way ABACUS starts, at
the client: it reads a probe (the first ``probe_bytes`` of the object) through the
node's storage object, times the pattern on it (RE2, as the grep object runs it) and
counts the matching bytes, which gives the filter's CPU per byte and its
selectivity. Scaled to the bytes to search and put beside the link's profile (the
node–OSD link taken as free, as on one host), it is a
:class:`~shuttle.runtime.sites.FilterView` for :func:`choose`.

The OSD's ``osdgrep`` is anchored at the node (it calls the OSDs from there), so the
OSD site is chosen once, before the search, from the probe; between the client and the
node the run-time goes on adapting as it does for any stack. ``shuttle grep
--placement auto`` and ``shuttle bench ceph filter`` both decide here.
"""

from __future__ import annotations

import time

from shuttle.net.profiles import LinkProfile
from shuttle.runtime.client import Runtime
from shuttle.runtime.osd import literal_of
from shuttle.runtime.patterns import compile_pattern
from shuttle.runtime.placement import PlacementConfig
from shuttle.runtime.sites import FilterView, LinkView, SitePlan, SiteView, choose_site

#: Bytes read for the probe: a few lines of text, one round trip.
PROBE_BYTES = 8192
#: Lua's ``string.find`` over the buffer against Python's ``re`` on the same 16 MB:
#: 19-40 ms against 26-42 ms (measured for issue 12), so about 0.8.
OSD_CPU_RATIO = 0.8
#: Bytes of framing per matching line the console receives ([key, number, line]).
MATCH_FRAMING_BYTES = 30


def probe_grep(
    rt: Runtime,
    node_id: str,
    key: str,
    pattern: str,
    *,
    size_bytes: int,
    block_bytes: int,
    batch_bytes: int,
    ignore_case: bool = False,
    probe_bytes: int = PROBE_BYTES,
    osd_cpu_ratio: float = OSD_CPU_RATIO,
) -> FilterView:
    """What a grep for ``pattern`` over ``size_bytes`` of data costs, from a probe of
    ``key``'s first ``probe_bytes`` read through ``node_id``'s storage object."""
    regex = compile_pattern(pattern, ignore_case=ignore_case)
    with rt.console("probe"):
        data = bytes(rt.storage(node_id).read(key, 0, probe_bytes))
    cpu0 = time.thread_time()
    matched = 0
    for line in data.split(b"\n"):
        if regex.search(line):
            matched += len(line) + MATCH_FRAMING_BYTES
    cpu_s = time.thread_time() - cpu0
    scale = size_bytes / max(1, len(data))
    return FilterView(
        "grep",
        cpu_s=cpu_s * scale,
        input_bytes=size_bytes,
        output_bytes=matched * scale,
        input_calls=size_bytes / block_bytes,
        output_calls=size_bytes / batch_bytes,
        site=None,
        osd_capable=literal_of(pattern) is not None,
        osd_cpu_ratio=osd_cpu_ratio,
    )


def choose(
    view: FilterView, link: LinkProfile | None, config: PlacementConfig | None = None
) -> SitePlan:
    """The site the three-site model picks for ``view``, the client reaching the node
    over ``link`` (None: loopback) and the node reaching its OSDs for free."""
    if link is None or link.bandwidth_bits_per_s is None:
        bandwidth = None
    else:
        bandwidth = link.bandwidth_bits_per_s / 8
    latency = 0.0 if link is None else link.latency_s
    sites = [SiteView("client"), SiteView("node"), SiteView("osd")]
    links = [LinkView(bandwidth, latency), LinkView(None, 0.0)]
    return choose_site(view, sites, links, config or PlacementConfig())
