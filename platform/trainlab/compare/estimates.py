"""Estimate vs measurement: what each configuration's trials were estimated to need before they
ran (the est/... metrics, trainlab.estimate.record) beside what they measured.

    rows = estimate_rows(trials)     # [] when no trial logged an estimate: nothing is shown
    rich_table(rows), markdown(rows), html_section(rows), plot(rows, path=...)

A pure function of trials, as summarize. Per trial: the measured step time and tokens/s are the
medians over logged steps after the first (warm-up), as the summary's tokens/s; the measured peak
is the largest sys/peak_mem_gb (rank 0's steady state), beside the estimate of rank 0. Per
configuration, means over its finished trials that logged an estimate.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trainlab import names
from trainlab.compare import curves
from trainlab.compare.records import Trial

ESTIMATE_PNG = "estimate_vs_measured.png"
STEP_BAND = 0.30
"""The issue's bar after calibration: step time within 30 %, peak memory within 15 %."""
PEAK_BAND = 0.15
NA = "-"


@dataclass(frozen=True)
class Measured:
    """One trial's estimate and measurement of the same three quantities; None where absent."""

    est_step_time_s: float | None
    step_time_s: float | None
    est_tokens_per_s: float | None
    tokens_per_s: float | None
    est_peak_mem_gb: float | None
    peak_mem_gb: float | None
    est_mfu: float | None
    mfu: float | None

    @property
    def has_estimate(self) -> bool:
        return self.est_step_time_s is not None or self.est_peak_mem_gb is not None


def measured(trial: Trial) -> Measured:
    """The trial's estimate (logged once) and what it measured."""
    def est(key: str) -> float | None:
        v = curves.last_value(trial.series(key))
        return v if v is not None and math.isfinite(v) else None

    return Measured(
        est_step_time_s=est(names.EST_STEP_TIME_S),
        step_time_s=curves.median_after_first(trial.series(names.STEP_TIME_S)),
        est_tokens_per_s=est(names.EST_TOKENS_PER_S),
        tokens_per_s=curves.median_after_first(trial.series(names.TOKENS_PER_S)),
        est_peak_mem_gb=est(names.EST_PEAK_MEM_GB),
        peak_mem_gb=curves.max_finite(trial.series(names.PEAK_MEM_GB)),
        est_mfu=est(names.EST_MFU),
        mfu=curves.median_after_first(trial.series(names.MFU)),
    )


def _mean(values: Sequence[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return sum(xs) / len(xs) if xs else None


def _ratio(measured_value: float | None, estimated: float | None) -> float | None:
    if measured_value is None or not estimated:
        return None
    return measured_value / estimated


@dataclass(frozen=True)
class EstimateRow:
    """One configuration: the mean estimate and the mean measurement over its finished trials."""

    label: str
    n_trials: int
    bound: str
    """What the estimate says limits it (names.TAG_EST_BOUND); ' | '-joined when its trials differ."""
    calibration: str
    m: Measured

    @property
    def step_time_ratio(self) -> float | None:
        """measured / estimated: 1 = exact, 1.3 = the step took 30 % longer than estimated."""
        return _ratio(self.m.step_time_s, self.m.est_step_time_s)

    @property
    def tokens_per_s_ratio(self) -> float | None:
        return _ratio(self.m.tokens_per_s, self.m.est_tokens_per_s)

    @property
    def peak_mem_ratio(self) -> float | None:
        return _ratio(self.m.peak_mem_gb, self.m.est_peak_mem_gb)


def estimate_rows(trials: Sequence[Trial]) -> list[EstimateRow]:
    """One row per configuration (in the trials' order) whose finished trials logged an estimate."""
    by_label: dict[str, list[tuple[Trial, Measured]]] = {}
    for t in trials:
        m = measured(t)
        if t.status == names.STATUS_FINISHED and m.has_estimate:
            by_label.setdefault(t.label, []).append((t, m))
    rows = []
    for label, pairs in by_label.items():
        ms = [m for _, m in pairs]
        mean = Measured(**{f: _mean([getattr(m, f) for m in ms]) for f in Measured.__dataclass_fields__})
        rows.append(EstimateRow(
            label=label, n_trials=len(pairs), m=mean,
            bound=" | ".join(dict.fromkeys(t.est_bound for t, _ in pairs if t.est_bound)) or NA,
            calibration=" | ".join(dict.fromkeys(t.est_calibration for t, _ in pairs if t.est_calibration)) or NA))
    return rows


# -- text -----------------------------------------------------------------------------------------

def _num(x: float | None, spec: str) -> str:
    return NA if x is None else format(x, spec)


def _ratio_text(x: float | None) -> str:
    return NA if x is None else f"{x:.2f}x"


COLUMNS = (
    ("config", lambda r: r.label),
    ("trials", lambda r: str(r.n_trials)),
    ("bound (est.)", lambda r: r.bound),
    ("step s est.", lambda r: _num(r.m.est_step_time_s, ".4g")),
    ("step s meas.", lambda r: _num(r.m.step_time_s, ".4g")),
    ("step meas/est", lambda r: _ratio_text(r.step_time_ratio)),
    ("tokens/s est.", lambda r: _num(r.m.est_tokens_per_s, ",.0f")),
    ("tokens/s meas.", lambda r: _num(r.m.tokens_per_s, ",.0f")),
    ("peak GB est.", lambda r: _num(r.m.est_peak_mem_gb, ".3g")),
    ("peak GB meas.", lambda r: _num(r.m.peak_mem_gb, ".3g")),
    ("peak meas/est", lambda r: _ratio_text(r.peak_mem_ratio)),
    ("MFU est.", lambda r: NA if r.m.est_mfu is None else f"{100 * r.m.est_mfu:.3g}%"),
    ("MFU meas.", lambda r: NA if r.m.mfu is None else f"{100 * r.m.mfu:.3g}%"),
    ("calibration", lambda r: r.calibration),
)

TITLE = "Estimate vs measured"
DEFINITION = (
    "Estimated before each trial ran (est/... metrics: trainlab estimate's model, the calibration named); "
    "measured: step time and tokens/s the median over logged steps after the first, peak GB rank 0's "
    "largest sys/peak_mem_gb beside the estimate of rank 0; means over each configuration's finished "
    "trials. meas/est 1.00x = exact; above 1 the trial took longer (or more memory) than estimated. "
    "`trainlab calibrate` fits the model's efficiencies to these runs.")


def cells(rows: Sequence[EstimateRow]) -> list[list[str]]:
    return [[fn(r) for _, fn in COLUMNS] for r in rows]


def rich_table(rows: Sequence[EstimateRow], *, title: str):
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"{title}: {TITLE.lower()}")
    for head, _ in COLUMNS:
        table.add_column(head, overflow="fold")
    for row in cells(rows):
        table.add_row(*(Text(c) for c in row))  # Text: labels like 'layers=[2,4]' are no markup
    return table


def markdown(rows: Sequence[EstimateRow]) -> str:
    """summary.md's section; '' without rows."""
    if not rows:
        return ""

    def line(items: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in items) + " |"

    table = [line([h for h, _ in COLUMNS]), line(["---"] * len(COLUMNS)), *(line(c) for c in cells(rows))]
    return "\n".join([f"## {TITLE}", "", *table, "", f"- {DEFINITION}", ""])


def html_section(rows: Sequence[EstimateRow]) -> str:
    """report.html's section (a table in a box that scrolls on its own); '' without rows."""
    if not rows:
        return ""
    head = "".join(f"<th>{html.escape(h)}</th>" for h, _ in COLUMNS)
    body = "\n".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in cells(rows))
    return (f'<h2 id="estimates">{TITLE}</h2>\n<div class="scroll"><table class="estimates">\n'
            f"<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody>\n</table></div>\n"
            f'<p class="defs">{html.escape(DEFINITION)}</p>')


# -- the plot ---------------------------------------------------------------------------------------

def plot(rows: Sequence[EstimateRow], *, title: str, path: Path) -> Path | None:
    """Measured against estimated, log-log, step time and peak memory side by side, each
    configuration one point and the line y = x: how far off the model is, and in which direction,
    reads at a glance across configurations whose values span decades. None without rows."""
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    if not rows:
        return None
    fig = Figure(figsize=(10, 4.8), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2)
    cmap = colormaps["tab10"]
    panels = ((axes[0], "step time (s)", STEP_BAND, lambda r: (r.m.est_step_time_s, r.m.step_time_s)),
              (axes[1], "rank 0 peak memory (GB)", PEAK_BAND, lambda r: (r.m.est_peak_mem_gb, r.m.peak_mem_gb)))
    for ax, what, band, pick in panels:
        points = [(i, *pick(r)) for i, r in enumerate(rows)]
        points = [(i, e, m) for i, e, m in points if e and m and e > 0 and m > 0]
        if not points:
            ax.text(0.5, 0.5, f"no {what} estimated and measured", ha="center", va="center", transform=ax.transAxes)
            ax.set_title(what)
            continue
        for i, e, m in points:
            ax.scatter([e], [m], color=cmap(i % 10), label=rows[i].label, s=40, zorder=3)
        lo = min(min(e, m) for _, e, m in points) / 1.5
        hi = max(max(e, m) for _, e, m in points) * 1.5
        ax.plot([lo, hi], [lo, hi], color="#888", lw=1, ls="--", label="measured = estimated")
        ax.fill_between([lo, hi], [lo * (1 - band), hi * (1 - band)], [lo * (1 + band), hi * (1 + band)],
                        color="#888", alpha=0.15, lw=0, label="within the issue's bar (shaded)")
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel=f"estimated {what}",
               ylabel=f"measured {what}", title=f"{what}, shaded ±{100 * band:.0f}%")
        for axis in (ax.xaxis, ax.yaxis):  # plain numbers (0.5, 2), not 5x10^-1, at 1-2-5 steps
            axis.set_major_locator(LogLocator(subs=(1, 2, 5)))
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(NullFormatter())
        ax.grid(alpha=0.3, which="both")
    handles, labels = max((ax.get_legend_handles_labels() for ax in axes), key=lambda hl: len(hl[0]))
    if handles:
        fig.legend(handles, labels, loc="outside right upper", fontsize=8)
    fig.suptitle(f"{title}: measured vs estimated")
    fig.savefig(path)
    return path
