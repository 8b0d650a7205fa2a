"""The cluster an estimate is for: GPU types and counts per node, and the links between them.

    ClusterSpec.of_nodes(["8xH100", "8xH100"], network_gb_s=50)   # from config (cluster.nodes)
    ClusterSpec.cpu(ranks=4)                                     # this machine, gloo ranks

A gang's ranks fill the nodes in order (Ray's PACK strategy: as few nodes as possible), so rank
r's node is fixed by the counts; links inside a node are the GPU type's NVLink (or the host's
shared memory on CPU), links between nodes the network.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CPU = "cpu"
"""The device type of a CPU node (gloo ranks on one host)."""


@dataclass(frozen=True)
class NodeSpec:
    """One node: `count` devices of one type (a Ray accelerator type, or 'cpu')."""

    type: str
    count: int


@dataclass(frozen=True)
class ClusterSpec:
    nodes: tuple[NodeSpec, ...]
    nvlink_gb_s: float = 0.0
    """Bandwidth between two devices of a node, GB/s per direction; 0 = the device type's own."""
    network_gb_s: float = 0.0
    """Bandwidth between nodes per device, GB/s per direction; 0 = the default of the link model."""
    source: str = "config"
    """Where the description came from: 'config' (cluster.nodes), 'ray' (a running cluster) or 'local'."""

    @classmethod
    def cpu(cls, *, ranks: int) -> ClusterSpec:
        return cls(nodes=(NodeSpec(CPU, ranks),), source="local")

    @classmethod
    def of_nodes(cls, items: list[str] | tuple[str, ...], **links: float) -> ClusterSpec:
        return cls(nodes=tuple(parse_node(item) for item in items), **links)

    @property
    def devices(self) -> int:
        return sum(n.count for n in self.nodes)

    def rank_nodes(self, world: int) -> list[int]:
        """The node index of each of `world` ranks (PACK: nodes filled in order)."""
        if world > self.devices:
            raise ValueError(f"the cluster has {self.devices} devices ({self.describe()}) for "
                             f"cluster.num_workers={world}; describe more nodes or use fewer workers")
        return [i for i, node in enumerate(self.nodes) for _ in range(node.count)][:world]

    def describe(self) -> str:
        return " + ".join(f"{n.count}x{n.type}" for n in self.nodes)


_NODE = re.compile(r"(?:(\d+)\s*[xX*]\s*)?([A-Za-z0-9][A-Za-z0-9_.-]*)")


def parse_node(item: str) -> NodeSpec:
    """'8xH100' -> NodeSpec('H100', 8); 'A100' -> one device; ValueError naming cluster.nodes."""
    m = _NODE.fullmatch(str(item).strip())
    if m is None or (m.group(1) is not None and int(m.group(1)) < 1):
        raise ValueError(f"cluster.nodes entry {item!r} is not COUNTxTYPE; write e.g. "
                         "cluster.nodes=[8xH100,8xH100] (Ray accelerator type names) or [4xcpu]")
    return NodeSpec(m.group(2), int(m.group(1) or 1))
