"""A small real cluster for the faces' tests: node processes on 127.0.0.1."""

from __future__ import annotations

import threading
from pathlib import Path

from shuttle.client.model import NodeAddress
from shuttle.cluster.clusterfile import ClusterFile, NodeEntry
from tests.integration.nodeproc import NodeProcess


class FacesCluster:
    """``count`` nodes started in parallel (keys spread over them, so listings, renames
    and directories cross nodes)."""

    def __init__(self, tmp: Path, count: int = 2) -> None:
        self.procs = [NodeProcess(tmp / f"n{i + 1}") for i in range(count)]
        starters = [threading.Thread(target=p.start) for p in self.procs]
        for t in starters:
            t.start()
        for t in starters:
            t.join()
        assert all(p.alive() for p in self.procs), "a node did not start"

    def addresses(self) -> list[NodeAddress]:
        return [NodeAddress(p.data_dir.name, "127.0.0.1", p.port, None) for p in self.procs]

    def write_cluster_file(self, path: Path) -> Path:
        """A cluster file naming these nodes (what `--cluster` and $SHUTTLE_CLUSTER take)."""
        nodes = tuple(
            NodeEntry(p.data_dir.name, "127.0.0.1", p.port, p.data_dir) for p in self.procs
        )
        ClusterFile("faces", path.parent, nodes).save(path)
        return path

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
