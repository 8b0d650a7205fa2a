"""`trainlab train -m` on local Ray against a real `mlflow server` process: one parent, four
children, a rerun that runs nothing, and compare. (A failing trial that stops nothing, the sweep
exiting 1 with the parent's counts: test_faults.py's killed-worker test, since 2026-12-07.)"""

from __future__ import annotations

import csv
import json
import os
import statistics
import subprocess
import urllib.request

import pytest
from mlflow.tracking import MlflowClient

from conftest import trainlab_cmd
from report_checks import check_parent_result, check_report_page, fastest_ok
from trainlab import names

pytestmark = [pytest.mark.ray, pytest.mark.slow]

TRIAL = ["model=tiny", "train.max_steps=12", "train.eval_every=6", "train.global_batch_size=8",
         "train.micro_batch_size=8", "train.seq_len=64", "cluster.num_workers=1",
         "tracking.system_metrics=false"]
SWEEP = [*TRIAL, "precision=fp32,fp16", "seed=0,1", "sweep_name=itest_sweep", "tracking.experiment=itest_sweep"]


def _trainlab(args, *, cwd, uri, timeout=600):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update(MLFLOW_TRACKING_URI=uri, PYTHONUNBUFFERED="1", COLUMNS="200")
    return subprocess.run(trainlab_cmd(*args), cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _rest(uri, path, body):
    req = urllib.request.Request(f"{uri}/api/2.0/mlflow/{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def test_sweep_parent_children_rerun_and_compare(mlflow_server, tmp_path, request, joined_cluster):
    uri = mlflow_server.uri
    proc = _trainlab(["train", "-m", *SWEEP, *joined_cluster.sweep()], cwd=tmp_path, uri=uri)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    # ---- the server's REST API lists one parent and four children with their params ----
    client = MlflowClient(tracking_uri=uri)
    exp_id = client.get_experiment_by_name("itest_sweep").experiment_id
    parents = _rest(uri, "runs/search", {
        "experiment_ids": [exp_id], "filter": f"tags.`{names.TAG_ROLE}` = '{names.ROLE_SWEEP}'"})["runs"]
    assert len(parents) == 1
    parent_id = parents[0]["info"]["run_id"]
    children = _rest(uri, "runs/search", {
        "experiment_ids": [exp_id], "filter": f"tags.mlflow.parentRunId = '{parent_id}'"})["runs"]
    assert len(children) == 4
    param_keys = [frozenset(p["key"] for p in c["data"]["params"]) for c in children]
    assert len(set(param_keys)) == 1 and "precision.name" in param_keys[0]
    tags = [{t["key"]: t["value"] for t in c["data"]["tags"]} for c in children]
    assert sorted((t[names.TAG_CONFIG_LABEL], t[names.TAG_SEED]) for t in tags) == [
        ("precision=fp16", "0"), ("precision=fp16", "1"), ("precision=fp32", "0"), ("precision=fp32", "1")]
    assert all(t[names.TAG_STATUS] == names.STATUS_FINISHED for t in tags)
    assert client.get_run(parent_id).data.tags[names.TAG_STATUS] == names.STATUS_FINISHED
    assert "sweep/trials.md" in [a.path for a in client.list_artifacts(parent_id, "sweep")]

    # ---- the same sweep again: nothing new runs, no second parent ----
    again = _trainlab(["train", "-m", *SWEEP, *joined_cluster.sweep()], cwd=tmp_path, uri=uri)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "4 trials already finished" in again.stdout
    runs = client.search_runs([exp_id])
    assert len(runs) == 5

    # ---- compare: its numbers are the MLflow runs' numbers ----
    out = tmp_path / "cmp"
    cmp = _trainlab(["compare", "--sweep", "itest_sweep", "--out", str(out)], cwd=tmp_path, uri=uri)
    assert cmp.returncode == 0, cmp.stdout[-3000:] + cmp.stderr[-3000:]
    rows = {r["label"]: r for r in csv.DictReader((out / "summary.csv").open())}
    for label in ("precision=fp32", "precision=fp16"):
        ids = [c["info"]["run_id"] for c, t in zip(children, tags) if t[names.TAG_CONFIG_LABEL] == label]
        finals = [client.get_metric_history(i, names.VAL_LOSS)[-1].value for i in ids]
        rates = [statistics.median(m.value for m in sorted(
            client.get_metric_history(i, names.TOKENS_PER_S), key=lambda m: m.step)[1:]) for i in ids]
        assert float(rows[label]["final_val_loss_mean"]) == pytest.approx(statistics.mean(finals), rel=1e-9)
        assert float(rows[label]["final_val_loss_std"]) == pytest.approx(statistics.stdev(finals), rel=1e-6)
        assert float(rows[label]["tokens_per_s_mean"]) == pytest.approx(statistics.mean(rates), rel=1e-9)
        assert label in cmp.stdout
    assert rows["precision=fp32"]["is_baseline"] == "True"  # the highest precision present
    assert float(rows["precision=fp16"]["speedup"]) == pytest.approx(
        float(rows["precision=fp16"]["tokens_per_s_mean"]) / float(rows["precision=fp32"]["tokens_per_s_mean"]))
    for name in ("summary.md", "val_loss_vs_tokens.png", "throughput.png", "report.html",
                 "per_layer_numerics.png"):  # fp16's casts, from each child's detail.parquet
        assert (out / name).exists(), name
    assert all(names.ARTIFACT_DETAIL in [a.path for a in client.list_artifacts(c["info"]["run_id"])]
               for c in children)
    logged = [a.path for a in client.list_artifacts(parent_id, names.ARTIFACT_COMPARE_DIR)]
    assert f"{names.ARTIFACT_COMPARE_DIR}/report.html" in logged

    # ---- what won: compare's first line, the parent's row (logged by both runs), the report ----
    answer_line = cmp.stdout.splitlines()[0]
    best = fastest_ok(rows)
    assert answer_line.startswith(f"fastest ok: {best['label']}:" if best else "no configuration is ok")
    check_parent_result(uri, parent_id, rows=rows, answer_line=answer_line, n_trials=4)
    assert len(client.get_metric_history(parent_id, names.trials_metric(names.STATUS_FINISHED))) == 2
    check_report_page(request.getfixturevalue("browser"), out / "report.html", answer_line=answer_line,
                      screenshot=tmp_path / "report.png")


def test_invalid_job_refuses_the_whole_sweep(tmp_path):
    proc = _trainlab(["train", "-m", *TRIAL, "train.micro_batch_size=8,3"], cwd=tmp_path,
                     uri=f"sqlite:///{tmp_path / 'm.db'}", timeout=120)
    assert proc.returncode == 2
    assert "nothing was started" in proc.stderr and "train.micro_batch_size=3" in proc.stderr
    assert not (tmp_path / "m.db").exists()


def test_hydra_basic_launcher_still_runs_trials_one_after_another(tmp_path, joined_cluster):
    proc = _trainlab(["train", "-m", "hydra/launcher=basic", *TRIAL, "train.max_steps=3", "train.eval_every=0",
                      "seed=0,1", "tracking=none", f"hydra.sweep.dir={tmp_path / 'multi'}", *joined_cluster.run],
                     cwd=tmp_path, uri=f"sqlite:///{tmp_path / 'unused.db'}", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    spans = []  # (first, last) time a loss was logged, per job
    for job in ("0", "1"):
        records = [json.loads(line) for line in (tmp_path / "multi" / job / "metrics.jsonl").read_text().splitlines()]
        times = [r["time"] for r in records if names.LOSS in r]
        assert len(times) == 3
        spans.append((min(times), max(times)))
    assert spans[0][1] < spans[1][0], spans  # one after another: job 1 trained after job 0's last step
