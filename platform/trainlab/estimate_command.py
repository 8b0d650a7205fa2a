"""`trainlab estimate [-m] OVERRIDES...`: memory and time of a trial, or of every trial of a sweep,
before anything runs.

    trainlab estimate model=7b parallel=fsdp precision=bf16 cluster.num_workers=16 \\
        cluster.nodes=[8xH100,8xH100] cluster.network_gb_s=50
    trainlab estimate -m +sweep=parallel_grid cluster.nodes=[4xA100]
    trainlab estimate cluster=ray cluster.address=HEAD:6379 model=1b      # the running cluster's GPUs

The command line is composed and checked exactly as `trainlab train` would (config.multirun:
the same conf/, the same refusals, a sweep's jobs as Hydra's basic sweeper makes them; Hydra's
Optuna sweeper's as far as they are known before any runs, a line first saying which; any other
search sweeper refused, naming one point to estimate instead); nothing starts, no Hydra folder is
written, and no Ray is started (a running cluster at cluster.address is only read). The cluster is cluster.nodes, else the one at cluster.address
(the GPU types placement would give the trial), else this machine. Exit status 2 for bad input
(a config, or a cluster that cannot hold a trial's gang), else 0: a trial that does not fit is
an answer, shown in red with what it lacks.
"""

from __future__ import annotations

import sys

USAGE = """usage: trainlab estimate [-m] [overrides...]

Memory per rank (by kind, and headroom on its device), step time, tokens/s, MFU and the bound
of each trial, composed as `trainlab train` composes it, on the cluster of
  cluster.nodes=[8xH100,8xH100]   (Ray accelerator types; cluster.nvlink_gb_s, cluster.network_gb_s)
  cluster.address=HEAD:6379       (a running Ray cluster, when cluster.nodes is empty)
  this machine                    (neither)
with cluster.calibration=FILE's efficiencies (`trainlab calibrate -o FILE`).
  -m, --multirun   every job of a sweep (comma lists, +sweep=NAME), ranked at the end, and its
                   estimated compute; with hydra/sweeper=optuna the trials known before any runs
                   (a grid's every point, a seeded sampler's first batch), a line saying which
"""

SHOWN_KEYS = ("model", "parallel", "precision")
"""What names a single trial (a sweep's trials are named by the keys they vary)."""


def _labels(jobs) -> list[str]:
    from trainlab.launch.sweep_trial import pick as _pick
    from trainlab.launch.sweep_trial import varied_keys

    if len(jobs) > 1:
        keys = varied_keys([list(j.overrides) for j in jobs])
        return [f"#{i} {_pick(j.overrides, keys)}" for i, j in enumerate(jobs)]
    run = jobs[0].run
    return [f"model={run.model.name} parallel={run.parallel.name} precision={run.precision.name} "
            f"x{run.cluster.num_workers}"]


def estimate_jobs(jobs) -> list:
    """Each job's TrialEstimate (an error where its cluster cannot be read or hold it)."""
    from trainlab.estimate.fit_check import estimate_run
    from trainlab.estimate.table import TrialEstimate
    from trainlab.plan.derive_layout import plan_layout

    out = []
    for label, job in zip(_labels(jobs), jobs):
        cluster = None
        try:
            cluster, note = described_cluster(job.run)
            estimate = estimate_run(job.run, cluster, trial_layout=plan_layout(job.run))
            out.append(TrialEstimate(label=label, cluster=cluster, estimate=estimate, note=note))
        except (ValueError, NotImplementedError) as e:  # a model it has no shape for: said, not a traceback
            out.append(TrialEstimate(label=label, cluster=cluster, estimate=None, error=str(e)))
    return out


def compute_line(sweep, trials) -> str:
    """The sweep's estimated compute, as `trainlab train -m` prints it before its first trial
    (step time x train.max_steps x ranks, summed), over what is listed: all its trials; at most
    the costliest of a grid it runs some points of; or a search's first trials, with what all of
    them would take, each as costly as the costliest listed."""
    costs = [t.estimate.step_time_s * job.run.train.max_steps * len(t.estimate.ranks)
             for t, job in zip(trials, sweep.jobs) if t.estimate is not None]
    devices = "/".join(sorted({r.device.name for t in trials if t.estimate for r in t.estimate.ranks})) or "device"

    def amount(device_s: float) -> str:
        return f"{device_s / 3600:,.2f} {devices}-hours" if device_s >= 360 else f"{device_s:.3g} {devices}-seconds"

    listed, runs, how = len(sweep.jobs), sweep.num_trials, "step time x train.max_steps x ranks, summed"
    if len(costs) < listed:
        return (f"estimated compute: {amount(sum(costs))} for the {len(costs)} of {listed} listed trials that "
                f"have an estimate ({how})")
    if runs == listed:
        return f"estimated compute: {amount(sum(costs))} for {runs} trials ({how})"
    if runs < listed:
        return (f"estimated compute: at most {amount(sum(sorted(costs)[-runs:]))} for the {runs} trials it runs "
                f"(the {runs} costliest of these {listed}; {how})")
    return (f"estimated compute: {amount(sum(costs))} for the {listed} trials listed ({how}); the other "
            f"{runs - listed} are not known before they run: {runs} trials as costly as the costliest listed "
            f"would take {amount(runs * max(costs, default=0.0))}")


def described_cluster(run) -> tuple:
    """The estimate's cluster (a ClusterSpec) and a note on it: cluster.nodes; else the running
    cluster at cluster.address, where the launcher's own planning (launch.plan.plan_gang) puts the
    gang (all its GPUs, with placement's reasons as the note, when no type can take it); else
    this machine."""
    import torch

    from trainlab.config import ConfigError
    from trainlab.devices import resolve_device
    from trainlab.estimate.fit_check import config_cluster, local_cluster
    from trainlab.launch.estimate_cluster import placed_cluster, ray_cluster
    from trainlab.launch.plan import plan_gang
    from trainlab.launch.preflight import check_cluster

    described = config_cluster(run)
    if described is not None:
        return described, ""
    if not run.cluster.address:
        device = resolve_device(run.cluster.device, gpus=torch.cuda.is_available(),
                                logical_gpus=run.debug.logical_gpus)
        return local_cluster(run, device=device), ""
    check_cluster(run)  # ValueError now, not ray.init retrying for minutes, when nothing answers there
    try:
        _, gang = plan_gang(run, run.cluster.device)  # joins the cluster
    except ConfigError as e:  # no GPU type can run it: shown beside the estimate on every GPU of the cluster
        import ray

        return ray_cluster(ray.nodes(), run, gpus=True), f"refused at launch: {e}"
    if not gang.gpus:
        return placed_cluster(run, gang), ""
    others = [t for t in gang.all_types if t not in gang.accelerator_types]
    note = f"placed on {', '.join(gang.accelerator_types)}"
    note += f" (not {', '.join(others)})" if others else ""
    return placed_cluster(run, gang), note


def main(argv: list[str]) -> None:
    from trainlab.config import ConfigError
    from trainlab.config.multirun import expand_sweep
    from trainlab.console import console
    from trainlab.estimate.table import ranking_table, trial_renderables
    from trainlab.plan.derive_layout import plan_layout
    from trainlab.redact import redact

    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return
    try:
        sweep = expand_sweep(argv, check=plan_layout)  # a layout that cannot run is refused as train refuses it
    except ConfigError as e:
        print(f"error: {redact(str(e))}", file=sys.stderr)
        sys.exit(2)
    if sweep.note:  # what a search sweeper's listed trials are of its study, before their numbers
        console.print(sweep.note, markup=False, soft_wrap=True)
        console.print()
    trials = estimate_jobs(sweep.jobs)
    if len(trials) == 1 and trials[0].estimate is None:  # bad input: one error line, as train's
        print(f"error: {redact(trials[0].error)}", file=sys.stderr)
        sys.exit(2)
    for t in trials:
        for item in trial_renderables(t):
            console.print(item)
        console.print()
    if len(trials) > 1:
        console.print(ranking_table(trials))
    if len(trials) > 1 or sweep.note:
        console.print(compute_line(sweep, trials), markup=False, soft_wrap=True)
    failed = [t for t in trials if t.estimate is None]
    if failed:
        each = "; ".join(f"{t.label}: {t.error}" for t in failed)
        print(f"error: {len(failed)} of {len(trials)} trials have no estimate: {redact(each)}", file=sys.stderr)
        sys.exit(2)
