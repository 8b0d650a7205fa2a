"""The whole comparison: load a sweep, summarize it (its answer with it), write the files, log
them to the parent; and the answer alone, logged to the parent at a sweep's end. A study of
several objectives gets its Pareto front on its parent and trial runs at both."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from trainlab import names
from trainlab.compare import estimates, pareto, plots, tables
from trainlab.compare.answer import without_trials
from trainlab.compare.html_report import write_report
from trainlab.compare.layer_plots import write_layer_heatmaps
from trainlab.compare.read_sweep import load_sweep
from trainlab.compare.records import Answer, ConfigRow, Summary, SweepData, Trial
from trainlab.compare.summarize import TOLERANCE, summarize
from trainlab.tracking.sweep_runs import log_pareto_front

SUMMARY_MD = "summary.md"
SUMMARY_CSV = "summary.csv"
REPORT_HTML = "report.html"


@dataclass(frozen=True)
class CompareResult:
    """What `compare_sweep` computed and wrote."""

    sweep: SweepData
    summary: Summary
    out_dir: Path
    files: tuple[Path, ...]  # every file written, report last
    report: Path
    logged_to_run: str | None  # the parent run the files were logged to; None with log=False

    @property
    def rows(self) -> tuple[ConfigRow, ...]:
        return self.summary.rows


def default_out_dir(sweep_name: str) -> Path:
    """./compare/<sweep name>/, with characters a folder name cannot hold replaced."""
    safe = re.sub(r"[^\w.=+-]+", "_", sweep_name).strip("._") or "sweep"
    return Path.cwd() / "compare" / safe


def title_of(data: SweepData) -> str:
    return f"trainlab compare: {data.name}"


def context_lines(data: SweepData) -> list[str]:
    """Where the numbers come from, for the reader of summary.md / report.html."""
    lines = [f"tracking URI: {data.tracking_uri}",
             f"experiment: {data.experiment_name} (id {data.experiment_id})",
             f"parent run: {data.parent_run_id}",
             f"trials: {len(data.trials)}"]
    return lines + ([data.note] if data.note else [])


def write_outputs(data: SweepData, summary: Summary, *, out_dir: Path) -> tuple[Path, ...]:
    """summary.md, summary.csv, the PNGs and report.html into out_dir (created if needed)."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"cannot create output folder {out_dir} ({e.strerror}); pass --out DIR "
                         f"somewhere writable") from None
    title, context = title_of(data), context_lines(data)
    est_rows = estimates.estimate_rows(data.trials)  # [] where no trial was estimated: no section, no plot
    md = out_dir / SUMMARY_MD
    md.write_text("\n".join(filter(None, [tables.markdown_document(summary, title=title, context=context),
                                         estimates.markdown(est_rows)])), encoding="utf-8")
    csv_path = tables.write_csv(summary, out_dir / SUMMARY_CSV)
    images = plots.write_all(summary, data.trials, sweep=data.name, out_dir=out_dir)
    images += [p for p in (estimates.plot(est_rows, title=data.name, path=out_dir / estimates.ESTIMATE_PNG),) if p]
    images += [p for p in (write_layer_heatmaps(data, summary, out_dir=out_dir),) if p]  # per layer, last
    report = write_report(summary, data.trials, title=title, context=context, images=images,
                          path=out_dir / REPORT_HTML, estimates_html=estimates.html_section(est_rows))
    return (md, csv_path, *images, report)


def by_device_types(trial: Trial) -> Trial:
    """The trial relabelled '<label> @ <device types>', so rows split by hardware."""
    return replace(trial, label=f"{trial.label} @ {trial.device_types or 'unknown'}")


def log_to_parent(data: SweepData, files: tuple[Path, ...]) -> None:
    """Each file onto the parent run under names.ARTIFACT_COMPARE_DIR (files, not the folder:
    a user's --out may hold other things)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=data.tracking_uri)
    for f in files:
        client.log_artifact(data.parent_run_id, str(f), artifact_path=names.ARTIFACT_COMPARE_DIR)


def trial_labels(data: SweepData) -> dict[str, str]:
    """Each trial run's configuration label (run id -> label): which runs a Pareto tag goes on."""
    return {t.run_id: t.label for t in data.trials}


def compare_sweep(*, tracking_uri: str, sweep: str | None = None, experiment: str | None = None,
                  parent_run_id: str | None = None, baseline: str | None = None,
                  target_loss: float | None = None, tolerance: float = TOLERANCE,
                  out_dir: Path | str | None = None, log: bool = True,
                  by_hardware: bool = False) -> CompareResult:
    """Load the sweep chosen by one selector, summarize it, write and (by default) log the files.

    See load.load_sweep for the selectors and summarize.summarize for baseline / target_loss.
    out_dir defaults to ./compare/<sweep name>/. by_hardware splits each configuration by the
    device types its trials ran on.
    """
    loaded = load_sweep(tracking_uri=tracking_uri, sweep=sweep, experiment=experiment,
                        parent_run_id=parent_run_id)
    data = replace(loaded, trials=tuple(by_device_types(t) for t in loaded.trials)) if by_hardware else loaded
    summary = summarize(data.trials, baseline=baseline, target_loss=target_loss, tolerance=tolerance,
                        objectives=data.objectives)
    out = Path(out_dir).resolve() if out_dir else default_out_dir(data.name)
    files = write_outputs(data, summary, out_dir=out)
    if log:
        log_to_parent(data, files)
        if pareto.has_front(loaded.objectives):
            # the runs' tags name the configurations the study ran, not this view's split by hardware
            front = summarize(loaded.trials, objectives=loaded.objectives).pareto_front if by_hardware \
                else summary.pareto_front
            log_pareto_front(tracking_uri=tracking_uri, parent_run_id=loaded.parent_run_id, front=front,
                             trial_labels=trial_labels(loaded))
    return CompareResult(sweep=data, summary=summary, out_dir=out, files=files, report=files[-1],
                         logged_to_run=data.parent_run_id if log else None)


def sweep_answer(*, tracking_uri: str, parent_run_id: str) -> Answer:
    """The answer for a sweep's parent run as `trainlab compare --parent` computes it (default
    baseline, target and tolerance), read back from MLflow; a sweep without trial runs gets
    zero counts and a line that says so."""
    return _answer_and_labels(tracking_uri=tracking_uri, parent_run_id=parent_run_id)[0]


def _answer_and_labels(*, tracking_uri: str, parent_run_id: str) -> tuple[Answer, dict[str, str]]:
    """sweep_answer, and trial_labels for the Pareto tags ({} without trial runs)."""
    try:
        data = load_sweep(tracking_uri=tracking_uri, parent_run_id=parent_run_id)
    except ValueError as e:  # no trial runs yet (every job refused at submission)
        return without_trials(str(e)), {}
    return summarize(data.trials, objectives=data.objectives).answer, trial_labels(data)


def log_sweep_answer(*, tracking_uri: str, parent_run_id: str) -> Answer | None:
    """sweep_answer onto the parent run (tracking.sweep_runs.log_sweep_result), at a sweep's
    end, and in a study of several objectives its Pareto front onto the parent and trial runs.
    None, with a warning, when that fails: the trials' runs are what matter, the parent's
    summary can be had again with `trainlab compare`."""
    from rich.markup import escape

    from trainlab.console import console
    from trainlab.redact import redact
    from trainlab.tracking.sweep_runs import log_sweep_result

    try:
        result, labels = _answer_and_labels(tracking_uri=tracking_uri, parent_run_id=parent_run_id)
        log_sweep_result(tracking_uri=tracking_uri, parent_run_id=parent_run_id, result=result,
                         trial_labels=labels)
    except Exception as e:  # noqa: BLE001 - a summary must never fail the sweep it summarizes
        console.print(f"[yellow]warning:[/] the sweep's result was not logged to its parent run "
                      f"{parent_run_id} ({escape(type(e).__name__ + ': ' + redact(str(e))[:300])}); "
                      f"`trainlab compare --parent {parent_run_id}` computes it")
        return None
    return result
