"""The loop every worker of a warm gang runs: trial after trial from the driver's queue.

Rank 0 asks the gang's queue (launch.gang_queue) for the next trial and broadcasts it over
the gang's world group; every rank runs it (engine.run.run_trial, as a gang of its own would:
its own seed, model, optimizer, data, its own MLflow run logged by rank 0's tracker); rank 0
sends its progress events and its result; then every rank puts back what the trial changed
in the process (engine.isolation) and takes the next. An empty, ended queue ends the gang.

A trial that raises (or a worker that dies) is not caught: the error leaves this function, as
it would a gang of its own, and Ray Train restarts the worker group; the restarted rank 0 asks
the queue again, which decides whether the trial resumes from its checkpoint or is failed (its
cluster.max_failures). Before raising, the worker reports its error to the queue.
"""

from __future__ import annotations

import traceback

NEXT_TIMEOUT_S = 10.0
"""How long rank 0 waits in one request for the next trial (it asks again while the driver
is preparing one: checks, opening its MLflow run)."""
REPORT_TIMEOUT_S = 30.0
"""How long a worker waits for the queue to take its error before raising anyway."""


def gang_loop(config: dict) -> None:
    """Ray Train's worker function of a warm gang (its process group is already initialised)."""
    import ray.train

    from trainlab.engine.isolation import GangState
    from trainlab.tracking.mlflow_tracker import discard_spare_writer

    queue = config["queue"]
    ctx = ray.train.get_context()
    rank0 = ctx.get_world_rank() == 0
    _pin_device(config["device"], ctx.get_local_rank())
    state = GangState.capture()
    while True:
        ticket = _share(_next_ticket(queue) if rank0 else None)
        if ticket is None:
            discard_spare_writer()
            return
        try:
            result = _run_one(ticket, queue=queue, rank0=rank0, local_rank=ctx.get_local_rank())
        except BaseException as e:  # reported, then Ray Train's failure handling takes over
            _report(queue, ticket["key"], f"{type(e).__name__}: {e}", rank=ctx.get_world_rank())
            raise
        if rank0:
            ray.get(queue.finish.remote(ticket["key"], result))
        state.after_trial()


def _run_one(ticket: dict, *, queue, rank0: bool, local_rank: int):
    """One trial on this worker (ray_trial.execute_on_worker, as a gang of its own runs it),
    its events through the gang's queue."""
    from trainlab.events import STEP
    from trainlab.launch.interrupt import follow_stop_flag
    from trainlab.launch.ray_trial import execute_on_worker
    from trainlab.tracking.mlflow_tracker import prestart_writer

    payload, key = ticket["payload"], ticket["key"]
    plan, target = payload["plan"], payload["tracking"]  # as the driver resolved it: executed, not re-checked
    spare_due = target.run is not None  # the next trial's MLflow writer, not started yet

    def progress(event) -> None:
        nonlocal spare_due
        queue.put_event.remote(key, event)  # not waited for: a slow driver never stops training
        if spare_due and event.kind == STEP:
            # the next trial's writer imports MLflow while this one trains; started after this
            # one's first logged step, so that it never takes the CPU from this trial's start
            spare_due = False
            prestart_writer(tracking_uri=target.run.tracking_uri)

    return execute_on_worker(plan, target, local_rank=local_rank, rank0=rank0, progress=progress,
                             follow=lambda: follow_stop_flag(None, ask=lambda: queue.stop_kind.remote(key)))


def _next_ticket(queue) -> dict | None:
    import ray

    from trainlab.launch.gang_queue import WAIT

    while True:
        ticket = ray.get(queue.next.remote(NEXT_TIMEOUT_S))
        if ticket is None:
            return None
        if ticket != WAIT:  # the queue holds the payload by reference (gang_queue.Ticket): rank 0 gets it
            return {**ticket, "payload": ray.get(ticket["payload"][0])}


def _share(ticket: dict | None) -> dict | None:
    """Rank 0's ticket on every rank (a broadcast over the gang's world group)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return ticket
    box = [ticket]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _pin_device(device: str, local_rank: int) -> None:
    """On GPUs, this worker's device before the first broadcast (NCCL sends objects through the
    current device), as trainlab.distributed.setup_distributed picks it."""
    if device == "cuda":
        import torch

        torch.cuda.set_device(local_rank % torch.cuda.device_count())


def _report(queue, key: str, error: str, *, rank: int) -> None:
    import ray

    try:
        ray.get(queue.failed.remote(key, f"{error} (rank {rank})"), timeout=REPORT_TIMEOUT_S)
    except Exception:  # the driver is gone: Ray Train's own error is all there is
        traceback.print_exc()
