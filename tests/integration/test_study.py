"""A search sweeper's multirun is ONE study, through the real CLI on local Ray: Hydra's Optuna
sweeper (TPE, seeded), 4 trials 2 at a time, two objectives, then the same command with 6 trials.

1. one parent run for both batches, the sweeper, sampler, seed and objectives on it; the trials
   numbered 0-3 across batches; the second batch on the first batch's warm gangs (2 gangs
   started, not 4); every trial run holds the values Optuna got (objective/*), and Optuna got
   both: its optimization_results.yaml lists a Pareto front of [val_loss, tokens_per_s] pairs;
   its study (trainlab's storage, optuna_trials.json) holds each trial's val-loss curve;
2. the same study with n_trials=6 continues it: the same parent, its 4 finished trials
   proposed again (seeded) and skipped, 2 new ones run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import yaml
from mlflow.tracking import MlflowClient

from conftest import trainlab_cmd
from trainlab import names

pytestmark = [pytest.mark.ray, pytest.mark.slow]

EXP = "optuna_study"
STUDY = ["hydra/sweeper=optuna", "hydra.sweeper.n_jobs=2", "hydra.sweeper.sampler.seed=0",
         "optim.lr=tag(log,interval(1e-4,1e-2))", "hydra.launcher.objective=[val_loss,tokens_per_s]",
         "hydra.sweeper.direction=[minimize,maximize]", "model=tiny", "train.max_steps=12",
         "train.global_batch_size=4", "train.micro_batch_size=4", "train.seq_len=32", "cluster.num_workers=1",
         "tracking.system_metrics=false", f"sweep_name={EXP}", f"tracking.experiment={EXP}"]


@pytest.fixture(scope="module")
def study(tmp_path_factory, store_template):
    root = tmp_path_factory.mktemp("study")
    shutil.copyfile(store_template, root / "mlflow.db")  # its schema made once (conftest.store_template)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update(MLFLOW_TRACKING_URI=f"sqlite:///{root / 'mlflow.db'}", PYTHONUNBUFFERED="1", COLUMNS="200")

    def run(n_trials: int, folder: str):
        proc = subprocess.run(trainlab_cmd("train", "-m", *STUDY, f"hydra.sweeper.n_trials={n_trials}",
                                           f"hydra.sweep.dir={root / folder}"),
                              cwd=root, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc, json.loads((root / folder / "sweep_timing.json").read_text()), root / folder

    first = run(4, "first")
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name(EXP).experiment_id
    after_first = client.search_runs([exp], max_results=100)
    return first, after_first, run(6, "again"), client, exp


def _parents(runs):
    return [r for r in runs if r.data.tags.get(names.TAG_ROLE) == names.ROLE_SWEEP]


def test_a_study_of_two_batches_is_one_parent_with_its_sweeper_and_objectives(study):
    (proc, timing, _), runs, *_ = study
    parents = _parents(runs)
    assert len(parents) == 1, [p.info.run_id for p in parents]
    tags = parents[0].data.tags
    assert (tags[names.TAG_SWEEPER], tags[names.TAG_SAMPLER], tags[names.TAG_SWEEPER_SEED]) == ("optuna", "TPESampler", "0")
    assert tags[names.TAG_OBJECTIVE] == "val_loss,tokens_per_s" and tags[names.TAG_DIRECTION] == "minimize,maximize"
    trials = [r for r in runs if r.data.tags.get(names.TAG_PARENT_RUN_ID) == parents[0].info.run_id]
    assert len(trials) == 4 and [row["idx"] for row in timing["trials"]] == [0, 1, 2, 3]
    assert parents[0].data.metrics[names.TRIALS_TOTAL] == 4
    assert tags[names.TAG_BEST_CONFIG] != "none" and "optim.lr=" in tags[names.TAG_SWEEP_RESULT]  # over the study


def test_the_second_batch_starts_on_the_first_batchs_warm_gangs(study):
    (_, timing, _), *_ = study
    gangs = [row["gang"] for row in timing["trials"]]
    assert sum(not g.startswith("warm") for g in gangs) == 2, gangs  # the concurrency, not one per trial
    assert all(g.startswith("warm") for g in gangs[2:]), gangs
    # a warm start is seconds (0.3-4.5 s in a whole slow tier here, 2026-12-07), a fresh gang's 20-130 s
    assert all(row["start_latency_s"] < 15 for row in timing["trials"][2:]), timing["trials"]


def test_optuna_gets_both_objectives_and_each_trial_run_keeps_what_it_got(study):
    (_, _, folder), runs, *_ = study
    front = yaml.safe_load((folder / "optimization_results.yaml").read_text())["solutions"]
    assert front and all(len(s["values"]) == 2 for s in front)
    trials = {r.info.run_id: r for r in runs if r.data.tags.get(names.TAG_ROLE) == names.ROLE_TRIAL}
    for r in trials.values():
        m = r.data.metrics
        assert m[names.objective_metric("val_loss")] == pytest.approx(m[names.VAL_LOSS])
        assert m[names.objective_metric("tokens_per_s")] > 0
    logged = [(r.data.metrics[names.objective_metric("val_loss")], r.data.metrics[names.objective_metric("tokens_per_s")])
              for r in trials.values()]
    for val, speed in (s["values"] for s in front):  # Optuna's front is made of what the trials returned
        assert any(val == pytest.approx(x) and speed == pytest.approx(y) for x, y in logged), (val, speed, logged)
    # the sweeper's study was trainlab's storage: each trial's curve reported as an objective would
    optuna_trials = json.loads((folder / "optuna_trials.json").read_text())
    assert [t["state"] for t in optuna_trials] == ["COMPLETE"] * 4
    assert all(t["intermediate_values"] for t in optuna_trials), optuna_trials


def test_the_same_study_with_more_trials_continues_it_without_running_its_trials_again(study):
    _, first_runs, (proc, timing, _), client, exp = study
    runs = client.search_runs([exp], max_results=100)
    assert [p.info.run_id for p in _parents(runs)] == [p.info.run_id for p in _parents(first_runs)]
    rows = timing["trials"]
    assert [row["idx"] for row in rows] == list(range(6))
    assert [row["skipped"] for row in rows] == [True] * 4 + [False] * 2, rows
    assert len([r for r in runs if r.data.tags.get(names.TAG_ROLE) == names.ROLE_TRIAL]) == 6
    assert "(resumed)" in proc.stdout
