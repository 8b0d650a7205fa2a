"""The settings of the Hydra launcher `trainlab_ray` (hydra.launcher.*).

The plugin (hydra_plugins.trainlab_launcher) registers and reads them; the config layer reads
them too (an unknown hydra.launcher key is named with the keys this class has). A plugin
imports the application, never the reverse, so the dataclass sits below both.
"""

from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class TrainlabRayLauncherConf:
    _target_: str = "hydra_plugins.trainlab_launcher.ray_launcher.TrainlabRayLauncher"
    max_concurrent_trials: int = 0
    """Trials running at once; 0 = as many as the cluster's CPUs (or GPUs) fit."""
    max_trials: int = 256
    """Trials a sweep may hold: a larger one is refused before any job is composed, naming its
    size (trainlab.config.sweep_limits); 0 = no bound."""
    rerun: bool = False
    """Run trials again even when the sweep already holds a finished run of the same config."""
    # stopping hopeless trials early (trainlab.config.prune_rule, trainlab.launch.pruner)
    prune: str = "none"
    """none | margin | asha | median | successive_halving | hyperband: none stops a trial early only
    when it diverges (as always); margin when its val loss at equal tokens is worse than the best
    trial's by more than prune_margin; asha by asynchronous successive halving (Ray Tune's
    ASHAScheduler); median, successive_halving and hyperband are Optuna's pruners (MedianPruner,
    SuccessiveHalvingPruner, HyperbandPruner), fed every trial's val-loss curve at equal tokens."""
    prune_margin: float = 0.1
    """margin: how much worse than the best trial's val loss, as a fraction (0.1 = 10 %)."""
    prune_grace_tokens: int = 0
    """Tokens every trial trains before it can be pruned (asha: the first rung); 0 = a quarter
    of the sweep's shortest trial."""
    prune_reduction_factor: float = 4.0
    """asha, successive_halving, hyperband: each rung keeps the best 1/factor of the trials that
    reached it; rungs are grace x factor^k tokens."""
    prune_startup_trials: int = 5
    """median: trials that must end before any is pruned (Optuna's n_startup_trials)."""
    # what each trial returns to the sweeper (trainlab.config.study_rule, trainlab.vocab.objectives)
    objective: List[str] = field(default_factory=lambda: ["val_loss"])
    """val_loss | tokens_per_s | peak_mem_gb | time_to_loss, one or several (then a list, in this
    order, and `trainlab compare` marks the Pareto front); hydra.sweeper.direction must match."""
    objective_tokens: int = 0
    """val_loss is read at these tokens seen (curves interpolated: batch sizes may differ); 0 = each
    trial's last validation."""
    target_loss: Optional[float] = None
    """time_to_loss: the val loss to reach."""
    reuse_gangs: bool = True
    """Trials of the same gang shape run one after another on warm gangs (one Ray Train run
    each, trial after trial from a queue); false gives each trial a gang of its own."""
    keep_warm_s: float = 0
    """On a running cluster (cluster.address): seconds a warm gang stays up after the multirun,
    free for the next command's trials of its shape (trainlab.launch.kept_gang); 0 = gangs end
    with the multirun."""
