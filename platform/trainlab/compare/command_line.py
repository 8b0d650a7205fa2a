"""`trainlab compare`: argument parsing, the terminal table, and user errors as `error: ...`."""

from __future__ import annotations

import argparse
import math
import os
import sys

from trainlab import names
from trainlab.compare.summarize import TOLERANCE
from trainlab.redact import redact
from trainlab.tracking.store_check import BOUNDED_HTTP, check_store


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="trainlab compare",
        description="Compare the configurations of a sweep: a summary table (seeds aggregated), "
                    "plots and a self-contained report.html, logged to the sweep's parent run.")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--sweep", metavar="NAME", help="the sweep's name (its experiment, or the "
                       f"parent runs tagged {names.TAG_SWEEP}=NAME); the most recent parent run")
    which.add_argument("--experiment", metavar="NAME", help="the most recent sweep in this experiment")
    which.add_argument("--parent", metavar="RUN_ID", help="the sweep's parent run id")
    p.add_argument("--tracking-uri", metavar="URI", default="",
                   help="MLflow store (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the cwd)")
    p.add_argument("--baseline", metavar="LABEL", help="configuration label to compare against "
                   "(default: the most precise precision with a finished trial)")
    p.add_argument("--target-loss", metavar="X", type=float,
                   help="val loss for 'tokens to target' (default: baseline's final val loss x 1.05)")
    p.add_argument("--tolerance", metavar="F", type=float, default=TOLERANCE,
                   help="a row is 'degraded' when its Δ val loss exceeds F x the baseline's val loss "
                        f"(default: {TOLERANCE})")
    p.add_argument("--by-hardware", action="store_true",
                   help="one row per configuration and device types (e.g. 'precision=fp16 @ "
                        "V100:2'), for sweeps whose trials landed on different GPUs")
    p.add_argument("--out", metavar="DIR", help="output folder (default: ./compare/<sweep name>/)")
    p.add_argument("--no-log", action="store_true",
                   help=f"do not log the files to the parent run (under {names.ARTIFACT_COMPARE_DIR}/), nor "
                        f"a study's Pareto front to its runs (tags {names.TAG_PARETO_FRONT}, {names.TAG_PARETO})")
    return p


def _console():
    from rich.console import Console

    # a log or a pipe has no width; rich would assume 80 and fold the columns into mush
    probe = Console()
    return Console(highlight=False, width=None if probe.is_terminal else 200)


def _print_result(result) -> None:
    from rich.markup import escape

    from trainlab.compare import estimates, tables
    from trainlab.compare.compare_sweep import title_of

    console = _console()
    # what people come for, first, on one line however long (a script reads it with head -1)
    console.print(result.summary.answer.line, markup=False, soft_wrap=True)
    if result.summary.answer.pareto_line:  # a study of several objectives: its trade-off, second
        console.print(result.summary.answer.pareto_line, markup=False, soft_wrap=True)
    if result.sweep.note:
        console.print(f"[yellow]note:[/] {escape(result.sweep.note)}")
    for table in tables.rich_tables(result.summary, title=title_of(result.sweep)):
        console.print(table)
    for line in tables.headline(result.summary):
        console.print(line, markup=False)
    est_rows = estimates.estimate_rows(result.sweep.trials)
    if est_rows:
        console.print(estimates.rich_table(est_rows, title=title_of(result.sweep)))
    for t in result.sweep.trials:
        if t.status in (names.STATUS_FAILED, names.STATUS_DIVERGED):
            why = t.error.strip().splitlines()[-1][:200] if t.error.strip() else (
                f"at step {t.diverged_step}" if t.diverged_step is not None else "")
            what = f"{t.label} seed {t.seed or '?'} ({t.run_id}) {why}"
            console.print(f"[red]{t.status}:[/] {escape(what)}")
        elif t.status == names.STATUS_PRUNED:  # a result, not a failure: where and why it stopped
            what = f"{t.label} seed {t.seed or '?'} ({t.run_id})" + (
                f" at step {t.pruned_step}" if t.pruned_step is not None else "") + (
                f": {t.pruned_reason}" if t.pruned_reason else "")
            console.print(f"[cyan]pruned:[/] {escape(what)}")
    winner = exported_winner(result)
    if winner:
        console.print(f"the winner's model (train.export=hf), for transformers' from_pretrained: {winner}",
                      markup=False, soft_wrap=True)
    console.print(f"outputs: {result.out_dir}", markup=False)
    console.print(f"report: {result.report}", markup=False)
    if result.logged_to_run:
        console.print(f"logged to parent run {result.logged_to_run} under {names.ARTIFACT_COMPARE_DIR}/",
                      markup=False)
    from trainlab.tracking.mlflow_ui import sweep_link_lines

    data = result.sweep
    for line in sweep_link_lines(data.tracking_uri, parent_run_id=data.parent_run_id, experiment_id=data.experiment_id,
                                 run_ids=[t.run_id for t in data.trials]):
        console.print(line, markup=False, soft_wrap=True)


def exported_winner(result) -> str:
    """The command that fetches the answer's configuration's exported model (its finished trial
    with the lowest val loss, when that trial ran with train.export=hf); "" when there is none."""
    from mlflow.tracking import MlflowClient

    best = result.summary.answer.best
    finished = [t for t in result.sweep.trials if t.label == best and t.status == names.STATUS_FINISHED]
    if not best or not finished:
        return ""
    trial = min(finished, key=lambda t: t.metrics.get(names.VAL_LOSS, [(0, float("inf"))])[-1][1])
    client = MlflowClient(tracking_uri=result.sweep.tracking_uri)
    if names.ARTIFACT_HF_MODEL not in {a.path for a in client.list_artifacts(trial.run_id)}:
        return ""
    return (f"MLFLOW_TRACKING_URI={redact(result.sweep.tracking_uri)} mlflow artifacts download --run-id "
            f"{trial.run_id} --artifact-path {names.ARTIFACT_HF_MODEL} --dst-path winner")


def _damaged(uri: str, why: str) -> str:
    return (f"the MLflow store {redact(uri)} is damaged past its schema ({why}); restore it from "
            "a backup or pass --tracking-uri for another store")


def main(argv: list[str]) -> None:
    """Run `trainlab compare` with argv (without the subcommand); exit 2 on a user error."""
    args = build_parser().parse_args(argv)
    for k, v in BOUNDED_HTTP.items():  # a server that stops answering halfway: seconds, not minutes
        os.environ.setdefault(k, v)
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import DatabaseError

    from trainlab.compare.compare_sweep import compare_sweep
    from trainlab.tracking.store import resolve_tracking_uri

    uri = ""
    try:
        if args.target_loss is not None and not math.isfinite(args.target_loss):
            raise ValueError(f"--target-loss must be a finite number, got {args.target_loss}")
        if not 0 <= args.tolerance < math.inf:
            raise ValueError(f"--tolerance must be a finite number >= 0 (a fraction of the baseline's val "
                             f"loss, e.g. {TOLERANCE}), got {args.tolerance}")
        uri = resolve_tracking_uri(args.tracking_uri)
        field = "--tracking-uri" if args.tracking_uri else (
            "MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") else "the default tracking URI")
        check_store(uri, field=field, elsewhere="pass --tracking-uri for the store the sweep logged to")
        result = compare_sweep(
            tracking_uri=uri, sweep=args.sweep,
            experiment=args.experiment, parent_run_id=args.parent, baseline=args.baseline,
            target_loss=args.target_loss, tolerance=args.tolerance, out_dir=args.out,
            log=not args.no_log, by_hardware=args.by_hardware)
    except (ValueError, MlflowException) as e:
        # user errors (bad selector, missing store, unknown baseline): a message, not a traceback
        message = e.message if isinstance(e, MlflowException) else str(e)
        if isinstance(e, MlflowException) and "DatabaseError" in message:  # MLflow's wrap of SQLAlchemy's
            message = _damaged(uri, message.splitlines()[0])
        print(f"error: {message.splitlines()[0] if message else type(e).__name__}", file=sys.stderr)
        sys.exit(2)
    except DatabaseError as e:  # damage deeper in a sqlite store than its schema (see check_store)
        print(f"error: {_damaged(uri, str(e.orig))}", file=sys.stderr)
        sys.exit(2)
    _print_result(result)
