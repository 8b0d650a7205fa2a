"""The driver's summary of a trial whose workers failed (a save on a full disk at step 3): its
step count is the last step the workers reported, as the tracker recorded them, not 0."""

from __future__ import annotations

from trainlab import names
from trainlab.config import compose_run_config
from trainlab.console import console
from trainlab.events import TrialResult
from trainlab.launch.lifecycle import print_summary
from trainlab.launch.outcome import TrialOutcome


def summary_rows(outcome: TrialOutcome, tmp_path) -> dict[str, str]:
    run = compose_run_config(["model=tiny", "tracking=none"])
    with console.capture() as cap:
        print_summary(run, outcome, tmp_path)
    rows: dict[str, str] = {}
    key = ""
    for line in cap.get().splitlines():
        cells = [c.strip() for c in line.split("│")][1:-1]
        if len(cells) == 2:  # a wrapped value goes on under an empty key
            key = cells[0] or key
            rows[key] = f"{rows[key]} {cells[1]}" if key in rows and not cells[0] else cells[1]
    return rows


def test_a_failed_trial_reports_the_steps_its_workers_recorded(tmp_path):
    failed = TrialOutcome(status=names.STATUS_FAILED, result=None, run_id=None, tracking_uri=None,
                          error="CheckpointWriteError: the checkpoint of step 3 could not be written (rank "
                                "0: RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos "
                                "704 vs 598)",
                          last_step=2)
    rows = summary_rows(failed, tmp_path)
    assert rows["steps"] == "2 (the last the workers reported)", rows
    assert rows["status"].startswith("failed (CheckpointWriteError")
    assert "[enforce fail at inline_container.cc:672]" in rows["status"]  # torch's words, not rich markup


def test_a_trial_that_reported_its_result_keeps_the_results_count(tmp_path):
    result = TrialResult(status=names.STATUS_FINISHED, steps=5, tokens_seen=640, final_loss=2.0, final_val_loss=2.1,
                         tokens_per_s=100.0, mfu=None, peak_mem_gb=0.1, skipped_steps=0, nonfinite_steps=0,
                         loss_spikes=0, elapsed_s=1.0)
    done = TrialOutcome(status=names.STATUS_FINISHED, result=result, run_id=None, tracking_uri=None, last_step=5)
    assert summary_rows(done, tmp_path)["steps"] == "5 (640 tokens)"


def test_a_long_output_dir_and_store_uri_stay_whole_on_a_narrow_console(tmp_path):
    """At 80 columns (a pytest-xdist worker's, a narrow terminal's) the summary folds a long value
    onto more lines instead of cutting it to '...': the path and the URI can still be copied."""
    deep = tmp_path.joinpath(*(["a_rather_long_folder_name"] * 6))
    uri = f"sqlite:///{deep}/mlflow.db"
    result = TrialResult(status=names.STATUS_FINISHED, steps=5, tokens_seen=640, final_loss=2.0, final_val_loss=2.1,
                         tokens_per_s=100.0, mfu=None, peak_mem_gb=0.1, skipped_steps=0, nonfinite_steps=0,
                         loss_spikes=0, elapsed_s=1.0)
    done = TrialOutcome(status=names.STATUS_FINISHED, result=result, run_id="0" * 32, tracking_uri=uri, last_step=5)
    width = console.width
    console.width = 80
    try:
        rows = summary_rows(done, deep)
    finally:
        console.width = width
    assert "…" not in "".join(rows.values()), rows
    assert "".join(rows["output dir"].split()) == str(deep), rows["output dir"]
    assert "".join(rows["MLflow run"].split()) == f"{'0' * 32}in{uri}", rows["MLflow run"]


def test_a_notice_with_a_long_path_is_one_line_on_a_narrow_console(tmp_path):
    """A log line is never broken at the console's width: grep for 'at step 2' finds it."""
    line = f"resumed from {tmp_path.joinpath(*(['checkpoints'] * 8))}/step_00000002 at step 2 (restart 1) on 1 workers"
    width = console.width
    console.width = 80
    try:
        with console.capture() as cap:
            console.print(f"[cyan]{line}[/]")
    finally:
        console.width = width
    assert cap.get() == line + "\n"
