"""Two jobs of one multirun in one folder are refused on the driver before anything starts, naming
the setting, its value, both jobs and a folder per job (launch.sweep_folders): `output_dir=same/out
seed=0,1` had trial #1 fail with `LeaseHeld: another driver trains this trial`, its own driver's
other trial. tests/integration/test_refused_before_ray.py runs the tester's command and its fix."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from trainlab.config import compose_run_config
from trainlab.launch.paths import resolve_paths
from trainlab.launch.sweep_folders import folder_clash
from trainlab.launch.sweep_trial import Trial


def _job(idx: int, tmp_path, *, output_dir: str = "", checkpoint_dir: str = "", seed: int | None = None,
         hydra_dir: str = "") -> Trial:
    """Job #idx as the launcher holds it: its typed run (output_dir unset: Hydra's job folder
    `hydra_dir`, as run_config_from_hydra fills it) and the config Hydra composed for it."""
    given = {"seed": idx if seed is None else seed, "output_dir": output_dir,
             "train": {"checkpoint_dir": checkpoint_dir}}
    run = compose_run_config(["model=tiny", f"seed={given['seed']}", f"train.checkpoint_dir={checkpoint_dir}"])
    run.output_dir = str(tmp_path / (output_dir or hydra_dir or f"multirun/{idx}"))
    return Trial(idx=idx, overrides=[f"seed={given['seed']}"], run=resolve_paths(run),
                 job_return=SimpleNamespace(cfg=OmegaConf.create(given)))


def _labels(trials):
    return [f"#{t.idx} (seed={t.run.seed})" for t in trials]


def test_jobs_in_one_output_dir_are_refused_naming_it_both_jobs_and_a_folder_per_job(tmp_path):
    jobs = [_job(0, tmp_path, output_dir="same/out"), _job(1, tmp_path, output_dir="same/out")]
    assert folder_clash(jobs, _labels(jobs)) == (
        f"output_dir='same/out' is the same output folder ({tmp_path}/same/out) for jobs #0 (seed=0) and #1 (seed=1), "
        "so their checkpoints and files would mix and the second would wait on the first's lease; leave output_dir "
        "unset, so each job gets Hydra's own folder (hydra.sweep.dir/<job number>), or give each job its own: "
        "'output_dir=same/out/${hydra:job.num}'")


def test_jobs_in_one_checkpoint_folder_are_refused_naming_train_checkpoint_dir(tmp_path):
    jobs = [_job(0, tmp_path, checkpoint_dir=f"{tmp_path}/ck"), _job(1, tmp_path, checkpoint_dir=f"{tmp_path}/ck")]
    message = folder_clash(jobs, _labels(jobs))
    assert message.startswith(f"train.checkpoint_dir='{tmp_path}/ck' is the same checkpoint folder ({tmp_path}/ck) "
                              "for jobs #0 (seed=0) and #1 (seed=1)")
    assert message.endswith("leave train.checkpoint_dir unset, so each job keeps its checkpoints in its own "
                            f"output_dir, or give each job its own: 'train.checkpoint_dir={tmp_path}/ck/${{hydra:job.num}}'")
    # one job's checkpoint_dir where another keeps its own by default (<output_dir>/checkpoints): the same folder
    into = [_job(0, tmp_path), _job(1, tmp_path, checkpoint_dir=f"{tmp_path}/multirun/0/checkpoints")]
    assert "train.checkpoint_dir=" in folder_clash(into, _labels(into))


def test_a_fixed_hydra_job_folder_is_refused_naming_hydra_sweep_subdir(tmp_path):
    jobs = [_job(0, tmp_path, hydra_dir="multirun/fixed"), _job(1, tmp_path, hydra_dir="multirun/fixed")]
    assert folder_clash(jobs, _labels(jobs)).startswith(
        "hydra.sweep.subdir gives jobs #0 (seed=0) and #1 (seed=1) the same folder")


@pytest.mark.parametrize("folders", [
    {},  # Hydra's own folder per job
    {"output_dir": "same/out/0"},  # what output_dir=same/out/${hydra:job.num} resolves to for job #0 ...
])
def test_a_folder_per_job_passes(folders, tmp_path):
    jobs = [_job(0, tmp_path, **folders), _job(1, tmp_path, **{k: v.replace("/0", "/1") for k, v in folders.items()})]
    assert folder_clash(jobs, _labels(jobs)) == ""


def test_a_later_batch_may_reuse_an_earlier_folder_of_its_own_config_only(tmp_path):
    earlier = [_job(0, tmp_path, checkpoint_dir=f"{tmp_path}/ck", seed=7)]
    again = [_job(1, tmp_path, checkpoint_dir=f"{tmp_path}/ck", seed=7)]  # the sweeper proposed the same point
    other = [_job(2, tmp_path, checkpoint_dir=f"{tmp_path}/ck", seed=8)]
    assert folder_clash(again, _labels(again), earlier=earlier, earlier_labels=_labels(earlier)) == ""
    assert "for jobs #0 (seed=7) and #2 (seed=8)" in folder_clash(other, _labels(other), earlier=earlier,
                                                                  earlier_labels=_labels(earlier))
    assert "for jobs #0 (seed=7) and #1 (seed=7)" in folder_clash(earlier + again, _labels(earlier + again))
