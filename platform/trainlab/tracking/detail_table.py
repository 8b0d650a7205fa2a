"""Per-layer and per-rank numbers as one long table per trial, not as thousands of metrics.

A 2-layer model logs ~170 per-linear metrics (num/layers.*/<tensor>/<stat>), a 32-layer one
thousands, and per-rank ones (rank/<r>/*) grow with the gang; in the MLflow UI they bury the
few a person compares (train/, val/, sys/, the num/max/* aggregates). So rank 0's tracker is
wrapped in a DetailTracker: what names.detail_of recognises goes, one row per (step, metric),
to `<output_dir>/detail_rows.csv` (appended at each log call: cheap, and a crash keeps it),
and at close into `<output_dir>/detail.parquet`, logged as the run's artifact of that name
through the tracker (so through its writer, and its spill file during an outage). The rest
goes on as metrics. tracking.detail=full logs the detail as metrics too.

    import mlflow, pandas as pd
    df = pd.read_parquet(mlflow.artifacts.download_artifacts(run_id=RUN_ID, artifact_path="detail.parquet"))

A trial that starts again in the same output dir (a resume, a Ray Train restart) appends to
the same rows file; a step logged twice keeps its later row.
"""

from __future__ import annotations

import csv
import os
import warnings
from pathlib import Path
from typing import Any

from trainlab import names
from trainlab.config.schema import DETAIL_LEVELS
from trainlab.vocab.tracker import Tracker

COLUMNS = ("step", "tokens", "kind", "name", "stat", "value", "metric")
"""The table's columns: step (int64, the optimizer step), tokens (int64, tokens seen at that
step; null if unknown), kind ('layer' or 'rank'), name (the layer's module name, e.g.
'layers.0.attention.wq', 'output', 'layers.1' for a SwiGLU block; the rank's number as text),
stat ('input/underflow', 'grad_output/amax', 'swiglu/outlier_ratio', 'busy_fraction', ...),
value (float64), metric (the MLflow key it has under tracking.detail=full)."""


class DetailTracker:
    """`inner` with the per-layer and per-rank metrics split off into the detail table.

    level: 'summary' (they are rows only) or 'full' (rows and metrics)."""

    def __init__(self, inner: Tracker, *, output_dir: str | Path, level: str = "summary"):
        assert level in DETAIL_LEVELS, f"tracking.detail={level!r}: the config's check let it through"
        self.inner, self.level = inner, level
        out = Path(output_dir)
        self.rows_path, self.artifact_path = out / names.DETAIL_ROWS_FILE, out / names.ARTIFACT_DETAIL
        self._file = None
        self._writer = None
        self._tokens: dict[int, int] = {}  # step -> tokens seen, from train/tokens_seen
        self._tokens_per_step: float | None = None
        self._pending: list[tuple[int, str, float]] = []  # rows waiting for their step's tokens

    # -- Tracker protocol ------------------------------------------------------------------
    def log_metrics(self, metrics: dict[str, float], *, step: int) -> None:
        if names.TOKENS_SEEN in metrics and step > 0:
            self._tokens[step] = int(metrics[names.TOKENS_SEEN])
            self._tokens_per_step = metrics[names.TOKENS_SEEN] / step
        kept = {}
        for k, v in metrics.items():
            if names.detail_of(k):
                self._pending.append((step, k, float(v)))
                if self.level == "summary":
                    continue
            kept[k] = v
        self._write(final=False)
        if kept:
            self.inner.log_metrics(kept, step=step)

    def set_tags(self, tags: dict[str, Any]) -> None:
        self.inner.set_tags(tags)

    def log_artifact(self, path: str) -> None:
        self.inner.log_artifact(path)

    def sync(self) -> None:
        """Rows to disk as well (before a checkpoint): a crash after it keeps them."""
        self._write(final=True)
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
        self.inner.sync()

    def close(self) -> None:
        """The rows into detail.parquet, logged as the run's artifact; then the inner close."""
        self._write(final=True)
        if self._file is not None:
            self._file.close()
            self._file = None
        try:
            if self.rows_path.exists() and write_parquet(self.rows_path, self.artifact_path):
                self.inner.log_artifact(str(self.artifact_path))
        except Exception as e:  # noqa: BLE001 - the metrics still go in; the rows stay on disk
            warnings.warn(f"per-layer/per-rank detail not written to {self.artifact_path} ({e}); its rows "
                          f"are in {self.rows_path}", stacklevel=2)
        self.inner.close()

    # -- rows ------------------------------------------------------------------------------
    def _tokens_at(self, step: int) -> int | None:
        if step in self._tokens:
            return self._tokens[step]
        return round(step * self._tokens_per_step) if self._tokens_per_step is not None else None

    def _write(self, *, final: bool) -> None:
        """Append the pending rows whose tokens are known (their step's train/tokens_seen came,
        or a later step's did: this one will not get its own); all of them when `final`."""
        if not self._pending:
            return
        latest = max(self._tokens, default=-1)
        ready = [r for r in self._pending if final or r[0] <= latest]
        if not ready:
            return
        self._pending = [r for r in self._pending if not (final or r[0] <= latest)]
        if self._writer is None:
            self.rows_path.parent.mkdir(parents=True, exist_ok=True)
            new = not self.rows_path.exists() or self.rows_path.stat().st_size == 0
            self._file = self.rows_path.open("a", newline="", buffering=1 << 16)
            self._writer = csv.writer(self._file)
            if new:
                self._writer.writerow(COLUMNS)
        for step, key, value in ready:
            kind, name, stat = names.detail_of(key)
            tokens = self._tokens_at(step)
            # repr keeps every bit of the float (and writes nan/inf, which pyarrow reads back)
            self._writer.writerow((step, "" if tokens is None else tokens, kind, name, stat, repr(value), key))


def write_parquet(rows_path: str | Path, parquet_path: str | Path) -> bool:
    """The rows file as Parquet (a step logged twice: its last row), sorted by step and metric;
    False if it holds no row."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    types = {"step": pa.int64(), "tokens": pa.int64(), "kind": pa.string(), "name": pa.string(),
             "stat": pa.string(), "value": pa.float64(), "metric": pa.string()}
    table = pacsv.read_csv(rows_path, convert_options=pacsv.ConvertOptions(
        column_types=types, include_columns=list(COLUMNS), strings_can_be_null=False))
    if table.num_rows == 0:
        return False
    # the later of two rows of one (step, metric): its row number is the larger
    table = table.append_column("_row", pa.array(range(table.num_rows), pa.int64()))
    last = table.group_by(["step", "metric"], use_threads=False).aggregate([("_row", "max")])
    if last.num_rows < table.num_rows:
        table = table.take(pc.sort_indices(last["_row_max"]))
    table = table.drop_columns(["_row"]).sort_by([("step", "ascending"), ("metric", "ascending")])
    tmp = Path(f"{parquet_path}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, parquet_path)  # a reader never sees half a file
    return True


def leftover_rows(output_dir: str | Path) -> Path | None:
    """The output dir's rows file if no detail.parquet was made from it since it last changed
    (rank 0 died before its close): what the trial's closer turns into the artifact."""
    rows, parquet = Path(output_dir) / names.DETAIL_ROWS_FILE, Path(output_dir) / names.ARTIFACT_DETAIL
    if not rows.exists():
        return None
    if parquet.exists() and parquet.stat().st_mtime_ns >= rows.stat().st_mtime_ns:
        return None
    return rows


__all__ = ["COLUMNS", "DetailTracker", "leftover_rows", "write_parquet"]
