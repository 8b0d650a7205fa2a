"""compare's answer (the fastest configuration whose verdict is ok) and the report as a reader sees
it: the answer first, a page that fits a 1600 px window, plots whose axes show the data.

Expected answers are worked out here from the logged values, not with the package's helpers.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

import pytest

from trainlab import names
from trainlab.compare import plots
from trainlab.compare.answer import answer
from trainlab.compare.compare_sweep import write_outputs
from trainlab.compare.records import SweepData, Trial
from trainlab.compare.summarize import summarize

TOKENS_PER_STEP = 1000
# long labels, as a sweep over two keys makes them, widen the table as users see it
FP32, BF16, FP16, FP8 = (f"precision={p} parallel=fsdp optim.lr=0.003"
                         for p in ("fp32", "bf16", "fp16", "fp8_tensorwise"))
RATE = {FP32: 1000.0, BF16: 1800.0, FP16: 1500.0, FP8: 3000.0}  # tokens/s
# val loss at steps 2, 4, 6: fp8 is the fastest but ends far above the baseline (degraded)
VAL = {FP32: [5.0, 4.0, 3.4], BF16: [5.0, 4.0, 3.41], FP16: [5.0, 4.01, 3.405], FP8: [5.3, 4.6, 4.2]}


def _trial(label: str, seed: int, *, status: str = names.STATUS_FINISHED, val=None, evals=(2, 4, 6),
           underflow=None) -> Trial:
    precision = label.split()[0].split("=")[1]
    val = VAL[label] if val is None else val
    metrics = {
        names.TOKENS_PER_S: tuple((s, RATE[label] * (1 + 0.01 * seed)) for s in range(1, 7)),
        names.LOSS: tuple((s, 6.0 - 0.3 * s) for s in range(1, 7)),
        names.by_tokens(names.LOSS): tuple((s * TOKENS_PER_STEP, 6.0 - 0.3 * s) for s in range(1, 7)),
        names.VAL_LOSS: tuple(zip(evals, val[-len(evals):])),
        names.by_tokens(names.VAL_LOSS): tuple((s * TOKENS_PER_STEP, v) for s, v in zip(evals, val[-len(evals):])),
    }
    if underflow is not None:
        metrics[names.cast_max_metric("grad_output", names.CAST_UNDERFLOW)] = tuple(enumerate(underflow, 1))
    return Trial(run_id=f"{precision}-{seed}", label=label, status=status, seed=str(seed),
                 precision=precision, metrics=metrics, world_size=1, device_types="cpu (x86_64):1")


def _sweep(**kw) -> list[Trial]:
    return [_trial(label, seed, **kw) for label in (FP32, BF16, FP16, FP8) for seed in (0, 1)]


def test_answer_is_the_fastest_configuration_whose_verdict_is_ok():
    summary = summarize(_sweep())
    verdicts = {r.label: r.verdict for r in summary.rows}
    assert verdicts == {FP32: "baseline", BF16: "ok", FP16: "ok", FP8: "degraded"}  # fp8 is faster
    result = answer(summary)
    rate = {label: statistics.mean([RATE[label], RATE[label] * 1.01]) for label in RATE}
    assert result.best == BF16 and result.baseline == FP32
    assert result.speedup == pytest.approx(rate[BF16] / rate[FP32])
    assert result.val_loss == pytest.approx(VAL[BF16][-1])
    assert result.delta_val_loss == pytest.approx(VAL[BF16][-1] - VAL[FP32][-1])  # same tokens
    assert result.line.startswith(f"fastest ok: {BF16}: speedup {rate[BF16] / rate[FP32]:.2f}x")
    assert f"{VAL[BF16][-1] - VAL[FP32][-1]:+.3g}" in result.line and FP32 in result.line
    assert dict(result.trials_by_status)[names.STATUS_FINISHED] == 8


def test_no_ok_configuration_says_why_and_counts_every_trial():
    trials = [t for t in _sweep() if t.label in (FP32, FP8)]
    trials.append(_trial(FP16, 0, status=names.STATUS_DIVERGED))
    trials.append(replace(_trial(BF16, 0, status=names.STATUS_FAILED), metrics={}))
    result = answer(summarize(trials))
    assert result.best is None and result.speedup is None
    assert result.line.startswith(f"no configuration is ok against the baseline {FP32}: ")
    for label, verdict in ((FP8, "degraded"), (FP16, "diverged"), (BF16, "failed")):
        assert f"{label} {verdict}" in result.line
    assert "\n" not in result.line
    counts = dict(result.trials_by_status)
    assert (counts[names.STATUS_FINISHED], counts[names.STATUS_DIVERGED], counts[names.STATUS_FAILED]) == (4, 1, 1)

    # nothing finished: no baseline to compare with, but the counts are there
    failed = answer(summarize([replace(t, status=names.STATUS_FAILED) for t in _sweep()]))
    assert failed.best is None and failed.baseline is None and "no configuration is ok" in failed.line
    assert dict(failed.trials_by_status)[names.STATUS_FAILED] == 8


def test_an_ok_configuration_slower_than_the_baseline_is_said_to_be_slower():
    trials = [_trial(FP32, 0), replace(_trial(BF16, 0), metrics={
        **_trial(BF16, 0).metrics, names.TOKENS_PER_S: tuple((s, 500.0) for s in range(1, 7))})]
    result = answer(summarize(trials))
    assert result.best == BF16 and result.speedup == pytest.approx(0.5)
    assert "0.50x" in result.line and "slower than the baseline" in result.line


def _visible_ticks(axis) -> list[float]:
    lo, hi = sorted(axis.get_view_interval())
    return [t for t in axis.get_majorticklocs() if lo <= t <= hi]


@pytest.mark.parametrize("fractions", [
    [0.0] * 6,  # a bf16-only sweep: nothing underflows (symlog's margins showed -10^-1 .. -10^-4)
    [0.0, 1e-6, 0.0, 0.0, 2e-6, 0.0],  # tiny fractions
    [0.0, 0.02, 0.5, 0.0, 1e-5, 0.03],
])
def test_underflow_axis_shows_no_negative_fraction(fractions):
    trials = [_trial(BF16, 0, underflow=fractions)]
    fig = plots.underflow_figure(summarize(trials), trials, title="underflow")
    fig.canvas.draw()
    ax = fig.axes[0]
    ticks = _visible_ticks(ax.yaxis)
    assert ticks and min(ticks) >= 0 and max(ticks) <= 1, ticks
    assert ax.get_ylim()[0] == 0 and max(fractions) <= ax.get_ylim()[1] <= 1
    shown = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert not any(x.removeprefix("$\\mathdefault{").startswith(("-", "\N{MINUS SIGN}")) for x in shown), shown


def test_val_loss_axis_fits_the_curves_not_a_far_target():
    trials = _sweep()
    target = 6.0  # far above every curve's last points: drawing it would squash the curves
    fig = plots.loss_vs_tokens_figure(summarize(trials), trials, metric=names.VAL_LOSS,
                                      ylabel="validation loss", title="t", target=target)
    ax = fig.axes[0]
    lo, hi = ax.get_ylim()
    values = [v for label in VAL for v in VAL[label]]
    assert lo <= min(values) and hi >= max(values)
    assert hi < target and (hi - lo) < 1.2 * (max(values) - min(values))
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(f"target {target:.3f}" in x and "above" in x for x in legend), legend


def test_short_sweep_val_loss_is_a_point_per_trial_per_configuration():
    """One evaluation per trial (max_steps below eval_every): a row per configuration, the axis
    spanning the trials' final val losses, the target (5 % above) named rather than stretching it."""
    trials = [_trial(label, seed, evals=(6,)) for label in (FP32, BF16) for seed in (0, 1)]
    summary = summarize(trials)
    fig = plots.loss_vs_tokens_figure(summary, trials, metric=names.VAL_LOSS, ylabel="validation loss",
                                      title="t", target=summary.target_loss)
    ax = fig.axes[0]
    assert [t.get_text().replace("\n", " ") for t in ax.get_yticklabels()] == [FP32, BF16]
    lo, hi = ax.get_xlim()
    finals = [VAL[FP32][-1], VAL[BF16][-1]]
    assert lo <= min(finals) and hi >= max(finals) and hi < summary.target_loss
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(f"target {summary.target_loss:.3f}" in x for x in legend), legend


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    trials = [*_sweep(underflow=[0.0, 0.01, 0.2, 0.0, 0.0, 0.05]),
              replace(_trial(FP16, 2, status=names.STATUS_FAILED), metrics={},
                      error="Traceback ...\nRuntimeError: " + "a long error message " * 20)]
    data = SweepData(name="answer_sweep", experiment_name="answer_sweep", experiment_id="1",
                     parent_run_id="0" * 32, tracking_uri=f"sqlite:///{out}/empty.db",
                     trials=tuple(trials))  # a store without these runs: no per-layer tables
    summary = summarize(data.trials)
    write_outputs(data, summary, out_dir=out)
    return out / "report.html", answer(summary)


def test_report_page_opens_with_the_answer_and_fits_1600px(browser, report, tmp_path):
    path, result = report
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    page.goto(path.as_uri())
    first = page.evaluate("document.body.innerText.trim().split('\\n')[0]")
    assert first == result.line and first.startswith(f"fastest ok: {BF16}")
    width = page.evaluate("[document.scrollingElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], f"the page scrolls sideways: {width}"
    images = page.evaluate("[...document.images].map(i => [i.alt, i.complete && i.naturalWidth])")
    pngs = sorted(p.stem for p in path.parent.glob("*.png"))
    assert sorted(a for a, _ in images) == pngs and all(w > 0 for _, w in images), images
    page.screenshot(path=str(tmp_path / "report.png"))  # looked at: answer, table, no side scroll
    page.close()
