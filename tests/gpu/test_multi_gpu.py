"""Layouts on NCCL against one GPU, for machines with 2+ GPUs (4 for the 2-D ones): the loss
curve of each layout equals one GPU's with the same global batch and seed (fp32, TF32 off), as
tests/distributed/test_layouts.py shows on gloo. Skipped below the GPUs a layout needs."""

from __future__ import annotations

import pytest
import torch

from conftest import spawn_ranks, trial_curves
from trainlab import names

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu,
              pytest.mark.skipif(GPUS < 2, reason=f"needs 2+ CUDA GPUs (this machine has {GPUS})")]

TINY = ["model=tiny", "data=markov", "train.max_steps=6", "train.global_batch_size=8",
        "train.micro_batch_size=2", "train.seq_len=32", "train.eval_every=3", "train.eval_batches=4",
        "optim.warmup_steps=2", "optim.eps=1e-6", "train.numerics_every=0", "precision=fp32",
        "cluster.device=cuda"]


def _run(world: int, overrides: list[str]):
    (got,) = spawn_ranks(trial_curves, world, [*TINY, *overrides], timeout=300)
    return got


@pytest.fixture(scope="module")
def one_gpu():
    return {2: _run(1, []), 4: _run(1, ["model.n_layers=4"])}


@pytest.mark.parametrize(("world", "overrides"), [
    (2, ["parallel=ddp"]),
    (2, ["parallel=fsdp"]),
    (2, ["parallel=zero1"]),
    (2, ["parallel=tp"]),
    (2, ["parallel=pp", "model.n_layers=4", "parallel.pp_schedule=1f1b"]),
    (4, ["parallel=dp_tp"]),
    (4, ["parallel=fsdp_tp"]),
    (4, ["parallel=dp_pp", "model.n_layers=4"]),
], ids=["ddp", "fsdp", "zero1", "tp", "pp_1f1b", "dp_tp", "fsdp_tp", "dp_pp"])
def test_layout_on_nccl_trains_like_one_gpu(one_gpu, world, overrides):
    if GPUS < world:
        pytest.skip(f"needs {world} CUDA GPUs (this machine has {GPUS})")
    ref_train, ref_val, _ = one_gpu[4 if "model.n_layers=4" in overrides else 2]
    train, val, status = _run(world, overrides)
    assert status == names.STATUS_FINISHED
    # NCCL sums in another order than one GPU's accumulation: rounding, not 1e-5 as on gloo
    assert train == pytest.approx(ref_train, rel=1e-3)
    assert val == pytest.approx(ref_val, rel=1e-3)


def test_bf16_gradient_compression_needs_nccl_and_trains(one_gpu):
    """The bf16 DDP communication hook (NCCL only): close to the fp32 all-reduce, not equal."""
    ref_train, _, _ = one_gpu[2]
    train, _, status = _run(2, ["parallel=ddp", "parallel.comm_dtype=bf16"])
    assert status == names.STATUS_FINISHED
    assert train == pytest.approx(ref_train, rel=2e-2)
    assert train != pytest.approx(ref_train, rel=1e-7)
