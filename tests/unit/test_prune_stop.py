"""The pruner's stop as the trainer and the sweep's store see it: a stop from outside that says
`prune` ends the trial `pruned` after its step, with no checkpoint (nothing will resume it),
while a preemption still saves one and wins over a prune; the progress events carry every
validation with its tokens whatever train.log_every is; and a rerun of the sweep skips a
pruned trial as it skips a finished one (a real sqlite MLflow store)."""

from __future__ import annotations

import json

import pytest

from conftest import probe_free_trainer, train_off_main_thread
from trainlab import names
from trainlab.config import compose_run_config
from trainlab.config.checkpoints import complete_checkpoints
from trainlab.engine import preemption
from trainlab.engine.checkpoint import Checkpointer
from trainlab.engine.run import Attempt
from trainlab.events import StepDone
from trainlab.plan.trial_plan import Where, plan_trial
from trainlab.tracking.runs import open_trial_run, trial_tags
from trainlab.tracking.sweep_runs import done_children, job_key, open_sweep_parent, unfinished_checkpoints
from trainlab.vocab.tracker import NullTracker

TINY_RUN = ["model=tiny", "data=markov", "train.max_steps=6", "train.global_batch_size=4",
            "train.micro_batch_size=4", "train.seq_len=32", "cluster.num_workers=1",
            "train.eval_every=0", "train.eval_batches=1", "cluster.device=cpu", "train.checkpoint_every=0"]


def _trainer(dist_info, overrides=(), root=None):
    trainer = probe_free_trainer([*TINY_RUN, *overrides], dist_info)
    if root is not None:
        trainer.checkpointer = Checkpointer(root, keep=3, rank=0, world_size=1, config_hash="h")
    return trainer


def _stopped_in_a_thread(dist_info, *, asks: list[str], at: int, root):
    return train_off_main_thread(lambda: _trainer(dist_info, root=root), at=at, asks=tuple(asks))


@pytest.mark.usefixtures("one_thread", "outside")
def test_a_prune_ends_the_trial_pruned_after_its_step_without_a_checkpoint(dist_info, tmp_path):
    result = _stopped_in_a_thread(dist_info, asks=[preemption.PRUNE], at=3, root=tmp_path / "p")
    assert result.status == names.STATUS_PRUNED and result.steps == 3
    assert complete_checkpoints(tmp_path / "p") == []


@pytest.mark.usefixtures("one_thread", "outside")
def test_a_prune_that_arrives_at_the_last_step_leaves_the_trial_finished(dist_info, tmp_path):
    """The driver's stop crossed the trial's end (a fast trial, a slow poll): it trained every
    step, so it finished; `pruned` would say it was cut short."""
    result = _stopped_in_a_thread(dist_info, asks=[preemption.PRUNE], at=6, root=tmp_path / "p")
    assert result.status == names.STATUS_FINISHED and result.steps == 6


@pytest.mark.usefixtures("one_thread", "outside")
def test_a_preemption_still_saves_and_wins_over_a_prune(dist_info, tmp_path):
    for asks in ([preemption.PREEMPT], [preemption.PREEMPT, preemption.PRUNE], [preemption.PRUNE, preemption.PREEMPT]):
        root = tmp_path / "_".join(asks)
        result = _stopped_in_a_thread(dist_info, asks=asks, at=2, root=root)
        assert result.status == names.STATUS_PREEMPTED and result.steps == 2, asks
        assert [c.step for c in complete_checkpoints(root)] == [2], asks


@pytest.mark.usefixtures("one_thread")
def test_progress_events_carry_every_validation_with_its_tokens(dist_info, tmp_path):
    """log_every=4, eval_every=3: the validations at steps 3 and 6 reach the driver (the pruner
    reads them) as well as the log step 4."""
    run = compose_run_config([*TINY_RUN, "train.log_every=4", "train.eval_every=3"])
    events: list = []
    trainer = _trainer(dist_info, ["train.log_every=4", "train.eval_every=3"])
    attempt = Attempt(plan_trial(run, Where(device=dist_info.device.type)), dist_info, tracker=NullTracker(),
                      root=tmp_path, trial_hash="h", progress=events.append, first=None)
    attempt.announce(trainer)
    trainer.train()
    steps = [e for e in events if isinstance(e, StepDone)]
    assert [e.step for e in steps] == [3, 4, 6]
    assert [e.step for e in steps if e.val_loss is not None] == [3, 6]
    assert [e.tokens for e in steps] == [3 * 4 * 32, 4 * 4 * 32, 6 * 4 * 32]


def test_a_rerun_skips_pruned_trials_and_never_resumes_them(tmp_path, mlflow_db, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow puts a sqlite store's artifacts under ./mlruns
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent, _ = open_sweep_parent(tracking_uri=uri, experiment="prune_rerun", sweep_name="s", sid="x",
                                  definition={})
    hashes = {}
    for status in (names.STATUS_FINISHED, names.STATUS_PRUNED, names.STATUS_PREEMPTED, names.STATUS_FAILED):
        run = compose_run_config([*TINY_RUN, "tracking.experiment=prune_rerun", f"seed={len(hashes)}"])
        root = tmp_path / status
        (root / "step_00000002").mkdir(parents=True)  # each left a periodic checkpoint
        (root / "step_00000002" / "trainlab.json").write_text(json.dumps({"step": 2, "files": {}}))
        tags = {**trial_tags(run), names.TAG_STATUS: status, names.TAG_CHECKPOINT_DIR: str(root)}
        open_trial_run(run, tracking_uri=uri, tags=tags, parent_run_id=parent)
        hashes[status] = job_key(tags)
    done = done_children(tracking_uri=uri, parent_run_id=parent)
    assert set(done) == {hashes[names.STATUS_FINISHED], hashes[names.STATUS_PRUNED]}
    resumable = unfinished_checkpoints(tracking_uri=uri, parent_run_id=parent)
    assert set(resumable) == {hashes[names.STATUS_PREEMPTED], hashes[names.STATUS_FAILED]}


def test_two_jobs_that_train_one_config_stay_two_jobs(tmp_path, mlflow_db, monkeypatch):
    """`cluster.max_failures=1,0` sweeps a field the config hash leaves out: both jobs have one hash.
    The one that failed must still count as failed in the sweep's answer, and a rerun must retry it
    rather than take the other's finished run as its own."""
    from trainlab.compare.compare_sweep import sweep_answer

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent, _ = open_sweep_parent(tracking_uri=uri, experiment="same_hash", sweep_name="s", sid="y",
                                  definition={})
    for overrides, status in (("cluster.max_failures=1", names.STATUS_FINISHED),
                              ("cluster.max_failures=0", names.STATUS_FAILED)):
        run = compose_run_config([*TINY_RUN, "tracking.experiment=same_hash", overrides])
        tags = {**trial_tags(run), names.TAG_STATUS: status, names.TAG_OVERRIDES: overrides,
                names.TAG_CONFIG_LABEL: overrides}
        open_trial_run(run, tracking_uri=uri, tags=tags, parent_run_id=parent)
    counts = dict(sweep_answer(tracking_uri=uri, parent_run_id=parent).trials_by_status)
    assert (counts[names.STATUS_FINISHED], counts[names.STATUS_FAILED]) == (1, 1)
    done = done_children(tracking_uri=uri, parent_run_id=parent)
    assert [r.data.tags[names.TAG_OVERRIDES] for r in done.values()] == ["cluster.max_failures=1"]
