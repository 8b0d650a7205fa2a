"""hydra.launcher.prune: the rules (margin with its grace, ASHA's rungs and asynchronous
promotion, comparison at equal tokens, divergence), the config's one-line errors, the stop
that travels as `prune` to the trainer (status pruned, no checkpoint), and a pruned trial
counting as done for a rerun and showing in compare.

ASHA is checked against Ray Tune's own ASHAScheduler bracket (ray.tune's _Bracket) fed the
same results: the same trials must be stopped at the same points."""

from __future__ import annotations

import math
import random
import threading
from types import SimpleNamespace
from unittest.mock import ANY

import numpy as np
import pytest

from trainlab import names
from trainlab.compare import tables
from trainlab.compare.html_report import _trials_table
from trainlab.compare.records import Trial
from trainlab.compare.summarize import summarize
from trainlab.config import compose_run_config
from trainlab.config.prune_rule import PruneConfig, check_prunable, grace_tokens, max_tokens, prune_config
from trainlab.events import Notice, StepDone, TrialResult
from trainlab.launch.pruner import Pruner, quantile, rungs, value_at
from trainlab.tracking.runs import closing_tags

A, B, C, D = "a", "b", "c", "d"


def _pruner(rule: str = "margin", *, grace: int = 100, longest: int = 1000, keys=(A, B, C, D), **knobs) -> Pruner:
    return Pruner(PruneConfig(prune=rule, **knobs), grace=grace, longest=longest,
                  labels={k: f"#{k}" for k in keys})


# ---------------------------------------------------------------- equal tokens
def test_value_at_interpolates_between_validations_and_never_extrapolates():
    pts = [(100, 5.0), (300, 3.0), (400, 2.0)]
    assert value_at(pts, 100) == 5.0
    assert value_at(pts, 200) == pytest.approx(4.0)
    assert value_at(pts, 350) == pytest.approx(2.5)
    assert value_at(pts, 400) == 2.0
    assert value_at(pts, 99) is None and value_at(pts, 401) is None and value_at([], 5) is None


def test_margin_compares_at_equal_tokens_not_at_equal_steps():
    """B runs 4x the batch of A. At step 8 A has 4.0 and B 2.0 (A 100 % worse, at equal STEPS),
    but B had seen 32k tokens to A's 8k: at 8k tokens B had 3.8, A is 5 % behind and goes on.
    Only when A stalls, 11 % behind B at equal tokens, is it stopped."""
    p = _pruner(grace=1000, prune_margin=0.1)
    for step in range(1, 9):  # A: 1000 tokens a step, loss 6 - 0.25 step
        assert p.report(A, step=step, tokens=1000 * step, val_loss=6 - 0.25 * step) == {}
    assert p.report(B, step=1, tokens=4000, val_loss=4.6) == {}  # A at 4k: 5.0: B is better
    assert p.report(B, step=2, tokens=8000, val_loss=3.8) == {}  # A at 8k: 4.0, 5.3 % worse
    assert p.report(B, step=8, tokens=32000, val_loss=2.0) == {}  # A's step 8 vs B's: not compared
    assert p.report(A, step=9, tokens=9000, val_loss=3.75) == {}  # B at 9k: 3.725 (interpolated)
    why = p.report(A, step=12, tokens=12000, val_loss=3.9)  # B at 12k: 3.5
    assert list(why) == [A]
    assert why[A].startswith("val loss 3.9000 at 12k tokens (step 12) is 11.4% above the best trial's 3.5000")
    assert "#b" in why[A] and "margin 10%" in why[A]


def test_margin_stops_a_trial_that_ran_ahead_once_another_catches_up():
    """A started first and validated at 4k while nobody else had 4k tokens; B, started later,
    reaches 5k: at 4k B had 3.06 (interpolated) where A has 4.0: A is stopped at B's validation."""
    p = _pruner(grace=1000, prune_margin=0.1)
    for tokens, loss in ((2000, 4.5), (4000, 4.0)):
        assert p.report(A, step=tokens // 1000, tokens=tokens, val_loss=loss) == {}
    assert p.report(B, step=1, tokens=1000, val_loss=4.0) == {}  # B: 1k, 5k (A's last point: 4k)
    why = p.report(B, step=5, tokens=5000, val_loss=2.75)
    assert list(why) == [A] and "val loss 4.0000 at 4k tokens (step 4) is 30.6% above" in why[A]
    assert p.report(B, step=6, tokens=6000, val_loss=2.7) == {}  # said once
    p.ended(B)  # an ended trial is never stopped, though its curve still compares
    assert p.report(C, step=5, tokens=5000, val_loss=2.0) == {}


def test_margin_waits_for_the_grace_and_stays_within_the_margin():
    p = _pruner(grace=500, prune_margin=0.2)
    for tokens, loss in ((100, 4.0), (300, 3.0), (600, 2.0), (900, 1.5)):
        p.report(A, step=tokens // 100, tokens=tokens, val_loss=loss)
    assert p.report(B, step=1, tokens=300, val_loss=9.0) == {}  # 3x worse, but inside the grace
    assert p.report(B, step=2, tokens=600, val_loss=2.4) == {}  # 20 % worse: the margin allows it
    why = p.report(B, step=3, tokens=900, val_loss=1.81)  # 20.7 % worse
    assert "margin 20%" in why[B]
    assert p.report(B, step=4, tokens=950, val_loss=99.0) == {}  # said once


def test_margin_goes_on_where_no_other_trial_covers_those_tokens():
    p = _pruner(grace=1, prune_margin=0.0)
    assert p.report(A, step=1, tokens=1000, val_loss=3.0) == {}  # the first trial: nobody to compare with
    assert p.report(B, step=1, tokens=2000, val_loss=9.0) == {}  # A's curve ends at 1000
    assert p.report(C, step=1, tokens=500, val_loss=9.0) == {}  # and starts at 1000
    assert list(p.report(C, step=2, tokens=1000, val_loss=3.1)) == [C]  # margin 0: any worse loss


# ---------------------------------------------------------------- divergence
def test_a_nonfinite_val_loss_stops_at_once_and_never_becomes_the_best():
    p = _pruner(grace=10_000, prune_margin=0.1)
    assert p.report(A, step=1, tokens=100, val_loss=3.0) == {}
    why = p.report(B, step=1, tokens=100, val_loss=math.nan)  # inside the grace: stopped anyway
    assert why == {B: "val loss is nan at step 1: it diverged"}
    assert "diverged" in p.report(C, step=1, tokens=100, val_loss=math.inf)[C]
    # the diverged curves never make another trial look bad: only A's 3.0 is a best
    p2 = _pruner(grace=1, prune_margin=0.1)
    p2.report(A, step=1, tokens=100, val_loss=math.nan)
    assert p2.report(B, step=1, tokens=100, val_loss=50.0) == {}


def test_asha_ranks_a_diverged_trial_last():
    p = _pruner("asha", grace=100, longest=1000, prune_reduction_factor=2)
    assert list(p.report(A, step=1, tokens=100, val_loss=math.nan)) == [A]
    assert p.report(B, step=1, tokens=100, val_loss=7.0) == {}  # A was never recorded as better


def test_a_rollback_retrains_tokens_and_the_curve_goes_on_from_there():
    p = _pruner(grace=1, prune_margin=0.1)
    p.report(A, step=2, tokens=200, val_loss=3.0)
    p.report(A, step=4, tokens=400, val_loss=2.0)
    p.report(A, step=3, tokens=300, val_loss=2.9)  # rolled back to step 2 and trained again
    assert p.report(B, step=4, tokens=400, val_loss=2.5) == {}  # A's 2.0 at 400 is gone
    assert p._curves[A].points == [(200, 3.0), (300, 2.9)]


# ---------------------------------------------------------------- ASHA
def test_rungs_are_grace_times_powers_of_the_factor_below_the_longest_trial():
    assert rungs(grace=100, last=1000, reduction_factor=2) == [100, 200, 400, 800]
    assert rungs(grace=100, last=1600, reduction_factor=4) == [100, 400]  # 1600 is the end: no rung there
    assert rungs(grace=1000, last=1000, reduction_factor=3) == []


def test_quantile_is_numpys_and_keeps_inf_as_the_worst():
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 7):
        xs = list(rng.normal(size=n))
        for q in (0.25, 1 / 3, 0.5):
            assert quantile(xs, q) == pytest.approx(float(np.quantile(xs, q)))
    assert quantile([1.0, math.inf], 0.25) == math.inf
    assert quantile([1.0, 2.0, math.inf, math.inf], 0.25) == pytest.approx(1.75)


def test_asha_promotes_asynchronously_the_best_quarter_of_those_that_reached_the_rung():
    p = _pruner("asha", grace=100, longest=10_000, keys="abcdefg", prune_reduction_factor=4)
    assert p.rungs == [100, 400, 1600, 6400]
    assert p.report("a", step=1, tokens=100, val_loss=5.0) == {}  # the first at a rung goes on
    why = p.report("b", step=1, tokens=100, val_loss=5.5)  # worse than the only one before it
    assert why["b"] == ("val loss 5.5000 at the 100-token rung (step 1) is not among the best 1/4 of the 1 trial "
                   "that reached it before (cutoff 5.0000)")
    assert p.report("c", step=1, tokens=100, val_loss=4.0) == {}  # better: promoted
    # before d: {5.0, 5.5, 4.0}: the 0.25-quantile is 4.5
    assert p.report("d", step=1, tokens=100, val_loss=4.4) == {}
    assert "cutoff 4.3000" in p.report("e", step=1, tokens=100, val_loss=4.6)["e"]  # {4.0, 4.4, 5.0, 5.5}: 4.3
    # just above the cutoff: shown with the digits that tell them apart
    why = p.report("f", step=1, tokens=100, val_loss=4.400001)["f"]  # cutoff of {4.0, 4.4, 4.6, 5.0, 5.5}: 4.4
    assert "val loss 4.400001 at the 100-token rung" in why and "cutoff 4.400000" in why
    # a later rung judges only the trials that reached it: a alone at 400 goes on
    assert p.report("a", step=4, tokens=400, val_loss=3.0) == {}
    assert list(p.report("c", step=4, tokens=400, val_loss=3.1)) == ["c"]  # ASHA judges only who reports


def test_asha_judges_every_trial_at_the_rung_itself():
    """Validations every 300 tokens pass the 400-token rung at 600: the trial is recorded with
    its loss interpolated at 400, not the one at 600 (which had 50 % more tokens)."""
    p = _pruner("asha", grace=400, longest=2000, prune_reduction_factor=2)
    assert p.report(A, step=4, tokens=400, val_loss=3.0) == {}
    assert p.report(B, step=3, tokens=300, val_loss=3.3) == {}  # below the rung
    # at 600: 2.5 (better than A's 3.0), but at 400 it had 3.3 + (2.5 - 3.3) / 3 = 3.033: worse
    why = p.report(B, step=6, tokens=600, val_loss=2.5)
    assert "val loss 3.0333 at the 400-token rung" in why[B]


def test_asha_stops_the_same_trials_as_ray_tunes_scheduler():
    """Random interleavings of 12 trials validating at every 100 tokens (so the rungs fall on
    validations, where Ray Tune's value and the interpolated one agree), fed to Ray Tune's
    _Bracket (reward = -val loss) and to the Pruner: the same stop decisions, one by one."""
    from ray.tune.schedulers.async_hyperband import _Bracket
    from ray.tune.schedulers.trial_scheduler import TrialScheduler

    for seed in range(20):
        rng = random.Random(seed)
        rf = rng.choice([2, 3, 4])
        keys = [f"t{i}" for i in range(12)]
        ours = _pruner("asha", grace=100, longest=1000, keys=keys, prune_reduction_factor=rf)
        ray_bracket = _Bracket(min_t=100, max_t=1000, reduction_factor=rf, s=0)
        assert sorted(m for m, _ in ray_bracket._rungs) == [r for r in ours.rungs]
        quality = {k: rng.uniform(0, 1) for k in keys}
        tokens = {k: 0 for k in keys}
        live = list(keys)
        while live:
            k = rng.choice(live)
            tokens[k] += 100
            loss = 5 - 3 * quality[k] * tokens[k] / 1000 + rng.gauss(0, 0.2)
            ray_stops = ray_bracket.on_result(SimpleNamespace(trial_id=k), tokens[k], -loss) == TrialScheduler.STOP
            we_stop = ours.report(k, step=tokens[k] // 100, tokens=tokens[k], val_loss=loss) == {k: ANY}
            assert we_stop == ray_stops, (seed, k, tokens[k])
            if we_stop or tokens[k] >= 1000:
                live.remove(k)


def test_the_pruner_takes_reports_from_many_threads():
    p = _pruner("asha", grace=100, longest=100_000, keys=range(16), prune_reduction_factor=2)

    def trial(k: int) -> None:
        for s in range(1, 50):
            p.report(k, step=s, tokens=100 * s, val_loss=10 / s + k / 100)

    threads = [threading.Thread(target=trial, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(len(r) >= 1 for r in p._recorded[:1]) and len(p._recorded[0]) == 16


def test_progress_events_feed_the_pruner_and_others_are_ignored():
    p = _pruner(grace=1, prune_margin=0.0)

    def step(val_loss=None, loss=None):
        return StepDone(step=1, max_steps=10, loss=loss, tokens_per_s=None, val_loss=val_loss, tokens=10)

    assert p.saw(A, step(val_loss=3.0)) == {}
    assert p.saw(B, step(loss=9.0)) == {}  # no validation
    assert p.saw(B, Notice(kind="warning", message="x")) == {}
    assert list(p.saw(B, step(val_loss=3.5))) == [B]


# ---------------------------------------------------------------- the config
@pytest.mark.parametrize(("knobs", "says"), [
    ({"prune": "pbt"}, ["hydra.launcher.prune=pbt", "none, margin, asha, median, successive_halving, hyperband"]),
    ({"prune": "margin", "prune_margin": -0.1}, ["hydra.launcher.prune_margin=-0.1", ">= 0",
                                                  "hydra.launcher.prune_margin=0.1"]),
    ({"prune": "margin", "prune_margin": math.nan}, ["hydra.launcher.prune_margin=nan", "finite"]),
    ({"prune": "asha", "prune_reduction_factor": 1.0}, ["hydra.launcher.prune_reduction_factor=1.0", "> 1",
                                                         "prune_reduction_factor=4.0"]),
    ({"prune": "asha", "prune_grace_tokens": -5}, ["hydra.launcher.prune_grace_tokens=-5", ">= 0"]),
])
def test_bad_prune_values_name_the_field_the_value_and_the_fix(knobs, says):
    with pytest.raises(ValueError) as e:
        PruneConfig(**knobs)
    for part in says:
        assert part in str(e.value)
    assert "\n" not in str(e.value)


def test_knobs_the_rule_does_not_read_are_reported_ignored():
    assert PruneConfig(prune="margin").ignored() == []
    notes = PruneConfig(prune="asha", prune_margin=0.3).ignored()
    assert notes == ["hydra.launcher.prune_margin=0.3 is ignored: hydra.launcher.prune=asha does not use it "
                     "(it is for prune=margin)"]
    assert len(PruneConfig(prune_grace_tokens=10, prune_reduction_factor=2).ignored()) == 2


def test_the_launcher_node_hydra_composes_gives_the_prune_config(tmp_path):
    from hydra import compose, initialize_config_dir

    from trainlab.config import CONF_DIR, register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", return_hydra_config=True,
                      overrides=["hydra.launcher.prune=asha", "hydra.launcher.prune_grace_tokens=2048"])
        default = compose(config_name="config", return_hydra_config=True)
    assert prune_config(cfg.hydra.launcher) == PruneConfig(prune="asha", prune_grace_tokens=2048)
    assert prune_config(default.hydra.launcher) == PruneConfig()
    assert prune_config(SimpleNamespace()) == PruneConfig()  # hydra/launcher=basic: no keys, no pruning


RUN = ["model=tiny", "cluster.num_workers=1", "train.max_steps=40", "train.eval_every=10", "train.global_batch_size=8",
       "train.micro_batch_size=8", "train.seq_len=32"]


def test_a_sweep_that_cannot_be_pruned_is_refused_before_it_starts():
    runs = [compose_run_config([*RUN, "train.eval_every=0"]), compose_run_config(RUN)]
    with pytest.raises(ValueError, match=r"job #0 validates only at its end \(train.eval_every=0.*"
                                         r"set train.eval_every=4"):
        check_prunable(PruneConfig(prune="margin"), runs, ["#0", "#1"])
    check_prunable(PruneConfig(prune="none"), runs, ["#0", "#1"])  # nothing to compare: fine
    ok = [compose_run_config(RUN), compose_run_config([*RUN, "train.global_batch_size=16"])]
    assert [max_tokens(r) for r in ok] == [40 * 8 * 32, 40 * 16 * 32]
    with pytest.raises(ValueError, match="prune_grace_tokens=20480 is at or past the end of every trial"):
        check_prunable(PruneConfig(prune="asha", prune_grace_tokens=20480), ok, ["#0", "#1"])
    assert grace_tokens(PruneConfig(prune="asha"), ok) == 40 * 8 * 32 // 4  # a quarter of the shortest


# ---------------------------------------------------------------- recorded and shown
def test_a_pruned_trial_closes_with_its_reason_and_step():
    def result(status: str, steps: int) -> TrialResult:
        return TrialResult(status=status, steps=steps, tokens_seen=0, final_loss=3.0, final_val_loss=3.0,
                           tokens_per_s=1.0, mfu=None, peak_mem_gb=0.0, skipped_steps=0, nonfinite_steps=0,
                           loss_spikes=0, elapsed_s=1.0)

    tags = closing_tags(result(names.STATUS_PRUNED, 30), "", pruned_reason="val loss 5 above the best")
    assert tags == {names.TAG_PRUNED_STEP: 30, names.TAG_PRUNED_REASON: "val loss 5 above the best"}
    assert closing_tags(result(names.STATUS_FINISHED, 40), "") == {}


def test_compare_counts_pruned_trials_as_ended_and_says_where_and_why():
    series = {names.VAL_LOSS: ((10, 3.0), (20, 2.5)), names.by_tokens(names.VAL_LOSS): ((2560, 3.0), (5120, 2.5))}
    good = Trial(run_id="r1", label="optim.lr=0.01", status=names.STATUS_FINISHED, seed="0", metrics=series)
    bad = Trial(run_id="r2", label="optim.lr=1e-05", status=names.STATUS_PRUNED, seed="0", pruned_step=12,
                pruned_reason="val loss 5.1 at 3.07k tokens is 70% above the best", metrics=series)
    summary = summarize([good, bad])
    row = summary.row("optim.lr=1e-05")
    assert (row.n_pruned, row.n_running, row.pruned_steps, row.verdict) == (1, 0, (12,), "pruned")
    cells = dict(zip([h for h, _ in tables.COLUMNS], tables.cells(summary)[[r.label for r in summary.rows]
                                                                          .index("optim.lr=1e-05")]))
    assert cells["status"] == "1 pruned" and cells["pruned at"] == "12"
    page = _trials_table([good, bad])
    assert "pruned" in page and "<td>12</td>" in page and "70% above the best" in page
