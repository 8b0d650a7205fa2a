"""`trainlab estimate -m` with a search sweeper: Hydra's Optuna sweeper's trials are listed as far
as they are known before any runs, held to the plugin's own proposals (its OptunaSweeperImpl.sweep
run on the config and the arguments Hydra's multirun hands it, a launcher that only records each
batch and returns results); any other search sweeper is refused in one line naming a point to
estimate instead."""

from __future__ import annotations

import math
import re
import shlex
import subprocess
from types import SimpleNamespace

import pytest

from conftest import assert_refused, trainlab_cmd
from trainlab.config import CONF_DIR, register_configs
from trainlab.config.multirun import expand_sweep

OPTUNA = ["hydra/sweeper=optuna", "model=tiny", "train.max_steps=3"]
GRID = [*OPTUNA, "hydra/sweeper/sampler=grid", "precision=fp32,bf16", "seed=range(0,2)"]
"""A grid of 2 precisions x 2 seeds."""


def _hydra_multirun(args: list[str], tmp_path):
    """The config Hydra's multirun composes and the arguments it hands the sweeper
    (hydra._internal.hydra.Hydra.multirun: cfg.hydra.overrides.task)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = GlobalHydra.instance().hydra.compose_config(
            "config", [*args, f"hydra.sweep.dir={tmp_path}"], run_mode=RunMode.MULTIRUN)
    return cfg, list(cfg.hydra.overrides.task)


def _plugins_trials(args: list[str], tmp_path, *, result) -> list[tuple[str, ...]]:
    """Every trial the plugin's own sweep launches, in order, each told `result(overrides)`."""
    from hydra.utils import instantiate

    tmp_path.mkdir(parents=True, exist_ok=True)  # the sweep folder: its optimization_results.yaml
    cfg, arguments = _hydra_multirun(args, tmp_path)
    sweeper = instantiate(cfg.hydra.sweeper).sweeper  # the OptunaSweeper's OptunaSweeperImpl, as Hydra builds it
    launched: list[tuple[str, ...]] = []

    class RecordingLauncher:
        def launch(self, job_overrides, initial_job_idx):
            launched.extend(tuple(o) for o in job_overrides)
            return [SimpleNamespace(return_value=result(o)) for o in job_overrides]

    sweeper.config, sweeper.hydra_context, sweeper.launcher, sweeper.job_idx = cfg, object(), RecordingLauncher(), 0
    sweeper.sweep(arguments)
    return launched


def _lr(overrides) -> float:
    return float(next(o for o in overrides if o.startswith("optim.lr=")).partition("=")[2])


# ---- the GridSampler: every point, whatever n_trials leaves to chance

def test_a_grid_lists_every_trial_the_sweeper_runs(tmp_path):
    sweep = expand_sweep(["-m", *GRID])
    listed = [j.overrides for j in sweep.jobs]
    ran = _plugins_trials(GRID, tmp_path, result=lambda o: 0.0)
    assert len(listed) == 4 and sorted(listed) == sorted(ran)
    assert sweep.num_trials == 4 and "all 4 trials are knowable" in sweep.note and "GridSampler" in sweep.note
    assert [j.run.precision.name for j in sweep.jobs] == ["fp32", "fp32", "bf16", "bf16"]  # in grid order


def test_a_grid_cut_by_n_trials_lists_every_point_and_says_it_runs_some(tmp_path):
    args = [*GRID, "hydra.sweeper.n_trials=3"]
    sweep = expand_sweep(["-m", *args])
    ran = _plugins_trials(args, tmp_path, result=lambda o: 0.0)
    listed = {j.overrides for j in sweep.jobs}
    assert len(ran) == len(set(ran)) == 3 and set(ran) <= listed and len(listed) == 4
    assert sweep.num_trials == 3 and "it runs 3 of these 4 grid points" in sweep.note


@pytest.mark.parametrize("args, says", [
    (["hydra/sweeper/sampler=grid", "optim.lr=interval(1e-4,1e-2)"], ["optim.lr: the GridSampler", "comma list"]),
    (["hydra.sweeper.n_jobs=0", "precision=fp32,bf16"], ["hydra.sweeper.n_jobs=0", "hydra.sweeper.n_jobs=2"]),
    (["optim.lr=interval(1e-2,1e-4)"], ["optim.lr=interval(1e-2,1e-4)", "give them in order: optim.lr=interval(0.0001,0.01)"]),
])
def test_a_study_the_sweeper_cannot_run_is_refused_naming_the_key(args, says):
    from trainlab.config import ConfigError

    with pytest.raises(ConfigError) as e:
        expand_sweep(["-m", *OPTUNA, *args])
    for part in says:
        assert part in str(e.value), str(e.value)


# ---- a seeded sampler: what it proposes before any result, and no more

SEEDED = [*OPTUNA, "hydra.sweeper.sampler.seed=0", "hydra.sweeper.n_trials=8", "hydra.sweeper.n_jobs=2",
          "optim.lr=tag(log,interval(1e-4,1e-2))", "precision=fp32,bf16"]


@pytest.mark.parametrize("extra, known, says", [
    (["hydra.sweeper.sampler.n_startup_trials=1"], 2, "its first batch of 2 of 8 trials is knowable"),
    (["hydra.sweeper.sampler.n_startup_trials=3"], 4, "its first 4 of 8 trials are knowable"),  # 2 batches before 3 results
    (["hydra/sweeper/sampler=cmaes"], 2, "(CmaEsSampler, seed 0): its first batch of 2 of 8"),
    (["hydra/sweeper/sampler=random"], 8, "(RandomSampler, seed 0): all 8 trials are knowable"),
])
def test_a_seeded_sampler_lists_what_the_sweeper_proposes_whatever_the_results(extra, known, says, tmp_path):
    args = [*SEEDED, *extra]
    sweep = expand_sweep(["-m", *args])
    listed = [j.overrides for j in sweep.jobs]
    low_lr_wins = _plugins_trials(args, tmp_path / "a", result=_lr)
    high_lr_wins = _plugins_trials(args, tmp_path / "b", result=lambda o: -_lr(o))
    assert listed == low_lr_wins[:known] == high_lr_wins[:known]
    assert sweep.num_trials == 8 and says in sweep.note


def test_a_tpe_studys_later_trials_depend_on_the_results_and_are_not_listed(tmp_path):
    args = [*SEEDED, "hydra.sweeper.sampler.n_startup_trials=3"]
    sweep = expand_sweep(["-m", *args])
    low_lr_wins = _plugins_trials(args, tmp_path / "a", result=_lr)
    high_lr_wins = _plugins_trials(args, tmp_path / "b", result=lambda o: -_lr(o))
    assert len(sweep.jobs) == 4 and low_lr_wins[4:] != high_lr_wins[4:]
    assert "the later ones depend on the results" in sweep.note


def test_a_sweep_files_space_and_a_fixed_value_are_the_sweepers(tmp_path):
    """lr_precision_search's params (precision x log lr, two objectives); precision=bf16 on the
    command line fixes the key it sweeps, in the sweeper as here."""
    args = ["+sweep=lr_precision_search", "model=tiny", "train.max_steps=3", "precision=bf16"]
    sweep = expand_sweep(["-m", *args])
    ran = _plugins_trials(args, tmp_path, result=lambda o: [_lr(o), _lr(o)])
    assert [j.overrides for j in sweep.jobs] == ran[:4]  # n_startup_trials: 4
    assert {j.run.precision.name for j in sweep.jobs} == {"bf16"}
    assert "its first 4 of 12 trials" in sweep.note


def test_an_unseeded_sampler_lists_a_sample_and_says_a_seed_fixes_it():
    args = ["-m", *OPTUNA, "optim.lr=interval(1e-4,1e-2)", "hydra.sweeper.n_trials=4", "hydra.sweeper.n_jobs=2"]
    first, second = expand_sweep(args), expand_sweep(args)
    assert "unseeded" in first.note and "a sample" in first.note and "hydra.sweeper.sampler.seed=0" in first.note
    assert [_lr(j.overrides) for j in first.jobs] != [_lr(j.overrides) for j in second.jobs]


# ---- what the command prints

def test_the_estimate_says_what_it_lists_then_the_compute_it_can_bound(capsys):
    from trainlab.estimate_command import main

    main(["-m", *GRID, "hydra.sweeper.n_trials=3", "cluster.num_workers=1"])
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("hydra/sweeper=optuna (GridSampler): it runs 3 of these 4 grid points"), out[:500]
    assert len(re.findall(r"^(?:fits|does NOT fit)\b", out, flags=re.M)) == 4
    bound = re.search(r"^estimated compute: at most ([\d.,]+) cpu-(seconds|hours) for the 3 trials it runs", out,
                      flags=re.M)
    assert bound, out[-1500:]
    # the bound is the 3 costliest trials' step time x train.max_steps x ranks
    steps = [float(s) / (1000 if u == "ms" else 1) for s, u in re.findall(r"step ([\d.]+) (ms|s)\b", out)]
    costliest = sorted(s * 3 * 1 for s in steps)[-3:]  # train.max_steps=3 on 1 rank
    shown = float(bound.group(1).replace(",", "")) * (3600 if bound.group(2) == "hours" else 1)
    assert math.isclose(shown, sum(costliest), rel_tol=0.02), (shown, costliest)


def test_another_search_sweeper_is_refused_in_one_line_naming_a_point_to_estimate(cli_env, tmp_path, capsys):
    from trainlab.estimate_command import main

    nevergrad = "hydra_plugins.hydra_nevergrad_sweeper.nevergrad_sweeper.NevergradSweeper"
    proc = subprocess.run(trainlab_cmd("estimate", "-m", f"hydra.sweeper._target_={nevergrad}", "model=tiny",
                                       "optim.lr=interval(1e-4,1e-2)", "precision=fp32,bf16"),
                          cwd=tmp_path, env=cli_env, capture_output=True, text=True, timeout=300)
    assert_refused(proc, ["hydra/sweeper=nevergrad", "cannot be listed before they run",
                          "trainlab estimate model=tiny optim.lr=0.0001 precision=fp32"], sessions=[])
    point = proc.stderr.split("instead: ", 1)[1].strip()
    main(shlex.split(point)[2:])  # the point it names is one a user can estimate
    assert re.search(r"^fits\b.*tokens/s", capsys.readouterr().out, flags=re.M)
