"""A torch.distributed group whose sockets listen on one address only (torch alone, no Ray).

c10d's TCPStore server binds every interface ("::") whatever host it is given; gloo listens
on the address the hostname resolves to, and NCCL's bootstrap on the first interface that is
not loopback. Here the store's socket is bound by us, to `ip`, and handed over
(`master_listen_fd`), and gloo and NCCL are pinned to the interface holding `ip`.
launch.rendezvous does this for a Ray Train gang; a GPU test does it under plain processes.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch.distributed as dist

from trainlab.launch.interfaces import interface_of

PINNED_ENV = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
"""The interface gloo's pairs and NCCL's bootstrap listen on."""


def pin_interfaces(ip: str) -> dict[str, str]:
    """Set gloo's and NCCL's interface to the one holding `ip` (127.0.0.1: 'lo'), where the user
    has not set them; returns what was set (nothing when no interface holds `ip`)."""
    iface = interface_of(ip)
    if iface is None:
        return {}
    pinned = {k: iface for k in PINNED_ENV if not os.environ.get(k)}
    os.environ.update(pinned)
    return pinned


def open_store(ip: str, *, world_size: int, timeout_s: float) -> dist.TCPStore:
    """Rank 0's TCPStore server, listening on `ip` alone, on a port the kernel picks (read it
    from `.port`: no race for a 'free' port)."""
    sock = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((ip, 0))
        sock.listen(max(128, world_size))
        port = sock.getsockname()[1]
    except OSError:
        sock.close()
        raise
    # the store owns the socket from here: libuv closes it with the server
    return dist.TCPStore(ip, port, world_size, is_master=True, timeout=timedelta(seconds=timeout_s),
                         wait_for_workers=False, master_listen_fd=sock.detach())


def join_group(*, backend: str, rank: int, world_size: int, addr: str, port: int, timeout_s: float,
               store: dist.Store | None = None) -> None:
    """init_process_group through the store at addr:port (rank 0 passes the one it opened)."""
    if backend == "nccl":  # as Ray Train does: fail, not hang, on a stuck collective
        if "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in os.environ and "TORCH_NCCL_BLOCKING_WAIT" not in os.environ:
            os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = addr, str(port)  # for whatever reads them
    timeout = timedelta(seconds=timeout_s)
    if store is None:
        store = dist.TCPStore(addr, port, world_size, is_master=False, timeout=timeout)
    dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
