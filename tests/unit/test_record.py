"""What a trial records of its estimate (estimate.record): each est/ metric the counterpart of a
measured one (rank 0's peak as sys/peak_mem_gb, the largest rank's state as sys/param_gb, the
slowest rank's step), the tags, and measured/estimated at the end. Expected values are worked
out here from the hand-built ranks, not with the module's helpers."""

from __future__ import annotations

import pytest

from trainlab import names
from trainlab.estimate.record import estimate_metrics, estimate_tags, ratio_metrics
from trainlab.estimate.result import DeviceSpec, Estimate, RankEstimate, RankMemory, RankTime

GB = 10**9


def _rank(rank: int, *, node: int, params: float, act: float, compute: float, comm: float = 0.0,
          wait: float = 0.0, peak: float | None = 100.0) -> RankEstimate:
    mem = RankMemory(params=int(params * GB), grads=int(params * GB), optim_state=int(2 * params * GB),
                     activations=int(act * GB), buffers=GB // 2)
    return RankEstimate(rank=rank, device=DeviceSpec("H100", 80.0, peak, node=node), memory=mem,
                        time=RankTime(compute_s=compute, comm_s=comm, bubble_s=0.1, wait_s=wait))


def _estimate(peak: float | None = 100.0) -> Estimate:
    # rank 1 holds more parameters; rank 2 is the slowest (compute + comm + bubble = 2.6 s)
    return Estimate(ranks=(_rank(0, node=0, params=1.0, act=3.0, compute=1.0, wait=1.4, peak=peak),
                           _rank(1, node=0, params=2.0, act=1.0, compute=1.2, peak=peak),
                           _rank(2, node=1, params=1.0, act=2.0, compute=2.0, comm=0.5, peak=peak)),
                    tokens_per_step=26_000, flops_per_step=3e14, calibration="cal.json")


def test_the_metrics_pair_with_what_the_trial_measures():
    m = estimate_metrics(_estimate())
    # rank 0: 1 + 1 + 2 (state) + 3 (activations) + 0.5 (buffers)
    assert m[names.EST_PEAK_MEM_GB] == pytest.approx(7.5)
    assert m[names.EST_PEAK_MEM_GB_MAX] == pytest.approx(max(7.5, 2 + 2 + 4 + 1 + 0.5, 4 + 2 + 0.5))
    assert m[names.EST_PARAM_GB] == pytest.approx(2.0)  # the largest rank's, as sys/param_gb
    assert m[names.EST_GRAD_GB] == pytest.approx(2.0)
    assert m[names.EST_OPTIM_STATE_GB] == pytest.approx(4.0)
    assert m[names.EST_ACTIVATION_GB] == pytest.approx(3.0)
    # the step is the slowest rank's: rank 2 (2 + 0.5 + 0.1 s), not rank 0 (1 + 0.1 + 1.4 s of waiting)
    assert m[names.EST_STEP_TIME_S] == pytest.approx(2.6)
    assert (m[names.EST_COMPUTE_S], m[names.EST_COMM_S], m[names.EST_BUBBLE_S]) == pytest.approx((2.0, 0.5, 0.1))
    assert m[names.EST_TOKENS_PER_S] == pytest.approx(26_000 / 2.6)
    assert m[names.EST_MFU] == pytest.approx(3e14 / 2.6 / 300e12)
    assert set(m) == set(names.EST_METRICS)
    assert all(k.startswith(names.EST_PREFIX) for k in m)


def test_an_unknown_peak_logs_no_mfu_and_no_estimate_logs_nothing():
    assert names.EST_MFU not in estimate_metrics(_estimate(peak=None))
    assert estimate_metrics(None) == {} and estimate_tags(None) == {}
    assert ratio_metrics(None, peak_mem_gb=1.0, tokens_per_s=1.0) == {}


def test_the_tags_say_bound_calibration_and_cluster():
    tags = estimate_tags(_estimate())
    assert tags == {names.TAG_EST_BOUND: _estimate().bound, names.TAG_EST_CALIBRATION: "cal.json",
                    names.TAG_EST_CLUSTER: "2xH100 + 1xH100"}


def test_ratios_are_measured_over_estimated():
    est = _estimate()
    r = ratio_metrics(est, peak_mem_gb=9.0, tokens_per_s=5_000.0)
    assert r[names.EST_PEAK_MEM_RATIO] == pytest.approx(9.0 / 7.5)
    assert r[names.EST_TOKENS_PER_S_RATIO] == pytest.approx(5_000 / 10_000)
    assert r[names.EST_STEP_TIME_RATIO] == pytest.approx((26_000 / 5_000) / 2.6)
    # a trial that measured nothing (failed at its first step: NaN tokens/s) logs no time ratio
    r = ratio_metrics(est, peak_mem_gb=9.0, tokens_per_s=float("nan"))
    assert set(r) == {names.EST_PEAK_MEM_RATIO}
