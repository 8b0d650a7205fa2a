"""The two halves of an interrupted trial that need no Ray: a trainer running off the main
thread (as in a Ray Train worker, where no signal handler can be installed) stops after its
step when the launcher asks from outside; and a rerun of `trainlab train` finds the unfinished
trial of its config in the MLflow store (a real sqlite store), and only where it should."""

from __future__ import annotations

import json

import pytest

from conftest import probe_free_trainer, train_off_main_thread
from trainlab import names
from trainlab.config import compose_run_config
from trainlab.engine import preemption
from trainlab.tracking.continued_run import unfinished_trial
from trainlab.tracking.runs import open_trial_run, trial_tags

TINY_RUN = ["model=tiny", "data=markov", "train.max_steps=6", "train.global_batch_size=4",
            "train.micro_batch_size=4", "train.seq_len=32", "cluster.num_workers=1",
            "train.eval_every=0", "train.eval_batches=1", "cluster.device=cpu"]


def _train_in_a_thread(dist_info, *, listen: bool, stop_at: int):
    return train_off_main_thread(lambda: probe_free_trainer(TINY_RUN, dist_info), at=stop_at,
                                 asks=(preemption.PREEMPT,), listen=listen)


@pytest.mark.usefixtures("one_thread", "outside")
def test_a_trainer_off_the_main_thread_stops_when_asked_from_outside(dist_info):
    result = _train_in_a_thread(dist_info, listen=True, stop_at=2)
    assert result.status == names.STATUS_PREEMPTED and result.steps == 2


@pytest.mark.usefixtures("one_thread", "outside")
def test_without_listening_an_outside_request_is_not_read(dist_info):
    """Off the main thread and not listening (torchrun's ranks listen to SIGTERM instead), the
    trainer does not read a request from outside and trains to its end."""
    result = _train_in_a_thread(dist_info, listen=False, stop_at=2)
    assert result.status == names.STATUS_FINISHED and result.steps == 6


# ---------------------------------------------------------------- finding the unfinished trial
def _trial(uri: str, run, root, *, status: str, ckpt_step: int | None, parent: str | None = None) -> str:
    """A trial's run as launch.lifecycle leaves it, with a complete checkpoint folder (or none)."""
    tags = {**trial_tags(run), names.TAG_CHECKPOINT_DIR: str(root), names.TAG_STATUS: status}
    trial = open_trial_run(run, tracking_uri=uri, tags=tags, parent_run_id=parent)
    if ckpt_step is not None:
        step = root / f"step_{ckpt_step:08d}"
        step.mkdir(parents=True)
        (step / "trainlab.json").write_text(json.dumps({"step": ckpt_step, "files": {}}))
    return trial.run_id


def test_a_rerun_finds_the_newest_unfinished_single_trial_of_its_config(tmp_path, mlflow_db, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow puts a sqlite store's artifacts under ./mlruns
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = compose_run_config([*TINY_RUN, "tracking.experiment=rerun", f"output_dir={tmp_path / 'new'}"])
    other = compose_run_config([*TINY_RUN, "tracking.experiment=rerun", "seed=7"])
    assert unfinished_trial(run, tracking_uri=uri, parent_run_id=None) is None  # no experiment yet

    _trial(uri, run, tmp_path / "a", status=names.STATUS_PREEMPTED, ckpt_step=4)
    wanted = _trial(uri, run, tmp_path / "b", status=names.STATUS_FAILED, ckpt_step=3)  # newest unfinished
    parent = _trial(uri, other, tmp_path / "parent", status=names.STATUS_RUNNING, ckpt_step=None)
    _trial(uri, run, tmp_path / "c", status=names.STATUS_PREEMPTED, ckpt_step=5, parent=parent)  # a sweep's
    _trial(uri, other, tmp_path / "d", status=names.STATUS_PREEMPTED, ckpt_step=5)  # another config
    _trial(uri, run, tmp_path / "e", status=names.STATUS_PREEMPTED, ckpt_step=None)  # nothing to resume
    _trial(uri, run, tmp_path / "f", status=names.STATUS_FINISHED, ckpt_step=5)  # done

    found = unfinished_trial(run, tracking_uri=uri, parent_run_id=None)
    assert (found.run_id, found.root, found.step) == (wanted, tmp_path / "b", 3)

    # where it does not look: the opt-out, an explicit folder, a sweep's trial, and a trial whose
    # own folder (a fixed output_dir) already holds a checkpoint
    assert unfinished_trial(compose_run_config([*TINY_RUN, "tracking.experiment=rerun", "train.resume=never"]),
                            tracking_uri=uri, parent_run_id=None) is None
    assert unfinished_trial(compose_run_config([*TINY_RUN, "tracking.experiment=rerun",
                                                f"train.checkpoint_dir={tmp_path / 'x'}"]),
                            tracking_uri=uri, parent_run_id=None) is None
    assert unfinished_trial(run, tracking_uri=uri, parent_run_id=parent) is None
    (tmp_path / "new" / "checkpoints" / "step_00000001").mkdir(parents=True)
    (tmp_path / "new" / "checkpoints" / "step_00000001" / "trainlab.json").write_text("{}")
    assert unfinished_trial(run, tracking_uri=uri, parent_run_id=None) is None


# issue 28: signals ------------------------------------------------------------------------
def _dead_process_id() -> str:
    """The process id ('HOST PID START') of a process that has ended: a SIGKILLed driver's."""
    import subprocess

    from trainlab.vocab.processes import process_id

    gone = subprocess.Popen(["sleep", "30"])
    dead = process_id(gone.pid)
    gone.kill()
    gone.wait()
    return dead


@pytest.mark.slow  # a sqlite MLflow store with three runs: seconds on a loaded machine
def test_the_next_start_ends_a_run_its_sigkilled_driver_left_running(tmp_path, mlflow_db, monkeypatch):
    """SIGKILL cannot be handled: the driver's run stays RUNNING and its cut-off save leaves a
    step_N.tmp. The next start of the same config ends that run FAILED with a note and removes
    the .tmp; a run whose driver still runs, and the run this start goes on in, stay RUNNING."""

    from mlflow.tracking import MlflowClient

    from trainlab.tracking.continued_run import end_orphaned_runs
    from trainlab.vocab.processes import process_id

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = compose_run_config([*TINY_RUN, "tracking.experiment=orphans"])
    dead_driver = _dead_process_id()

    def left_running(name: str, driver: str, *, ckpt_step: int | None = None) -> str:
        run_id = _trial(uri, run, tmp_path / name, status=names.STATUS_RUNNING, ckpt_step=ckpt_step)
        MlflowClient(tracking_uri=uri).set_tag(run_id, names.TAG_DRIVER, driver)
        (tmp_path / name / "step_00000007.tmp").mkdir(parents=True)
        return run_id

    orphan = left_running("killed", dead_driver)
    continued = left_running("continued", dead_driver, ckpt_step=5)
    alive = left_running("alive", process_id())
    said = end_orphaned_runs(run, tracking_uri=uri, keep=continued)

    client = MlflowClient(tracking_uri=uri)
    ended = client.get_run(orphan)
    assert ended.info.status == "FAILED" and ended.data.tags[names.TAG_STATUS] == names.STATUS_FAILED
    assert "ended without closing it (SIGKILL or a crash)" in ended.data.tags[names.TAG_ERROR]
    assert said == [f"run {orphan} was left RUNNING: {ended.data.tags[names.TAG_ERROR]}; marked FAILED"]
    assert client.get_run(continued).info.status == "RUNNING" and client.get_run(alive).info.status == "RUNNING"
    assert not list((tmp_path / "killed").glob("*.tmp")) and not list((tmp_path / "continued").glob("*.tmp"))
    assert list((tmp_path / "alive").glob("*.tmp"))  # a live driver's save in progress is never touched


@pytest.mark.slow  # a sqlite MLflow store with seven runs: seconds on a loaded machine
def test_a_sweeps_rerun_ends_the_runs_its_sigkilled_driver_left_running(tmp_path, mlflow_db, monkeypatch):
    """The sweep's side of the same: of the runs of one sweep left RUNNING, the rerun ends FAILED
    the trial it does not resume, and a parent of the sweep it does not continue with its trial
    (a checkpoint under that parent is not resumed); it goes on in the parent it found and the
    trial it resumes; a trial whose driver runs, or ran on another host, is never touched."""

    from mlflow.tracking import MlflowClient

    from trainlab.tracking.sweep_runs import end_orphaned_sweep_runs, open_sweep_parent
    from trainlab.vocab.processes import process_id

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = compose_run_config([*TINY_RUN, "tracking.experiment=orphans"])
    dead = _dead_process_id()
    client = MlflowClient(tracking_uri=uri)
    sweep = {"tracking_uri": uri, "experiment": "orphans", "sweep_name": "s", "sid": "abc", "definition": {}}
    parent, _ = open_sweep_parent(**sweep)
    client.set_tag(parent, names.TAG_DRIVER, dead)
    other = client.create_run(client.get_run(parent).info.experiment_id, tags={  # a later parent of the same sweep
        names.TAG_ROLE: names.ROLE_SWEEP, names.TAG_SWEEP_ID: "abc", names.TAG_DRIVER: dead}).info.run_id

    def left_running(name: str, under: str, driver: str, *, ckpt_step: int | None = None) -> str:
        run_id = _trial(uri, run, tmp_path / name, status=names.STATUS_RUNNING, ckpt_step=ckpt_step, parent=under)
        client.set_tag(run_id, names.TAG_DRIVER, driver)
        (tmp_path / name / "step_00000007.tmp").mkdir(parents=True)
        return run_id

    cut_off = left_running("cut_off", parent, dead)
    resumed = left_running("resumed", parent, dead, ckpt_step=3)
    alive = left_running("alive", parent, process_id())
    far = left_running("far", parent, f"elsewhere.example {dead.split()[1]} 1")
    stray = left_running("stray", other, dead, ckpt_step=3)

    assert open_sweep_parent(**sweep) == (parent, True)  # the rerun goes on in the first parent
    said = end_orphaned_sweep_runs(tracking_uri=uri, sid="abc", parent_run_id=parent,
                                   resumed_roots={str(tmp_path / "resumed")})

    status = {k: client.get_run(v).info.status for k, v in
              {"parent": parent, "other": other, "cut_off": cut_off, "resumed": resumed, "alive": alive,
               "far": far, "stray": stray}.items()}
    assert status == {"parent": "RUNNING", "other": "FAILED", "cut_off": "FAILED", "resumed": "RUNNING",
                      "alive": "RUNNING", "far": "RUNNING", "stray": "FAILED"}
    note = client.get_run(cut_off).data.tags[names.TAG_ERROR]
    assert "ended without closing it" in note and note.endswith("ended by the next start of its sweep")
    assert sorted(said) == sorted(f"run {r} was left RUNNING: {note}; marked FAILED" for r in (cut_off, stray, other))
    assert [n for n in ("cut_off", "resumed", "alive", "far", "stray") if list((tmp_path / n).glob("*.tmp"))] \
        == ["alive", "far"]  # a gone driver's cut-off saves removed; a live or far one's never touched
