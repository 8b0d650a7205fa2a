"""The one trial lifecycle (launch.lifecycle.train) on the executors that need no Ray
(launch.executors): InProcess, and Torchrun as rank 0 or another rank of its gang, recorded in a
real MLflow store (sqlite). The Ray gang's side is test_trial's and test_interrupt's."""

from __future__ import annotations

import shutil

import pytest
from mlflow.tracking import MlflowClient

from trainlab import names
from trainlab.config import compose_run_config
from trainlab.console import console
from trainlab.events import TrialResult
from trainlab.launch.executors import InProcess, Torchrun
from trainlab.launch.lifecycle import train

STEPS = 3
TINY = ["model=tiny", "data=markov", f"train.max_steps={STEPS}", "train.global_batch_size=4",
        "train.micro_batch_size=2", "train.seq_len=32", "train.eval_every=0", "cluster.num_workers=1",
        "cluster.device=cpu", "tracking.system_metrics=false"]


@pytest.fixture(scope="module")
def store(tmp_path_factory, store_template) -> str:
    """One sqlite store for the module, its schema made once (conftest.store_template); an
    experiment per test."""
    return f"sqlite:///{shutil.copyfile(store_template, tmp_path_factory.mktemp('store') / 'mlflow.db')}"


@pytest.fixture
def experiment(request) -> str:
    return request.node.name


def _run(tmp_path, store: str, experiment: str):
    return compose_run_config([*TINY, f"tracking.uri={store}", f"tracking.experiment={experiment}",
                               f"output_dir={tmp_path / 'out'}"])


def _runs(store: str, experiment: str) -> list:
    client = MlflowClient(tracking_uri=store)
    found = client.get_experiment_by_name(experiment)
    return client.search_runs([found.experiment_id]) if found else []


def test_an_in_process_trial_lands_in_its_run_and_prints_its_summary(tmp_path, store, experiment):
    with console.capture() as cap:
        outcome = train(_run(tmp_path, store, experiment), executor=InProcess())
    assert outcome.status == names.STATUS_FINISHED, outcome.error
    assert outcome.result.steps == STEPS and outcome.last_step == STEPS
    (mrun,) = _runs(store, experiment)
    assert mrun.info.run_id == outcome.run_id
    assert mrun.info.status == "FINISHED"
    assert mrun.data.tags[names.TAG_STATUS] == names.STATUS_FINISHED
    assert mrun.data.tags[names.TAG_WORLD_SIZE] == "1"
    client = MlflowClient(tracking_uri=outcome.tracking_uri)
    assert [m.step for m in client.get_metric_history(outcome.run_id, names.LOSS)] == list(range(1, STEPS + 1))
    printed = cap.get()
    assert "trial tiny-fp32-ddp1-s0" in printed and outcome.run_id in printed  # the summary, with its run


def _fails_after_rank0_opened(plan, *, tracker_factory, progress, **_):
    tracker_factory(None, False).close()  # rank 0 started tracking: its run is open
    raise RuntimeError("rank 0 fell over")


def test_a_failed_in_process_trial_is_its_outcome_and_its_run_ends_failed(tmp_path, store, experiment, monkeypatch):
    import trainlab.engine.run

    monkeypatch.setattr(trainlab.engine.run, "run_trial", _fails_after_rank0_opened)
    with console.capture() as cap:
        outcome = train(_run(tmp_path, store, experiment), executor=InProcess())
    assert outcome.status == names.STATUS_FAILED
    assert outcome.error == "RuntimeError: rank 0 fell over"
    (mrun,) = _runs(store, experiment)
    assert mrun.info.status == "FAILED" and mrun.data.tags[names.TAG_ERROR] == outcome.error
    assert "rank 0 fell over" in cap.get()  # in the summary's status row


def test_an_in_process_trial_that_fails_before_its_run_opened_is_still_summarised(tmp_path, store, experiment,
                                                                                 monkeypatch):
    """This process is the trial's driver: its failure is the outcome and the summary says it."""
    import trainlab.engine.run

    def fails_at_once(plan, **_):
        raise RuntimeError("no model")

    monkeypatch.setattr(trainlab.engine.run, "run_trial", fails_at_once)
    with console.capture() as cap:
        outcome = train(_run(tmp_path, store, experiment), executor=InProcess())
    assert outcome.status == names.STATUS_FAILED and outcome.run_id is None
    assert _runs(store, experiment) == []
    assert "no model" in cap.get()


def test_a_torchrun_rank_closes_its_run_failed_and_raises(tmp_path, store, experiment, monkeypatch):
    """A rank's error ends its process (torchrun reports it), after rank 0 closed the run."""
    import trainlab.engine.run

    monkeypatch.setattr(trainlab.engine.run, "run_trial", _fails_after_rank0_opened)
    with pytest.raises(RuntimeError, match="rank 0 fell over"):
        train(_run(tmp_path, store, experiment), executor=Torchrun())
    (mrun,) = _runs(store, experiment)
    assert mrun.info.status == "FAILED"
    assert mrun.data.tags[names.TAG_ERROR] == "RuntimeError: rank 0 fell over"


def test_a_torchrun_rank_other_than_0_only_executes(tmp_path, store, experiment, monkeypatch):
    """No tracker asked for (rank 0 alone makes one): no run, no summary, the result as it came."""
    import trainlab.engine.run

    result = TrialResult(status=names.STATUS_FINISHED, steps=STEPS, tokens_seen=0, final_loss=1.0,
                         final_val_loss=1.5, tokens_per_s=0.0, mfu=None, peak_mem_gb=0.0, skipped_steps=0,
                         nonfinite_steps=0, loss_spikes=0, elapsed_s=0.0)
    monkeypatch.setattr(trainlab.engine.run, "run_trial", lambda plan, **_: result)
    with console.capture() as cap:
        outcome = train(_run(tmp_path, store, experiment), executor=Torchrun())
    assert outcome.status == names.STATUS_FINISHED and outcome.result is result
    assert outcome.run_id is None
    assert _runs(store, experiment) == []
    assert "trial tiny" not in cap.get()
