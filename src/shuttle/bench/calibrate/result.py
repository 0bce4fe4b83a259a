"""A calibration: what was measured on a live node, and the simulator's configuration
it gives (``[server]`` table, :class:`shuttle.sim.config.ServerConfig`).

Every figure is measured at the node's own CPU factor ``f`` and stated at speed 1 by
multiplying by ``f`` (a node of factor ``f`` burns ``1/f`` times its work,
``shuttle.net.cpu``); ``server_speed`` scales it back. Cycle counts are at
``cpu_reference_hz``, this host's clock (the machine the object traces are recorded on).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shuttle.net.profiles import LinkProfile
from shuttle.sim.config import ServerConfig, to_dict

if TYPE_CHECKING:  # fresh.py imports this module
    from shuttle.bench.calibrate.fresh import ProcessReads

#: The simulator's block for a live node: a page, so a read's per-byte cost is
#: charged to within 4 KiB (the node reads and sends whole requests, not blocks).
LIVE_BLOCK_BYTES = 4096


@dataclass
class Calibration:
    """What was measured, the configuration it gives, and how it was measured."""

    node: str
    link: LinkProfile
    node_cpu_factor: float
    server_speed: float
    measured: dict[str, Any] = field(default_factory=dict)
    #: The fresh processes that drained the program's grep at the node (their figures
    #: are in ``measured["fresh_calls"]``); more can be added later
    #: (:func:`~shuttle.bench.calibrate.run.with_drains`).
    drains: tuple[ProcessReads, ...] = ()

    def server_config(self) -> ServerConfig:
        """The simulator's configuration for this node and link."""
        m = self.measured
        hz = float(m["cpu_reference_hz"])
        f = self.node_cpu_factor  # measured costs at factor f, stated at speed 1

        def cycles(seconds: float) -> float:
            return max(0.0, seconds) * f * hz

        # The rate the live shaper achieved where it was measured, else the profile's.
        bw = m.get("link_bandwidth_bits_per_s", self.link.bandwidth_bits_per_s)
        disk = m.get("disk", {})
        return ServerConfig(
            block_size_bytes=LIVE_BLOCK_BYTES,
            cache_infinite=True,
            metadata_io_bytes=LIVE_BLOCK_BYTES,
            metadata_write_through=False,
            disk_seek_s=float(disk.get("seek_s", 0.0)),
            disk_bandwidth_bytes_per_s=float(disk.get("bandwidth_bytes_per_s", math.inf)),
            cpu_reference_hz=hz,
            server_speed=self.server_speed,
            client_speed=1.0,
            metadata_read_cycles=0.0,
            metadata_write_cycles=0.0,
            block_read_cycles=cycles(m["read_node_cpu_per_block_s"]),
            block_write_cycles=cycles(m["read_node_cpu_per_block_s"]),
            request_cycles=cycles(m["read_node_cpu_per_request_s"]),
            local_request_cycles=cycles(m["local_read_cpu_per_request_s"]),
            local_block_read_cycles=cycles(m["local_read_cpu_per_block_s"]),
            call_cycles=cycles(m["call_node_cpu_s"]),
            network_latency_s=self.link.latency_s,
            network_bandwidth_bits_per_s=math.inf if bw is None else bw,
            network_burst_bytes=self.link.effective_burst_bytes,
            network_exact_bytes=True,
            rpc_header_bytes=round(m["reply_header_bytes"]),
            rpc_request_header_bytes=round(m["request_header_bytes"]),
            rpc_overhead_s=max(0.0, m["rpc_overhead_s"]),
            call_overhead_s=max(0.0, m["call_overhead_s"]),
            connect_s=max(0.0, m.get("connect_s", 0.0)),
            client_setup_s=max(0.0, m.get("client_setup_s", 0.0)),
            server_setup_s=max(0.0, m.get("server_setup_s", 0.0)),
            mobile_footprint_bytes=0,
            client_request_bytes_max=16 << 20,
            client_cache_blocks=0,
            mobile_client_cpu_ratio=m["mobile_client_cpu_ratio"],
            mobile_server_cpu_ratio=m["mobile_server_cpu_ratio"],
            mobile_trace_speed=1.0,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "link": {"name": self.link.name, "spec": self.link.spec()},
            "node_cpu_factor": self.node_cpu_factor,
            "server_speed": self.server_speed,
            "measured": self.measured,
            "server": to_dict(self.server_config()),
        }

    def to_toml(self) -> str:
        """The ``[server]`` table ``shuttle sim`` commands read (``--config``), with
        what was measured as comments above it."""
        lines = [
            "# shuttle sim calibrate: the simulator's configuration for one live node.",
            f"# node {self.node} (CPU factor {self.node_cpu_factor:g}), link {self.link}",
            f"# modelled server speed {self.server_speed:g}; cycles at "
            f"{self.measured['cpu_reference_hz'] / 1e6:.0f} MHz (this host)",
        ]
        for key, value in sorted(self.measured.items()):
            if isinstance(value, float):
                lines.append(f"# {key} = {value:.6g}")
        lines.append("[server]")
        for key, value in to_dict(self.server_config()).items():
            if value is None:
                continue  # TOML has no null: an unset parameter is left out
            lines.append(f"{key} = {_toml_value(value)}")
        return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value == "inf" or (isinstance(value, float) and math.isinf(value)):
        return "inf"
    if isinstance(value, float):
        return repr(value)
    return str(value)
