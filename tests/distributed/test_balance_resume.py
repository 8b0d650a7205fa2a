"""A balanced trial (parallel.dp_balance=weighted, shares measured) stopped after its shares
were fixed goes on from its checkpoint with those shares, not with equal ones: the measured
shares are part of the trainer's state (2 gloo ranks, rank 1 emulated 2x slower)."""

from __future__ import annotations

import pytest

from conftest import RecordingTracker, rank_env, reporting_to, spawn_ranks
from trainlab import names
from trainlab.plan.here import plan_here

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # 11-47 s of gloo groups: the gate keeps under 15 min

WORLD = 2
BALANCED = ["model=tiny", "data=markov", "cluster.device=cpu", "train.seq_len=32", "train.global_batch_size=16",
            "train.micro_batch_size=4", "train.max_steps=8", "train.eval_every=0", "train.eval_batches=2",
            "train.numerics_every=0", "parallel.dp_balance=weighted", "parallel.dp_balance_warmup=3",
            "debug.slowdown=[1,2]", "train.checkpoint_every=3"]
"""Shares measured over steps 3 and 4 (fixed after step 4), checkpoints at 3 and 6."""
SHARE_KEYS = [names.rank_metric(r, k) for r in range(WORLD)
              for k in (names.RANK_DP_SHARE, names.RANK_DP_MICRO_BATCHES, names.RANK_DP_WEIGHT)]


def _stopped_then_resumed(rank: int, world: int, port: int, out, root: str) -> None:
    rank_env(rank, world, port)

    from trainlab.config import compose_run_config
    from trainlab.engine.run import run_trial

    reports = {}
    with reporting_to(out):
        for name, extra in (("stopped", ["debug.inject_fault=sigterm@6"]), ("resumed", [])):
            run = compose_run_config([*BALANCED, *extra, f"train.checkpoint_dir={root}",
                                      f"cluster.num_workers={world}"])
            tracker = RecordingTracker()
            result = run_trial(plan_here(run), tracker_factory=lambda *_, t=tracker: t)
            shares = {step: {k: m[k] for k in SHARE_KEYS} for step, m in tracker.metrics if SHARE_KEYS[0] in m}
            reports[name] = dict(status=result.status, steps=result.steps, shares=shares,
                                 losses=tracker.by_step(names.LOSS))
        if rank == 0:
            out.put(reports)


def test_a_resumed_balanced_trial_keeps_its_measured_shares(tmp_path):
    (got,) = spawn_ranks(_stopped_then_resumed, WORLD, str(tmp_path), timeout=300)
    assert isinstance(got, dict), got
    stopped, resumed = got["stopped"], got["resumed"]
    assert (stopped["status"], stopped["steps"]) == (names.STATUS_PREEMPTED, 6)
    assert sorted(stopped["shares"]) == [3, 4]  # measured twice, fixed after step 4
    assert (resumed["status"], resumed["steps"]) == (names.STATUS_FINISHED, 8)
    assert sorted(resumed["losses"]) == [7, 8]
    # the resumed trial says which shares it goes on with: the ones the stopped trial fixed
    assert sorted(resumed["shares"]) == [7], resumed["shares"]
    assert resumed["shares"][7] == stopped["shares"][4]
    total = sum(resumed["shares"][7][names.rank_metric(r, names.RANK_DP_SHARE)] for r in range(WORLD))
    assert total == 16  # the whole global batch, cut as measured
