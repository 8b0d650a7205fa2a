"""Benchmarks outside torchrun: a local gloo world of spawned workers, rank 0's rows back.

    rows = spawn_rows(run_rounds, world=2, overrides=[...], repeats=2)

Every worker is `rank` of a 127.0.0.1 rendezvous with one torch thread (several share the
machine) and calls ``fn(**kwargs, world=world)``; rank 0 puts what it returns on a queue. A
worker that dies is noticed within a second, instead of after the rows' timeout.
"""

from __future__ import annotations

import os
import queue as queue_mod
from typing import Callable


def _worker(rank: int, world: int, port: int, queue, fn: Callable, kwargs: dict) -> None:
    import torch

    from trainlab.distributed import close_distributed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    try:
        rows = fn(**kwargs, world=world)
        if rank == 0:
            queue.put(rows)
    finally:
        close_distributed()


def start_ranks(target: Callable, *, world: int, args: tuple = ()) -> tuple[list, object]:
    """`world` spawned processes running ``target(rank, world, port, queue, *args)`` around a free
    127.0.0.1 rendezvous port; (the started processes, the queue they report on)."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, world, port, queue, *args)) for r in range(world)]
    for p in procs:
        p.start()
    return procs, queue


def spawn_rows(fn: Callable, *, world: int, **kwargs) -> list[dict]:
    """Run the module-level function `fn` in `world` spawned gloo workers; rank 0's result.
    SystemExit with the exit codes if a worker failed."""
    procs, queue = start_ranks(_worker, world=world, args=(fn, kwargs))
    rows = None
    try:
        while rows is None:  # fail fast when a worker dies instead of waiting out the timeout
            try:
                rows = queue.get(timeout=1)
            except queue_mod.Empty:
                if any(p.exitcode not in (None, 0) for p in procs) or all(p.exitcode == 0 for p in procs):
                    break
    finally:
        for p in procs:
            p.join(timeout=60)
    codes = [p.exitcode for p in procs]
    if rows is None or codes != [0] * world:
        raise SystemExit(f"a worker failed: exit codes {codes}")
    return rows
