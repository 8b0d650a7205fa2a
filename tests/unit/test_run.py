"""What a trial records that the README promises and only GPU tests looked at (engine/run.py):
the tag `precision_emulated` (true where the precision ran emulated: fp16 on CPU, whose default
precision.fp16_impl=auto emulates it there; false where it ran natively) and the reference lines
`ref/unigram_entropy` and, for data=markov only, `ref/true_entropy`: logged at step 0 and beside
every val/loss point, so MLflow draws them as lines under the val curve.

In-process trials of the tiny model (one process, no Ray), rank 0's tracker recording; the
same calls feed MLflow's run (tests/integration/test_convergence.py reads ref/unigram_entropy
back from the demo's MLflow run)."""

from __future__ import annotations

import pytest

from conftest import RecordingTracker
from trainlab import names
from trainlab.config import compose_run_config
from trainlab.engine.run import run_trial
from trainlab.plan.here import plan_here

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["model=tiny", "train.max_steps=4", "train.eval_every=2", "train.eval_batches=1", "train.global_batch_size=4",
        "train.micro_batch_size=4", "train.seq_len=32", "train.numerics_every=0", "cluster.num_workers=1",
        "cluster.device=cpu"]


def _trial(tmp_path, *overrides: str) -> tuple[RecordingTracker, dict]:
    tracker = RecordingTracker()
    run = compose_run_config([*TINY, *overrides, f"output_dir={tmp_path}"])
    result = run_trial(plan_here(run), tracker_factory=lambda *_: tracker)
    assert result.status == names.STATUS_FINISHED
    return tracker, result.extra


def test_emulated_fp16_on_cpu_is_tagged_and_markov_data_draws_its_true_entropy(tmp_path):
    tracker, extra = _trial(tmp_path, "precision=fp16", "data=markov", "data.vocab_size=32")
    assert tracker.tags[names.TAG_PRECISION_EMULATED] == "true"
    val_steps = sorted(tracker.by_step(names.VAL_LOSS))
    assert val_steps == [2, 4]
    true_h, unigram_h = extra["true_entropy"], extra["unigram_entropy"]
    assert 0 < true_h < unigram_h  # the source's entropy rate, below its unigram entropy
    assert tracker.by_step(names.REF_TRUE_ENTROPY) == {s: true_h for s in (0, *val_steps)}
    assert tracker.by_step(names.REF_UNIGRAM_ENTROPY) == {s: unigram_h for s in (0, *val_steps)}


def test_native_fp32_on_text_is_tagged_not_emulated_and_has_no_true_entropy(tmp_path):
    tracker, extra = _trial(tmp_path, "precision=fp32", "data=text")
    assert tracker.tags[names.TAG_PRECISION_EMULATED] == "false"
    assert extra["true_entropy"] is None
    assert names.REF_TRUE_ENTROPY not in tracker.keys()  # a real corpus has no known entropy rate
    assert sorted(tracker.by_step(names.REF_UNIGRAM_ENTROPY)) == [0, 2, 4]
