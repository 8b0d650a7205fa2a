"""The parallelism grid as a user runs it: `trainlab train -m +sweep=parallel_grid` on local
Ray (each trial a gang of 2 gloo workers), then `trainlab compare`: every layout finishes with
the same validation loss as DDP (same model, batch and seed), and compare states each layout's
throughput and its speedup over DDP's."""

from __future__ import annotations

import csv
import os
import subprocess

import pytest

from conftest import trainlab_cmd

pytestmark = [pytest.mark.ray, pytest.mark.slow]

LAYOUTS = ("ddp", "pp")
"""The grid narrowed on the command line, as a user narrows a sweep (`parallel=ddp,pp` overrides
the sweep file's list): each 2-worker trial costs ~45 s on 2 cores, and every layout already
trains like one process through the trainer in tests/distributed/test_layouts.py."""


def test_parallel_grid_sweep_and_compare(tmp_path, mlflow_db, joined_cluster):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update(PYTHONUNBUFFERED="1", COLUMNS="250", OMP_NUM_THREADS="1")
    run = subprocess.run(trainlab_cmd("train", "-m", "+sweep=parallel_grid", f"parallel={','.join(LAYOUTS)}",
                                      "model=tiny",
                                      "train.max_steps=10", "train.seq_len=32", "train.global_batch_size=8",
                                      "train.micro_batch_size=2", "train.eval_every=5",
                                      "tracking.system_metrics=false", f"tracking.uri={uri}", *joined_cluster.sweep()),
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    cmp = subprocess.run(trainlab_cmd("compare", "--sweep", "parallel_grid", "--baseline", "parallel=ddp",
                                      f"--tracking-uri={uri}", "--out", str(tmp_path / "cmp")),
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert cmp.returncode == 0, cmp.stdout[-3000:] + cmp.stderr[-3000:]
    rows = {r["label"]: r for r in csv.DictReader(open(tmp_path / "cmp" / "summary.csv"))}
    assert set(rows) == {f"parallel={layout}" for layout in LAYOUTS}
    base = float(rows["parallel=ddp"]["final_val_loss_mean"])
    base_tps = float(rows["parallel=ddp"]["tokens_per_s_mean"])
    for layout in LAYOUTS:
        row = rows[f"parallel={layout}"]
        assert row["n_finished"] == "1", row
        assert float(row["final_val_loss_mean"]) == pytest.approx(base, rel=1e-4), layout
        tps = float(row["tokens_per_s_mean"])
        assert tps > 0
        assert float(row["speedup"]) == pytest.approx(tps / base_tps, rel=1e-6), row  # what a reader compares
