"""A resume with another train.max_steps goes on in a run of its own: the run it left keeps what
it logged (marked as continued), the new run holds the history up to the checkpoint and then only
what the resumed trial trains, so its last loss, val loss, learning rate and train.max_steps param
are the trained model's. The same config resumed goes on in its run, as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainlab import names
from trainlab.config import compose_run_config
from trainlab.config.checkpoints import step_dir
from trainlab.tracking.continued_run import open_or_resume_trial_run


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return f"sqlite:///{tmp_path_factory.mktemp('store')}/mlflow.db"


def _killed_attempt(store: str, root: Path, *, max_steps: int, logged_to: int, checkpoint: int):
    """A trial's first attempt: its run, the steps it logged (past its last checkpoint), killed."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    run = compose_run_config(["model=tiny", f"train.max_steps={max_steps}"])
    trial, reopened = open_or_resume_trial_run(run, tracking_uri=store, tags={}, root=root, resuming=False)
    assert not reopened
    client = MlflowClient(tracking_uri=store)
    client.log_batch(trial.run_id, metrics=[Metric(key, 10.0 - s / 100, 0, s) for s in range(1, logged_to + 1)
                                            for key in (names.LOSS, names.LR)])
    client.log_batch(trial.run_id, metrics=[Metric(names.VAL_LOSS, 5.0, 0, s) for s in (50, logged_to - 9)])
    done = step_dir(root, checkpoint)
    done.mkdir(parents=True)
    (done / "trainlab.json").write_text("{}")
    return client, trial


def test_a_resume_with_another_max_steps_continues_in_a_run_of_its_own(store, tmp_path):
    root = tmp_path / "checkpoints"
    client, old = _killed_attempt(store, root, max_steps=200, logged_to=179, checkpoint=150)
    shorter = compose_run_config(["model=tiny", "train.max_steps=160"])
    new, reopened = open_or_resume_trial_run(shorter, tracking_uri=store, tags={}, root=root, resuming=True)
    assert not reopened and new.run_id != old.run_id
    run = client.get_run(new.run_id)
    assert run.data.params["train.max_steps"] == "160"
    assert run.data.tags[names.TAG_CONTINUES] == old.run_id
    loss = client.get_metric_history(new.run_id, names.LOSS)
    assert [m.step for m in loss] == list(range(1, 151))  # up to the checkpoint, not the thrown-away 151..179
    assert max(m.step for m in client.get_metric_history(new.run_id, names.VAL_LOSS)) == 50
    left = client.get_run(old.run_id)
    assert left.info.status == "KILLED" and left.data.tags[names.TAG_CONTINUED_IN] == new.run_id
    assert "from the checkpoint of step 150 with train.max_steps 200 -> 160" in left.data.tags[names.TAG_NOTE]
    assert len(client.get_metric_history(old.run_id, names.LOSS)) == 179  # what it logged stays
    # the next resume of the new config goes on in the new run
    again, reopened = open_or_resume_trial_run(shorter, tracking_uri=store, tags={}, root=root, resuming=True)
    assert reopened and again.run_id == new.run_id


def test_the_same_config_resumed_goes_on_in_its_run(store, tmp_path):
    root = tmp_path / "checkpoints"
    client, old = _killed_attempt(store, root, max_steps=200, logged_to=179, checkpoint=150)
    same = compose_run_config(["model=tiny", "train.max_steps=200"])
    trial, reopened = open_or_resume_trial_run(same, tracking_uri=store, tags={}, root=root, resuming=True)
    assert reopened and trial.run_id == old.run_id
    assert names.TAG_CONTINUED_IN not in client.get_run(old.run_id).data.tags
