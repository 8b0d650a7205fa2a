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

Rounding and the shares themselves: data.shares (apportion, plan_shares, loss_weight).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import torch
import torch.distributed as dist

from trainlab import names
from trainlab.data.shares import plan_shares


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


__all__ = ["DpBalancer"]
