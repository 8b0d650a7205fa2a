"""`trainlab calibrate`: fit the estimate's efficiencies to a store's finished trials.

    trainlab calibrate [--tracking-uri URI] [--experiment E] [--sweep NAME] [-o calibration.json]

Reads every finished trial (calibrate.observations), fits (estimate.calibration.fit), writes the JSON
that cluster.calibration=PATH reads, and prints each trial's estimate before and after the fit
beside what it measured, with the error of each.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from trainlab.redact import redact

DEFAULT_OUT = "calibration.json"
STEP_WITHIN = 0.30
"""The issue's bar for step time after calibration."""
PEAK_WITHIN = 0.15
"""The issue's bar for peak memory."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="trainlab calibrate",
        description="Fit the estimate's efficiencies and overheads to the finished trials of an MLflow "
                    "store; writes the JSON that cluster.calibration=PATH reads (trainlab estimate, train).")
    p.add_argument("--tracking-uri", metavar="URI", default="",
                   help="MLflow store (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the cwd)")
    p.add_argument("--experiment", metavar="NAME", help="only this experiment's trials (default: every experiment)")
    p.add_argument("--sweep", metavar="NAME", help="only the trials of this sweep (tag sweep=NAME)")
    p.add_argument("-o", "--out", metavar="PATH", default=DEFAULT_OUT,
                   help=f"where to write the calibration (default: ./{DEFAULT_OUT})")
    return p


@dataclass(frozen=True)
class Errors:
    """|estimate / measured - 1| of one quantity over the observations that measured it."""

    values: tuple[float, ...]

    def line(self, within: float) -> str:
        if not self.values:
            return "not measured"
        mean = sum(self.values) / len(self.values)
        ok = sum(v <= within for v in self.values)
        return f"mean error {100 * mean:.0f}%, within {100 * within:.0f}%: {ok}/{len(self.values)}"


def _err(est: float | None, meas: float | None) -> float | None:
    ok = est is not None and meas is not None and meas > 0 and math.isfinite(est)
    return abs(est / meas - 1) if ok else None


def _errors(pairs: list[tuple[float | None, float | None]]) -> Errors:
    return Errors(tuple(e for e in (_err(est, meas) for est, meas in pairs) if e is not None))


def calibrate(*, tracking_uri: str, experiment: str | None, sweep: str | None, out: Path, console) -> Path:
    """Read, fit, write, print; ValueError for a user error (no trials, an unwritable path)."""
    from rich.table import Table
    from rich.text import Text

    from trainlab.calibrate.observations import read_observations
    from trainlab.estimate.least_squares import fit
    from trainlab.estimate.trial_estimate import estimate_trial

    found = read_observations(tracking_uri=tracking_uri, experiment=experiment, sweep=sweep)
    for why in found.skipped:
        console.print(f"[yellow]skipped:[/] {why}", markup=True, highlight=False)
    if not found.observations:
        raise ValueError(f"none of the {len(found.skipped)} finished trial(s) could be used (see 'skipped' above)")
    console.print(f"fitting to {len(found.observations)} trial(s) of {redact(tracking_uri)}", highlight=False)
    fitted = fit(found.observations)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fitted.save(out)
    except OSError as e:
        raise ValueError(f"-o {out}: cannot write the calibration ({e.strerror}); pass -o PATH somewhere "
                         "writable") from None

    table = Table(title="step time and peak memory: measured, estimated before / after the fit")
    for head in ("trial", "step s meas.", "before", "after", "peak GB meas.", "before", "after"):
        table.add_column(head, overflow="fold")
    steps, peaks = {"before": [], "after": []}, {"before": [], "after": []}
    for label, obs in zip(found.labels, found.observations):
        before = estimate_trial(obs.run, obs.cluster, trial_layout=obs.trial_layout)
        after = estimate_trial(obs.run, obs.cluster, trial_layout=obs.trial_layout, calibration=fitted)
        row = [label, f"{obs.step_time_s:.4g}"]
        for when, est in (("before", before), ("after", after)):
            steps[when].append((est.step_time_s, obs.step_time_s))
        row += [f"{before.step_time_s:.4g}", f"{after.step_time_s:.4g}"]
        # the largest rank's peak, measured and estimated
        row.append("-" if obs.peak_mem_gb is None else f"{obs.peak_mem_gb:.3g}")
        for when, est in (("before", before), ("after", after)):
            peaks[when].append((est.peak_mem_gb, obs.peak_mem_gb))
            row.append(f"{est.peak_mem_gb:.3g}")
        table.add_row(*(Text(c) for c in row))
    console.print(table)
    for what, pairs, within in (("step time", steps, STEP_WITHIN), ("peak memory", peaks, PEAK_WITHIN)):
        console.print(f"{what}: before {_errors(pairs['before']).line(within)}; "
                      f"after {_errors(pairs['after']).line(within)}", highlight=False)
    console.print(f"calibration ({fitted.source}): {out}", highlight=False)
    console.print(f"use it: trainlab estimate ... cluster.calibration={out}", highlight=False)
    return out


def main(argv: list[str]) -> None:
    """Run `trainlab calibrate` with argv (without the subcommand); exit 2 on a user error."""
    args = build_parser().parse_args(argv)
    from rich.console import Console

    from trainlab.tracking.store_check import BOUNDED_HTTP, check_store

    for k, v in BOUNDED_HTTP.items():  # a server that stops answering halfway: seconds, not minutes
        os.environ.setdefault(k, v)
    from mlflow.exceptions import MlflowException

    from trainlab.tracking.store import resolve_tracking_uri

    probe = Console()  # a log or a pipe has no width: rich would fold the table into 80 columns
    console = Console(highlight=False, width=None if probe.is_terminal else 200)
    try:
        uri = resolve_tracking_uri(args.tracking_uri)
        field = "--tracking-uri" if args.tracking_uri else (
            "MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") else "the default tracking URI")
        check_store(uri, field=field, elsewhere="pass --tracking-uri for the store the trials logged to")
        calibrate(tracking_uri=uri, experiment=args.experiment, sweep=args.sweep, out=Path(args.out).resolve(),
                  console=console)
    except (ValueError, MlflowException) as e:
        message = e.message if isinstance(e, MlflowException) else str(e)
        print(f"error: {redact(message.splitlines()[0] if message else type(e).__name__)}", file=sys.stderr)
        sys.exit(2)
