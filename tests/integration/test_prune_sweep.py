"""hydra.launcher.prune through the real CLI: bad values are refused in one line before anything
starts; a real sweep on local Ray stops its hopeless trial early, records it `pruned` in MLflow
with its reason and step, exits 0, counts it as done for a rerun, and compare shows it."""

from __future__ import annotations

import csv
import os
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import assert_refused, trainlab_cmd
from trainlab import names

TRIAL = ["model=tiny", "train.max_steps=40", "train.eval_every=5", "train.global_batch_size=8",
         "train.micro_batch_size=8", "train.seq_len=64", "cluster.num_workers=1", "tracking.system_metrics=false"]


def _trainlab(args, *, cwd, uri, timeout=600, ray_tmp=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RAY_"))}
    env.update(MLFLOW_TRACKING_URI=uri, PYTHONUNBUFFERED="1", COLUMNS="250")
    if ray_tmp is not None:  # where Ray would start its session
        env.update(RAY_TMPDIR=str(ray_tmp), TMPDIR=str(ray_tmp))
    return subprocess.run(trainlab_cmd(*args), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


BAD = [  # (overrides, what the one error line must say: the field, the value, the fix)
    (["hydra.launcher.prune=pbt"], ["hydra.launcher.prune=pbt", "one of none, margin, asha, median, successive_halving, hyperband"]),
    (["hydra.launcher.prune=margin", "hydra.launcher.prune_margin=-0.5"],
     ["hydra.launcher.prune_margin=-0.5", ">= 0", "hydra.launcher.prune_margin=0.1"]),
    (["hydra.launcher.prune=asha", "hydra.launcher.prune_reduction_factor=abc"],
     ["hydra.launcher.prune_reduction_factor=abc", "hydra.launcher.prune_reduction_factor=4.0"]),
    (["hydra.launcher.prune=asha", "hydra.launcher.prune_grace=100"],
     ["hydra.launcher.prune_grace=100", "did you mean hydra.launcher.prune_grace_tokens?"]),
    (["hydra.launcher.prune=asha", "train.eval_every=0"],
     ["hydra.launcher.prune=asha", "train.eval_every=0", "set train.eval_every=4"]),
]


def test_bad_prune_values_are_refused_in_one_line_before_anything_starts(tmp_path):
    def run(case):
        overrides, _ = case
        with tempfile.TemporaryDirectory(prefix="tlprune-") as ray_tmp:
            proc = _trainlab(["train", "-m", *TRIAL, "seed=0,1", *overrides], cwd=tmp_path,
                             uri=f"sqlite:///{tmp_path / 'm.db'}", timeout=120, ray_tmp=ray_tmp)
            return proc, [str(p) for p in Path(ray_tmp).rglob("session_*")]

    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = list(pool.map(run, BAD))
    for (overrides, says), (proc, session) in zip(BAD, outcomes):
        assert_refused(proc, says, sessions=session, context=str(overrides))
    assert not (tmp_path / "m.db").exists()  # no MLflow store was opened


@pytest.mark.ray
@pytest.mark.slow
def test_a_hopeless_trial_is_pruned_recorded_skipped_by_a_rerun_and_compared(tmp_path, mlflow_db, joined_cluster):
    """lr=1e-5 barely moves while lr=1e-2 learns: run one after the other, the second is
    compared with the first's curve at equal tokens and stopped after the grace (at step 10;
    200 steps leave the stop seconds to arrive on a loaded machine)."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sweep = ["train", "-m", *TRIAL, *joined_cluster.sweep(), "train.max_steps=200", "train.eval_every=10", "train.global_batch_size=16",
             "train.micro_batch_size=16", "train.seq_len=128", "optim.lr=1e-2,1e-5", "hydra.launcher.prune=margin",
             "hydra.launcher.prune_grace_tokens=2048", "hydra.launcher.max_concurrent_trials=1",
             "sweep_name=itest_prune", "tracking.experiment=itest_prune"]
    proc = _trainlab(sweep, cwd=tmp_path, uri=uri)
    shown = proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.returncode == 0, shown  # pruned is a result, not a failure

    client = MlflowClient(tracking_uri=uri)
    exp_id = client.get_experiment_by_name("itest_prune").experiment_id
    runs = client.search_runs([exp_id], filter_string=f"tags.`{names.TAG_ROLE}` = '{names.ROLE_TRIAL}'")
    by_lr = {r.data.params["optim.lr"]: r for r in runs}
    assert set(by_lr) == {"0.01", "1e-05"}, shown
    good, bad = by_lr["0.01"], by_lr["1e-05"]
    assert good.data.tags[names.TAG_STATUS] == names.STATUS_FINISHED, shown
    assert bad.data.tags[names.TAG_STATUS] == names.STATUS_PRUNED, shown
    assert bad.info.status == "FINISHED"  # in MLflow's terms it ended normally
    reason = bad.data.tags[names.TAG_PRUNED_REASON]
    assert "above the best trial's" in reason and "optim.lr=0.01" in reason and "margin 10%" in reason
    # the step it stopped at is the last it trained and logged, well before its end
    losses = client.get_metric_history(bad.info.run_id, names.LOSS)
    pruned_step = int(bad.data.tags[names.TAG_PRUNED_STEP])
    assert pruned_step == max(m.step for m in losses) and 10 <= pruned_step < 200, (pruned_step, reason)
    assert names.TAG_PRUNED_STEP not in good.data.tags
    assert client.get_run(good.data.tags[names.TAG_PARENT_RUN_ID]).data.tags[names.TAG_STATUS] == \
        names.STATUS_FINISHED
    assert f"pruned at step {pruned_step}" in proc.stdout

    # ---- the same sweep again: the pruned trial is done, like the finished one ----
    again = _trainlab(sweep, cwd=tmp_path, uri=uri)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "2 trials already finished" in again.stdout
    assert len(client.search_runs([exp_id])) == 3  # a parent and the two trials: nothing new ran

    # ---- compare: the pruned trial with where and why ----
    out = tmp_path / "cmp"
    cmp = _trainlab(["compare", "--sweep", "itest_prune", "--out", str(out)], cwd=tmp_path, uri=uri)
    assert cmp.returncode == 0, cmp.stdout[-3000:] + cmp.stderr[-3000:]
    assert f"pruned: optim.lr=1e-05 seed 0 ({bad.info.run_id}) at step {pruned_step}: {reason[:40]}" \
        in " ".join(cmp.stdout.split())
    rows = {r["label"]: r for r in csv.DictReader((out / "summary.csv").open())}
    assert rows["optim.lr=1e-05"]["n_pruned"] == "1" and rows["optim.lr=1e-05"]["n_running"] == "0"
    assert rows["optim.lr=1e-05"]["pruned_steps"] == str(pruned_step)
    assert reason[:40] in (out / "report.html").read_text()
