"""Hydra launcher `trainlab_ray`: every multirun job becomes a gang-scheduled Ray trial.

Hydra hands over the jobs' overrides; trainlab.launch.sweep does the work (compose and
validate every job first, find or create the sweep's parent MLflow run, skip finished
trials, run the rest concurrently on Ray). This class only adapts it to Hydra's interface.
"""


import sys
from dataclasses import dataclass
from typing import Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


@dataclass
class TrainlabRayLauncherConf:
    _target_: str = "hydra_plugins.trainlab_launcher.ray_launcher.TrainlabRayLauncher"
    max_concurrent_trials: int = 0
    """Trials running at once; 0 = as many as the cluster's CPUs (or GPUs) fit."""
    rerun: bool = False
    """Run trials again even when the sweep already holds a finished run of the same config."""
    # stopping hopeless trials early (trainlab.config.prune, trainlab.launch.prune)
    prune: str = "none"
    """none | margin | asha: none stops a trial early only when it diverges (as always); margin
    when its val loss at equal tokens is worse than the best trial's by more than prune_margin;
    asha by asynchronous successive halving (Ray Tune's ASHAScheduler)."""
    prune_margin: float = 0.1
    """margin: how much worse than the best trial's val loss, as a fraction (0.1 = 10 %)."""
    prune_grace_tokens: int = 0
    """Tokens every trial trains before it can be pruned (asha: the first rung); 0 = a quarter
    of the sweep's shortest trial."""
    prune_reduction_factor: float = 4.0
    """asha: each rung keeps the best 1/factor of the trials that reached it; rungs are
    grace x factor^k tokens."""
    reuse_gangs: bool = True
    """Trials of the same gang shape run one after another on warm gangs (one Ray Train run
    each, trial after trial from a queue); false gives each trial a gang of its own."""


ConfigStore.instance().store(group="hydra/launcher", name="trainlab_ray", node=TrainlabRayLauncherConf,
                             provider="trainlab")


class TrainlabRayLauncher(Launcher):
    def __init__(self, max_concurrent_trials: int = 0, rerun: bool = False, reuse_gangs: bool = True,
                 prune: str = "none", prune_margin: float = 0.1, prune_grace_tokens: int = 0,
                 prune_reduction_factor: float = 4.0) -> None:
        self.max_concurrent_trials = max_concurrent_trials
        self.rerun = rerun
        self.reuse_gangs = reuse_gangs
        self.prune, self.prune_margin = prune, prune_margin
        self.prune_grace_tokens, self.prune_reduction_factor = prune_grace_tokens, prune_reduction_factor
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction,
              config: DictConfig) -> None:
        # the task function is trainlab.train.app's; trials run through trainlab.launch.sweep
        self.config = config
        self.hydra_context = hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from trainlab.config.prune import prune_config
        from trainlab.launch.sweep import run_sweep

        assert self.config is not None and self.hydra_context is not None
        try:  # `trainlab train` checked it already (config.overrides); another entry point may not have
            prune = prune_config(self)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        return run_sweep(hydra_context=self.hydra_context, config=self.config,
                         job_overrides=job_overrides, initial_job_idx=initial_job_idx,
                         max_concurrent_trials=self.max_concurrent_trials, rerun=self.rerun, prune=prune,
                         reuse_gangs=self.reuse_gangs)
