"""The parts of a trainer's state that torch and Python keep, as a checkpoint holds them.

Trainer.state_dict() / load_state_dict() say what the state is; these helpers do the
mechanics: the model and optimizer as torch.distributed.checkpoint saves them (each rank its
shards, under the model's parameter names), a ZeRO-1 shard (rank-local), and the RNG states
of torch, CUDA, numpy and Python, all as tensors and plain values, so that a rank's file loads
with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import random

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)


def is_zero1(optimizer) -> bool:
    """A ZeRO-1 optimizer: each rank steps its own shard of the states (saved per rank)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return isinstance(optimizer, ZeroRedundancyOptimizer)


def sharded_state(model: torch.nn.Module, optimizer) -> dict:
    """{'model', 'optim'}: what DCP saves and loads in place (no 'optim' for ZeRO-1)."""
    state = {"model": get_model_state_dict(model)}
    if not is_zero1(optimizer):
        state["optim"] = get_optimizer_state_dict(model, optimizer)
    return state


def load_sharded_state(model: torch.nn.Module, optimizer, state: dict) -> None:
    set_model_state_dict(model, state["model"])
    if "optim" in state:
        set_optimizer_state_dict(model, optimizer, state["optim"])


def zero1_state(optimizer) -> dict:
    """This rank's shard of a ZeRO-1 optimizer and the scheduled learning rates of the
    wrapper's groups (copied into the shard's at each step); {} for any other optimizer."""
    if not is_zero1(optimizer):
        return {}
    return {"zero1_optim": optimizer.optim.state_dict(), "zero1_lrs": [g["lr"] for g in optimizer.param_groups]}


def load_zero1_state(optimizer, state: dict) -> None:
    if "zero1_optim" not in state:
        return
    optimizer.optim.load_state_dict(state["zero1_optim"])
    for group, lr in zip(optimizer.param_groups, state["zero1_lrs"]):
        group["lr"] = lr


def rng_state() -> dict:
    """Every RNG this process draws from (numpy's key array as an int64 tensor)."""
    np_state = np.random.get_state()
    version, internal, gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "python": [version, list(internal), gauss],
    }


def set_rng_state(rng: dict) -> None:
    torch.set_rng_state(rng["torch"])
    if rng["cuda"]:
        torch.cuda.set_rng_state_all(rng["cuda"])
    kind, keys, *rest = rng["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), *rest))
    version, internal, gauss = rng["python"]
    random.setstate((version, tuple(internal), gauss))
