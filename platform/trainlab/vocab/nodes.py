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
MAX_NODE_DEVICES = 1024
"""Most devices one cluster.nodes entry may hold: GPU nodes hold 8 or 16, a CPU node's gloo
ranks at most its cores; past this a count is a typo (and was expanded device by device)."""


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
        ranks: list[int] = []
        for i, node in enumerate(self.nodes):  # node by node: never a list of every device
            ranks += [i] * min(node.count, world - len(ranks))
            if len(ranks) == world:
                break
        return ranks

    def describe(self) -> str:
        return " + ".join(f"{n.count}x{n.type}" for n in self.nodes)


_NODE = re.compile(r"(?:(\d+)\s*[xX*]\s*)?([A-Za-z0-9][A-Za-z0-9_.-]*)")
_NO_COUNT = re.compile(r"[xX*]\s*[A-Z0-9]")
"""'xH100', '*A100', 'x 8': a COUNTxTYPE whose count is missing (no type starts so)."""
_FORMAT = "write e.g. cluster.nodes=[8xH100,8xH100] (Ray accelerator type names) or [4xcpu]"


def parse_node(item: str) -> NodeSpec:
    """'8xH100' -> NodeSpec('H100', 8); 'A100' -> one device; ValueError naming cluster.nodes."""
    text = str(item).strip()
    if _NO_COUNT.match(text):
        raise ValueError(f"cluster.nodes entry {item!r} has no count before its 'x'; {_FORMAT}")
    m = _NODE.fullmatch(text)
    digits = (m.group(1) or "1").lstrip("0") if m else ""
    if m is None or not digits:
        raise ValueError(f"cluster.nodes entry {item!r} is not COUNTxTYPE; {_FORMAT}")
    if len(digits) > len(str(MAX_NODE_DEVICES)) or int(digits) > MAX_NODE_DEVICES:  # no int of 10**4300
        raise ValueError(f"cluster.nodes entry {item!r} gives one node {digits} devices, more than "
                         f"{MAX_NODE_DEVICES}; give each node's own count and list the nodes "
                         "(e.g. cluster.nodes=[8xH100,8xH100])")
    return NodeSpec(m.group(2), int(digits))
