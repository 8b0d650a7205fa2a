"""trainlab compare against a real MLflow sqlite store built here with MlflowClient.

Expected numbers are computed in the test from the values logged, in plain Python, not with
the package's helpers, so a wrong definition in the package cannot agree with itself.
"""

from __future__ import annotations

import csv
import math
import statistics
import time
from dataclasses import replace

import pytest

from trainlab import names
from trainlab.compare import compare_sweep, load_sweep, main, summarize
from trainlab.compare.records import Trial

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FP32, FP16, BF16 = "precision=fp32", "precision=fp16", "precision=bf16"

# -- the logged values ------------------------------------------------------------------------
# fp32: 1000 tokens/step, 8 steps, val every 2 steps; fp16: 1200 tokens/step, 6 steps
TPS = {
    (FP32, 0): [400.0, 1000.0, 1020.0, 980.0, 1010.0, 990.0, 1005.0, 1000.0],
    (FP32, 1): [380.0, 990.0, 1000.0, 1010.0, 1000.0, 995.0, 1002.0, 998.0],
    (FP16, 0): [300.0, 1800.0, 1850.0, 1790.0, 1820.0, 1810.0],
    (FP16, 1): [310.0, 1780.0, 1800.0, 1840.0, 1760.0, 1790.0],
}
VAL = {  # val loss at steps 2, 4, 6, (8)
    (FP32, 0): [5.0, 4.0, 3.4, 3.2],
    (FP32, 1): [5.1, 4.1, 3.6, 3.3],
    (FP16, 0): [5.0, 4.0, 3.3],
    (FP16, 1): [5.1, 4.2, 3.5],
}
TOKENS_PER_STEP = {FP32: 1000, FP16: 1200}
MFU = {FP32: 0.30, FP16: 0.50}
PEAK = {(FP32, 0): 2.0, (FP32, 1): 2.1, (FP16, 0): 1.5, (FP16, 1): 1.6}
SKIPPED = {(FP16, 0): [0, 0, 1, 1, 1, 2], (FP16, 1): [0, 1, 1, 1, 1, 1]}
LOSS_SCALE = [65536.0, 65536.0, 32768.0, 32768.0, 65536.0, 65536.0]
UNDERFLOW = [0.01, 0.02, 0.0, 0.05, 0.01, 0.03]  # worst-layer gradient underflow (fp16)
# the diverged fp16 trial (seed 2): absurd throughput so that counting it would show
DIV_TPS = [300.0, 5000.0, 5000.0]
DIV_GRAD = [1.0, 50.0, math.inf]


def _metric(key, value, step):
    from mlflow.entities import Metric

    return Metric(key, float(value), int(time.time() * 1000), int(step))


def _log(client, run_id, metrics):
    for i in range(0, len(metrics), 900):  # under MLflow's 1000 metrics per batch
        client.log_batch(run_id, metrics=metrics[i:i + 900])


def _trial_metrics(label, seed):
    tps, val, tok = TPS[(label, seed)], VAL[(label, seed)], TOKENS_PER_STEP[label]
    out = []
    for i, v in enumerate(tps):
        step = i + 1
        out += [_metric(names.TOKENS_PER_S, v, step), _metric(names.MFU, MFU[label] + 0.01 * seed, step),
                _metric(names.PEAK_MEM_GB, PEAK[(label, seed)] - 0.1 * (i == 0), step),
                _metric(names.GRAD_NORM, 1.0 + 0.1 * i, step),
                _metric(names.LOSS, 6.0 - 0.3 * step, step), _metric(names.TOKENS_SEEN, step * tok, step),
                _metric(names.by_tokens(names.LOSS), 6.0 - 0.3 * step, step * tok),
                _metric(names.SKIPPED_STEPS, SKIPPED.get((label, seed), [0] * 8)[i], step),
                _metric(names.NONFINITE_STEPS, SKIPPED.get((label, seed), [0] * 8)[i], step),
                _metric(names.LOSS_SPIKES, 0, step)]
        if label == FP16:
            out.append(_metric(names.LOSS_SCALE, LOSS_SCALE[i], step))
            out.append(_metric(names.cast_max_metric("grad_output", names.CAST_UNDERFLOW),
                               UNDERFLOW[i], step))
    for k, v in enumerate(val):
        step = 2 * (k + 1)
        out += [_metric(names.VAL_LOSS, v, step), _metric(names.by_tokens(names.VAL_LOSS), v, step * tok)]
    return out


def _child(client, exp_id, parent_id, *, label, seed, status, precision, tags=None, start_time=None):
    all_tags = {names.TAG_PARENT_RUN_ID: parent_id, names.TAG_ROLE: names.ROLE_TRIAL,
                names.TAG_CONFIG_LABEL: label, names.TAG_OVERRIDES: f"{label} seed={seed}",
                names.TAG_SEED: str(seed), names.TAG_PRECISION: precision, names.TAG_STATUS: status,
                names.TAG_CONFIG_HASH: f"hash-{label}-{seed}", **(tags or {})}
    return client.create_run(exp_id, run_name=f"{precision}-s{seed}", tags=all_tags,
                             start_time=start_time).info.run_id


def _parent(client, exp_id, sweep, start_time):
    return client.create_run(exp_id, start_time=start_time, run_name=f"{sweep}-parent", tags={
        names.TAG_ROLE: names.ROLE_SWEEP, names.TAG_SWEEP: sweep, names.TAG_SWEEP_ID: "abc123"}).info.run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """shootout: an old parent (1 trial) and a new one (2 configs x 2 seeds + diverged + failed);
    'nightly': a sweep logged into an experiment of another name."""
    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("shootout", artifact_location=(root / "artifacts").as_uri())
    now = int(time.time() * 1000)
    old = _parent(client, exp, "shootout", now - 3_600_000)
    rid = _child(client, exp, old, label=FP32, seed=0, status=names.STATUS_FINISHED, precision="fp32")
    _log(client, rid, _trial_metrics(FP32, 0))
    new = _parent(client, exp, "shootout", now)
    # a failed first attempt of fp32 seed 1, retried by a rerun of the sweep: must not count
    _child(client, exp, new, label=FP32, seed=1, status=names.STATUS_FAILED, precision="fp32",
           start_time=now - 60_000, tags={names.TAG_ERROR: "worker lost"})
    for label, precision in ((FP32, "fp32"), (FP16, "fp16")):
        for seed in (0, 1):
            rid = _child(client, exp, new, label=label, seed=seed, status=names.STATUS_FINISHED,
                         precision=precision)
            _log(client, rid, _trial_metrics(label, seed))
    div = _child(client, exp, new, label=FP16, seed=2, status=names.STATUS_DIVERGED, precision="fp16",
                 tags={names.TAG_DIVERGED_STEP: "3"})
    _log(client, div, [
        *[_metric(names.TOKENS_PER_S, v, i + 1) for i, v in enumerate(DIV_TPS)],
        *[_metric(names.GRAD_NORM, v, i + 1) for i, v in enumerate(DIV_GRAD)],
        *[_metric(names.NONFINITE_STEPS, v, i + 1) for i, v in enumerate([0, 0, 1])],
        *[_metric(names.LOSS_SPIKES, v, i + 1) for i, v in enumerate([0, 1, 1])],
        *[_metric(names.LOSS_SCALE, v, i + 1) for i, v in enumerate([65536, 32768, 16384])],
        _metric(names.LOSS, math.nan, 3), _metric(names.VAL_LOSS, 9.0, 2),
        _metric(names.by_tokens(names.VAL_LOSS), 9.0, 2400)])
    _child(client, exp, new, label=BF16, seed=0, status=names.STATUS_FAILED, precision="bf16",
           tags={names.TAG_ERROR: "Traceback ...\nRuntimeError: bf16 is not supported here"})
    other = client.create_experiment("misc", artifact_location=(root / "artifacts2").as_uri())
    nightly = _parent(client, other, "nightly", now)
    rid = _child(client, other, nightly, label=FP32, seed=0, status=names.STATUS_FINISHED, precision="fp32")
    _log(client, rid, _trial_metrics(FP32, 0))
    return {"uri": uri, "old": old, "new": new, "nightly": nightly, "client": client}


# -- expected numbers, from the logged values ---------------------------------------------------
def _median_after_first(values):
    return statistics.median(values[1:])


def _expected_tps(label):
    return [_median_after_first(TPS[(label, s)]) for s in (0, 1)]


def test_summary_numbers(store):
    data = load_sweep(tracking_uri=store["uri"], sweep="shootout")
    assert data.parent_run_id == store["new"] and data.n_parents == 2 and "most recent" in data.note
    assert "1 earlier attempt(s)" in data.note and len(data.trials) == 6
    s = summarize(data.trials)
    assert s.baseline == FP32
    assert [r.label for r in s.rows] == [FP32, BF16, FP16]  # vocab.precision rank order
    r32, r16, r_bf = s.row(FP32), s.row(FP16), s.row(BF16)
    # one fp16 seed diverged: the configuration is unstable, whatever its other seeds did
    assert (r32.verdict, r16.verdict, r_bf.verdict) == ("baseline", "diverged", "failed")
    assert r16.max_underflow == max(UNDERFLOW) and r32.max_underflow is None

    tps32, tps16 = _expected_tps(FP32), _expected_tps(FP16)
    assert r32.tokens_per_s_mean == pytest.approx(sum(tps32) / 2)
    assert r32.tokens_per_s_std == pytest.approx(statistics.stdev(tps32))
    assert r16.tokens_per_s_mean == pytest.approx(sum(tps16) / 2)  # the diverged trial is left out
    assert r16.speedup == pytest.approx((sum(tps16) / 2) / (sum(tps32) / 2))
    assert r32.speedup == pytest.approx(1.0) and r32.is_baseline and not r16.is_baseline
    assert r16.mfu_mean == pytest.approx(0.505) and r32.peak_mem_gb == pytest.approx(2.1)

    fin32 = [VAL[(FP32, s)][-1] for s in (0, 1)]
    fin16 = [VAL[(FP16, s)][-1] for s in (0, 1)]
    assert r32.final_val_loss_mean == pytest.approx(sum(fin32) / 2)
    assert r32.final_val_loss_std == pytest.approx(statistics.stdev(fin32))
    assert r16.final_val_loss_mean == pytest.approx(sum(fin16) / 2)
    # Δ: fp16 ends at 3 evals x 2 steps x 1200 = 7200 tokens; fp32 evaluated at 6000 and 8000
    x = 3 * 2 * TOKENS_PER_STEP[FP16]
    base_at_x = [VAL[(FP32, s)][2] + (x - 6000) / 2000 * (VAL[(FP32, s)][3] - VAL[(FP32, s)][2])
                 for s in (0, 1)]
    assert r16.final_tokens_mean == x
    assert r16.delta_val_loss == pytest.approx(sum(fin16) / 2 - sum(base_at_x) / 2)
    assert r32.delta_val_loss == pytest.approx(0.0)

    target = sum(fin32) / 2 * 1.05
    assert s.target_loss == pytest.approx(target)

    def first_reach(label, seed):
        tok = TOKENS_PER_STEP[label]
        for k, v in enumerate(VAL[(label, seed)]):
            if v <= target:
                return 2 * (k + 1) * tok
        return None

    reach32 = [first_reach(FP32, s) for s in (0, 1)]
    reach16 = [t for t in (first_reach(FP16, s) for s in (0, 1)) if t is not None]
    assert None not in reach32 and len(reach16) == 1  # one fp16 seed never gets there
    assert (r32.tokens_to_target_mean, r32.n_reached_target) == (sum(reach32) / 2, 2)
    assert (r16.tokens_to_target_mean, r16.n_reached_target, r16.n_target_measured) == (reach16[0], 1, 2)

    assert (r32.n_trials, r32.n_finished, r32.n_diverged, r32.n_failed) == (2, 2, 0, 0)
    assert (r16.n_trials, r16.n_finished, r16.n_diverged, r16.n_failed) == (3, 2, 1, 0)
    assert (r_bf.n_trials, r_bf.n_finished, r_bf.n_failed) == (1, 0, 1)
    # stability covers every trial, the diverged one included
    assert r16.skipped_steps == SKIPPED[(FP16, 0)][-1] + SKIPPED[(FP16, 1)][-1]
    assert r16.nonfinite_steps == SKIPPED[(FP16, 0)][-1] + SKIPPED[(FP16, 1)][-1] + 1
    assert r16.loss_spikes == 1 and r16.diverged_steps == (3,) and r16.max_grad_norm == 50.0
    assert r32.skipped_steps == 0 and r32.diverged_steps == ()
    # the all-failed configuration: present, with no numbers
    assert not r_bf.has_numbers and r_bf.tokens_per_s_mean is None and r_bf.speedup is None
    assert r_bf.final_val_loss_mean is None and r_bf.delta_val_loss is None


def test_explicit_baseline_and_target(store):
    trials = load_sweep(tracking_uri=store["uri"], parent_run_id=store["new"]).trials
    s = summarize(trials, baseline=FP16, target_loss=4.0)
    assert s.baseline == FP16 and s.row(FP16).speedup == pytest.approx(1.0)
    # fp32 seed 0 gets to <= 4.0 at its 2nd eval (4000 tokens), seed 1 (4.1) at its 3rd (6000)
    assert s.target_loss == 4.0 and s.row(FP32).tokens_to_target_mean == (4000 + 6000) / 2
    with pytest.raises(ValueError, match="precision=nope.*precision=fp32"):
        summarize(trials, baseline="precision=nope")
    with pytest.raises(ValueError, match="no finished trial"):
        summarize(trials, baseline=BF16)


def test_verdict_degraded_beyond_the_tolerance():
    from trainlab.compare.records import ConfigRow
    from trainlab.compare.summarize import verdict

    row = ConfigRow(label="precision=emulated", precision="emulated", is_baseline=False, n_trials=2,
                    n_finished=2, n_diverged=0, n_failed=0, n_running=0, delta_val_loss=0.03)
    assert verdict(row, base_val_loss=2.0, tolerance=0.01) == "degraded"  # 1.5 % worse
    assert verdict(row, base_val_loss=2.0, tolerance=0.02) == "ok"
    better = replace(row, delta_val_loss=-0.5)
    assert verdict(better, base_val_loss=2.0, tolerance=0.01) == "ok"


def test_default_baseline_by_precision_rank():
    def t(label, precision, status=names.STATUS_FINISHED):
        return Trial(run_id=label, label=label, status=status, precision=precision)

    # bf16 ranks above fp16 (vocab.precision: more range; a diverged fp16 trial retries in bf16)
    trials = [t("b", "fp16"), t("a", "bf16"), t("z", "fp32", names.STATUS_FAILED)]
    assert summarize(trials).baseline == "a"  # fp32 never finished
    assert summarize([t("y", "bf16"), t("x", "bf16")]).baseline == "x"  # tie: label order
    assert summarize([t("z", "fp32", names.STATUS_FAILED)]).baseline is None


def test_files_artifacts_and_report(store, tmp_path):
    out = tmp_path / "out"
    result = compare_sweep(tracking_uri=store["uri"], sweep="shootout", out_dir=out)
    names_written = {p.name for p in result.files}
    assert names_written == {"summary.md", "summary.csv", "val_loss_vs_tokens.png",
                             "train_loss_vs_tokens.png", "throughput.png", "loss_scale.png",
                             "underflow.png", "report.html"}
    for p in result.files:
        assert p.parent == out and p.stat().st_size > 0
        if p.suffix == ".png":
            assert p.read_bytes()[:8] == PNG_MAGIC
    md = (out / "summary.md").read_text()
    assert f"| {FP32} (baseline) |" in md and f"| {BF16} | 1 | 1 failed | - |" in md
    with (out / "summary.csv").open() as fh:
        rows = {r["label"]: r for r in csv.DictReader(fh)}
    assert rows[BF16]["n_failed"] == "1" and rows[BF16]["tokens_per_s_mean"] == ""
    assert float(rows[FP16]["speedup"]) == pytest.approx(result.summary.row(FP16).speedup)
    report = result.report.read_text()
    assert report.count("data:image/png;base64,") == 5
    assert "<table>" in report and f"{FP32} (baseline)" in report and "bf16 is not supported here" in report

    listed = store["client"].list_artifacts(store["new"], names.ARTIFACT_COMPARE_DIR)
    assert {a.path for a in listed} == {f"{names.ARTIFACT_COMPARE_DIR}/{n}" for n in names_written}


def test_cli_selectors(store, tmp_path, capsys, monkeypatch):
    uri = store["uri"]
    main(["--sweep", "shootout", "--tracking-uri", uri, "--out", str(tmp_path / "a"), "--no-log"])
    printed = capsys.readouterr().out
    assert FP16 in printed and "1 failed" in printed and str(tmp_path / "a" / "report.html") in printed
    assert "2 parent runs match" in printed

    # --experiment, with the store from $MLFLOW_TRACKING_URI and the default ./compare/<sweep>/
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    main(["--experiment", "misc", "--no-log"])
    assert (tmp_path / "compare" / "nightly" / "report.html").exists()
    written = {p.name for p in (tmp_path / "compare" / "nightly").iterdir()}
    assert "loss_scale.png" not in written and "underflow.png" not in written  # fp32 casts nothing
    capsys.readouterr()

    # --parent picks the older run of the same sweep: one trial
    main(["--parent", store["old"], "--out", str(tmp_path / "c"), "--no-log"])
    with (tmp_path / "c" / "summary.csv").open() as fh:
        assert [(r["label"], r["n_trials"]) for r in csv.DictReader(fh)] == [(FP32, "1")]
    # --sweep falls back to the parents' sweep tag when no experiment has the name
    assert load_sweep(tracking_uri=uri, sweep="nightly").parent_run_id == store["nightly"]


@pytest.mark.parametrize("args, message", [
    (["--sweep", "nope"], "no sweep named 'nope' in sqlite:///.*; sweeps there: nightly, shootout"),
    (["--experiment", "nope"], "no experiment named 'nope'"),
    (["--parent", "0123abcd"], "no run with id '0123abcd'"),
    (["--sweep", "shootout", "--baseline", "precision=fp8"], "baseline 'precision=fp8'"),
])
def test_cli_errors(store, capsys, args, message):
    import re

    with pytest.raises(SystemExit) as exc:
        main([*args, "--tracking-uri", store["uri"], "--no-log"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and re.search(message, err) and "Traceback" not in err


def test_missing_store_is_not_created(tmp_path, capsys):
    db = tmp_path / "absent.db"
    with pytest.raises(SystemExit) as exc:
        main(["--sweep", "x", "--tracking-uri", f"sqlite:///{db}"])
    assert exc.value.code == 2 and "no MLflow store" in capsys.readouterr().err and not db.exists()


def test_hardware_is_shown_normalised_per_device_and_can_split_rows():
    from trainlab.compare.compare_sweep import by_device_types

    def t(run_id, seed, devices, world, tps):
        tokens = ((1, tps / 2), (2, tps), (3, tps))  # the first step (warm-up) is dropped
        return Trial(run_id=run_id, label="precision=fp16", status=names.STATUS_FINISHED, seed=seed,
                     precision="fp16", device_types=devices, world_size=world,
                     metrics={names.TOKENS_PER_S: tokens})

    trials = [t("a", "0", "V100:2", 2, 2000.0), t("b", "1", "H100:4", 4, 12000.0)]
    row = summarize(trials).row("precision=fp16")
    assert row.hardware == "V100:2 | H100:4"
    assert row.tokens_per_s_per_device == pytest.approx((1000 + 3000) / 2)
    split = summarize([by_device_types(x) for x in trials])
    assert {r.label for r in split.rows} == {"precision=fp16 @ H100:4", "precision=fp16 @ V100:2"}
    assert split.row("precision=fp16 @ H100:4").tokens_per_s_per_device == pytest.approx(3000)
