"""Capability-weighted data parallel: uneven shares of the global batch for ranks of unequal speed.

With equal shares (parallel.dp_balance=equal) every synchronous step lasts as long as the
slowest rank's compute; the others wait in the gradient all-reduce. Here rank r instead takes
n_r sequences of the same global batch, n_r proportional to its weight w_r (its relative
throughput), so every rank's compute lasts about as long:

- weighted:   every rank runs the equal mode's number of micro-batches (train.global_batch_size /
              (train.micro_batch_size x dp)); rank r cuts its n_r sequences into that many
              near-equal micro-batches, so a faster rank runs larger micro-batches (more memory).
- accumulate: every micro-batch keeps train.micro_batch_size sequences; rank r runs
              k_r micro-batches (accumulation steps), k_r proportional to w_r, at least one.
              ddp and zero1 only: FSDP2 communicates on every micro-batch.

The weights are parallel.dp_weights, or measured: the first parallel.dp_balance_warmup steps run
with equal shares while each rank times its forward+backward (telemetry.ranks.RankTimer's
compute, which excludes communication wait; steps 1 and 2 warm up and are not measured); then
every rank all-gathers the rates (sequences per compute-second) and the shares follow them.
A micro-batch has a fixed cost besides its per-sequence cost, so a rate measured at equal
shares over-states what a slow rank does with a smaller share: the rates are measured once
more over as many steps at the new shares, and the shares re-apportioned from those (for an
affine cost that lands near equal compute times), then fixed for the rest of the run.

The gradient is the mean over the global batch in every mode: DDP and FSDP average gradients
over the dp ranks, so rank r's micro-batch of b sequences has its (mean) loss multiplied by
b x dp / global_batch_size (equal shares: exactly 1 / accumulation steps, the equal mode's own
code path). The global order of sequences is the same in every mode (data.batches), so at each
step every mode trains on the same global batch: loss curves agree up to float summation order.

Rounding (apportion): largest remainders (Hamilton's method). A rank whose exact share falls
below the minimum (weighted: one sequence per micro-batch; accumulate: one micro-batch) is
pinned to the minimum and the rest re-apportioned over the others; leftover units go to the
largest fractional parts, ties to the lower rank. The shares sum exactly to the total.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from trainlab import names


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


# ---------------------------------------------------------------------------------------
class DpBalancer:
    """Sets the shares of a TokenBatches: at once from configured weights, or from measured
    compute rates after the warm-up and once more after as many steps at those shares (a
    collective: every rank calls after_step at every step). The trainer reports each step's
    sequences and compute time via observe(). The shares are logged each time they are set."""

    def __init__(self, *, mode: str, weights: Sequence[float], warmup: int, batches,
                 device: torch.device) -> None:
        self.mode, self.warmup, self.batches, self.device = mode, warmup, batches, device
        self.weights: list[float] | None = None
        self._log_pending = False
        self._sequences = 0
        self._compute_s = 0.0
        # measured: steps (first, last] of the equal warm-up, then as many at the first shares;
        # step 1 warms up and step 2 rebuilds DDP's buckets (a collective in forward, where a
        # fast rank's wait would look like compute): left out unless nothing follows them
        first = min(2, warmup - 1)
        self._windows = [(first, warmup), (warmup, 2 * warmup - first)]
        self.fixed = bool(weights)
        if weights:
            self._apply(list(weights))

    def measuring(self, step: int) -> bool:
        """Whether optimizer step `step` (1-based) is measured: the trainer reads a step's
        compute time only then (on a GPU, reading it waits for the step's events)."""
        return not self.fixed and self._windows[0][0] < step <= self._windows[0][1]

    def observe(self, step: int, *, sequences: int, compute_s: float) -> None:
        """This rank's forward+backward of optimizer step `step` (1-based)."""
        if self.measuring(step):
            self._sequences += sequences
            self._compute_s += compute_s

    def after_step(self, step: int) -> dict[str, float]:
        """After optimizer step `step`: the metrics to log (each rank's share, micro-batches and
        weight) at the step the shares are fixed, else {}."""
        if not self.fixed and step == self._windows[0][1]:
            rate = self._sequences / self._compute_s if self._compute_s > 0 else float("nan")
            self._sequences, self._compute_s = 0, 0.0
            self._windows.pop(0)
            self.fixed = not self._windows
            rates = _all_gather(rate, device=self.device)
            if not all(math.isfinite(r) and r > 0 for r in rates):
                warnings.warn(f"parallel.dp_balance={self.mode}: measured rates {rates} are not all "
                              "positive; keeping equal shares", stacklevel=2)
                rates = [1.0] * len(rates)
            self._apply(rates)
        if not self._log_pending:
            return {}
        self._log_pending = False
        assert self.weights is not None
        out = {}
        for r, (share, w) in enumerate(zip(self.shares, self.weights)):
            out[names.rank_metric(r, names.RANK_DP_SHARE)] = float(share.sequences)
            out[names.rank_metric(r, names.RANK_DP_MICRO_BATCHES)] = float(share.micro_batches)
            out[names.rank_metric(r, names.RANK_DP_WEIGHT)] = float(w)
        return out

    def state_dict(self) -> dict:
        """Plain values: the weights the shares follow (None: equal so far), the measuring
        windows left and this rank's sums in the current one."""
        return {"weights": self.weights, "windows": [list(w) for w in self._windows], "fixed": self.fixed,
                "sequences": self._sequences, "compute_s": self._compute_s}

    def load_state_dict(self, state: dict) -> None:
        """Go on from `state`: a resumed trial keeps the shares it measured (its windows are
        behind it) instead of falling back to equal ones."""
        self._windows = [tuple(w) for w in state["windows"]]
        self.fixed = bool(state["fixed"])
        self._sequences, self._compute_s = int(state["sequences"]), float(state["compute_s"])
        if state["weights"] is not None and list(state["weights"]) != self.weights:
            self._apply([float(w) for w in state["weights"]])

    def _apply(self, weights: list[float]) -> None:
        b = self.batches
        if len(weights) != b.dp_size:
            raise ValueError(f"parallel.dp_weights has {len(weights)} weights for dp={b.dp_size} ranks; "
                             "give one per data-parallel rank")
        self.weights = weights
        self.shares = plan_shares(self.mode, weights, global_batch_size=b.global_batch_size,
                                  micro_batch_size=b.micro_batch_size)
        b.set_shares([s.sequences for s in self.shares],
                     num_micro_batches=self.shares[b.dp_rank].micro_batches)
        self._log_pending = True


def _all_gather(value: float, *, device: torch.device) -> list[float]:
    """`value` of every rank of the world, in rank order (pure data parallel: world = dp)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [value]
    mine = torch.tensor([value], dtype=torch.float64, device=device)
    rows = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, mine)
    return [float(r) for r in rows]


__all__ = ["DpBalancer", "Share", "apportion", "loss_weight", "plan_shares"]
