"""Elastic data parallel on gloo: an elastic trial (cluster.num_workers=2, cluster.min_workers=1)
stopped on 2 ranks after its step-4 checkpoint goes on from it on 1 rank, stops again at step 7,
and finishes on 2 ranks: every step once, the same global batch throughout, and the loss of the
uninterrupted 2-rank trial (within float summation order: dp changes only how the same
gradients are summed)."""

from __future__ import annotations

import os
import signal

import pytest

from conftest import RecordingTracker, rank_env, reporting_to, spawn_ranks
from trainlab import names
from trainlab.plan.here import plan_here

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # 8-25 s of gloo groups: the gate keeps under 15 min

GLOBAL_BATCH, MICRO_BATCH, SEQ_LEN = 8, 2, 32
ELASTIC = ["model=tiny", "data=markov", "train.max_steps=10", f"train.global_batch_size={GLOBAL_BATCH}",
           f"train.micro_batch_size={MICRO_BATCH}", f"train.seq_len={SEQ_LEN}", "train.eval_every=0",
           "train.eval_batches=2", "optim.warmup_steps=2", "train.numerics_every=0", "cluster.device=cpu",
           "cluster.num_workers=2", "cluster.min_workers=1", "cluster.max_failures=1",
           "train.checkpoint_every=2"]
LOSS_RTOL = 1e-5
"""Losses of the resized trial against the uninterrupted one, relative. On 1 rank the same 8
sequences' gradients are summed in one process instead of on 2 and all-reduced: measured here,
the step losses differed by at most 3e-8 relative (the final loss not at all), while one step of
training moves the loss by ~1e-2, so a repeated, skipped or misplaced batch cannot pass."""


class PreemptingTracker(RecordingTracker):
    """Records, and sends its own process SIGTERM once `stop_at` is logged: the trainer then saves
    a checkpoint at that step and ends the trial `preempted` (debug.inject_fault only acts on a
    trial's first attempt)."""

    def __init__(self, stop_at: int | None):
        super().__init__()
        self.stop_at = stop_at

    def log_metrics(self, metrics, *, step):
        super().log_metrics(metrics, step=step)
        if step == self.stop_at and names.LOSS in metrics:
            os.kill(os.getpid(), signal.SIGTERM)


def _phase(rank: int, world: int, port: int, out, runs: list[tuple[str, list[str], int | None]]) -> None:
    """One rank of each (name, overrides, stop_at) trial in turn, in one process group; rank 0
    reports what each logged and the events it showed."""
    rank_env(rank, world, port)

    from trainlab.config import compose_run_config
    from trainlab.engine.run import run_trial

    reports = {}
    with reporting_to(out):
        for name, overrides, stop_at in runs:
            tracker, events = PreemptingTracker(stop_at), []
            result = run_trial(plan_here(compose_run_config([*ELASTIC, *overrides])), tracker_factory=lambda *_, t=tracker: t,
                               progress=events.append)
            reports[name] = dict(status=result.status, steps=result.steps, final_loss=result.final_loss,
                                 losses=tracker.by_step(names.LOSS), tokens=tracker.by_step(names.TOKENS_SEEN),
                                 workers=tracker.by_step(names.WORKERS), accum=tracker.by_step(names.GRAD_ACCUM),
                                 restarts=tracker.by_step(names.RESTARTS), world_tag=tracker.tags.get(names.TAG_WORLD_SIZE),
                                 events=[e for e in events if e.kind != "step"])
        if rank == 0:
            out.put(reports)


@pytest.fixture(scope="module")
def resized(tmp_path_factory):
    root = tmp_path_factory.mktemp("elastic")
    cut = f"train.checkpoint_dir={root}/trial"
    (full,) = spawn_ranks(_phase, 2, [("whole", ["train.resume=never", f"train.checkpoint_dir={root}/whole"], None),
                                      ("first", ["debug.inject_fault=sigterm@4", cut], None)])
    (shrunk,) = spawn_ranks(_phase, 1, [("shrunk", [cut], 7)])
    (grown,) = spawn_ranks(_phase, 2, [("grown", [cut], None)])
    for got in (full, shrunk, grown):
        assert isinstance(got, dict), got
    return {**full, **shrunk, **grown}


def test_the_trial_goes_on_from_its_checkpoint_on_fewer_workers_and_back(resized):
    first, shrunk, grown = resized["first"], resized["shrunk"], resized["grown"]
    assert (first["status"], first["steps"]) == (names.STATUS_PREEMPTED, 4)
    assert (shrunk["status"], shrunk["steps"]) == (names.STATUS_PREEMPTED, 7)
    assert (grown["status"], grown["steps"]) == (names.STATUS_FINISHED, 10)
    # every step once: each attempt logs only the steps it ran, from where the last one stopped
    assert sorted(first["losses"]) == [1, 2, 3, 4]
    assert sorted(shrunk["losses"]) == [5, 6, 7]
    assert sorted(grown["losses"]) == [8, 9, 10]
    # recorded as such: the workers and the micro-batches per worker of each (re)start
    assert (first["workers"], shrunk["workers"], grown["workers"]) == ({0: 2}, {4: 1}, {7: 2})
    assert (first["accum"], shrunk["accum"], grown["accum"]) == ({0: 2}, {4: 4}, {7: 2})
    assert (first["restarts"], shrunk["restarts"], grown["restarts"]) == ({0: 0}, {4: 1}, {7: 2})
    assert (shrunk["world_tag"], grown["world_tag"]) == (1, 2)
    resizes = [e.message for e in shrunk["events"] if e.kind == "resized"]
    assert resizes == [f"continuing on 1 of 2 workers: global batch {GLOBAL_BATCH} kept with 4 "
                       "micro-batches per step"]
    assert not [e for e in first["events"] + grown["events"] if e.kind == "resized"]


def test_the_global_batch_and_the_loss_are_those_of_the_uninterrupted_trial(resized):
    whole = resized["whole"]
    tokens = {**resized["first"]["tokens"], **resized["shrunk"]["tokens"], **resized["grown"]["tokens"]}
    assert tokens == whole["tokens"]  # the same tokens per step on 2 workers and on 1
    assert set(tokens) == set(range(1, 11))
    assert {tokens[s] - tokens.get(s - 1, 0) for s in tokens} == {GLOBAL_BATCH * SEQ_LEN}
    # the steps before the resize ran on the same 2 ranks: bit for bit
    assert resized["first"]["losses"] == {s: whole["losses"][s] for s in (1, 2, 3, 4)}
    assert resized["grown"]["final_loss"] == pytest.approx(whole["final_loss"], rel=LOSS_RTOL)
    for step, loss in {**resized["shrunk"]["losses"], **resized["grown"]["losses"]}.items():
        assert loss == pytest.approx(whole["losses"][step], rel=LOSS_RTOL), step
