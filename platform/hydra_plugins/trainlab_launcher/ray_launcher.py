"""Hydra launcher `trainlab_ray`: every multirun job becomes a gang-scheduled Ray trial.

Hydra hands over the jobs' overrides; trainlab.launch.sweep does the work (compose and
validate every job first, find or create the sweep's parent MLflow run, skip finished
trials, run the rest concurrently on Ray). This class only adapts it to Hydra's interface.
"""


import sys
from typing import Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from trainlab.config.compose_cache import reuse_compositions
from trainlab.vocab.launcher import TrainlabRayLauncherConf

ConfigStore.instance().store(group="hydra/launcher", name="trainlab_ray", node=TrainlabRayLauncherConf,
                             provider="trainlab")


class TrainlabRayLauncher(Launcher):
    def __init__(self, max_concurrent_trials: int = 0, rerun: bool = False, reuse_gangs: bool = True,
                 prune: str = "none", prune_margin: float = 0.1, prune_grace_tokens: int = 0,
                 prune_reduction_factor: float = 4.0, prune_startup_trials: int = 5, max_trials: int = 256,
                 objective: Sequence[str] = ("val_loss",), objective_tokens: int = 0,
                 target_loss: float | None = None, keep_warm_s: float = 0) -> None:
        self.max_concurrent_trials = max_concurrent_trials
        self.max_trials = max_trials  # read from the config by launch.sweep (config.sweep_limits)
        self.rerun = rerun
        self.reuse_gangs, self.keep_warm_s = reuse_gangs, keep_warm_s
        self.prune, self.prune_margin = prune, prune_margin
        self.prune_grace_tokens, self.prune_reduction_factor = prune_grace_tokens, prune_reduction_factor
        self.prune_startup_trials = prune_startup_trials
        # what a trial returns to the sweeper: read from the config by launch.sweep (config.study_rule)
        self.objective, self.objective_tokens, self.target_loss = objective, objective_tokens, target_loss
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.study = None
        """The multirun's launch.study.Study, opened at the first launch(): every batch the sweeper
        launches runs in it (one parent run, warm gangs across batches)."""

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction,
              config: DictConfig) -> None:
        # the task function is trainlab.train.app's; trials run through trainlab.launch.sweep
        reuse_compositions(hydra_context.config_loader)  # the sweeper's check and _prepare compose each job
        self.config = config
        self.hydra_context = hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from trainlab.config import ConfigError
        from trainlab.config.prune_rule import prune_config
        from trainlab.launch.sweep import new_study, run_sweep

        assert self.config is not None and self.hydra_context is not None
        if self.study is None:
            try:  # `trainlab train` checked it already (config.overrides); another entry point may not have
                self.study = new_study(self.config, max_concurrent_trials=self.max_concurrent_trials,
                                       rerun=self.rerun, prune=prune_config(self), reuse_gangs=self.reuse_gangs,
                                       keep_warm_s=self.keep_warm_s)
            except (ValueError, ConfigError) as e:
                print(f"error: {e}", file=sys.stderr)
                sys.exit(2)
        return run_sweep(hydra_context=self.hydra_context, config=self.config, job_overrides=job_overrides,
                         initial_job_idx=initial_job_idx, study=self.study)
