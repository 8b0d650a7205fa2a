"""What the README says the demo (`trainlab train`, README command 1) prints, checked on its output:
a live line (step, loss, val loss, tokens/s, ETA), then a summary that says where the MLflow run
is and how to open it, `mlflow ui --backend-store-uri sqlite:///$PWD/mlflow.db --host 127.0.0.1`,
the store MLflow's client finds the run in. (Starting that `mlflow ui` as well took 40-60 s on the
busy 2-core machine, on top of the demo's minutes: left to MLflow's own tests.)

Out of a terminal (a log, CI, `ray job logs`) the live line is a plain line every tenth of the run
(console.ProgressLine); the summary is a rich table of `│ key │ value │` rows, a long value wrapped
onto rows with an empty key.
"""

from __future__ import annotations

import re
from pathlib import Path

from trainlab import names

LIVE = re.compile(r"^step (\d+)/(\d+)  loss (\d+\.\d{3})  val (\d+\.\d{3}|-)  ([\d,]+) tok/s  ETA (\d+)s$", re.M)


def summary_rows(stdout: str) -> dict[str, str]:
    """The summary table's rows, key -> value (a wrapped value's pieces joined by a space)."""
    rows: dict[str, str] = {}
    key = None
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if len(cells) != 2 or not line.lstrip().startswith("│"):
            continue
        if cells[0]:
            key = cells[0]
            rows[key] = cells[1]
        elif key is not None:
            rows[key] += " " + cells[1]
    return rows


def check_demo_output(stdout: str, *, cwd: Path) -> None:
    """Assert the demo's output in `cwd` (its store: cwd/mlflow.db) is what the README says."""
    from mlflow.tracking import MlflowClient

    # ---- the live line: every tenth of the run, steps rising to the last, ETA falling to 0 ----
    lines = [(int(s), int(n), float(loss), val, float(tps.replace(",", "")), int(eta))
             for s, n, loss, val, tps, eta in LIVE.findall(stdout)]
    assert len(lines) >= 10, f"{len(lines)} live lines in:\n{stdout[-3000:]}"
    steps = [s for s, *_ in lines]
    total = lines[0][1]
    assert steps == sorted(set(steps)) and steps[-1] == total, steps
    assert all(tps > 0 for *_, tps, _ in lines) and lines[-1][-1] == 0, lines
    assert lines[-1][3] != "-", "the last live line shows no val loss"

    # ---- the summary: the trial's numbers, where its run is and how to open it ----
    rows = summary_rows(stdout)
    assert rows.get("status") == names.STATUS_FINISHED, rows
    assert rows["steps"].startswith(f"{total} ("), rows
    uri = f"sqlite:///{cwd / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("trainlab").experiment_id])
    assert rows["val loss"] == f"{run.data.metrics[names.VAL_LOSS]:.4f}", (rows["val loss"], run.data.metrics)
    assert rows["unigram entropy"] == f"{run.data.metrics[names.REF_UNIGRAM_ENTROPY]:.4f}", rows
    assert lines[-1][3] == f"{run.data.metrics[names.VAL_LOSS]:.3f}"  # the live line's last val
    assert "".join(rows["MLflow run"].split()) == f"{run.info.run_id}in{uri}", rows["MLflow run"]
    command = f"mlflow ui --backend-store-uri {uri} --host 127.0.0.1"  # README: sqlite:///$PWD/mlflow.db
    assert "".join(rows["view it"].split()) == "".join(command.split()), (rows["view it"], command)

