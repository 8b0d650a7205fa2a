"""`trainlab train -m` with Hydra's Optuna sweeper refuses a study it cannot run before the sweeper
or Ray starts, with the same one line as `trainlab estimate -m` (config.optuna_trials.optuna_proposal,
read by both through config.overrides.check_overrides): n_trials=0 ran nothing and exited 0, n_jobs=-1
and an interval given high-low ended in tracebacks. Each fix the line gives passes the same check."""

from __future__ import annotations

import pytest

from trainlab.config import ConfigError
from trainlab.config.multirun import expand_sweep
from trainlab.config.overrides import check_overrides

STUDY = ["-m", "+sweep=lr_precision_search", "model=tiny", "train.max_steps=2", "tracking=none"]


@pytest.mark.parametrize("bad, says, fix", [
    ("hydra.sweeper.n_trials=0", "hydra.sweeper.n_trials=0: the study needs at least 1; give hydra.sweeper.n_trials=20",
     "hydra.sweeper.n_trials=20"),
    ("hydra.sweeper.n_jobs=-1", "hydra.sweeper.n_jobs=-1: the study needs at least 1; give hydra.sweeper.n_jobs=2",
     "hydra.sweeper.n_jobs=2"),
    ("optim.lr=interval(1e-2,1e-4)", "optim.lr=interval(1e-2,1e-4): its low end 0.01 is above its high end 0.0001; "
     "give them in order: optim.lr=interval(0.0001,0.01)", "optim.lr=interval(0.0001,0.01)"),
    ("optim.lr=tag(log,interval(0,1e-2))", "optim.lr=tag(log,interval(0,1e-2)): a log interval needs a low end above "
     "0 (its logarithm is drawn), not 0; give one, e.g. optim.lr=tag(log,interval(1e-06,0.01))",
     "optim.lr=tag(log,interval(1e-06,0.01))"),
    ("optim.lr=interval(a,b)", "optim.lr=interval(a,b): interval(...): mismatch type argument start: str is "
     "incompatible with Union[int, float]; interval(low,high) takes two numbers, low <= high, e.g. "
     "optim.lr=interval(0.0001,0.01)", "optim.lr=interval(0.0001,0.01)"),
    ("optim.lr=choice()", "optim.lr=choice(): choice(...): empty choice is not legal; choice(...) takes one value or "
     "more, e.g. optim.lr=choice(0.001)", "optim.lr=choice(0.001)"),
    ("seed=range(3,3)", "seed=range(3,3) gives no value, so the sweep would have no trials; give it values, e.g. "
     "seed=range(3,7)", "seed=range(3,7)"),
    ("hydra.sweeper.n_trials=100000", "hydra.sweeper.n_trials=100000 runs 100000 trials, more than "
     "hydra.launcher.max_trials=256; lower it to hydra.sweeper.n_trials=256 or fewer, or run all 100000 with "
     "hydra.launcher.max_trials=100000", "hydra.sweeper.n_trials=256"),
])
def test_a_study_optuna_cannot_run_is_refused_by_train_and_estimate_alike_with_a_fix_that_runs(bad, says, fix):
    lines = []
    for command in (lambda a: check_overrides(a, folders=False), expand_sweep):  # train -m's first check, estimate -m
        with pytest.raises(ConfigError) as info:
            command([*STUDY, bad])
        lines.append(str(info.value))
    assert lines[0] == lines[1] and "\n" not in lines[0]
    assert says in lines[0]
    check_overrides([*STUDY, fix], folders=False)  # the fix it gives is a study that runs


def test_a_grid_with_more_trials_than_points_runs_its_points_within_the_bound():
    # n_trials above max_trials is fine where the grid holds fewer points: the sweeper runs those
    grid = ["-m", "hydra/sweeper=optuna", "hydra/sweeper/sampler=grid", "model=tiny", "tracking=none",
            "precision=fp32,bf16", "optim.lr=0.001,0.002", "hydra.sweeper.n_trials=1000"]
    check_overrides(grid, folders=False)
    assert expand_sweep(grid).num_trials == 4  # 2 precisions x 2 lrs
    with pytest.raises(ConfigError, match="hydra.sweeper.n_trials=1000 runs 4 trials, more than hydra.launcher."
                                          "max_trials=3"):
        check_overrides([*grid, "hydra.launcher.max_trials=3"], folders=False)
