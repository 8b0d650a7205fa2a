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
