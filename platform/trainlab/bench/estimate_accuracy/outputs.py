"""The estimate bench's outputs: a table per trial, a CSV and a log-log plot of estimate vs measured.

The table and the CSV hold the same trials: measured state bytes (the largest rank's params +
grads + optimizer state) and whether the estimate counted every rank's exactly; peak memory
measured and estimated (held out) with their ratio (the worst rank's); step time measured and
estimated (default calibration, in-sample, held out) with ratios. The plot has two panels,
peak memory and step time, estimate against measured on log-log axes around the y = x line with
the tolerance band shaded.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from trainlab.bench.estimate_accuracy.comparison import KINDS, PEAK_TOLERANCE, STEP_TOLERANCE, Row, within
from trainlab.console import fmt

HEADER = (f"{'trial':<28} {'x':>2} {'state MB':>9} {'exact':>5} {'peak GB':>8} {'est':>7} {'ratio':>6} "
          f"{'step ms':>9} {'default':>9} {'in-samp':>9} {'held-out':>9} {'ratio':>6}  bound")


def _ms(s: float | None) -> str:
    return fmt(None if s is None else s * 1e3, ".1f")


def table_lines(rows: list[Row]) -> list[str]:
    """One line per trial (HEADER's columns); skipped and failed trials with their reason."""
    lines = [HEADER]
    for r in rows:
        m = r.measured
        label = f"{m.case.name:<28} {m.case.world:>2}"
        if not m.ok:
            lines.append(f"{label} {m.status}: {m.reason.splitlines()[-1] if m.reason else ''}")
            continue
        state_mb = max(p + g + o for p, g, o in zip(m.params, m.grads, m.optim_state)) / 1e6
        if not r.est:
            lines.append(f"{label} {state_mb:>9.3f} {'-':>5} {max(m.peak_gb):>8.3f}  not estimated: {r.error}")
            continue
        held = r.est["held_out"]
        worst = max(range(len(held.peak_gb)), key=lambda i: abs(math.log(held.peak_gb[i] / m.peak_gb[i])))
        steps = " ".join(f"{_ms(r.est[k].step_time_s):>9}" for k in KINDS)
        peak_ratio, step_ratio = r.peak_ratio("held_out"), r.step_ratio("held_out")
        lines.append(
            f"{label} {state_mb:>9.3f} {'yes' if r.state_exact else 'NO':>5} {m.peak_gb[worst]:>8.3f} "
            f"{held.peak_gb[worst]:>7.3f} {peak_ratio:>5.2f}{_mark(peak_ratio, PEAK_TOLERANCE)} "
            f"{_ms(m.step_time_s):>9} {steps} {step_ratio:>5.2f}{_mark(step_ratio, STEP_TOLERANCE)}  {held.bound}")
    return lines


def _mark(ratio: float, tolerance: float) -> str:
    """'*' after a ratio outside its tolerance."""
    return " " if within(ratio, tolerance) else "*"


CSV_FIELDS = ("trial", "world", "status", "reason", "wall_s", "tokens_per_step",
              "meas_params_b", "meas_grads_b", "meas_optim_state_b", "est_params_b", "est_grads_b",
              "est_optim_state_b", "state_exact", "base_gb", "meas_peak_gb",
              *(f"est_peak_gb_{k}" for k in KINDS), *(f"peak_ratio_{k}" for k in KINDS),
              "meas_step_s", *(f"est_step_s_{k}" for k in KINDS), *(f"step_ratio_{k}" for k in KINDS),
              "meas_above_base_mb", "est_above_runtime_mb", "bound", "estimate_error")
"""Per-rank values are ';'-joined in rank order. above_base / above_runtime: the peak less what the
process held before the trial was built (measured) or the estimate's runtime (held-out
calibration): the trial's own memory, without the interpreter and libraries that dominate a CPU
rank's resident set."""


def _joined(values) -> str:
    return ";".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in values)


def write_csv(rows: list[Row], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for r in rows:
            m = r.measured
            rec = {"trial": m.case.name, "world": m.case.world, "status": m.status,
                   "reason": " ".join(m.reason.split())[-500:], "wall_s": f"{m.wall_s:.2f}",
                   "tokens_per_step": m.tokens_per_step, "meas_params_b": _joined(m.params),
                   "meas_grads_b": _joined(m.grads), "meas_optim_state_b": _joined(m.optim_state),
                   "base_gb": _joined(m.base_gb), "meas_peak_gb": _joined(m.peak_gb),
                   "meas_step_s": f"{m.step_time_s:.6g}", "estimate_error": r.error,
                   "meas_above_base_mb": _joined((p - b) * 1e3 for p, b in zip(m.peak_gb, m.base_gb))}
            if r.est:
                rec |= {"est_params_b": _joined(s[0] for s in r.state), "est_grads_b": _joined(s[1] for s in r.state),
                        "est_optim_state_b": _joined(s[2] for s in r.state), "state_exact": r.state_exact,
                        "bound": r.est["held_out"].bound,
                        "est_above_runtime_mb": _joined((p - b) * 1e3 for p, b in
                                                        zip(r.est["held_out"].peak_gb, r.est["held_out"].runtime_gb))}
                for k in KINDS:
                    rec |= {f"est_peak_gb_{k}": _joined(r.est[k].peak_gb), f"peak_ratio_{k}": f"{r.peak_ratio(k):.4f}",
                            f"est_step_s_{k}": f"{r.est[k].step_time_s:.6g}",
                            f"step_ratio_{k}": f"{r.step_ratio(k):.4f}"}
            w.writerow(rec)


def write_plot(rows: list[Row], path: Path, *, title: str) -> None:
    """Two log-log panels (peak memory per rank, step time), held-out estimates against measured."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig = Figure(figsize=(11, 5), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    ax_mem, ax_step = fig.subplots(1, 2)
    done = [r for r in rows if r.measured.ok and r.est]
    panels = (
        (ax_mem, "peak memory per rank (GB)", PEAK_TOLERANCE,
         {k: ([p for r in done for p in r.measured.peak_gb], [p for r in done for p in r.est[k].peak_gb])
          for k in ("held_out",)}),
        (ax_step, "step time (s)", STEP_TOLERANCE,
         {k: ([r.measured.step_time_s for r in done], [r.est[k].step_time_s for r in done])
          for k in ("default", "held_out")}),
    )
    for ax, what, tol, series in panels:
        values = [v for xs, ys in series.values() for v in (*xs, *ys) if v > 0]
        if not values:
            continue
        lo, hi = min(values) / 1.5, max(values) * 1.5
        ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8, label="estimate = measured")
        ax.fill_between([lo, hi], [lo * (1 - tol), hi * (1 - tol)], [lo * (1 + tol), hi * (1 + tol)],
                        color="tab:green", alpha=0.15, label=f"within {tol:.0%}")
        for (kind, (xs, ys)), marker in zip(series.items(), ("o", "x")):
            ax.scatter(xs, ys, s=18, marker=marker, label=f"{kind.replace('_', '-')} calibration", alpha=0.8)
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel=f"measured {what}",
               ylabel=f"estimated {what}", title=what)
        for axis in (ax.xaxis, ax.yaxis):  # 1-2-5 labels in plain numbers: a range may span less than a decade
            axis.set_major_locator(LogLocator(subs=(1, 2, 5)))
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(NullFormatter())
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.savefig(path)
