"""The sweeps kept in sweeps/sweep/ compose and validate, every job of each, without running.

Hydra's own sweeper splits the composed definition (`+sweep=NAME` with return_hydra_config,
its `hydra.sweeper.params`) into jobs, exactly as `trainlab train -m +sweep=NAME` does; each
job is then composed and put through what the launcher checks before anything starts: the
typed config and its cross-field checks (config.to_run_config), the sweep's prune rule, and
the environment checks that need no cluster or store (launch.preflight, services=False).
A definition that names a removed option, a key that moved, or a combination the checks
refuse fails here instead of at a user's `trainlab train -m`.

A compose costs 0.1-0.5 s on a busy 2-core machine, so the seeds are not crossed with every
other combination (a seed changes no check but its own range): every combination of the other
swept keys is composed with the first seed, and every seed with the first combination.
"""

from __future__ import annotations

import functools

import pytest
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser

from trainlab.config import ConfigError
from trainlab.config.convert import CONF_DIR, SWEEPS_DIR, to_run_config
from trainlab.config.multirun import expand_sweep
from trainlab.config.prune_rule import PruneConfig, check_prunable
from trainlab.config.schema import register_configs
from trainlab.config.study_rule import BASIC_SWEEPER
from trainlab.launch.preflight import preflight
from trainlab.precision.capability import cpu_lacks_native

SWEEPS = sorted(p.stem for p in (SWEEPS_DIR / "sweep").glob("*.yaml"))
SEARCHES = ("lr_precision_search",)
"""Kept sweeps whose sweeper is a search (Hydra's Optuna sweeper): their jobs are proposed, not a grid."""
README_SWEEPS = ("precision_shootout", "format_ladder", "parallel_grid", "lr_precision_stability")


def _covering(jobs: list[list[str]]) -> list[list[str]]:
    """The jobs with the first seed, and the other seeds' jobs of the first combination."""
    def rest(job):
        return [o for o in job if not o.startswith("seed=")]

    first_seed = next((o for o in jobs[0] if o.startswith("seed=")), None)
    return [j for j in jobs if first_seed is None or first_seed in j or rest(j) == rest(jobs[0])]


@functools.cache
def _sweep(name: str) -> tuple[dict, list[list[str]], list[tuple[list[str], object]]]:
    """The sweep's params as composed, its jobs' overrides as Hydra's basic sweeper makes them,
    and (job, RunConfig or the ConfigError refusing it) for the covering jobs."""
    searched = None
    if name in SEARCHES:  # (config.multirun composes with a Hydra of its own: before this one starts)
        searched = [list(job.overrides) for job in expand_sweep(["-m", f"+sweep={name}"]).jobs]
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"+sweep={name}"], return_hydra_config=True)
        params = dict(cfg.hydra.sweeper.params or {})
        if searched is not None:  # a search: the trials known before any runs
            assert cfg.hydra.sweeper._target_ != BASIC_SWEEPER, name
            jobs = searched
        else:
            parsed = OverridesParser.create().parse_overrides(
                [f"+sweep={name}", *(f"{k}={v}" for k, v in params.items())])
            (jobs,) = BasicSweeper.split_arguments(parsed, None)  # no max_batch_size: one batch of every job
        checked = []
        for job in _covering(jobs):
            try:
                run = to_run_config(compose(config_name="config", overrides=job))
                preflight(run, tracking_uri=None, services=False)
            except ConfigError as e:
                run = e
            checked.append((job, run))
    return params, jobs, checked


def _refused_for_cpu_rowwise(job: list[str], refusal: ConfigError) -> bool:
    """The one refusal a kept sweep may meet here: a rowwise FP8 mode run natively where torch's
    CPU _scaled_mm has no rowwise scales (torch 2.11, the GPU machine's version, on this CPU
    machine), refused before anything starts, naming the fix. On CUDA and 2.13 they run."""
    precision = next((o.split("=", 1)[1] for o in job if o.startswith("precision=")), None)
    return (precision is not None and "precision.fp8_impl=emulated" in str(refusal)
            and cpu_lacks_native(precision, emulated="precision.fp8_impl=emulated" in job))


def test_the_readmes_sweeps_are_all_kept():
    assert set(README_SWEEPS) <= set(SWEEPS), SWEEPS


@pytest.mark.parametrize("name", SWEEPS)
def test_every_job_of_a_kept_sweep_composes_and_passes_the_launchers_checks(name, capsys):
    params, jobs, checked = _sweep(name)
    assert params, f"sweeps/sweep/{name}.yaml sweeps nothing (no hydra.sweeper.params)"
    if name in SEARCHES:  # its listed trials: Optuna's random start, each value within the space
        assert len(jobs) >= 2, jobs
    else:
        sizes = [len(str(v).split(",")) for v in params.values()]
        assert len(jobs) == functools.reduce(int.__mul__, sizes), (len(jobs), params)
    refused = [f"{' '.join(job)}: {run}" for job, run in checked if isinstance(run, ConfigError)
               if not _refused_for_cpu_rowwise(job, run)]
    assert not refused, "\n".join(refused)
    for job, run in checked:  # the job trains what it says: its sweep's name, each swept field's value
        if isinstance(run, ConfigError):
            continue  # the refusal above
        assert run.sweep_name == name, job
        for override in job[1:]:
            key, value = override.split("=", 1)
            if "." in key or key == "seed":  # a field (a group's option is a preset, named otherwise)
                got = functools.reduce(getattr, key.split("."), run)
                assert (got == float(value)) if isinstance(got, float) else str(got) == value, (job, got)
    kept = [(job, run) for job, run in checked if not isinstance(run, ConfigError)]
    check_prunable(PruneConfig(), [run for _, run in kept], [" ".join(job) for job, _ in kept])
    assert "warning" not in capsys.readouterr().out.lower()  # no swept value is ignored either


def test_format_ladder_removes_activation_bits_with_weights_and_gradients_fixed():
    _, jobs, checked = _sweep("format_ladder")
    runs = [run for _, run in checked]
    ladder = {r.precision.formats.activations for r in runs}
    assert {"e4m3", "e2m1fn", "e5m0"} <= ladder and len(ladder) == 6, ladder
    assert {(r.precision.name, r.precision.formats.weights, r.precision.formats.gradients) for r in runs} == {
        ("emulated", "e4m3", "e5m2")}
    assert len(jobs) == 12 and {r.seed for r in runs} == {0, 1}


def test_lr_precision_stability_crosses_learning_rates_with_precisions_over_two_seeds():
    _, jobs, checked = _sweep("lr_precision_stability")
    runs = [run for _, run in checked]
    assert len({(r.precision.name, r.optim.lr) for r in runs}) == 16 and len(jobs) == 32
    assert {r.seed for r in runs} == {0, 1}
    assert {tuple(r.precision.keep_hp) for r in runs} == {("output", "unaligned")}
