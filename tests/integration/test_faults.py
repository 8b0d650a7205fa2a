"""Faults a long trial meets, injected into real runs: `trainlab train -m` on local Ray against a
real `mlflow server` process. A worker SIGKILLed (restarted from its checkpoint within
cluster.max_failures, failed past it, and the sweep goes on), the sweep driver SIGKILLed (a
rerun resumes the unfinished trial into its run), a truncated checkpoint (refused). Each
asserts what MLflow holds afterwards: one run per trial, every step exactly once."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from conftest import kill_what_ray_left, trainlab_cmd
from trainlab import names
from trainlab.config.checkpoints import complete_checkpoints, latest_checkpoint

pytestmark = [pytest.mark.ray, pytest.mark.slow]

TRIAL = ["model=tiny", "data=markov", "train.global_batch_size=8", "train.micro_batch_size=2",
         "train.seq_len=32", "train.eval_every=0", "train.numerics_every=0", "train.checkpoint_every=3",
         "tracking.system_metrics=false"]


@pytest.fixture
def ray_tmp():
    """The test's own Ray temp root (short: Ray's socket paths must fit 107 bytes), so what a
    killed driver leaves behind is found by its path and removed."""
    path = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))
    yield path
    kill_what_ray_left(path)
    shutil.rmtree(path, ignore_errors=True)


def _env(uri: str, ray_tmp: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update(MLFLOW_TRACKING_URI=uri, PYTHONUNBUFFERED="1", COLUMNS="200", RAY_TMPDIR=str(ray_tmp))
    return env


def _trainlab(args, *, cwd, uri, ray_tmp, timeout=600):
    return subprocess.run(trainlab_cmd(*args), cwd=cwd, env=_env(uri, ray_tmp), capture_output=True, text=True,
                          timeout=timeout)


def _children(client: MlflowClient, experiment: str) -> list:
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id], filter_string=f"tags.`{names.TAG_ROLE}` = '{names.ROLE_TRIAL}'")


def _steps(client: MlflowClient, run_id: str, key: str = names.LOSS) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def test_a_killed_worker_restarts_from_its_checkpoint_within_the_limit(mlflow_server, tmp_path, ray_tmp):
    """One sweep, rank 1 SIGKILLed after step 5 in both trials: with no restart allowed the
    trial fails with the reason; with one, Ray restarts the gang from step 3's checkpoint and
    the trial finishes in the same run, every step logged once."""
    exp = "faults_worker"
    proc = _trainlab(["train", "-m", *TRIAL, "train.max_steps=8", "debug.inject_fault=sigkill@5:1",
                      "cluster.max_failures=0,1", f"tracking.experiment={exp}", f"sweep_name={exp}"],
                     cwd=tmp_path, uri=mlflow_server.uri, ray_tmp=ray_tmp)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]  # one trial failed; the sweep still ran both
    assert "1 of 2 trials failed" in out
    client = MlflowClient(tracking_uri=mlflow_server.uri)
    runs = {r.data.params["cluster.max_failures"]: r for r in _children(client, exp)}
    assert sorted(runs) == ["0", "1"]  # one run per trial: the restart went on in its own

    failed, restarted = runs["0"], runs["1"]
    assert failed.data.tags[names.TAG_STATUS] == names.STATUS_FAILED
    assert failed.data.tags[names.TAG_ERROR]  # Ray Train's reason: a worker died
    assert failed.info.status == "FAILED"

    assert restarted.data.tags[names.TAG_STATUS] == names.STATUS_FINISHED, restarted.data.tags
    assert restarted.data.tags[names.TAG_RESUMED_FROM].endswith("step_00000003")
    assert _steps(client, restarted.info.run_id) == list(range(1, 9))  # no gap, no duplicate
    assert [m.value for m in client.get_metric_history(restarted.info.run_id, names.RESTARTS)] == [0, 1]
    assert "resumed from" in out

    # ---- a checkpoint truncated on disk is refused before any worker starts ----
    root = Path(restarted.data.tags[names.TAG_CHECKPOINT_DIR])
    latest = sorted(root.glob("step_*"))[-1]
    shard = next(latest.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:100])
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    proc = _trainlab(["train", *TRIAL, "train.max_steps=8", f"train.resume={latest}",
                      f"tracking.experiment={exp}"], cwd=tmp_path, uri=mlflow_server.uri, ray_tmp=ray_tmp)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"{shard.name} should have" in proc.stderr and "Traceback" not in proc.stdout + proc.stderr
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == before  # left as it was
    assert len(_children(client, exp)) == 2  # and no run was opened for it


def test_a_rerun_of_a_killed_sweep_resumes_its_unfinished_trial(mlflow_server, tmp_path, ray_tmp):
    """(MLFLOW_TRACKING_URI picks the store, as for every MLflow client.) SIGKILL the sweep
    driver once trial #0 has a complete checkpoint; the same command again skips
    nothing finished, resumes #0 from its latest complete checkpoint into its run, then runs #1."""
    exp = "faults_driver"
    # 3x slower steps: the kill lands mid-trial, after the first checkpoint and before the end
    args = ["train", "-m", *TRIAL, "train.max_steps=24", "debug.slowdown=[3,3]", "seed=0,1",
            "hydra.launcher.max_concurrent_trials=1",
            f"tracking.experiment={exp}", f"sweep_name={exp}"]
    driver = subprocess.Popen(trainlab_cmd(*args), cwd=tmp_path, env=_env(mlflow_server.uri, ray_tmp),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    # complete, not merely begun: a `step_N.tmp` being written is no checkpoint to resume from
    while not [c for root in tmp_path.glob("multirun/*/*/0/checkpoints") for c in complete_checkpoints(root)]:
        assert driver.poll() is None, driver.stdout.read()[-4000:]
        assert time.monotonic() < deadline, "no complete checkpoint of trial #0 within 300 s"
        time.sleep(0.5)
    driver.send_signal(signal.SIGKILL)
    driver.wait(timeout=30)
    driver.stdout.close()
    kill_what_ray_left(ray_tmp)  # the gang too: a worker left running would go on checkpointing
    (root,) = tmp_path.glob("multirun/*/*/0/checkpoints")
    kept = latest_checkpoint(root)  # the newest one the kill left whole: the rerun must start there
    assert kept is not None and 0 < kept.step < 24, kept
    client = MlflowClient(tracking_uri=mlflow_server.uri)
    (first,) = _children(client, exp)
    assert first.data.tags[names.TAG_STATUS] == names.STATUS_RUNNING  # nobody closed it
    logged = _steps(client, first.info.run_id)

    proc = _trainlab(args, cwd=tmp_path, uri=mlflow_server.uri, ray_tmp=ray_tmp)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "1 unfinished trials resume from their checkpoints" in out
    runs = {r.data.params["seed"]: r for r in _children(client, exp)}
    assert sorted(runs) == ["0", "1"]
    resumed = runs["0"]
    assert resumed.info.run_id == first.info.run_id  # the same run, continued
    assert resumed.data.tags[names.TAG_STATUS] == names.STATUS_FINISHED
    assert resumed.data.tags[names.TAG_RESUMED_FROM] == str(kept.path)  # not a fresh start from step 0
    assert f"resumed from {kept.path} at step {kept.step}" in out, out[-4000:]
    assert _steps(client, resumed.info.run_id) == list(range(1, 25))  # no gap, no duplicate
    assert logged and logged == list(range(1, len(logged) + 1))
    assert runs["1"].data.tags[names.TAG_STATUS] == names.STATUS_FINISHED


def test_a_diverged_trial_rolls_back_and_retries_with_a_lower_learning_rate(mlflow_server, tmp_path, ray_tmp):
    """A sweep of the divergence policy on a learning rate that wrecks the model: `stop` ends
    diverged; `rollback` goes back to its last checkpoint (every 3 steps), retries at lr x1e-6
    and finishes, and the sweep summary and the trial's MLflow run say so."""
    exp = "faults_rollback"
    proc = _trainlab(["train", "-m", *TRIAL, "train.max_steps=12", "optim.lr=1000", "train.on_divergence=stop,rollback",
                      "train.rollback_lr_factor=1e-6", f"tracking.experiment={exp}", f"sweep_name={exp}"],
                     cwd=tmp_path, uri=mlflow_server.uri, ray_tmp=ray_tmp)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]  # a diverged trial is a result, not a failure
    client = MlflowClient(tracking_uri=mlflow_server.uri)
    runs = {r.data.params["train.on_divergence"]: r for r in _children(client, exp)}
    stopped, retried = runs["stop"], runs["rollback"]
    assert stopped.data.tags[names.TAG_STATUS] == names.STATUS_DIVERGED
    diverged_at = int(stopped.data.tags[names.TAG_DIVERGED_STEP])
    back_to = (diverged_at - 1) // 3 * 3  # the last checkpoint before it
    assert back_to > 0, diverged_at
    assert f"rolled back to step {back_to}, retry 1 of 2" in out, out[-4000:]
    assert "finished (rolled back 1x)" in out, out[-4000:]
    assert retried.data.tags[names.TAG_STATUS] == names.STATUS_FINISHED and retried.info.status == "FINISHED"
    assert retried.data.tags[names.TAG_ROLLBACKS] == f"step {diverged_at} -> {back_to} (lr x1e-06)"
    assert [(m.step, m.value) for m in client.get_metric_history(retried.info.run_id, names.ROLLBACKS)] \
        == [(back_to, 1.0)]
    # the diverged attempt's steps stay on record beside the retry's, which go on to the end
    assert _steps(client, retried.info.run_id) == sorted([*range(1, diverged_at + 1), *range(back_to + 1, 13)])
