"""Balanced data parallel (engine.balance, engine.slowdown, data.batches shares) in one process:
the shares, the loss weights that keep the gradient the global-batch mean, the refusals."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from trainlab.config import ConfigError, compose_run_config, ignored_options
from trainlab.data import TokenBatches
from trainlab.data.shares import Share, apportion, loss_weight, plan_shares
from trainlab.engine.slowdown import Slowdown
from trainlab.plan.derive_layout import plan_layout
from trainlab.telemetry.ranks import RankTimer


# ---------------------------------------------------------------------------- shares
@pytest.mark.parametrize(("weights", "total", "minimum", "expected"), [
    ([1, 1], 16, 1, [8, 8]),
    ([2, 1], 16, 1, [11, 5]),          # exact 10.67 / 5.33: the larger remainder wins
    ([2, 1], 15, 1, [10, 5]),          # exact
    ([1, 1, 1], 16, 1, [6, 5, 5]),     # three equal remainders: the lowest rank gets the unit
    ([100, 1, 1], 10, 2, [6, 2, 2]),   # the slow ranks pinned to the minimum, the rest to the fast one
    ([3, 2, 1], 8, 2, [4, 2, 2]),      # 4, 2.67, 1.33 -> rank 2 pinned, 6 left as 3.6 / 2.4
    ([1.5, 0.5], 4, 1, [3, 1]),
])
def test_apportion_is_proportional_exact_and_respects_the_minimum(weights, total, minimum, expected):
    shares = apportion(weights, total, minimum=minimum)
    assert shares == expected
    assert sum(shares) == total and min(shares) >= minimum


def test_apportion_refuses_impossible_input():
    with pytest.raises(ValueError, match="at least 3 each"):
        apportion([1, 1], 5, minimum=3)
    with pytest.raises(ValueError, match="above 0"):
        apportion([1, 0], 8)


def test_plan_shares_per_mode():
    kw = dict(global_batch_size=16, micro_batch_size=2)
    assert plan_shares("equal", [2, 1], **kw) == [Share(8, 4), Share(8, 4)]
    # weighted: the equal mode's 4 micro-batches on each rank, sizes proportional to the weights
    assert plan_shares("weighted", [2, 1], **kw) == [Share(11, 4), Share(5, 4)]
    # accumulate: micro-batches of 2, their count proportional: 8 micro-batches as 5.33 / 2.67
    assert plan_shares("accumulate", [2, 1], **kw) == [Share(10, 5), Share(6, 3)]
    # a very slow rank keeps one micro-batch (accumulate) or one sequence per micro-batch (weighted)
    assert plan_shares("accumulate", [50, 1], **kw)[1] == Share(2, 1)
    assert plan_shares("weighted", [50, 1], **kw)[1] == Share(4, 4)


def test_weighted_losses_average_to_the_global_batch_mean_gradient():
    """What DDP computes with uneven shares: the mean over dp ranks of each rank's gradient of
    its weighted micro-batch losses, against one process's gradient of the global mean loss."""
    torch.manual_seed(0)
    G, dp = 16, 2
    x, y = torch.randn(G, 5), torch.randn(G, 1)
    model = torch.nn.Linear(5, 1)

    def grad(loss_fn) -> torch.Tensor:
        model.zero_grad()
        loss_fn().backward()
        return model.weight.grad.clone()

    reference = grad(lambda: torch.nn.functional.mse_loss(model(x), y))
    for mode in ("weighted", "accumulate"):
        shares = plan_shares(mode, [2, 1], global_batch_size=G, micro_batch_size=2)
        per_rank, lo = [], 0
        for share in shares:
            xs, ys = x[lo:lo + share.sequences], y[lo:lo + share.sequences]
            lo += share.sequences

            def rank_loss(xs=xs, ys=ys, share=share):
                return sum(loss_weight(len(xb), dp_size=dp, global_batch_size=G)
                           * torch.nn.functional.mse_loss(model(xb), yb)
                           for xb, yb in zip(xs.tensor_split(share.micro_batches),
                                             ys.tensor_split(share.micro_batches)))
            per_rank.append(grad(rank_loss))
        averaged = sum(per_rank) / dp  # DDP's all-reduce average
        torch.testing.assert_close(averaged, reference, rtol=1e-5, atol=1e-7)
        # the plain 1/accum weighting would be wrong with these uneven shares
        assert not torch.allclose(per_rank[0], per_rank[1])


def test_loss_weight_of_equal_shares_is_one_over_accumulation_steps():
    # equal mode keeps `loss / accum_steps`: the same number, for the same reason
    assert loss_weight(2, dp_size=2, global_batch_size=16) == 1 / 4


# ---------------------------------------------------------------------------- batches
def _loaders(tokens, dp, **kw):
    base = dict(seq_len=8, global_batch_size=12, micro_batch_size=2, dp_size=dp, seed=3)
    return [TokenBatches(tokens, dp_rank=r, **{**base, **kw}) for r in range(dp)]


def test_uneven_shares_cut_the_same_global_batch():
    tokens = np.arange(5000) % 251
    (single,) = _loaders(tokens, 1)
    ranks = _loaders(tokens, 2)
    for loader, (share, micro) in zip(ranks, ((8, 4), (4, 4))):
        loader.set_shares([8, 4], num_micro_batches=micro)
        assert loader.balanced and loader.per_rank == share and loader.accum_steps == micro
    for _ in range(3):
        whole = torch.cat([x for x, _ in single.next_step()])
        parts = [rank.next_step() for rank in ranks]
        assert [len(p) for p in parts] == [4, 4]
        assert [len(x) for x, _ in parts[0]] == [2, 2, 2, 2] and [len(x) for x, _ in parts[1]] == [1] * 4
        assert torch.equal(torch.cat([x for p in parts for x, _ in p]), whole)


def test_uneven_micro_batches_differ_by_at_most_one():
    loader = _loaders(np.arange(5000) % 251, 2)[1]
    loader.set_shares([5, 7], num_micro_batches=3)
    assert [len(x) for x, _ in loader.next_step()] == [3, 2, 2]


def test_set_shares_refuses_shares_that_do_not_cover_the_batch():
    loader = _loaders(np.arange(5000) % 251, 2)[0]
    assert not loader.balanced
    with pytest.raises(ValueError, match="summing to train.global_batch_size=12"):
        loader.set_shares([8, 5], num_micro_batches=1)
    with pytest.raises(ValueError, match="cannot be cut into 3 micro-batches"):
        loader.set_shares([2, 10], num_micro_batches=3)


# ---------------------------------------------------------------------------- config
def _refusal(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        plan_layout(compose_run_config(["model=tiny", *overrides]))
    return str(info.value)


@pytest.mark.parametrize(("overrides", "fields"), [
    (["parallel=tp", "parallel.dp_balance=weighted"], ["parallel.dp_balance=weighted", "parallel.tp=2",
                                                       "parallel.tp=1"]),
    (["parallel=pp", "parallel.dp_balance=accumulate"], ["parallel.dp_balance=accumulate", "parallel.pp=2"]),
    (["parallel.dp_balance=weighted", "parallel.dp_weights=[1,1,1]"], ["parallel.dp_weights=[1.0, 1.0, 1.0]",
                                                                      "dp=2"]),
    (["parallel.dp_balance=weighted", "parallel.dp_weights=[1,0]"], ["parallel.dp_weights", "0.0"]),
    (["parallel=fsdp", "parallel.dp_balance=accumulate"], ["parallel.data_parallel=fsdp",
                                                           "parallel.dp_balance=weighted"]),
    (["parallel.dp_balance=even"], ["parallel.dp_balance='even'", "equal, weighted, accumulate"]),
    (["parallel.dp_balance_warmup=0"], ["parallel.dp_balance_warmup=0"]),
    (["debug.slowdown=[1,0.5]"], ["debug.slowdown=[1.0, 0.5]", ">= 1"]),
    (["debug.slowdown=[2]"], ["debug.slowdown=[2.0]", "cluster.num_workers=2"]),
])
def test_balance_refusals_name_the_field_and_the_fix(overrides, fields):
    msg = _refusal(overrides)
    for f in fields:
        assert f in msg, msg


def test_balanced_modes_that_fit_pass_and_unused_options_are_warned():
    run = compose_run_config(["parallel=fsdp", "parallel.dp_balance=weighted", "parallel.dp_weights=[2,1]",
                              "debug.slowdown=[1,2]"])
    assert run.parallel.dp_weights == [2.0, 1.0] and run.debug.slowdown == [1.0, 2.0]
    assert compose_run_config([]).parallel.dp_balance == "equal"
    notes = ignored_options(compose_run_config(["parallel.dp_weights=[2,1]"]))
    assert any("parallel.dp_balance=equal" in n for n in notes), notes


# ---------------------------------------------------------------------------- slowdown
def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_slowdown_stretches_each_micro_batch_by_its_factor():
    slow = Slowdown(3.0, timer=RankTimer("cpu"))
    works = []  # each micro-batch's work as timed here: a loaded machine stretches it
    start = time.perf_counter()
    for _ in range(4):
        with slow.micro_batch(2):
            t0 = time.perf_counter()
            _busy(0.02)
            works.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - start
    # stretched 3x: 2x asleep, the first micro-batch after itself, the others before them, by the
    # lower quartile of those before (measured side by side: each work lasts at least 20 ms, maybe more)
    want = 2 * works[0] + sum(2 * sorted(works[:i])[i // 4] for i in range(1, 4))
    assert slow.slept_s >= 2 * 4 * 0.02
    assert slow.slept_s == pytest.approx(want, rel=0.2), (works, slow.slept_s)
    assert elapsed >= sum(works) + slow.slept_s  # a sleep lasts at least as long as asked
    with pytest.raises(ValueError, match=">= 1"):
        Slowdown(0.5, timer=RankTimer("cpu"))


def test_a_burst_of_other_work_does_not_stretch_the_sleeps_after_it():
    slow = Slowdown(3.0, timer=RankTimer("cpu"))
    for work in [0.01] * 8 + [0.05] * 6:  # steady, then a burst that slows 6 micro-batches 5x
        with slow.micro_batch(1):
            _busy(work)
    before = slow.slept_s
    with slow.micro_batch(1):
        pass
    # the emulated device is 3x its uncontended speed: 2 x ~10 ms asleep, not 2 x the burst's 50 ms
    assert 0.018 <= slow.slept_s - before < 0.05, slow.slept_s - before
