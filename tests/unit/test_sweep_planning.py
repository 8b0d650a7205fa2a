"""Issue 28 (sweep): planning a sweep costs milliseconds per trial, says its size, and is bounded.

Hydra composes a job from scratch (every YAML read, the defaults tree built and merged); a sweep
over values (seed=range(...)) shares one defaults list, so it is composed once and each job is a
copy with its values applied (config.compose_cache). Counted, not timed: Hydra's defaults-list
construction runs once per distinct group choice, however many jobs.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_dir
from hydra._internal import config_loader_impl
from omegaconf import OmegaConf

from trainlab.config import ConfigError, compose_run_config
from trainlab.config.compose_cache import reuse_compositions
from trainlab.config.convert import CONF_DIR
from trainlab.config.multirun import expand_jobs
from trainlab.config.overrides import check_overrides, hydra_error_message
from trainlab.config.schema import register_configs


@pytest.fixture
def defaults_lists(monkeypatch):
    """How many times Hydra builds a defaults list (the expensive part of composing a job)."""
    calls = []
    real = config_loader_impl.create_defaults_list

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(config_loader_impl, "create_defaults_list", counting)
    return calls


def test_a_sweep_over_values_is_composed_once(defaults_lists):
    jobs = expand_jobs(["-m", "model=tiny", "seed=range(0,30)", "train.max_steps=3"])
    assert [j.run.seed for j in jobs] == list(range(30))
    assert all(j.run.train.max_steps == 3 for j in jobs)
    # the master config, then one composition per distinct defaults list (one here), not one per job
    assert len(defaults_lists) <= 2, len(defaults_lists)


def test_check_overrides_composes_a_swept_value_once_per_defaults_list(defaults_lists):
    check_overrides(["-m", "model=tiny", "seed=range(0,40)", "precision=fp32,bf16"], folders=False)
    # the fixed overrides, then one per swept group option; the 40 seeds reuse the first
    assert len(defaults_lists) <= 3, len(defaults_lists)


@pytest.mark.parametrize("overrides", [
    ["model=tiny", "seed=3"],
    ["seed=3", "model=tiny", "train.max_steps=7", "+foo=1"],
    ["+sweep=precision_shootout", "seed=2", "hydra.launcher.max_concurrent_trials=2"],
    ["model=tiny", "precision=bf16", "train={max_steps: 4}"],
])
def test_a_reused_composition_is_what_hydra_composes(overrides):
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        hydras = OmegaConf.to_container(compose(config_name="config", overrides=overrides, return_hydra_config=True))
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        from hydra.core.global_hydra import GlobalHydra

        reuse_compositions(GlobalHydra.instance().hydra.config_loader)
        compose(config_name="config", overrides=overrides, return_hydra_config=True)  # fills the cache
        reused = OmegaConf.to_container(compose(config_name="config", overrides=overrides, return_hydra_config=True))
    assert reused == hydras


def test_a_bad_value_is_refused_as_hydra_refuses_it():
    register_configs()
    messages = []
    for reuse in (False, True):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            from hydra.core.global_hydra import GlobalHydra

            if reuse:
                reuse_compositions(GlobalHydra.instance().hydra.config_loader)
                compose(config_name="config", overrides=["model=tiny"])
            with pytest.raises(Exception) as e:
                compose(config_name="config", overrides=["model=tiny", "train.max_steps=abc"])
            messages.append(hydra_error_message(e.value, ["model=tiny", "train.max_steps=abc"]))
    assert messages[0] == messages[1] and "train.max_steps=abc" in messages[0]



# ---- the sweep's size, refused before its jobs are composed (hydra.launcher.max_trials)

def test_a_sweep_over_the_default_bound_is_refused_before_composing_its_jobs(defaults_lists):
    with pytest.raises(ConfigError) as e:
        check_overrides(["-m", "model=tiny", "seed=range(0,10000)"], folders=False)
    msg = str(e.value)
    assert "10000 trials" in msg and "seed (10000 values)" in msg
    assert "hydra.launcher.max_trials=256" in msg and "hydra.launcher.max_trials=10000" in msg
    assert len(defaults_lists) == 1  # the fixed overrides only: no job was composed


def test_the_bound_is_counted_over_a_sweep_files_params_and_lifted_by_the_override_it_names():
    args = ["-m", "+sweep=precision_shootout", "model=tiny", "seed=0,1,2", "hydra.launcher.max_trials=4"]
    with pytest.raises(ConfigError) as e:
        check_overrides(args, folders=False)
    n = int(str(e.value).split(" trials")[0].split()[-1])
    assert n > 4 and f"hydra.launcher.max_trials={n}" in str(e.value)
    check_overrides([*args[:-1], f"hydra.launcher.max_trials={n}"], folders=False)  # the fix, followed


@pytest.mark.parametrize("args, words", [
    (["-m", "model=tiny", "seed=range(5,5)"], ["seed=range(5,5)", "no value", "seed=range(5,9)"]),
    (["-m", "model=tiny", "seed=0,1", "hydra.launcher.max_concurrent_trials=-1"],
     ["hydra.launcher.max_concurrent_trials=-1", ">= 0", "hydra.launcher.max_concurrent_trials=0"]),
    (["-m", "model=tiny", "seed=0,1", "hydra.launcher.max_trials=-1"],
     ["hydra.launcher.max_trials=-1", ">= 0", "hydra.launcher.max_trials=256"]),
])
def test_launcher_counts_and_empty_ranges_are_refused(args, words):
    with pytest.raises(ConfigError) as e:
        check_overrides(args, folders=False)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_a_key_given_twice_is_warned_about(capsys):
    check_overrides(["model=tiny", "train.max_steps=3", "train.max_steps=5"], folders=False)
    out = capsys.readouterr().out
    assert "warning:" in out and "train.max_steps" in out and "train.max_steps=5, wins" in out


# ---- what the sweep says while it prepares: a count, then its size and estimated compute

def test_planning_a_sweep_prints_a_count_on_stderr(monkeypatch, capsys):
    from trainlab.launch import study

    monkeypatch.setattr(study, "plan_launch", lambda run, **kw: SimpleNamespace(run=run))
    todo = [study.Trial(idx=i, overrides=[f"seed={i}"], run=SimpleNamespace()) for i in range(20)]
    assert len(study.Study()._placeable(todo)) == 20
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == "planning trials: 20/20" and "planning trials: 2/20" in err  # a line every tenth in a log


def test_the_sweeps_estimated_compute_is_summed_over_its_trials():
    from trainlab.launch.sweep_report import compute_line

    def trial(step_s, steps, ranks):
        est = SimpleNamespace(step_time_s=step_s, ranks=(None,) * ranks)
        return SimpleNamespace(plan=SimpleNamespace(estimate=est, device="cuda"),
                               run=SimpleNamespace(train=SimpleNamespace(max_steps=steps)))

    line = compute_line([trial(0.5, 3600, 8), trial(1.0, 3600, 8), SimpleNamespace(plan=None)])
    assert "12.00 cuda-hours for 3 trials" in line and "1 trials without an estimate" in line


# ---- a gang beyond the cluster's CPUs: refused on the driver, before Ray starts

def test_a_gang_beyond_the_local_clusters_cpus_is_refused_with_the_numbers_and_the_fix(monkeypatch):
    from trainlab.launch import preflight

    monkeypatch.setattr(preflight.os, "cpu_count", lambda: 2)
    run = compose_run_config(["model=tiny", "cluster.num_workers=64", "tracking=none"])
    with pytest.raises(ValueError) as e:
        preflight.check_gang_cpus(run)
    msg = str(e.value)
    assert "cluster.num_workers=64" in msg and "needs 64 CPUs" in msg and "takes 4" in msg
    assert "cluster.num_workers=4 or fewer" in msg
    preflight.check_gang_cpus(compose_run_config(["model=tiny", "cluster.num_workers=4"]))  # the fix, followed
    wide = compose_run_config(["model=tiny", "cluster.cpus_per_worker=64"])
    with pytest.raises(ValueError, match=r"cluster.cpus_per_worker=2 or fewer"):
        preflight.check_gang_cpus(wide)
    with pytest.raises(ValueError, match=r"cluster.address=HEAD:7 has 8"):  # a joined cluster, once connected
        preflight.check_gang_cpus(compose_run_config(["cluster.address=HEAD:7", "cluster.num_workers=16"]),
                                  cluster_cpus=8)


def test_a_sweep_holding_one_such_trial_is_refused_whole(monkeypatch):
    from trainlab.launch import preflight

    monkeypatch.setattr(preflight.os, "cpu_count", lambda: 2)
    runs = [compose_run_config(["model=tiny", "tracking=none", f"cluster.cpus_per_worker={n}"]) for n in (1, 64)]
    with pytest.raises(ConfigError, match=r"cluster.cpus_per_worker=64 needs 128 CPUs"):
        preflight.check_sweep_services(runs)


def test_a_missing_sweep_names_the_folder_sweeps_live_in():
    with pytest.raises(ConfigError) as e:
        check_overrides(["-m", "+sweep=nope"], folders=False)
    assert "sweep=nope" in str(e.value) and "sweeps/sweep/" in str(e.value) and "conf/sweep" not in str(e.value)


def test_a_joined_clusters_cpus_refuse_each_trial_beyond_them_on_a_line_of_its_own():
    """Once joined, the cluster's CPUs (as ray.cluster_resources() reports them) against every
    trial's gang: a sweep names each trial that cannot fit; a single trial gets its line alone."""
    from trainlab.launch.plan import check_joined_gangs

    head = "cluster.address=127.0.0.1:7"
    runs = [compose_run_config(["model=tiny", "tracking=none", head, f"cluster.num_workers={n}"]) for n in (2, 4, 3)]
    labels = [f"#{i} (cluster.num_workers={n})" for i, n in enumerate((2, 4, 3))]
    with pytest.raises(ConfigError) as e:
        check_joined_gangs(runs, labels, resources={"CPU": 2.0})
    lines = str(e.value).splitlines()
    assert lines[0] == "the sweep has trials that cannot run; nothing was started:"
    assert [line.strip().split(": ")[0] for line in lines[1:]] == labels[1:]
    assert ("#1 (cluster.num_workers=4): cluster.num_workers=4 x cluster.cpus_per_worker=1 needs 4 CPUs, "
            "but the Ray cluster at cluster.address=127.0.0.1:7 has 2; use cluster.num_workers=2 or fewer") in lines[1]
    with pytest.raises(ConfigError) as one:  # a single trial (launch.plan.plan_gang): the same check, its line
        check_joined_gangs(runs[1:2], resources={"CPU": 2.0})
    assert str(one.value) == lines[1].strip().split(": ", 1)[1]
    check_joined_gangs(runs[:1], labels[:1], resources={"CPU": 2.0})  # the fix it names, followed
    logical = compose_run_config(["model=tiny", "tracking=none", head, "cluster.num_workers=4", "debug.logical_gpus=true"])
    check_joined_gangs([logical], resources={"CPU": 2.0, "GPU": 4.0})  # a GPU gang is placed by its GPUs


def test_a_sweeps_trials_are_checked_once_each_and_their_gangs_once_per_shape(monkeypatch, tmp_path):
    """check_sweep_services checks each gang shape once; what check_sweep_trials found of a trial
    (device, estimate) is what its plan's preflight returns, nothing of it checked again."""
    from trainlab.launch import preflight

    calls: dict[str, int] = {}
    for name in ("check_gang_cpus", "check_data", "check_device", "check_fits_here", "estimate_run"):
        real = getattr(preflight, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls[_name] = calls.get(_name, 0) + 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(preflight, name, counted)
    runs = [compose_run_config(["model=tiny", "tracking=none", "cluster.device=cpu", f"seed={s}",
                                f"cluster.num_workers={n}", f"output_dir={tmp_path}"]) for s in (0, 1) for n in (1, 2)]
    preflight.check_sweep_services(runs)
    assert calls == {"check_gang_cpus": 2}  # two shapes, four trials
    found = preflight.check_sweep_trials(runs, [f"#{i}" for i in range(len(runs))])
    assert all(f.device == "cpu" and f.estimate is not None for f in found)
    once = dict(calls)
    assert once == {"check_gang_cpus": 2, "check_data": 4, "check_device": 4, "check_fits_here": 4, "estimate_run": 4}
    for run, checks in zip(runs, found):
        assert preflight.preflight(run, tracking_uri=None, services=False, swept=checks) is checks
    assert calls == once  # the sweep's trials: not again
    alone = preflight.preflight(runs[0], tracking_uri=None, services=False)  # a single trial checks it all, once
    assert alone.device == "cpu" and alone.estimate is not None
    assert calls == {name: n + 1 for name, n in once.items()}
