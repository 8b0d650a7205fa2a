"""compare's estimate vs measured (compare.estimates) from hand-built trials: one row per
configuration over its finished trials that logged an estimate, measured as the summary measures
(medians after the first step, the largest steady-state peak), the ratios, the sections of
summary.md and report.html, and the plot. Expected numbers are worked out here in plain Python."""

from __future__ import annotations

import statistics

import pytest

from trainlab import names
from trainlab.compare import estimates
from trainlab.compare.records import Trial

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STEP = {0: [2.0, 0.50, 0.52, 0.48, 0.51], 1: [2.2, 0.60, 0.58, 0.62, 0.61]}  # the first step: warm-up


def _trial(label: str, seed: int, *, status=names.STATUS_FINISHED, est_step=0.4, est_peak=1.0, est=True) -> Trial:
    steps = STEP[seed]
    metrics = {
        names.STEP_TIME_S: tuple(enumerate(steps, start=1)),
        names.TOKENS_PER_S: tuple((i, 1000 / s) for i, s in enumerate(steps, start=1)),
        names.PEAK_MEM_GB: ((2, 1.1 + seed / 10), (3, 1.2 + seed / 10), (4, 1.15 + seed / 10)),
    }
    if est:
        metrics |= {names.EST_STEP_TIME_S: ((0, est_step),), names.EST_TOKENS_PER_S: ((0, 1000 / est_step),),
                    names.EST_PEAK_MEM_GB: ((0, est_peak),)}
    return Trial(run_id=f"{label}-{seed}", label=label, status=status, seed=str(seed), metrics=metrics,
                 est_bound="overhead" if est else "", est_calibration="default" if est else "")


def test_a_row_per_estimated_configuration_measured_as_the_summary_measures():
    trials = [_trial("parallel=ddp", 0), _trial("parallel=ddp", 1),
              _trial("parallel=ddp", 2 - 2, status=names.STATUS_FAILED, est_step=99.0),  # not counted
              _trial("parallel=fsdp", 0, est_step=0.25, est_peak=2.0),
              _trial("parallel=tp", 0, est=False)]  # logged no estimate: no row
    rows = estimates.estimate_rows(trials)
    assert [r.label for r in rows] == ["parallel=ddp", "parallel=fsdp"]
    ddp, fsdp = rows
    assert ddp.n_trials == 2 and ddp.bound == "overhead" and ddp.calibration == "default"
    medians = [statistics.median(STEP[s][1:]) for s in (0, 1)]  # after the warm-up step
    assert ddp.m.step_time_s == pytest.approx(sum(medians) / 2)
    assert ddp.m.est_step_time_s == pytest.approx(0.4)
    assert ddp.step_time_ratio == pytest.approx(sum(medians) / 2 / 0.4)
    assert ddp.m.peak_mem_gb == pytest.approx((1.2 + 1.3) / 2)  # each trial's largest, mean over seeds
    assert ddp.peak_mem_ratio == pytest.approx(1.25 / 1.0)
    assert fsdp.step_time_ratio == pytest.approx(medians[0] / 0.25)
    assert fsdp.tokens_per_s_ratio == pytest.approx(statistics.median([1000 / s for s in STEP[0][1:]]) / 4000)


def test_no_estimate_no_section():
    rows = estimates.estimate_rows([_trial("a", 0, est=False)])
    assert rows == [] and estimates.markdown(rows) == "" and estimates.html_section(rows) == ""


def test_summary_and_report_sections_and_the_plot(tmp_path):
    rows = estimates.estimate_rows([_trial("parallel=ddp", 0), _trial("layers=[2|4]", 0, est_peak=0.5)])
    md = estimates.markdown(rows)
    assert md.startswith(f"## {estimates.TITLE}")
    lines = [line for line in md.splitlines() if line.startswith("| parallel=ddp")]
    ratio = statistics.median(STEP[0][1:]) / 0.4
    assert len(lines) == 1 and f"{ratio:.2f}x" in lines[0]
    assert "layers=[2\\|4]" in md  # a pipe in a label does not split the Markdown row
    section = estimates.html_section(rows)
    assert 'id="estimates"' in section and "layers=[2|4]" in section and f"{1.2 / 0.5:.2f}x" in section
    png = estimates.plot(rows, title="s", path=tmp_path / estimates.ESTIMATE_PNG)
    assert png.read_bytes()[:8] == PNG_MAGIC
    assert estimates.plot([], title="s", path=tmp_path / "none.png") is None
