"""The pipeline's measured bubble (sys/pp_bubble) against its theory (sys/pp_bubble_theory,
(p-1)/(m+p-1)) through the real trainer, for several micro-batch counts m on 2 gloo ranks.

The measurement is 1 - rank 0's compute share of the step's wall time, so it holds the
schedule's idle slots plus communication: on CPU a message costs about a millisecond, more on
a loaded machine, where the other waits for a time slice. A stage's micro-batch is therefore
sized to take tens of ms (dim 256, 2 x 64 tokens), so that the schedule, not the messages, sets
what is measured. One spawn runs the three trials, one after another in the same processes.
"""

from __future__ import annotations

import statistics

import pytest

from conftest import RecordingTracker, rank_env, reporting_to, spawn_ranks
from trainlab import names

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

PP = 2
MICROBATCHES = (2, 4, 8)
STEPS = 7
MICRO_BATCH = 2
TRIAL = ["model=tiny", "model.n_layers=4", "model.dim=256", "data=markov", "parallel=pp",
         f"train.micro_batch_size={MICRO_BATCH}", "train.seq_len=64", f"train.max_steps={STEPS}",
         "train.eval_every=0", "train.eval_batches=4", "train.numerics_every=0", "train.checkpoint_every=0"]
# Measured on this 2-core machine under load 15 to 35 (other test runs beside it), medians of steps
# 2-7: the measured bubble was 0.01 to 0.19 above theory (communication, and the waits for a time
# slice it brings), never below it by more than noise. The bounds leave room for that and still
# fail a bubble that is not measured (about 0), or one that is all overhead (0.7 and more: what the
# tiny model's 1 ms micro-batches give, where messages cost as much as compute).
BELOW, ABOVE = 0.05, 0.25


def _trials(rank: int, world: int, port: int, out, m_values: tuple[int, ...]) -> None:
    """One rank of a pipelined trial for each m in turn; rank 0 puts {m: its logged metrics}."""
    rank_env(rank, world, port)
    from trainlab.config import compose_run_config
    from trainlab.engine.run import run_trial

    logged = {}
    with reporting_to(out):
        for m in m_values:
            tracker = RecordingTracker()
            run = compose_run_config([*TRIAL, f"parallel.pp_microbatches={m}",
                                      f"train.global_batch_size={m * MICRO_BATCH}", f"cluster.num_workers={world}"])
            result = run_trial(run, tracker_factory=lambda *_, t=tracker: t)
            assert result.status == names.STATUS_FINISHED, (m, result.status)
            logged[m] = tracker.metrics
        if rank == 0:
            out.put(logged)


@pytest.fixture(scope="module")
def bubbles() -> dict[int, tuple[dict[int, float], dict[int, float]]]:
    """{m: (measured bubble by step, theory by step)} from rank 0's tracker."""
    (logged,) = spawn_ranks(_trials, PP, MICROBATCHES, timeout=600)
    assert isinstance(logged, dict), logged  # a rank's error
    out = {}
    for m, metrics in logged.items():
        tracker = RecordingTracker()
        tracker.metrics = metrics
        out[m] = tracker.by_step(names.PP_BUBBLE), tracker.by_step(names.PP_BUBBLE_THEORY)
    return out


def test_both_bubbles_are_logged_at_every_step_and_the_theory_is_the_formula(bubbles):
    for m, (measured, theory) in bubbles.items():
        assert sorted(measured) == sorted(theory) == list(range(1, STEPS + 1)), m
        assert all(v == pytest.approx((PP - 1) / (m + PP - 1), abs=1e-12) for v in theory.values()), m


def test_measured_bubble_follows_the_theory_as_micro_batches_grow(bubbles):
    """Steps 2 on: step 1 also learns the stages' shapes (a pass torch makes once)."""
    steady = {m: statistics.median(v for step, v in measured.items() if step > 1)
              for m, (measured, _) in bubbles.items()}
    theory = {m: (PP - 1) / (m + PP - 1) for m in MICROBATCHES}
    shown = {m: (round(steady[m], 3), round(theory[m], 3)) for m in MICROBATCHES}
    print(f"pp bubble (measured, theory) by m: {shown}")
    for m in MICROBATCHES:
        assert theory[m] - BELOW < steady[m] < theory[m] + ABOVE, f"(measured, theory) by m: {shown}"
    assert steady[2] > steady[8], f"more micro-batches, a smaller bubble: {shown}"
