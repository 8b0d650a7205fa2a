"""`trainlab compare`: compare a sweep's configurations (precision, parallelism) from MLflow.

load (MLflow -> records) -> summarize (pure) -> tables / plots / html_report (files) ->
logged to the sweep's parent run under names.ARTIFACT_COMPARE_DIR.
"""

from trainlab.compare.command_line import main
from trainlab.compare.compare_sweep import CompareResult, compare_sweep, write_outputs
from trainlab.compare.read_sweep import load_sweep
from trainlab.compare.records import ConfigRow, Summary, SweepData, Trial
from trainlab.compare.summarize import summarize

__all__ = [
    "CompareResult", "ConfigRow", "Summary", "SweepData", "Trial", "compare_sweep", "load_sweep",
    "main", "summarize", "write_outputs",
]
