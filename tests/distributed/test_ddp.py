"""Data parallel with real gloo process groups: 2 ranks equal 1 process, torchrun works alone."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from conftest import free_port, spawn_ranks, trial_curves
from trainlab import names

pytestmark = pytest.mark.distributed

TINY = ["model=tiny", "data=markov", "train.max_steps=12", "train.global_batch_size=8",
        "train.micro_batch_size=2", "train.seq_len=32", "train.eval_every=6", "train.eval_batches=2",
        "optim.warmup_steps=2"]


def _run(world: int):
    """(train losses, val losses, status) of the trial on `world` gloo ranks."""
    (got,) = spawn_ranks(trial_curves, world, TINY)
    return got


def test_two_rank_ddp_matches_one_process_with_same_global_batch():
    one_train, one_val, s1 = _run(1)   # 1 process: 4 micro-batches of 2 accumulated
    two_train, two_val, s2 = _run(2)   # 2 ranks: 2 micro-batches each, gradients all-reduced
    assert s1 == s2 == names.STATUS_FINISHED
    assert len(one_train) == len(two_train) == 12
    assert one_train[-1] < one_train[0]  # it trains at all
    for a, b in zip(one_train, two_train):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-5)
    for a, b in zip(one_val, two_val):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-5)


def test_engine_runs_under_torchrun_without_ray_or_mlflow(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", str(free_port()), "-m", "trainlab.train", *TINY, "tracking=none",
           "cluster.num_workers=2", f"hydra.run.dir={out}"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"│ status +│ finished ", proc.stdout), proc.stdout[-2000:]  # the trial's summary
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r[names.LOSS] for r in rows if names.LOSS in r]
    assert len(losses) == 12 and losses[-1] < losses[0]
    assert any(r.get("tags", {}).get(names.TAG_WORLD_SIZE) == "2" for r in rows)


def test_engine_imports_neither_ray_nor_mlflow(tmp_path):
    code = (
        "import sys\n"
        "from trainlab.config import compose_run_config\n"
        "from trainlab.engine.run import run_trial\n"
        "from trainlab.plan.here import plan_here\n"
        f"run = compose_run_config({[*TINY, 'cluster.num_workers=1', 'train.max_steps=2']!r})\n"
        "result = run_trial(plan_here(run))\n"
        "assert result.status == 'finished', result\n"
        "leaked = sorted({m.split('.')[0] for m in sys.modules} & {'ray', 'mlflow'})\n"
        "print('LEAKED', leaked)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "LEAKED []" in proc.stdout


@pytest.mark.slow
def test_torchrun_with_mlflow_closes_its_run_with_the_status(tmp_path, mlflow_db):
    """Under torchrun there is no driver: rank 0 opens the run and must close it."""
    from mlflow.tracking import MlflowClient

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1",
           "--master-port", str(free_port()), "-m", "trainlab.train", *TINY, "train.max_steps=3",
           "cluster.num_workers=1", f"tracking.uri={store}", "tracking.system_metrics=false",
           f"hydra.run.dir={tmp_path / 'run'}"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(tracking_uri=store)
    (run,) = client.search_runs([client.get_experiment_by_name("trainlab").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.tags[names.TAG_STATUS] == names.STATUS_FINISHED
    assert [m.step for m in client.get_metric_history(run.info.run_id, names.LOSS)] == [1, 2, 3]
