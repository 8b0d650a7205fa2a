"""How long a collective takes: bytes each rank moves over the slowest link of its group.

    link = group_link(ranks=[0, 1, 2, 3], rank_nodes=[0, 0, 1, 1], cluster=..., hw=...)
    all_reduce_s(nbytes, n=4, link=link)      # ring or tree, whichever is faster (as NCCL picks)

The classic alpha-beta model (Thakur, Rabenseifner and Gropp 2005; NCCL's own tuning model):
a collective over n ranks of a buffer of `nbytes` (the full, unsharded size) costs

    ring all-reduce      2 (n-1)/n x nbytes / bw + 2 (n-1) x latency
    tree all-reduce      2 x nbytes / bw + 2 log2(n) x latency   (wins for small buffers)
    all-gather           (n-1)/n x nbytes / bw + (n-1) x latency   (nbytes = gathered size)
    reduce-scatter       (n-1)/n x nbytes / bw + (n-1) x latency   (nbytes = input size)
    broadcast            nbytes / bw + log2(n) x latency            (pipelined)
    p2p                  nbytes / bw + latency

A group inside one node runs at the node's device-to-device bandwidth (NVLink, PCIe, or the
host's shared memory for gloo); a group that spans nodes at the network's bandwidth per device
(a ring crosses the network at least twice, and every rank's share goes through it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from trainlab.vocab.nodes import CPU, ClusterSpec

NETWORK_GB_S = 25.0
"""Inter-node bandwidth per device when cluster.network_gb_s is 0: 200 Gb/s InfiniBand/RoCE per
GPU (a p4d/p5-class node has 400 Gb/s per GPU: set cluster.network_gb_s=50)."""
GLOO_GB_S = 2.0
"""gloo ranks on one host: TCP over loopback, GB/s per direction (measured order; calibrated)."""

LATENCY_S = {"nvlink": 5e-6, "pcie": 10e-6, "network": 15e-6, "gloo": 60e-6}
"""Per-hop latency of each kind of link, seconds (NCCL's base latencies; gloo's per message)."""


@dataclass(frozen=True)
class Link:
    kind: str
    """nvlink, pcie, network or gloo."""
    gb_s: float
    """Bandwidth per direction, GB/s."""
    latency_s: float

    def seconds(self, nbytes: float) -> float:
        return nbytes / (self.gb_s * 1e9)


def group_link(*, ranks: Sequence[int], rank_nodes: Sequence[int], cluster: ClusterSpec,
               device_types: Sequence[str], nvlink_gb_s: Sequence[float]) -> Link:
    """The link that bounds a collective among `ranks` (global ranks): the network if they span
    nodes, else the slowest device-to-device link of their node."""
    if any(device_types[r] == CPU for r in ranks):
        return Link("gloo", GLOO_GB_S, LATENCY_S["gloo"])
    if len({rank_nodes[r] for r in ranks}) > 1:
        return Link("network", cluster.network_gb_s or NETWORK_GB_S, LATENCY_S["network"])
    bw = cluster.nvlink_gb_s or min(nvlink_gb_s[r] for r in ranks)
    return Link("nvlink" if bw > 64 else "pcie", bw, LATENCY_S["nvlink" if bw > 64 else "pcie"])


def all_reduce_s(nbytes: float, *, n: int, link: Link) -> float:
    if n <= 1 or nbytes <= 0:
        return 0.0
    ring = 2 * (n - 1) / n * link.seconds(nbytes) + 2 * (n - 1) * link.latency_s
    tree = 2 * link.seconds(nbytes) + 2 * math.log2(n) * link.latency_s
    return min(ring, tree)


def all_gather_s(nbytes: float, *, n: int, link: Link) -> float:
    """`nbytes` = the gathered (full) buffer."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (n - 1) / n * link.seconds(nbytes) + (n - 1) * link.latency_s


def reduce_scatter_s(nbytes: float, *, n: int, link: Link) -> float:
    """`nbytes` = the input (full) buffer each rank reduces a 1/n share of."""
    return all_gather_s(nbytes, n=n, link=link)


def broadcast_s(nbytes: float, *, n: int, link: Link) -> float:
    if n <= 1 or nbytes <= 0:
        return 0.0
    return link.seconds(nbytes) + math.log2(n) * link.latency_s


def p2p_s(nbytes: float, *, link: Link) -> float:
    return link.seconds(nbytes) + link.latency_s if nbytes > 0 else 0.0
