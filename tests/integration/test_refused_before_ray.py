"""What a tester met through the real CLI after Ray had started, refused now on the driver before it
starts: `trainlab train` exits 2 with one `error:` line naming the field, the value and the fix, no
traceback, no Ray session. Each case once (a Python start-up each, three at a time); the checks'
details are in tests/unit (test_custom_model, test_tp_user_plan_checks, test_sweep_folders,
test_optuna_sweep_checks: the config layer's, in-process)."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import assert_refused

SMALL = ["model=tiny", "tracking=none", "train.max_steps=2", "train.seq_len=32", "train.global_batch_size=4",
         "train.micro_batch_size=2"]
CASES = {
    # failed 26-38 s later in the workers: "cannot be imported" from each rank
    "custom_module_missing": (["model=custom", "model._target_=tl_nowhere.build", "cluster.num_workers=1"],
                              ["model._target_='tl_nowhere.build' cannot be imported", "no module 'tl_nowhere'",
                               "PYTHONPATH"]),
    # a shape error in both ranks after 60 s
    "tp_plan_q_alone": (["parallel=tp", "cluster.num_workers=2", "model.tp_plan={layers.*.attention.wq:colwise}"],
                        ["model.tp_plan: layers.*.attention.wq is colwise", "layers.*.attention.wo rowwise are missing",
                         "give 'model.tp_plan={layers.*.attention.wq:colwise,layers.*.attention.wk:colwise,"
                         "layers.*.attention.wv:colwise,layers.*.attention.wo:rowwise}'"]),
    # trial #1 failed with LeaseHeld: its own driver's trial #0 held the folder
    "sweep_jobs_in_one_folder": (["-m", "seed=0,1", "output_dir=same/out", "cluster.num_workers=1"],
                                 ["output_dir='same/out' is the same output folder", "jobs #0 (seed=0) and #1 (seed=1)",
                                  "leave output_dir unset", "'output_dir=same/out/${hydra:job.num}'"]),
}


def _run(args: list[str], work: Path) -> tuple[subprocess.CompletedProcess, list[str]]:
    ray_tmp = work / "ray"
    ray_tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RAY_", "HYDRA_"))}
    flags = [a for a in args if a.startswith("-")]
    proc = subprocess.run([sys.executable, "-m", "trainlab.cli", "train", *flags, *SMALL,
                           *[a for a in args if not a.startswith("-")]],
                          cwd=work, capture_output=True, text=True, timeout=600,
                          env={**env, "PYTHONUNBUFFERED": "1", "RAY_TMPDIR": str(ray_tmp), "TMPDIR": str(ray_tmp)})
    return proc, [str(p) for p in ray_tmp.rglob("session_*")]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    works = {name: tmp_path_factory.mktemp(name) for name in CASES}
    with ThreadPoolExecutor(max_workers=3) as pool:
        return dict(zip(CASES, pool.map(lambda n: _run(CASES[n][0], works[n]), CASES)))


@pytest.mark.parametrize("case", list(CASES))
def test_refused_on_the_driver_in_one_line_before_ray_starts(case, outcomes):
    proc, sessions = outcomes[case]
    assert_refused(proc, CASES[case][1], sessions=sessions, context=case)
