"""A multirun as a study: what a trial returns to its sweeper (hydra.launcher.objective), the
refusals on the driver when the objectives and the sweeper disagree, what the sweeper is, and
Optuna's own pruners fed the trials' curves at equal tokens (hydra.launcher.prune=median|...)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import optuna
import pytest
from omegaconf import OmegaConf

from trainlab import names
from trainlab.config import compose_run_config
from trainlab.config.prune_rule import PruneConfig
from trainlab.config.study_rule import BASIC_SWEEPER, StudyConfig, check_study, study_config, sweeper_info
from trainlab.events import StepDone
from trainlab.launch.objectives import prior_values, returned, tokens_to, trial_values
from trainlab.launch.optuna_pruner import OptunaPruner
from trainlab.launch.sweep_trial import Trial, search_keys

OPTUNA = "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"


def _result(**kw):
    base = dict(final_val_loss=3.0, tokens_per_s=1000.0, peak_mem_gb=1.5)
    return SimpleNamespace(**{**base, **kw})


def _trial(status=names.STATUS_FINISHED, curve=(), **result) -> Trial:
    t = Trial(idx=0, overrides=[], run=None, status=status, result=_result(**result))
    t.curve = list(curve)
    return t


# ---------------------------------------------------------------- what a trial returns
def test_each_objective_is_read_from_the_trial_in_the_order_given():
    study = StudyConfig(objective=("tokens_per_s", "val_loss", "peak_mem_gb"))
    values = trial_values(_trial(), study)
    assert returned(tuple(values[n] for n in study.objective)) == [1000.0, 3.0, 1.5]  # several: a list, in order
    assert returned((trial_values(_trial(), StudyConfig())["val_loss"],)) == 3.0  # one: a plain float
    assert returned(None) is None


def test_val_loss_at_equal_tokens_is_the_curve_interpolated_there_not_the_last_value():
    study = StudyConfig(objective_tokens=2000)
    t = _trial(curve=[(1000, 4.0), (3000, 2.0)], final_val_loss=1.5)
    assert trial_values(t, study)["val_loss"] == pytest.approx(3.0)  # halfway between 4.0 and 2.0
    assert trial_values(t, StudyConfig())["val_loss"] == 1.5  # objective_tokens=0: its last validation


def test_a_diverged_trial_returns_the_worst_of_every_objective_never_nan():
    study = StudyConfig(objective=("val_loss", "tokens_per_s"))
    values = trial_values(_trial(status=names.STATUS_DIVERGED, final_val_loss=math.nan), study)
    assert values == {"val_loss": math.inf, "tokens_per_s": -math.inf}


def test_time_to_loss_is_tokens_to_the_target_over_throughput_and_inf_when_never_reached():
    study = StudyConfig(objective=("time_to_loss",), target_loss=3.0)
    assert tokens_to([(1000, 4.0), (3000, 2.0)], 3.0) == pytest.approx(2000)
    assert trial_values(_trial(curve=[(1000, 4.0), (3000, 2.0)]), study)["time_to_loss"] == pytest.approx(2.0)
    assert trial_values(_trial(curve=[(1000, 4.0), (3000, 3.5)]), study)["time_to_loss"] == math.inf


def test_a_failed_trial_returns_nothing_and_a_skipped_one_its_earlier_runs_values():
    assert trial_values(Trial(idx=0, overrides=[], run=None, status=names.STATUS_FAILED), StudyConfig()) is None
    study = StudyConfig(objective=("val_loss", "tokens_per_s"))
    logged = {names.objective_metric("val_loss"): 2.5, names.TOKENS_PER_S: 900.0}  # no objective/ metric: the metric
    assert prior_values(logged, study) == {"val_loss": 2.5, "tokens_per_s": 900.0}


# ---------------------------------------------------------------- refused on the driver
def test_objective_and_sweeper_direction_must_agree_and_the_error_gives_the_direction_to_set():
    optuna_node = {"_target_": OPTUNA, "sampler": {"_target_": "optuna.samplers.TPESampler", "seed": 0},
                   "direction": ["minimize", "minimize"], "n_trials": 12, "n_jobs": 2}
    sweeper = sweeper_info(OmegaConf.create(optuna_node))
    study = StudyConfig(objective=("val_loss", "tokens_per_s"))
    with pytest.raises(ValueError) as e:
        check_study(study, sweeper, [], [])
    assert "tokens_per_s is to maximize" in str(e.value) and "hydra.sweeper.direction=[minimize,maximize]" in str(e.value)
    check_study(study, sweeper_info(OmegaConf.create({**optuna_node, "direction": ["minimize", "maximize"]})), [], [])


@pytest.mark.parametrize(("knobs", "says"), [
    ({"objective": ("loss",)}, ["'loss' is not an objective", "val_loss, tokens_per_s"]),
    ({"objective": ()}, ["names no objective", "hydra.launcher.objective=[val_loss]"]),
    ({"objective": ("val_loss", "val_loss")}, ["names an objective twice"]),
    ({"objective": ("time_to_loss",)}, ["hydra.launcher.target_loss"]),
    ({"objective_tokens": -1}, ["hydra.launcher.objective_tokens=-1"]),
])
def test_bad_objective_settings_name_the_key_and_the_fix(knobs, says):
    with pytest.raises(ValueError) as e:
        StudyConfig(**knobs)
    assert all(w in str(e.value) for w in says), str(e.value)


def test_objective_tokens_past_a_trials_end_is_refused_naming_the_job():
    run = compose_run_config(["model=tiny", "train.max_steps=10", "train.global_batch_size=4",
                              "train.micro_batch_size=4", "train.seq_len=32", "train.eval_every=2"])
    check_study(StudyConfig(objective_tokens=1280), sweeper_info(OmegaConf.create({})), [run], ["#0 (lr=1)"])
    with pytest.raises(ValueError) as e:
        check_study(StudyConfig(objective_tokens=1281), sweeper_info(OmegaConf.create({})), [run], ["#0 (lr=1)"])
    assert "#0 (lr=1), which trains 1280 tokens" in str(e.value)


def test_what_the_sweeper_is_comes_from_its_node():
    basic = sweeper_info(OmegaConf.create({"_target_": BASIC_SWEEPER, "max_batch_size": None}))
    assert (basic.name, basic.searches, basic.sampler) == ("basic", False, "grid")
    tpe = sweeper_info(OmegaConf.create({"_target_": OPTUNA, "direction": "maximize", "n_trials": 8, "n_jobs": 2,
                                         "sampler": {"_target_": "optuna.samplers.TPESampler", "seed": 7}}))
    assert tpe.tags() == {"sweeper": "optuna", "sampler": "TPESampler", "sweeper_seed": "7", "direction": "maximize"}
    assert tpe.searches and tpe.batch_size == 2 and "n_trials" not in tpe.identity()  # more trials: the same study
    assert study_config(SimpleNamespace(objective=["val_loss", "peak_mem_gb"])).objective == ("val_loss", "peak_mem_gb")


def test_a_studys_trials_are_labelled_by_its_search_space_whatever_the_first_batch_drew():
    keys = search_keys(["model=tiny", "optim.lr=interval(1e-4,1e-2)", "precision=fp32,bf16"],
                       {"train.warmup_steps": "choice(0,10)", "seed": "3"})
    assert keys == ["optim.lr", "precision", "train.warmup_steps"]


# ---------------------------------------------------------------- Optuna's pruners
def _feed(p, key, curve, *, tokens_per_step=1000):
    stops = {}
    for step, loss in enumerate(curve, 1):
        stops |= p.saw(key, StepDone(step=step, max_steps=len(curve), loss=loss, tokens_per_s=1.0,
                                     val_loss=loss, tokens=tokens_per_step * step))
    return stops


def test_median_pruner_stops_a_trial_worse_than_the_median_of_ended_ones_at_equal_tokens():
    p = OptunaPruner(PruneConfig(prune="median", prune_startup_trials=2), grace=2000, longest=8000, unit=1000,
                     labels={k: f"#{k}" for k in "abcd"})
    for key, base in (("a", 3.0), ("b", 3.2)):
        assert _feed(p, key, [base + 1 - 0.1 * s for s in range(8)]) == {}
        p.ended(key, status=names.STATUS_FINISHED, value=base)
    # c runs at half the tokens per step: its steps 2, 4, 6 are a's steps 1, 2, 3 in tokens
    assert _feed(p, "c", [3.0 - 0.05 * s for s in range(16)], tokens_per_step=500) == {}  # better than both
    stops = _feed(p, "d", [9.0] * 8)
    assert list(stops) == ["d"] and "MedianPruner" in stops["d"] and "2 finished trials at equal tokens" in stops["d"]
    assert "at 2k tokens" in stops["d"]  # judged first at the end of its warm-up, not before


def test_median_pruner_waits_for_its_startup_trials_and_a_nan_stops_at_once():
    p = OptunaPruner(PruneConfig(prune="median", prune_startup_trials=5), grace=1000, longest=4000, unit=1000,
                     labels={"a": "#a", "b": "#b"})
    assert _feed(p, "a", [3.0] * 4) == {}
    p.ended("a", status=names.STATUS_FINISHED, value=3.0)
    assert _feed(p, "b", [9.0] * 4) == {}  # 1 ended trial of 5 needed: Optuna prunes nothing yet
    p.add({"c": "#c"})
    assert "diverged" in _feed(p, "c", [math.nan])["c"]


def test_successive_halving_keeps_the_best_of_each_rung_as_optunas_own_pruner_does():
    """The same curves through Optuna's SuccessiveHalvingPruner in a plain Optuna loop stop the
    same trials: the launcher only reports at equal tokens what an objective would report."""
    curves = {k: [4.0 - 0.2 * s + off for s in range(8)] for k, off in zip("abcdef", (0, .5, .1, .9, .05, .7))}
    p = OptunaPruner(PruneConfig(prune="successive_halving", prune_reduction_factor=2), grace=1000, longest=8000,
                     unit=1000, labels={k: k for k in curves})
    ours = set()
    for k, c in curves.items():
        ours |= set(_feed(p, k, c))
        p.ended(k, status=names.STATUS_PRUNED if k in ours else names.STATUS_FINISHED, value=c[-1])

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(pruner=optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=2),
                                sampler=optuna.samplers.RandomSampler(seed=0))
    theirs = set()
    for k, c in curves.items():
        trial = study.ask()
        for step, v in enumerate(c, 1):
            trial.report(v, step)
            if trial.should_prune():
                theirs.add(k)
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                break
        else:
            study.tell(trial, c[-1])
    assert ours == theirs and ours  # and some trial was pruned


# ---------------------------------------------------------------- the sweeper's own study
def test_trainlab_gives_optunas_sweeper_its_storage_unless_the_user_set_one():
    node = {"hydra": {"sweeper": {"_target_": OPTUNA, "storage": None}}}
    from trainlab.config.study_rule import storage_override

    assert storage_override(OmegaConf.create(node)) == \
        "hydra.sweeper.storage={_target_:trainlab.launch.optuna_storage.StudyStorage}"
    node["hydra"]["sweeper"]["storage"] = "sqlite:///mine.db"
    assert storage_override(OmegaConf.create(node)) is None  # the user's stays theirs
    assert storage_override(OmegaConf.create({"hydra": {"sweeper": {"_target_": BASIC_SWEEPER}}})) is None


def test_a_trial_trainlab_pruned_reaches_the_sweepers_study_as_pruned_with_its_curve(tmp_path):
    """The calls Hydra's Optuna sweeper makes (ask n_jobs trials, launch, tell each COMPLETE with
    its return value), with the launcher's between them: the pruned one is PRUNED in the study."""
    import json

    from trainlab.launch.optuna_storage import StudyStorage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = StudyStorage()
    study = optuna.create_study(storage=storage, sampler=optuna.samplers.RandomSampler(seed=0))
    asked = [study.ask() for _ in range(2)]
    for t in asked:
        t.suggest_float("optim.lr", 1e-4, 1e-2, log=True)
    jobs = storage.batch(4, 2)  # the batch's jobs #4 and #5, in the order asked
    assert jobs == {4: asked[0]._trial_id, 5: asked[1]._trial_id}
    for tokens, loss in ((1000, 5.0), (2000, 4.5)):
        storage.report(jobs[5], tokens=tokens, val_loss=loss)
    storage.mark_pruned(jobs[5])
    for t, value in zip(asked, (3.0, 4.5)):
        study.tell(t, value)  # what the sweeper says of every trial
    states = {t.number: (t.state.name, t.values, t.intermediate_values) for t in study.trials}
    assert states == {0: ("COMPLETE", [3.0], {}), 1: ("PRUNED", [4.5], {1000: 5.0, 2000: 4.5})}
    assert study.best_trial.number == 0  # a pruned trial never wins
    storage.write(tmp_path / "optuna_trials.json")
    rows = json.loads((tmp_path / "optuna_trials.json").read_text())
    assert [r["state"] for r in rows] == ["COMPLETE", "PRUNED"] and rows[1]["intermediate_values"]["2000"] == 4.5
