"""The estimate bench's bookkeeping: which trials it runs, how it judges an estimate, what it writes.

No process group here: Measured rows are built by hand where a number's provenance does not
matter (how a ratio is judged), and the matrix is read from conf/ as the bench reads it.
"""

from __future__ import annotations

import csv

import pytest

from trainlab.bench.estimate_accuracy.cases import full_matrix, quick_matrix
from trainlab.bench.estimate_accuracy.comparison import Estimated, Row, counts, folds, summary
from trainlab.bench.estimate_accuracy.estimate_vs_measured import load_measured, save_measured, select
from trainlab.bench.estimate_accuracy.measure import Measured
from trainlab.bench.estimate_accuracy.outputs import write_csv, write_plot
from trainlab.config import CONF_DIR


def test_the_full_matrix_covers_every_layout_and_every_precision_on_ddp_and_fsdp():
    cases = full_matrix()
    assert len({c.name for c in cases}) == len(cases)  # names key the results
    layouts = {o.split("=", 1)[1] for c in cases for o in c.overrides if o.startswith("parallel=")}
    assert layouts == {p.stem for p in (CONF_DIR / "parallel").glob("*.yaml")}
    schedules = {o.split("=", 1)[1] for c in cases for o in c.overrides if o.startswith("parallel.pp_schedule=")}
    assert schedules == {"gpipe", "1f1b", "interleaved_1f1b"}
    for layout in ("ddp", "fsdp"):
        ran = {o.split("=", 1)[1] for c in cases if f"parallel={layout}" in c.overrides for o in c.overrides
               if o.startswith("precision=")} | {"fp32"}
        assert ran == {p.stem for p in (CONF_DIR / "precision").glob("*.yaml")}, layout
    assert {o for c in cases for o in c.overrides if o.startswith("model=")} == {"model=tiny", "model=small"}
    assert {c.world for c in cases} == {2, 4}


def test_only_keeps_the_trials_named_and_the_quick_matrix_is_small():
    kept = select(full_matrix(), "hsdp,pp_gpipe")
    assert sorted(c.name for c in kept) == ["small/hsdp/fp32", "small/pp_gpipe/fp32", "tiny/hsdp/fp32",
                                            "tiny/pp_gpipe/fp32"]
    assert len(quick_matrix()) <= 4 and {c.world for c in quick_matrix()} == {2}


def test_the_halves_alternate_so_each_holds_every_kind_of_trial():
    assert folds(5) == [0, 1, 0, 1, 0]


def _row(name: str, *, peak: list[float], est_peak: list[float], step: float, est_step: float,
         exact: bool = True) -> Row:
    case = next(c for c in full_matrix() if c.name == name)
    m = Measured(case, status="finished", params=[100, 100], grads=[100, 100], optim_state=[200, 200],
                 peak_gb=peak, base_gb=[0.3, 0.3], step_time_s=step, tokens_per_step=2048, wall_s=1.0)
    est = Estimated(peak_gb=est_peak, step_time_s=est_step, bound="compute")
    return Row(m, state=[(100, 100, 200), (100, 100 if exact else 99, 200)],
               est={"default": est, "in_sample": est, "held_out": est})


def test_a_trial_is_judged_by_its_worst_rank_and_the_summary_counts_within_tolerance():
    good = _row("tiny/ddp/fp32", peak=[1.0, 1.0], est_peak=[1.1, 0.95], step=0.1, est_step=0.125)
    one_rank_off = _row("tiny/fsdp/fp32", peak=[1.0, 1.0], est_peak=[1.0, 0.8], step=0.1, est_step=0.14,
                        exact=False)
    assert good.peak_ratio("held_out") == pytest.approx(1.1)
    assert one_rank_off.peak_ratio("held_out") == pytest.approx(0.8)  # rank 1, not the perfect rank 0
    assert good.state_exact and not one_rank_off.state_exact
    c = counts([good, one_rank_off], kind="held_out")
    assert (c.trials, c.state_exact, c.peak_within, c.step_within) == (2, 1, 1, 1)
    assert summary([good, one_rank_off], kind="held_out") == (
        "state bytes exact: 1/2; peak memory within 15 %: 1/2; step time within 30 %: 1/2")


def test_a_skipped_trial_is_kept_in_the_csv_but_not_counted(tmp_path):
    good = _row("tiny/ddp/fp32", peak=[1.0, 1.0], est_peak=[1.0, 1.0], step=0.1, est_step=0.1)
    skipped = Row(Measured(full_matrix()[1], status="skipped", reason="parallel.x=1 is refused; use 2"))
    assert counts([good, skipped], kind="held_out").trials == 1
    write_csv([good, skipped], tmp_path / "e.csv")
    rows = list(csv.DictReader((tmp_path / "e.csv").open()))
    assert [r["status"] for r in rows] == ["finished", "skipped"]
    assert rows[0]["meas_params_b"] == "100;100" and rows[0]["state_exact"] == "True"
    assert rows[1]["reason"] == "parallel.x=1 is refused; use 2"
    write_plot([good, skipped], tmp_path / "e.png", title="t")
    assert (tmp_path / "e.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_measurements_written_are_read_back_for_a_re_estimate(tmp_path):
    m = _row("small/dp_pp/fp32", peak=[1.0, 2.0], est_peak=[1.0, 2.0], step=0.5, est_step=0.5).measured
    save_measured([m], steps=8, path=tmp_path / "m.json")
    back, steps = load_measured(tmp_path / "m.json")
    assert steps == 8 and back == [m]
