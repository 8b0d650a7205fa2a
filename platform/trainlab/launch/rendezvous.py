"""The process group of a trial's Ray Train gang, listening only on each node's own address.

Ray Train's TorchConfig has every worker call `init_process_group("env://")`, and rank 0's
c10d TCPStore then listens on every interface ("::"), whatever MASTER_ADDR says: the
rendezvous store, which has no authentication, was open to anyone who could reach the machine.
BoundTorchConfig sets the group up as Ray Train does (its env vars, its NCCL default, then
`init_process_group`) except that rank 0 binds the store to its node's IP and every worker pins
gloo and NCCL to the interface holding its node's IP (launch.bound_group). The node IP is
127.0.0.1 on a local cluster, which trainlab keeps on loopback, and on a multi-node cluster
the address Ray's own services use: nothing listens beyond the interface the cluster talks over.
"""

from __future__ import annotations

import ray
from ray.train.torch.config import TorchConfig, _TorchBackend

_store: dict = {}
"""Rank 0's TCPStore server ('store'), alive as long as its worker process: Ray Train ends the
workers with the group (shutting it down through a call to a rank that may hang is no safer)."""


def _pin() -> dict[str, str]:
    from trainlab.launch.bound_group import pin_interfaces

    return pin_interfaces(ray.util.get_node_ip_address())


def _open_store(*, world_size: int, timeout_s: float) -> tuple[str, int]:
    from trainlab.launch.bound_group import open_store

    ip = ray.util.get_node_ip_address()
    _store["store"] = open_store(ip, world_size=world_size, timeout_s=timeout_s)
    return ip, _store["store"].port


def _join(*, backend: str, world_rank: int, world_size: int, addr: str, port: int, timeout_s: float) -> None:
    from trainlab.launch.bound_group import join_group

    join_group(backend=backend, rank=world_rank, world_size=world_size, addr=addr, port=port,
               timeout_s=timeout_s, store=_store.get("store") if world_rank == 0 else None)


class _BoundTorchBackend(_TorchBackend):
    def on_start(self, worker_group, backend_config: TorchConfig) -> None:
        from ray.train._internal.worker_group import WorkerGroup as V1WorkerGroup
        from ray.train.torch.config import _set_torch_distributed_env_vars

        assert backend_config.backend, "BoundTorchConfig is given its backend (gloo, nccl)"
        n = len(worker_group)
        worker_group.execute(_pin)
        addr, port = worker_group.execute_single(0, _open_store, world_size=n, timeout_s=backend_config.timeout_s)
        if not isinstance(worker_group, V1WorkerGroup):  # LOCAL_RANK, RANK, ... as Ray Train sets them
            worker_group.execute(_set_torch_distributed_env_vars)
        ray.get([worker_group.execute_single_async(i, _join, backend=backend_config.backend, world_rank=i,
                                                   world_size=n, addr=addr, port=port,
                                                   timeout_s=backend_config.timeout_s)
                 for i in range(n)])


class BoundTorchConfig(TorchConfig):
    """Ray Train's TorchConfig, the group's sockets on each node's own address (see above)."""

    @property
    def backend_cls(self):
        return _BoundTorchBackend
