"""config.multirun lists a command line's jobs as Hydra's own multirun would run them: checked
against a real Hydra multirun of conf/ (Hydra's basic sweeper and launcher, a task that prints
each job's typed config), job for job, in Hydra's order."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from trainlab.config import ConfigError
from trainlab.config.convert import flatten
from trainlab.config.multirun import expand_jobs
from trainlab.plan.derive_layout import plan_layout

# the real `hydra.main` of conf/, its launcher swapped for Hydra's basic one: each job prints its
# overrides and its validated config
HYDRA_APP = """
import json, sys
import hydra
from hydra.core.hydra_config import HydraConfig
from trainlab.config import CONF_DIR, register_configs, to_run_config
from trainlab.config.convert import flatten
register_configs()
@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def task(cfg):
    job = {"overrides": list(HydraConfig.get().overrides.task), "config": flatten(to_run_config(cfg))}
    print("JOB " + json.dumps(job, default=str), flush=True)
task()
"""

SWEEP = ["+sweep=bf16_pure_updates", "seed=7", "model=tiny,small", "train.max_steps=5"]
"""A sweep file's params (precision x seed) with the command line's own: seed=7 replaces the
file's seeds, model=tiny,small adds a dimension."""


def _hydra_jobs(args: list[str], tmp_path) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYDRA_")}
    proc = subprocess.run([sys.executable, "-c", HYDRA_APP, "-m", *args, "hydra/launcher=basic",
                           f"hydra.sweep.dir={tmp_path}/multirun"], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line[4:]) for line in proc.stdout.splitlines() if line.startswith("JOB ")]


def test_a_sweeps_jobs_are_hydras_own_in_its_order(tmp_path):
    hydra_jobs = _hydra_jobs(SWEEP, tmp_path)
    jobs = expand_jobs(["-m", *SWEEP])
    assert len(hydra_jobs) == 8  # 4 bf16 update rules x 2 models, one seed
    assert [list(j.overrides) for j in jobs] == [h["overrides"] for h in hydra_jobs]
    assert [json.loads(json.dumps(flatten(j.run), default=str)) for j in jobs] == [h["config"] for h in hydra_jobs]
    assert {j.run.seed for j in jobs} == {7}
    chosen = {(j.run.model.name, next(o for o in j.overrides if o.startswith("precision="))) for j in jobs}
    assert chosen == {(m, f"precision={p}") for m in ("tiny", "small")
                      for p in ("bf16", "bf16_pure_plain", "bf16_pure_stochastic", "bf16_pure_kahan")}


def test_a_single_run_is_one_job_composed_as_train_composes_it():
    (job,) = expand_jobs(["model=tiny", "precision=bf16", "cluster.nodes=[8xH100,8xH100]"])
    assert (job.run.model.name, job.run.precision.name) == ("tiny", "bf16")
    assert job.run.cluster.nodes == ["8xH100", "8xH100"]


@pytest.mark.parametrize("args, says", [
    (["model=tiny", "train.global_batch_size=16", "train.micro_batch_size=3"], ["train.global_batch_size=16"]),
    (["modle=tiny"], ["modle"]),
    (["cluster.nodes=[8xH100,0xA100]"], ["cluster.nodes", "0xA100", "8xH100"]),
    (["-m", "model=tiny", "train.micro_batch_size=3,4", "train.global_batch_size=16"],
     ["the sweep has invalid jobs", "job #0", "train.micro_batch_size=3"]),
])
def test_bad_input_is_refused_naming_the_field(args, says):
    with pytest.raises(ConfigError) as e:
        expand_jobs(args, check=plan_layout)  # as the estimate command expands them
    for part in says:
        assert part in str(e.value), str(e.value)
