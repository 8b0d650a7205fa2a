"""Each data-parallel rank's share of the global batch (parallel.dp_balance): how many
sequences and micro-batches, apportioned by weight. Pure arithmetic: the engine's balancer
(engine.balance, which measures the weights and has the whole story) and the estimate both
read it.

Rounding (apportion): largest remainders (Hamilton's method). A rank whose exact share falls
below the minimum (weighted: one sequence per micro-batch; accumulate: one micro-batch) is
pinned to the minimum and the rest re-apportioned over the others; leftover units go to the
largest fractional parts, ties to the lower rank. The shares sum exactly to the total.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def apportion(weights: Sequence[float], total: int, *, minimum: int = 1) -> list[int]:
    """Integers n_r >= minimum summing to `total`, n_r as close to total x w_r / sum(w) as
    largest remainders allow (module docstring)."""
    if not weights or any(not w > 0 or math.isinf(w) for w in weights):
        raise ValueError(f"weights={list(weights)} must be finite numbers above 0, one per rank")
    if minimum < 0 or total < minimum * len(weights):
        raise ValueError(f"cannot give {len(weights)} ranks at least {minimum} each out of {total}")
    pinned: dict[int, int] = {}
    while True:  # ends: some rank's exact share is at least the average, itself >= minimum
        free = [r for r in range(len(weights)) if r not in pinned]
        left = total - sum(pinned.values())
        wsum = sum(weights[r] for r in free)
        exact = {r: left * weights[r] / wsum for r in free}
        low = [r for r in free if exact[r] < minimum]
        if not low:
            break
        pinned.update(dict.fromkeys(low, minimum))
    shares = {r: int(exact[r]) for r in free} | pinned
    by_remainder = sorted(free, key=lambda r: (-(exact[r] - shares[r]), r))
    for r in by_remainder[:left - sum(shares[r] for r in free)]:
        shares[r] += 1
    return [shares[r] for r in range(len(weights))]


@dataclass(frozen=True)
class Share:
    """One data-parallel rank's part of every global batch."""

    sequences: int
    micro_batches: int


def plan_shares(mode: str, weights: Sequence[float], *, global_batch_size: int,
                micro_batch_size: int) -> list[Share]:
    """Each rank's Share for parallel.dp_balance=`mode` (one weight per dp rank); the sequences
    sum to global_batch_size. Equal mode ignores the weights."""
    dp = len(weights)
    accum = global_batch_size // (micro_batch_size * dp)  # the equal mode's micro-batches per rank
    if mode == "equal":
        return [Share(global_batch_size // dp, accum)] * dp
    if mode == "weighted":
        # at least one sequence in each of the `accum` micro-batches
        return [Share(n, accum) for n in apportion(weights, global_batch_size, minimum=accum)]
    if mode == "accumulate":
        units = apportion(weights, global_batch_size // micro_batch_size, minimum=1)
        return [Share(k * micro_batch_size, k) for k in units]
    raise ValueError(f"parallel.dp_balance={mode!r} is not known; choose equal, weighted or accumulate")


def loss_weight(sequences: int, *, dp_size: int, global_batch_size: int) -> float:
    """Multiplier of a micro-batch's mean loss that makes the dp-averaged gradient the mean
    over the global batch: its share of the global batch, times dp (undoing the average)."""
    return sequences * dp_size / global_batch_size
