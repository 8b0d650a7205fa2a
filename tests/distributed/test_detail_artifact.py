"""Per-layer and per-rank numbers as a trial's detail.parquet, not as hundreds of metrics: a real
bf16 trial of the tiny model (torchrun, 2 ranks) into a real store, read back as a user and
`trainlab compare` read it; tracking.detail=full restores them as metrics."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest
from mlflow.artifacts import download_artifacts
from mlflow.tracking import MlflowClient

from conftest import free_port
from trainlab import names

pytestmark = pytest.mark.distributed

TINY = ["model=tiny", "data=markov", "precision=bf16", "train.max_steps=10", "train.global_batch_size=8",
        "train.micro_batch_size=2", "train.seq_len=32", "train.eval_every=5", "train.eval_batches=2",
        "train.numerics_every=5", "tracking.system_metrics=false"]
SUMMARY_BOUND = 60 + len(names.EST_METRICS) + 3
"""Metrics of a tiny trial at tracking.detail=summary (measured 46 on one rank, 49 for fp16/fp8,
before the estimate's est/... metrics and its 3 measured/estimated ratios, a fixed set, came);
was 241-250 with the per-layer and per-rank ones. It must not grow with layers or ranks."""


def _trial(tmp_path, uri: str, *extra: str, world: int = 2):
    out = tmp_path / f"run{len(list(tmp_path.glob('run*')))}"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world),
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "trainlab.train", *TINY,
           f"cluster.num_workers={world}", f"tracking.uri={uri}", f"hydra.run.dir={out}", *extra]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("trainlab").experiment_id],
                              order_by=["attributes.start_time DESC"])
    return client, runs[0]


def _table(uri: str, run_id: str, tmp_path) -> pd.DataFrame:
    """As the README tells a user to read it."""
    return pd.read_parquet(download_artifacts(run_id=run_id, artifact_path=names.ARTIFACT_DETAIL,
                                              dst_path=str(tmp_path), tracking_uri=uri))


@pytest.mark.slow  # 16 s of a 2-rank trial: the gate keeps under 15 min
def test_summary_keeps_few_metrics_and_the_table_holds_what_telemetry_computed(tmp_path, mlflow_db):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client, run = _trial(tmp_path, uri)
    metrics = run.data.metrics
    assert len(metrics) <= SUMMARY_BOUND, sorted(metrics)
    assert not [k for k in metrics if names.detail_of(k)]
    for key in (names.LOSS, names.VAL_LOSS, names.PEAK_MEM_GB, names.STRAGGLER_RATIO,
                names.cast_max_metric("grad_output", names.CAST_UNDERFLOW)):
        assert key in metrics, key

    df = _table(uri, run.info.run_id, tmp_path)
    assert list(df.columns) == ["step", "tokens", "kind", "name", "stat", "value", "metric"]
    assert sorted(df["step"].unique()) == [1, 5, 10]  # the sampled steps
    tokens_per_step = 8 * 32
    assert (df["tokens"] == df["step"] * tokens_per_step).all()
    layers = df[df["kind"] == names.DETAIL_LAYER]
    assert "layers.1.feed_forward.w2" in set(layers["name"]) and "layers.1" in set(layers["name"])
    assert set(df.loc[df["kind"] == names.DETAIL_RANK, "name"]) == {"0", "1"}
    # every max aggregate logged as a metric is the max over the table's layers at that step
    for tensor in names.CAST_TENSORS:
        for stat in (names.CAST_AMAX, names.CAST_UNDERFLOW, names.CAST_OVERFLOW):
            hist = {m.step: m.value for m in client.get_metric_history(run.info.run_id,
                                                                      names.cast_max_metric(tensor, stat))}
            rows = layers[layers["stat"] == f"{tensor}/{stat}"].groupby("step")["value"].max()
            assert hist == pytest.approx(rows.to_dict(), rel=1e-6), (tensor, stat)
    # the per-rank aggregates likewise
    busy = df[df["stat"] == names.RANK_BUSY_FRACTION].groupby("step")["value"].min()
    hist = {m.step: m.value for m in client.get_metric_history(run.info.run_id, names.BUSY_FRACTION_MIN)}
    assert hist == pytest.approx(busy.to_dict(), rel=1e-6)


@pytest.mark.slow
def test_detail_full_restores_the_metrics_and_they_equal_the_table(tmp_path, mlflow_db):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client, run = _trial(tmp_path, uri, "tracking.detail=full", world=1)
    df = _table(uri, run.info.run_id, tmp_path)
    detail_keys = {k for k in run.data.metrics if names.detail_of(k)}
    assert detail_keys == set(df["metric"]) and len(detail_keys) > 150
    key = names.cast_metric("layers.0.attention.wq", "input", names.CAST_AMAX)
    from_metrics = {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
    assert from_metrics == df[df["metric"] == key].set_index("step")["value"].to_dict()


@pytest.mark.slow
def test_compare_reads_the_table_from_an_mlflow_server(mlflow_server, tmp_path):
    """Proxied artifacts (mlflow-artifacts:/): compare's reader and its per-layer plot."""
    from trainlab.compare.layer_plots import LAYERS_PNG, write_layer_heatmaps
    from trainlab.compare.read_detail import read_detail
    from trainlab.compare.records import Summary, SweepData, Trial
    from trainlab.compare.summarize import summarize

    client, run = _trial(tmp_path, mlflow_server.uri, world=1)
    assert run.info.artifact_uri.startswith("mlflow-artifacts:")
    df = read_detail(tracking_uri=mlflow_server.uri, run_id=run.info.run_id)
    assert df is not None and (df["kind"] == names.DETAIL_LAYER).sum() > 150
    trial = Trial(run_id=run.info.run_id, label="precision=bf16", status=names.STATUS_FINISHED)
    data = SweepData(name="one", experiment_name="trainlab", experiment_id=run.info.experiment_id,
                     parent_run_id="", tracking_uri=mlflow_server.uri, trials=(trial,))
    summary: Summary = summarize([trial], baseline=None, target_loss=None)
    (tmp_path / "cmp").mkdir()
    png = write_layer_heatmaps(data, summary, out_dir=tmp_path / "cmp")
    assert png == tmp_path / "cmp" / LAYERS_PNG and png.stat().st_size > 10_000
