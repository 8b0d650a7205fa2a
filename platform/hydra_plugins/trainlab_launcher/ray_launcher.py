"""Hydra launcher `trainlab_ray`: every multirun job becomes a gang-scheduled Ray trial.

Hydra hands over the jobs' overrides; trainlab.launch.sweep does the work (compose and
validate every job first, find or create the sweep's parent MLflow run, skip finished
trials, run the rest concurrently on Ray). This class only adapts it to Hydra's interface.
"""


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
    reuse_gangs: bool = True
    """Trials of the same gang shape run one after another on warm gangs (one Ray Train run
    each, trial after trial from a queue); false gives each trial a gang of its own."""


ConfigStore.instance().store(group="hydra/launcher", name="trainlab_ray", node=TrainlabRayLauncherConf,
                             provider="trainlab")


class TrainlabRayLauncher(Launcher):
    def __init__(self, max_concurrent_trials: int = 0, rerun: bool = False, reuse_gangs: bool = True) -> None:
        self.max_concurrent_trials = max_concurrent_trials
        self.rerun = rerun
        self.reuse_gangs = reuse_gangs
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction,
              config: DictConfig) -> None:
        # the task function is trainlab.train.app's; trials run through trainlab.launch.sweep
        self.config = config
        self.hydra_context = hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from trainlab.launch.sweep import run_sweep

        assert self.config is not None and self.hydra_context is not None
        return run_sweep(hydra_context=self.hydra_context, config=self.config,
                         job_overrides=job_overrides, initial_job_idx=initial_job_idx,
                         max_concurrent_trials=self.max_concurrent_trials, rerun=self.rerun,
                         reuse_gangs=self.reuse_gangs)
