"""The sweep launcher's options (hydra.launcher.*) through the real CLI on local Ray: ONE sweep
of three trials (two learn, one diverges at optim.lr=1000) run by the same command three times.

1. max_concurrent_trials=2: two trials train at the same time, never more;
   sweep_timing.json holds a row per trial as MLflow recorded it;
2. the same command again skips the finished and the diverged trials, running nothing;
3. + hydra.launcher.rerun=true max_concurrent_trials=1: every trial runs again from step 1 in a
   new run under the same parent, one at a time (the cluster fits two: the cap is what stops it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass

import pytest
from mlflow.tracking import MlflowClient

from conftest import ray_train_runs, trainlab_cmd
from trainlab import names
from trial_windows import most_at_once, training_window

pytestmark = [pytest.mark.ray, pytest.mark.slow]

EXP = "launcher_options"
STEPS = 80
SWEEP = ["model=tiny", "train.global_batch_size=8", "train.micro_batch_size=8", "train.seq_len=32",
         "train.eval_every=0", "train.numerics_every=0", "cluster.num_workers=1", "tracking.system_metrics=false",
         f"train.max_steps={STEPS}", "train.checkpoint_every=30", "optim.lr=0.001,0.002,1000",
         f"sweep_name={EXP}", f"tracking.experiment={EXP}"]
LRS = ["0.001", "0.002", "1000"]


@dataclass
class Invocation:
    proc: subprocess.CompletedProcess
    timing: dict
    """Its sweep_timing.json."""
    ray_train_runs: int
    """Ray Train runs (gangs) it started."""

    @property
    def shown(self) -> str:
        return self.proc.stdout[-4000:] + self.proc.stderr[-4000:]


@dataclass
class Sweeps:
    uri: str
    first: Invocation
    again: Invocation
    rerun: Invocation


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory, store_template) -> Sweeps:
    root = tmp_path_factory.mktemp("launcher")
    shutil.copyfile(store_template, root / "mlflow.db")  # its schema made once (conftest.store_template)
    uri = f"sqlite:///{root / 'mlflow.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update(MLFLOW_TRACKING_URI=uri, PYTHONUNBUFFERED="1", COLUMNS="200")
    sweep_dir = root / "multirun"  # one folder for the three: a rerun must not resume a trial's last checkpoint

    def run(*launcher: str) -> Invocation:
        before = ray_train_runs(sweep_dir)
        proc = subprocess.run(trainlab_cmd("train", "-m", *SWEEP, f"hydra.sweep.dir={sweep_dir}", *launcher),
                              cwd=root, env=env, capture_output=True, text=True, timeout=900)
        started = set(ray_train_runs(sweep_dir).items()) - set(before.items())  # new, or written again
        return Invocation(proc, json.loads((sweep_dir / "sweep_timing.json").read_text()), len(started))

    return Sweeps(uri=uri, first=run("hydra.launcher.max_concurrent_trials=2"), again=run(),
                  rerun=run("hydra.launcher.rerun=true", "hydra.launcher.max_concurrent_trials=1"))


def _lr(run) -> str:
    """The run's optim.lr as the overrides give it (MLflow holds the float's text, 1000.0)."""
    return f"{float(run.data.params['optim.lr']):g}"


def _trials(uri: str) -> list:
    """The sweep's trial runs, oldest first."""
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(EXP).experiment_id
    runs = client.search_runs([exp], filter_string=f"tags.`{names.TAG_ROLE}` = '{names.ROLE_TRIAL}'")
    return sorted(runs, key=lambda r: r.info.start_time)


def test_two_trials_train_at_once_and_sweep_timing_json_has_each(sweeps):
    first = sweeps.first
    assert first.proc.returncode == 0, first.shown  # a diverged trial is a result, not a failure
    client = MlflowClient(sweeps.uri)
    runs = {_lr(r): r for r in _trials(sweeps.uri)[:3]}
    assert sorted(runs) == sorted(LRS), first.shown
    assert [runs[lr].data.tags[names.TAG_STATUS] for lr in LRS] == [names.STATUS_FINISHED] * 2 + [
        names.STATUS_DIVERGED]
    # on_divergence=stop (the default) ends it at the step it diverged, on record
    assert int(runs["1000"].data.tags[names.TAG_DIVERGED_STEP]) >= 1, runs["1000"].data.tags

    # ---- max_concurrent_trials=2: two trials at once, never three ----
    # (two at once is proven by the gangs below: trial #1 started a second gang because #0 held
    # the first; whether their *training* overlaps is a race of #0's 80 steps against gang 2's start)
    windows = {lr: training_window(client, runs[lr].info.run_id) for lr in LRS}
    assert most_at_once(list(windows.values())) <= 2, windows

    # ---- sweep_timing.json: a row per trial, as MLflow has it, with consistent timings ----
    timing = first.timing
    assert timing["concurrency"] == 2
    rows = timing["trials"]
    assert [r["idx"] for r in rows] == [0, 1, 2]
    for row, lr in zip(rows, LRS):
        run = runs[lr]
        assert f"optim.lr={lr}" in row["overrides"], row
        assert row["status"] == run.data.tags[names.TAG_STATUS] and not row["skipped"], row
        assert row["gang"] == run.data.tags[names.TAG_GANG], row
        assert row["plan_s"] > 0, row
        # waited for its gang, then trained: both within the time it took
        assert 0 < row["start_latency_s"] < row["wall_s"] and 0 < row["train_s"] < row["wall_s"], row
        assert row["wall_s"] < timing["wall_s"], (row, timing["wall_s"])
    # two gangs for two trials at once; the third took the first gang to free up
    assert sorted(r["gang"] for r in rows[:2]) == ["fresh: no warm gang of its shape (gang 1)",
                                                   "fresh: no warm gang of its shape (gang 2)"], rows
    assert rows[2]["gang"].startswith("warm #2 on gang "), rows


def test_the_same_sweep_again_skips_finished_and_diverged_trials(sweeps):
    again = sweeps.again
    assert again.proc.returncode == 0, again.shown
    assert "3 trials already finished in this sweep: skipped" in again.proc.stdout, again.shown
    assert "running " not in again.proc.stdout, again.shown  # no trial was started
    assert [r.data.tags[names.TAG_STATUS] for r in _trials(sweeps.uri)[:3]].count(names.STATUS_DIVERGED) == 1
    rows = again.timing["trials"]
    assert [(r["skipped"], r["status"]) for r in rows] == [(True, names.STATUS_FINISHED)] * 2 + [
        (True, names.STATUS_DIVERGED)], rows
    assert all(r["wall_s"] is None and r["train_s"] is None for r in rows), rows


def test_rerun_true_runs_every_trial_again_from_step_one_one_at_a_time(sweeps):
    rerun = sweeps.rerun
    assert rerun.proc.returncode == 0, rerun.shown
    assert "already finished" not in rerun.proc.stdout, rerun.shown
    client = MlflowClient(sweeps.uri)
    trials = _trials(sweeps.uri)
    assert len(trials) == 6, [_lr(r) for r in trials]  # the first sweep's 3 + 3 new
    before, after = trials[:3], trials[3:]
    assert {r.data.tags[names.TAG_PARENT_RUN_ID] for r in trials} == {before[0].data.tags[names.TAG_PARENT_RUN_ID]}
    old = {_lr(r): r for r in before}
    new = {_lr(r): r for r in after}
    assert sorted(new) == sorted(LRS)
    for lr in LRS:
        assert names.TAG_RESUMED_FROM not in new[lr].data.tags, new[lr].data.tags
        assert new[lr].data.tags[names.TAG_STATUS] == old[lr].data.tags[names.TAG_STATUS]
        steps = [m.step for m in client.get_metric_history(new[lr].info.run_id, names.LOSS)]
        assert steps == list(range(1, len(steps) + 1)), (lr, steps)  # from step 1, not from a checkpoint
        if new[lr].data.tags[names.TAG_STATUS] == names.STATUS_FINISHED:
            assert len(steps) == STEPS, (lr, steps)
    # max_concurrent_trials=1: one after another, though the cluster fits two
    windows = [training_window(client, new[lr].info.run_id) for lr in LRS]
    assert most_at_once(windows) == 1, windows
    assert rerun.timing["concurrency"] == 1
    assert [r["skipped"] for r in rerun.timing["trials"]] == [False] * 3
    # ... on ONE warm gang: one Ray Train run for the three, each trial's gang on record in its run
    # (test_warm_gangs.py's first sweep held this until 2026-12-07: the same three trials, one at a time)
    gangs = [r["gang"] for r in rerun.timing["trials"]]
    assert gangs == ["fresh: no warm gang of its shape (gang 1)", "warm #2 on gang 1", "warm #3 on gang 1"], gangs
    assert rerun.ray_train_runs == 1, rerun.ray_train_runs
    assert [new[lr].data.tags[names.TAG_GANG] for lr in LRS] == gangs
    assert all(r["start_latency_s"] > 0 for r in rerun.timing["trials"]), rerun.timing["trials"]
