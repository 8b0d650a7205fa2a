"""Estimate vs measured on this CPU machine: every layout x precision the estimator covers, side by side.

    trainlab bench estimate                    # the full matrix (bench/estimate_accuracy/cases.py), minutes
    trainlab bench estimate --quick            # a smoke size: 4 tiny trials, 3 steps
    trainlab bench estimate --only fsdp,pp     # the trials whose name holds one of these
    trainlab bench estimate --measured DIR/estimate_bench_measured.json   # re-estimate, no training

Trains every trial of the matrix through the real trainer on gloo ranks (one spawned group per
world size runs its trials in turn; bench/estimate_accuracy/measure.py), measuring per rank the bytes of
parameters, gradients and optimizer state, the peak resident set after warm-up and the steady
step time; then estimates each trial (trainlab.estimate.trial_estimate.estimate_trial) with the default
calibration, in-sample (fitted to every trial) and held out (fitted to the other half only;
bench/estimate_accuracy/comparison.py). Prints a table per trial with ratios (estimate / measured; '*' where
a ratio is outside its tolerance), writes estimate_bench.csv, estimate_bench.png (log-log) and
the measurements (estimate_bench_measured.json, for --measured) into --out, and ends with one
summary line per calibration, the held-out one last:

    held out: state bytes exact: n/n; peak memory within 15 %: n/n; step time within 30 %: n/n

Timings are this machine's under whatever else runs on it: a shared machine's are noisy.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from trainlab.bench.estimate_accuracy.cases import Case, full_matrix, quick_matrix, steps_for
from trainlab.bench.estimate_accuracy.comparison import KINDS, compare, summary
from trainlab.bench.estimate_accuracy.measure import Measured, measure
from trainlab.bench.estimate_accuracy.outputs import table_lines, write_csv, write_plot

CSV_NAME = "estimate_bench.csv"
PLOT_NAME = "estimate_bench.png"
MEASURED_NAME = "estimate_bench_measured.json"
CALIBRATION_NAME = "estimate_bench_calibration.json"
SUMMARY_LABELS = {"default": "default calibration", "in_sample": "in-sample", "held_out": "held out"}


def _say(text: str) -> None:
    print(text, flush=True)


def _progress(m: Measured, done: int, total: int) -> None:
    what = (f"{m.step_time_s * 1e3:.1f} ms/step, peak {max(m.peak_gb):.3f} GB" if m.ok
            else (m.reason.splitlines()[-1] if m.reason else ""))
    _say(f"[{done:>3}/{total}] {m.case.name} x{m.case.world}: {m.status} ({m.wall_s:.1f} s) {what}")
    if m.status == "failed":  # every rank's traceback, once, where the person is looking
        print(m.reason, file=sys.stderr, flush=True)


def select(cases: list[Case], only: str) -> list[Case]:
    """The cases whose name contains one of the comma-separated `only` parts ('' = all)."""
    parts = [p for p in only.split(",") if p]
    return [c for c in cases if not parts or any(p in c.name for p in parts)]


def save_measured(measured: list[Measured], *, steps: int, path: Path) -> None:
    path.write_text(json.dumps({"steps": steps, "trials": [asdict(m) for m in measured]}, indent=1))


def load_measured(path: Path) -> tuple[list[Measured], int]:
    data = json.loads(path.read_text())
    out = []
    for t in data["trials"]:
        case = t.pop("case")
        out.append(Measured(Case(case["name"], case["world"], tuple(case["overrides"])), **t))
    return out, int(data["steps"])


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="trainlab bench estimate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke size: 4 tiny trials on 2 ranks, 3 steps")
    ap.add_argument("--only", default="", help="comma-separated parts of trial names to keep (e.g. fsdp,pp)")
    ap.add_argument("--steps", type=int, default=0, help="optimizer steps per trial (default 8; --quick 3)")
    ap.add_argument("--out", type=Path, default=Path("."), help="folder for the CSV, plot and measurements")
    ap.add_argument("--measured", type=Path, default=None,
                    help=f"a previous run's {MEASURED_NAME}: estimate those measurements, train nothing")
    args = ap.parse_args(argv)
    if args.steps < 0 or args.steps == 1:
        ap.error(f"--steps {args.steps}: give at least 2 (the first step is warm-up, not timed), or 0 for the default")
    args.out.mkdir(parents=True, exist_ok=True)

    # ---- measure (or read back a previous run's measurements) ----
    if args.measured is not None:
        measured, steps = load_measured(args.measured)
        measured = [m for m in measured if select([m.case], args.only)]
        _say(f"estimate bench: {len(measured)} trials measured earlier ({args.measured}), {steps} steps each")
    else:
        steps = args.steps or steps_for(quick=args.quick)
        cases = select(quick_matrix() if args.quick else full_matrix(), args.only)
        if not cases:
            ap.error(f"--only {args.only!r} keeps no trial; names look like small/fsdp/fp32 or tiny/ddp/bf16")
        _say(f"estimate bench: {len(cases)} trials, {steps} steps each, on gloo ranks of this CPU "
             "(timings under this machine's current load)")
        start = time.perf_counter()
        measured = measure(cases, steps=steps, on_case=_progress)
        _say(f"measured in {time.perf_counter() - start:.0f} s")
        save_measured(measured, steps=steps, path=args.out / MEASURED_NAME)

    # ---- estimate, calibrate, report ----
    rows, fits = compare(measured, steps=steps)
    for kind in KINDS:
        _say(f"calibration {fits[kind]}")
    _say("ratios are estimate / measured; '*': outside the tolerance (peak 15 %, step 30 %); "
         "peak: the worst rank's, held-out calibration")
    for line in table_lines(rows):
        _say(line)
    write_csv(rows, args.out / CSV_NAME)
    write_plot(rows, args.out / PLOT_NAME, title=f"trainlab estimate vs measured: {len(rows)} CPU trials, "
                                                 f"{steps} steps each (held out: fitted on the other half)")
    _say(f"wrote {args.out / CSV_NAME}, {args.out / PLOT_NAME}")
    for kind in KINDS:  # the held-out line last: the number to believe
        _say(f"{SUMMARY_LABELS[kind]}: {summary(rows, kind=kind)}")
