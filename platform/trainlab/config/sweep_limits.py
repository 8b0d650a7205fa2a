"""How large a sweep may be, and the launcher's own counts: checked once, on the driver.

    check_launcher_limits(cfg.hydra.launcher)          # max_trials, max_concurrent_trials >= 0
    check_sweep_size(num_trials=500, max_trials=256)    # ValueError: its size and the override that lifts it

A multirun's size is the product of its swept values, known before a job is composed: a sweep
of seed=range(0,10000) is refused in a second, naming its size and hydra.launcher.max_trials
(the launcher's setting, beside max_concurrent_trials: what a Hydra user sets a launcher's limits
with), not planned for minutes and then launched. A sweep of no job (an empty range) is refused too.
"""

from __future__ import annotations

from typing import Any

from trainlab.vocab.launcher import TrainlabRayLauncherConf

DEFAULT_MAX_TRIALS = TrainlabRayLauncherConf.max_trials


def check_launcher_limits(launcher: Any) -> None:
    """The launcher's counts (Hydra's DictConfig of hydra.launcher, or the launcher itself):
    ValueError naming the key, the value and the fix. A launcher without them (basic) passes."""
    for key, meaning in (("max_concurrent_trials", "0 = as many as the cluster fits"),
                         ("max_trials", "0 = no bound")):
        value = getattr(launcher, key, None)
        if value is not None and value < 0:
            default = getattr(TrainlabRayLauncherConf, key)
            raise ValueError(f"hydra.launcher.{key}={value} is negative; give a count >= 0 ({meaning}), "
                             f"e.g. its default hydra.launcher.{key}={default}")


def check_keep_warm(launcher: Any, *, cluster_address: str) -> None:
    """hydra.launcher.keep_warm_s against the gangs it would keep: ValueError naming the key, the
    value and the fix. Gangs outlive the command only on a cluster that outlives it, and only
    warm gangs are kept."""
    keep = getattr(launcher, "keep_warm_s", None)
    if keep is None or keep == 0:
        return
    if keep < 0:
        raise ValueError(f"hydra.launcher.keep_warm_s={keep:g} is negative; give seconds >= 0 "
                         "(0 = gangs end with the multirun), e.g. hydra.launcher.keep_warm_s=600")
    if not getattr(launcher, "reuse_gangs", True):
        raise ValueError(f"hydra.launcher.keep_warm_s={keep:g} keeps warm gangs, but hydra.launcher.reuse_gangs=false "
                         "gives each trial a gang of its own; drop hydra.launcher.reuse_gangs=false, or "
                         "hydra.launcher.keep_warm_s")
    if not cluster_address:
        raise ValueError(f"hydra.launcher.keep_warm_s={keep:g} keeps gangs warm between commands on a running "
                         "cluster, but cluster.address is empty: the local Ray cluster this command starts "
                         "ends with it; start one (ray start --head --node-ip-address=127.0.0.1) and give "
                         "cluster.address=127.0.0.1:6379, or drop hydra.launcher.keep_warm_s")


def check_sweep_size(num_trials: int, *, max_trials: int | None, swept: str = "") -> None:
    """ValueError for a sweep of no trial, or of more than `max_trials` (0 or None: no bound).
    `swept`: the sweep's dimensions as a person reads them ('seed (10000 values)')."""
    over = f" over {swept}" if swept else ""
    if num_trials == 0:
        raise ValueError(f"the sweep has no trials{over}: a swept key has no value (an empty range such as "
                         "range(5,5)); give it at least one, e.g. seed=range(0,4) or seed=0,1")
    if max_trials and num_trials > max_trials:
        raise ValueError(f"the sweep has {num_trials} trials{over}, more than hydra.launcher.max_trials="
                         f"{max_trials}; sweep fewer values, or run all {num_trials} with "
                         f"hydra.launcher.max_trials={num_trials}")


def check_study_size(num_trials: int, *, asked: int, max_trials: int | None) -> None:
    """ValueError for a search sweeper's study of more than `max_trials` trials (0 or None: no
    bound): `num_trials` it runs, of hydra.sweeper.n_trials=`asked` (a grid runs at most its size)."""
    if max_trials and num_trials > max_trials:
        raise ValueError(f"hydra.sweeper.n_trials={asked} runs {num_trials} trials, more than hydra.launcher.max_trials="
                         f"{max_trials}; lower it to hydra.sweeper.n_trials={max_trials} or fewer, or run all "
                         f"{num_trials} with hydra.launcher.max_trials={num_trials}")
