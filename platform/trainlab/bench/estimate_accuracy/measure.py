"""Measure the estimate bench's trials: one spawned gloo group per world size runs its cases in turn.

    for m in measure(cases, steps=8, on_case=print):   # Measured per case, in matrix order
        m.params, m.peak_gb, m.step_time_s

Spawning a group costs seconds per rank on a 2-core machine (interpreter, torch, trainlab, the
rendezvous), often more than a tiny trial, so the ranks of one world size stay up and train
the cases one after another, as a warm gang's workers run trials: engine.isolation.GangState
puts back after each what a case changed in the process, and the freed heap goes back to the
OS (parallel._trim_heap) so that the next case's resident set starts near the baseline.

Each case is the real trainer (engine.run.build_trainer, Trainer.train) with tracking off and
no evaluation but the last; per rank, from the trainer's own rank telemetry at the last step:
bytes of parameters, gradients and optimizer state (parallel.fsdp.sharded_bytes, the
rank/<r>/param_gb ... metrics), and the peak resident set since the warm-up step
(rank/<r>/peak_mem_gb); the steady step time is the tokens of a step over the trainer's median
tokens/s after the first step, from the slowest rank. A config the checks refuse (ValueError,
raised alike on every rank before any collective) is skipped with its reason. A case that fails
otherwise ends its group; it is reported with every rank's traceback, and the cases after it
run in a fresh group.
"""

from __future__ import annotations

import gc
import os
import queue as queue_mod
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

from trainlab.bench.estimate_accuracy.cases import Case, by_world

FIXED = ("tracking=none", "train.eval_every=0", "train.numerics_every=0", "train.eval_batches=1",
         "train.log_every=1000000")
"""The same bookkeeping for every case: nothing but training steps inside the timed loop."""
CASE_TIMEOUT_S = 900.0
"""Seconds one case may take (4 ranks of `small` under pipeline parallel on 2 busy cores)."""
GRACE_S = 30.0
"""After a rank reported a failure: how long its peers get to report theirs."""


@dataclass
class Measured:
    """One case as it ran: per rank (index = global rank)."""

    case: Case
    status: str
    """The trainer's status (finished, diverged, ...), 'skipped' (refused config) or 'failed'."""
    reason: str = ""
    params: list[int] = field(default_factory=list)
    """Bytes of parameters (local shards) per rank at the last step."""
    grads: list[int] = field(default_factory=list)
    optim_state: list[int] = field(default_factory=list)
    peak_gb: list[float] = field(default_factory=list)
    """Peak resident set since the warm-up step (sys/peak_mem_gb), GB, per rank."""
    base_gb: list[float] = field(default_factory=list)
    """Resident set just before the case was built (what earlier cases left in the process), GB."""
    step_time_s: float = float("nan")
    """Steady step time: tokens per step / the slowest rank's median tokens/s after step 1."""
    tokens_per_step: int = 0
    wall_s: float = 0.0
    """Seconds the case took, build and evaluation included."""

    @property
    def ok(self) -> bool:
        return self.status not in ("skipped", "failed")


# ---------------------------------------------------------------------------------------
def _case_overrides(case: Case, *, steps: int) -> list[str]:
    return [*case.overrides, f"train.max_steps={steps}", *FIXED, f"cluster.num_workers={case.world}"]


def run_config_of(case: Case, *, steps: int):
    """The RunConfig the case trains (the estimate reads the same)."""
    from trainlab.config import compose_run_config

    return compose_run_config(_case_overrides(case, steps=steps))


def _run_case(case: Case, *, steps: int, world: int) -> dict:
    """Train `case` in this rank; rank 0 returns every rank's numbers (a collective)."""
    import torch

    from trainlab import names
    from trainlab.bench.layout_speed import _check_not_degenerate, _Latest, _trim_heap, gather_rows
    from trainlab.distributed import setup_distributed
    from trainlab.engine.run import build_trainer
    from trainlab.plan.trial_plan import Where, plan_trial
    from trainlab.telemetry.peak_memory import rss_gb

    try:
        run = run_config_of(case, steps=steps)
        _check_not_degenerate(run)
        dist_info = setup_distributed(run.cluster.device)
        torch.set_num_threads(run.cluster.cpus_per_worker)
        gc.collect()
        _trim_heap()
        base = rss_gb() or float("nan")
        latest = _Latest()
        trainer = build_trainer(plan_trial(run, Where(device=dist_info.device.type)), dist_info, tracker=latest)
    except ValueError as e:  # the config's checks: the same on every rank, before any collective
        return {"status": "skipped", "reason": " ".join(str(e).split())}
    result = trainer.train()
    mine = {"tokens_per_s": result.tokens_per_s, "base_gb": base, "status": result.status}
    rows = gather_rows([mine])
    out: dict = {}
    if dist_info.is_rank0:
        m = latest.metrics
        per = [r[0] for r in rows]

        def per_rank(key: str) -> list[float]:
            return [m[names.rank_metric(r, key)] for r in range(world)]

        out = {"status": next((p["status"] for p in per if p["status"] != names.STATUS_FINISHED), per[0]["status"]),
               "params": [round(gb * 1e9) for gb in per_rank(names.RANK_PARAM_GB)],
               "grads": [round(gb * 1e9) for gb in per_rank(names.RANK_GRAD_GB)],
               "optim_state": [round(gb * 1e9) for gb in per_rank(names.RANK_OPTIM_STATE_GB)],
               "peak_gb": per_rank(names.RANK_PEAK_MEM_GB), "base_gb": [p["base_gb"] for p in per],
               "tokens_per_step": trainer.batches.tokens_per_step,
               "step_time_s": trainer.batches.tokens_per_step / min(p["tokens_per_s"] for p in per)}
    del trainer  # free this case's model and optimizer before the next one is built
    gc.collect()
    _trim_heap()
    return out


def _rank_main(rank: int, world: int, port: int, out, cases: list[Case], steps: int) -> None:
    """One spawned rank: the world group, then each case; (kind, case name, rank, payload) on `out`."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    import torch
    import torch.distributed as dist

    from trainlab.distributed import close_distributed
    from trainlab.engine.isolation import GangState

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    state = GangState.capture()
    for case in cases:
        start = time.perf_counter()
        try:
            row = _run_case(case, steps=steps, world=world)
        except BaseException:  # noqa: BLE001 - reported to the driver, then this rank ends
            out.put(("error", case.name, rank, traceback.format_exc()))
            out.close()
            out.join_thread()
            raise
        if rank == 0:
            out.put(("row", case.name, rank, row | {"wall_s": time.perf_counter() - start}))
        state.after_trial()
    close_distributed()
    out.close()
    out.join_thread()


# ---------------------------------------------------------------------------------------
def measure(cases: list[Case], *, steps: int, on_case: Callable[[Measured, int, int], None] | None = None,
            timeout: float = CASE_TIMEOUT_S) -> list[Measured]:
    """Every case measured (matrix order); `on_case(measured, done, total)` after each (progress)."""
    done: dict[str, Measured] = {}
    total = len(cases)
    for world, group in by_world(cases).items():
        pending = list(group)
        while pending:
            for m in _one_group(world, pending, steps=steps, timeout=timeout):
                done[m.case.name] = m
                if on_case is not None:
                    on_case(m, len(done), total)
            pending = [c for c in pending if c.name not in done]
    return [done[c.name] for c in cases]


def _one_group(world: int, cases: list[Case], *, steps: int, timeout: float):
    """Spawn `world` ranks for `cases`; yield each case's Measured until all are done or one
    failed (yielded as 'failed'; the rest are left for a fresh group)."""
    from trainlab.bench.spawn import start_ranks

    procs, out = start_ranks(_rank_main, world=world, args=(cases, steps))
    clean = False
    try:
        for case in cases:
            m = _collect(case, out, procs, timeout=timeout)
            yield m
            if m.status == "failed":
                return
        clean = True
    finally:
        for p in procs:
            p.join(timeout=60 if clean else 0)
            if p.is_alive():
                p.kill()
                p.join()


def _collect(case: Case, out, procs, *, timeout: float) -> Measured:
    """Wait for rank 0's row of `case`, or a rank's error (then GRACE_S for the others'), a
    dead rank, or the timeout."""
    deadline = time.monotonic() + timeout
    errors: dict[int, str] = {}
    while True:
        try:
            kind, name, rank, payload = out.get(timeout=1)
        except queue_mod.Empty:
            kind = None
        if kind == "row" and name == case.name:
            return _measured(case, payload)
        if kind == "error":
            errors[rank] = payload
            deadline = min(deadline, time.monotonic() + GRACE_S)
        dead = {r: p.exitcode for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in errors}
        if (errors and len(errors) + len(dead) == len(procs)) or time.monotonic() > deadline or (dead and not errors):
            why = {**{r: f"exited with code {c}" for r, c in dead.items()}, **errors}
            if not why:
                why = {-1: f"no result within {timeout:.0f} s"}
            shown = "\n".join(f"--- rank {r}\n{e[-2000:]}" for r, e in sorted(why.items()))
            return Measured(case, status="failed", reason=shown)


def _measured(case: Case, row: dict) -> Measured:
    keys = ("status", "reason", "params", "grads", "optim_state", "peak_gb", "base_gb", "step_time_s",
            "tokens_per_step", "wall_s")
    return Measured(case, **{k: row[k] for k in keys if k in row})
