"""The training loss of one micro-batch: mean cross-entropy over its targets that are not masked.

A target of IGNORE_INDEX (-100, data.loss_on=answer's masked tokens) carries no loss. The mean is
the sum over the other targets divided by their count, at least 1: a micro-batch whose targets are
all masked (a window of prompt tokens) has loss 0 and zero gradients, where F.cross_entropy's mean
would be 0/0 = NaN and end the trial as diverged. With no target masked it is F.cross_entropy's
mean (the same sum over the same count: bit-equal on CPU, tests/unit/test_hf_data.py; not yet
compared on a GPU).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trainlab.data.batches import IGNORE_INDEX


def token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of (batch, seq, vocab) `logits` against (batch, seq) `targets` over the
    targets that are not IGNORE_INDEX (module docstring); computed in fp32."""
    flat = targets.flatten()
    total = F.cross_entropy(logits.float().flatten(0, 1), flat, ignore_index=IGNORE_INDEX, reduction="sum")
    count = (flat != IGNORE_INDEX).sum().clamp(min=1)  # on the device: no host sync
    return total / count
