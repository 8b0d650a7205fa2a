"""The divergence policy's rollback on gloo (2 ranks): a diverged trial goes back to its last
checkpoint (or the start), retries with a lower learning rate or in a higher precision, and
says so in its metrics and tags; a worker restarted after a rollback resumes in the retry's
state; past train.max_rollbacks the trial ends diverged after all."""

from __future__ import annotations

import json

import pytest

from conftest import RecordingTracker, rank_env, reporting_to, spawn_ranks
from trainlab import names
from trainlab.plan.here import plan_here

pytestmark = pytest.mark.distributed

TINY = ["model=tiny", "data=markov", "train.global_batch_size=8", "train.micro_batch_size=2",
        "train.seq_len=32", "train.eval_every=0", "train.eval_batches=2", "optim.warmup_steps=2",
        "train.numerics_every=0", "cluster.device=cpu"]
# an Adam step of lr 1000 wrecks the weights; their gradients overflow fp32 a few steps later
TOO_HIGH = ["optim.lr=1000", "train.max_steps=12", "train.checkpoint_every=0"]
ROLLBACK = ["train.on_divergence=rollback"]
# fp8 attempt poisoned at step 5 (an injected NaN, as a transient fault); checkpoints at 2, 4, 6
FP8 = ["precision=fp8_delayed", "precision.keep_hp=[output,unaligned]", "train.max_steps=8", "train.checkpoint_every=2",
       "debug.inject_nan=layers.0.feed_forward@5", *ROLLBACK, "train.rollback_lr_factor=1",
       "train.rollback_precision=fp32"]

TRIALS = {
    "stop": TOO_HIGH,
    "lower_lr": [*TOO_HIGH, *ROLLBACK, "train.rollback_lr_factor=1e-6"],
    "exhausted": [*TOO_HIGH, *ROLLBACK, "train.rollback_lr_factor=0.5", "train.max_rollbacks=1"],
    "fp32": [*FP8, "cut=fp32"],
    "fp32_stopped": [*FP8, "cut=restart", "debug.inject_fault=sigterm@6"],
    "fp32_restarted": [*FP8, "cut=restart"],
}


def _trials(rank: int, world: int, port: int, out, root: str) -> None:
    """One rank of every trial in TRIALS (one process group); rank 0 reports each one."""
    rank_env(rank, world, port)

    from trainlab.config import compose_run_config
    from trainlab.engine.run import run_trial

    reports = {}
    with reporting_to(out):
        for name, overrides in TRIALS.items():
            cut = next((o.split("=")[1] for o in overrides if o.startswith("cut=")), name)
            overrides = [o for o in overrides if not o.startswith("cut=")]
            run = compose_run_config([*TINY, *overrides, f"train.checkpoint_dir={root}/{cut}",
                                      f"cluster.num_workers={world}"])
            tracker = RecordingTracker()
            result = run_trial(plan_here(run), tracker_factory=lambda *_, t=tracker: t)
            reports[name] = dict(status=result.status, steps=result.steps, rollbacks=result.rollbacks,
                                 diverged_step=result.diverged_step, final_loss=result.final_loss,
                                 losses=tracker.series(names.LOSS), lrs=tracker.series(names.LR),
                                 marks=tracker.by_step(names.ROLLBACKS), tags=tracker.tags,
                                 sha=result.extra[names.TAG_PARAMS_SHA])
        if rank == 0:
            out.put(reports)


@pytest.fixture(scope="module")
def trials(tmp_path_factory):
    root = tmp_path_factory.mktemp("rollback")
    (got,) = spawn_ranks(_trials, 2, str(root), timeout=600)
    assert isinstance(got, dict), got
    return root, got


def test_a_diverged_trial_retries_from_the_start_with_a_lower_learning_rate(trials):
    _, got = trials
    stop, retried = got["stop"], got["lower_lr"]
    assert stop["status"] == names.STATUS_DIVERGED  # the policy's default: stop at once
    diverged_at = stop["diverged_step"]
    assert 1 < diverged_at < 12
    assert retried["status"] == names.STATUS_FINISHED and retried["steps"] == 12
    assert retried["rollbacks"] == 1 and retried["marks"] == {0: 1.0}  # no checkpoint: from step 0
    assert retried["tags"][names.TAG_ROLLBACKS] == f"step {diverged_at} -> 0 (lr x1e-06)"
    # the run keeps the diverged attempt's steps, then the retry's from step 1 again
    steps = [s for s, _ in retried["losses"]]
    assert steps == [*range(1, diverged_at + 1), *range(1, 13)]
    first, retry = retried["lrs"][:diverged_at], retried["lrs"][diverged_at:]
    assert [s for s, _ in retry][:2] == [1, 2]
    for (_, lr0), (_, lr1) in zip(first, retry):
        assert lr1 == pytest.approx(lr0 * 1e-6)
    assert all(abs(v) < 10 for _, v in retried["losses"][diverged_at:])  # it trains now


def test_a_trial_that_keeps_diverging_ends_diverged_after_max_rollbacks(trials):
    _, got = trials
    exhausted = got["exhausted"]
    assert exhausted["status"] == names.STATUS_DIVERGED and exhausted["rollbacks"] == 1
    assert exhausted["tags"][names.TAG_ROLLBACKS].endswith("(lr x0.5)")


def test_a_diverged_fp8_trial_rolls_back_to_its_checkpoint_and_retries_in_fp32(trials):
    root, got = trials
    r = got["fp32"]
    assert r["status"] == names.STATUS_FINISHED and r["steps"] == 8 and r["rollbacks"] == 1
    assert r["tags"][names.TAG_ROLLBACKS] == "step 5 -> 4 (fp32)"
    assert r["marks"] == {4: 1.0}
    assert [s for s, _ in r["losses"]] == [1, 2, 3, 4, 5, 5, 6, 7, 8]
    assert r["losses"][4][1] != r["losses"][4][1]  # NaN: the diverged step stays on record
    # the retry's checkpoints say what they were trained in, for a worker restarted later
    meta = json.loads((root / "fp32" / "step_00000006" / "trainlab.json").read_text())
    assert meta["precision"] == "fp32" and meta["rollback"]["count"] == 1


def test_a_worker_restarted_after_a_rollback_resumes_in_the_retrys_precision(trials):
    _, got = trials
    stopped, restarted, whole = got["fp32_stopped"], got["fp32_restarted"], got["fp32"]
    assert stopped["status"] == names.STATUS_PREEMPTED and stopped["steps"] == 6
    assert restarted["status"] == names.STATUS_FINISHED and restarted["rollbacks"] == 1
    assert [s for s, _ in restarted["losses"]] == [7, 8]  # on from the retry's step-6 checkpoint
    # in fp32 with the rollback's state: bit for bit the trial that was never stopped
    assert restarted["final_loss"] == whole["final_loss"] and restarted["sha"] == whole["sha"]
