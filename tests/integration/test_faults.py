"""Faults a long trial meets, injected into real runs: `trainlab train -m` on local Ray against a
real `mlflow server` process. A worker SIGKILLed (restarted from its checkpoint within
cluster.max_failures, failed past it, and the sweep goes on), a truncated checkpoint (refused), a
diverged trial (rolled back). Each asserts what MLflow holds afterwards: one run per trial, every
step exactly once. (The sweep driver SIGKILLed and its rerun resuming the unfinished trial into its
run: test_interrupt.py's SIGKILLed-sweep test, which holds that claim since 2026-12-07.)"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from conftest import kill_what_ray_left, trainlab_cmd
from trainlab import names

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
    # the parent's row: no winner (nothing finished with a validation loss to be ok), but the counts
    # (test_sweep's failing-trial test held these until 2026-12-07: the same sweep, run twice)
    (parent,) = client.search_runs([failed.info.experiment_id], f"tags.`{names.TAG_ROLE}` = '{names.ROLE_SWEEP}'")
    assert parent.data.tags[names.TAG_BEST_CONFIG] == "none"
    assert parent.data.tags[names.TAG_SWEEP_RESULT].startswith("no configuration is ok"), parent.data.tags
    assert parent.data.metrics[names.trials_metric(names.STATUS_FAILED)] == 1

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


def test_a_diverged_trial_rolls_back_and_retries_with_a_lower_learning_rate(mlflow_server, tmp_path, ray_tmp):
    """A learning rate that wrecks the model under on_divergence=rollback: the trial goes back to
    its last checkpoint (every 3 steps), retries at lr x1e-6 and finishes, and the sweep summary
    and the trial's MLflow run say so. (`stop`, the default, ending the trial diverged at that
    learning rate: test_ray_launcher.py's lr=1000 trial, since 2026-12-07 one trial fewer here.)"""
    exp = "faults_rollback"
    proc = _trainlab(["train", "-m", *TRIAL, "train.max_steps=12", "optim.lr=1000", "train.on_divergence=rollback",
                      "train.rollback_lr_factor=1e-6", f"tracking.experiment={exp}", f"sweep_name={exp}"],
                     cwd=tmp_path, uri=mlflow_server.uri, ray_tmp=ray_tmp)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    client = MlflowClient(tracking_uri=mlflow_server.uri)
    (retried,) = _children(client, exp)
    rolled = re.fullmatch(r"step (\d+) -> (\d+) \(lr x1e-06\)", retried.data.tags[names.TAG_ROLLBACKS])
    assert rolled, retried.data.tags[names.TAG_ROLLBACKS]
    diverged_at, back_to = int(rolled[1]), int(rolled[2])
    assert back_to == (diverged_at - 1) // 3 * 3 > 0, (diverged_at, back_to)  # the last checkpoint before it
    assert f"rolled back to step {back_to}, retry 1 of 2" in out, out[-4000:]
    assert "finished (rolled back 1x)" in out, out[-4000:]
    assert retried.data.tags[names.TAG_STATUS] == names.STATUS_FINISHED and retried.info.status == "FINISHED"
    assert [(m.step, m.value) for m in client.get_metric_history(retried.info.run_id, names.ROLLBACKS)] \
        == [(back_to, 1.0)]
    # the diverged attempt's steps stay on record beside the retry's, which go on to the end
    assert _steps(client, retried.info.run_id) == sorted([*range(1, diverged_at + 1), *range(back_to + 1, 13)])
