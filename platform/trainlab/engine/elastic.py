"""Elastic data parallel: an elastic trial goes on with the gang it was given.

A trial with 1 <= cluster.min_workers < cluster.num_workers may be started by Ray Train on
any worker count in that range (fewer after a node is lost, all of them again once it is
back). Each start resumes from the last checkpoint, which does not depend on the worker count
in pure data parallel (engine.checkpoint.elastic_layout), and runs the config resized to the
process group it found (re-planned: plan.trial_plan.replan): dp follows the world size and the global batch stays
train.global_batch_size, cut into more micro-batches per worker (plan.derive_layout.check_elastic
made sure every count in the range divides it). The config's hash, and with it the trial's
identity in its checkpoints and runs, stays the one it was launched with (engine.run).
"""

from __future__ import annotations

import dataclasses

from trainlab import names
from trainlab.config import RunConfig
from trainlab.plan.derive_layout import elastic_range
from trainlab.plan.trial_plan import TrialPlan


def fit_to_gang(run: RunConfig, *, world_size: int) -> RunConfig:
    """`run` as it runs on `world_size` workers: an elastic trial resized to them (num_workers,
    and debug.slowdown cut to their factors); any other run unchanged, so that a gang of
    the wrong size still fails the world-size check in build_trainer."""
    span = elastic_range(run)
    if span is None or world_size == run.cluster.num_workers:
        return run
    lo, hi = span
    if not lo <= world_size <= hi:
        raise ValueError(
            f"the process group has {world_size} workers, outside the range cluster.min_workers={lo} to "
            f"cluster.num_workers={hi} this elastic trial may run on; start {lo} to {hi} workers")
    cluster = dataclasses.replace(run.cluster, num_workers=world_size)
    debug = dataclasses.replace(run.debug, slowdown=list(run.debug.slowdown[:world_size]))
    return dataclasses.replace(run, cluster=cluster, debug=debug)


def elastic_metrics(span: tuple[int, int] | None, plan: TrialPlan) -> dict[str, float]:
    """For an elastic trial, logged at each (re)start beside fault/workers: the micro-batches
    each worker runs per step to keep the global batch on the gang it has (`plan`: re-planned
    for that gang, plan.trial_plan.replan)."""
    return {names.GRAD_ACCUM: plan.grad_accum_steps} if span else {}


def shrunk_note(span: tuple[int, int] | None, plan: TrialPlan) -> str:
    """What a person watching should read when an elastic trial runs below its full gang;
    empty otherwise."""
    run = plan.run
    if span is None or run.cluster.num_workers >= span[1]:
        return ""
    return (f"continuing on {run.cluster.num_workers} of {span[1]} workers: global batch "
            f"{run.train.global_batch_size} kept with {plan.grad_accum_steps} micro-batches per step")

