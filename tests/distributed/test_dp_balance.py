"""Balanced data parallel on 2 gloo ranks, rank 1 emulated 3x slower (debug.slowdown): weighted
and accumulate shares cut the fast rank's wait in the gradient all-reduce, and train the same
loss curve as equal shares at equal tokens (same global batches, same global-mean gradient).

Every mode trains in the same two processes, one trial after another (as `trainlab bench
balance` does), so the process group and the imports are paid once.
"""

from __future__ import annotations

import statistics
import traceback

import pytest

from conftest import RecordingTracker, rank0_unless_failed, rank_env, spawn_ranks
from trainlab import names
from trainlab.distributed import close_distributed
from trainlab.plan.here import plan_here

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # 11-47 s of gloo groups: the gate keeps under 15 min

WORLD = 2
STEPS = 12
SAMPLED = range(7, STEPS + 1)
"""Per-rank times are read at every step (numerics_every=1) and the median taken over steps
7-12: after every warm-up, the same steps per mode. A median, not the window's mean: a burst of
other work on a shared machine (another test's Ray cluster starting) can stall one rank for a
step or two, and the other then waits for it; in a mean that reads as a balancing that failed."""
COMMON = ["model=tiny", "cluster.device=cpu", "tracking=none", "train.seq_len=128",
          "train.global_batch_size=32", "train.micro_batch_size=8", f"train.max_steps={STEPS}",
          "train.eval_every=0", "train.eval_batches=2", "train.numerics_every=1",
          "debug.slowdown=[1,3]"]
MODES = {
    "equal": [],
    "weighted": ["parallel.dp_balance=weighted", "parallel.dp_balance_warmup=4"],  # measured: steps 3-4
    "accumulate": ["parallel.dp_balance=accumulate", "parallel.dp_weights=[3,1]"],
}


def _trials(rank: int, world: int, port: int, out) -> None:
    """Each mode through the real trainer; rank 0 reports its losses and the per-rank metrics,
    every rank the error of a mode that raised there."""
    rank_env(rank, world, port)

    from trainlab.config import compose_run_config
    from trainlab.engine.run import run_trial

    results = {}
    for mode, overrides in MODES.items():
        tracker = RecordingTracker()
        try:
            run = compose_run_config([*COMMON, *overrides, f"cluster.num_workers={world}"])
            result = run_trial(plan_here(run), tracker_factory=lambda *_, t=tracker: t)
            if rank != 0:  # only rank 0 tracks; the others report how they ended
                results[mode] = {"status": result.status}
                continue
            last = tracker.metrics[-1][1] | {k: v for _, m in tracker.metrics for k, v in m.items()
                                             if k.startswith(names.RANK_PREFIX)}
            sampled = [{k: v for k, v in m.items() if k.startswith(names.RANK_PREFIX)}
                       for step, m in tracker.metrics if step in SAMPLED]
            results[mode] = {"loss": [v for _, v in tracker.series(names.LOSS)], "last": last,
                             "sampled": [m for m in sampled if m], "status": result.status}
        except Exception:  # noqa: BLE001 - reported to the test, from every rank
            results[mode] = traceback.format_exc()
    out.put((rank, results))
    close_distributed()


@pytest.fixture(scope="module")
def modes() -> dict:
    results = rank0_unless_failed(spawn_ranks(_trials, WORLD, results=WORLD, timeout=180))
    for mode, res in results.items():
        if isinstance(res, str):
            pytest.fail(f"mode {mode}:\n{res}")
    return results


def _rank(res: dict, rank: int, key: str) -> float:
    return res["last"][names.rank_metric(rank, key)]


def _median(res: dict, key: str, rank: int = 0) -> float:
    """The median over the sampled steps of one rank's metric."""
    values = [m[names.rank_metric(rank, key)] for m in res["sampled"]]
    assert len(values) == len(SAMPLED), values
    return statistics.median(values)


def _waiting(res: dict) -> float:
    """Rank 0's share of its step spent waiting in the gradient all-reduce (median over the
    sampled steps): as a share, it holds still when other work on the machine stretches every
    phase of a step."""
    return statistics.median(m[names.rank_metric(0, names.RANK_COMM_WAIT)] / m[names.rank_metric(0, names.RANK_STEP_TIME)]
                             for m in res["sampled"])


def test_balanced_shares_cut_the_fast_ranks_wait(modes):
    equal = modes["equal"]
    # equal shares: rank 0 computes a third of the step and waits for rank 1 most of the rest
    assert _waiting(equal) > 0.4, equal["sampled"]
    # rank 1 (3x slower) computes longer: 3.40x rank 0's alone, 2.91-2.98x beside 2 busy processes,
    # 1.87x inside CI's slow tier (2026-12-07, load 7-14, where other work stretched rank 0's own
    # compute), which a bound of 2 failed
    assert _median(equal, names.RANK_COMPUTE, rank=1) > 1.3 * _median(equal, names.RANK_COMPUTE)
    # weighted keeps each rank's micro-batch count, whose fixed cost its measured rate cannot
    # move (tiny model): it balances less exactly than accumulate, and its shares follow rates
    # measured on a shared machine (at load 10-20: 0.36, 0.59 and 0.66 of equal's wait; 0.6 failed;
    # 0.83 in a local CI run of 2026-12-07 beside a leaked 2-rank trial, about 4 busy processes on
    # the 2 cores, which 0.8 failed). accumulate: 0.05 alone, 0.27-0.37 beside 2 busy processes,
    # 0.56 in a CI run (2026-12-06, before debug.slowdown sized its sleeps from a quartile)
    for mode, cut in (("weighted", 0.95), ("accumulate", 0.7)):
        res = modes[mode]
        assert _waiting(res) < cut * _waiting(equal), (mode, res["sampled"])
        assert _median(res, names.RANK_COMM_WAIT) < _median(equal, names.RANK_COMM_WAIT), mode
        assert _median(res, names.RANK_BUSY_FRACTION) > _median(equal, names.RANK_BUSY_FRACTION), mode


def test_balanced_loss_curves_match_equal_shares(modes):
    ref = modes["equal"]["loss"]
    assert len(ref) == STEPS and ref[-1] < ref[0]
    for mode in ("weighted", "accumulate"):
        assert modes[mode]["status"] == names.STATUS_FINISHED
        assert modes[mode]["loss"] == pytest.approx(ref, rel=1e-4), mode


def test_shares_are_logged_configured_and_measured(modes):
    acc = modes["accumulate"]
    # dp_weights [3, 1], 32 sequences in micro-batches of 8: 4 micro-batches as 3 and 1
    assert [_rank(acc, r, names.RANK_DP_SHARE) for r in (0, 1)] == [24, 8]
    assert [_rank(acc, r, names.RANK_DP_MICRO_BATCHES) for r in (0, 1)] == [3, 1]
    assert [_rank(acc, r, names.RANK_DP_WEIGHT) for r in (0, 1)] == [3, 1]
    w = modes["weighted"]
    shares = [_rank(w, r, names.RANK_DP_SHARE) for r in (0, 1)]
    rates = [_rank(w, r, names.RANK_DP_WEIGHT) for r in (0, 1)]
    # measured: rank 1 runs at about a third of rank 0's rate alone; 2 micro-batches each, uneven
    # sizes. Loose: other work on a shared 2-core machine lands on one rank's measure or the other's
    # (shares 18:14, rates 1.29x in a local CI run of 2026-12-07 beside a leaked 2-rank trial, about
    # 4 busy processes on the 2 cores, which bounds of 1.5x failed): the fast rank gets more
    assert sum(shares) == 32 and shares[0] > 1.15 * shares[1], shares
    assert 1.15 < rates[0] / rates[1] < 8.0, rates
    assert [_rank(w, r, names.RANK_DP_MICRO_BATCHES) for r in (0, 1)] == [2, 2]
    assert names.rank_metric(0, names.RANK_DP_SHARE) not in modes["equal"]["last"]
