"""precision.formats.comm_grads: what the data-parallel all-reduce sends is rounded to the
format, on real gloo process groups. Both ranks see the same batch, so the averaged gradient
must be exactly the rounded local gradient (one bucket: one per-tensor scale for all)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import rank_env, spawn_ranks
from trainlab.config import compose_run_config
from trainlab.distributed import close_distributed
from trainlab.precision.fake_cast import quantize, tensor_scale
from trainlab.vocab.format_names import parse_format

pytestmark = pytest.mark.distributed

FORMAT = "e3m1"


def _grads(run):
    """One forward/backward of the trial's model on a fixed batch; grads by parameter name."""
    from trainlab.distributed import setup_distributed
    from trainlab.engine.run import build_trainer
    from trainlab.plan.trial_plan import Where, plan_trial

    trainer = build_trainer(plan_trial(run, Where(device="cpu")), setup_distributed("cpu"))
    torch.manual_seed(123)  # the same batch on every rank
    x = torch.randint(0, 256, (2, 16))
    with trainer.recipe.autocast():
        logits = trainer.model(x)
    F.cross_entropy(logits.float().flatten(0, 1), x.flatten()).backward()
    model = getattr(trainer.model, "module", trainer.model)
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def _rank(rank: int, world: int, port: int, out) -> None:
    rank_env(rank, world, port)

    run = compose_run_config([
        "model=tiny", "data=text", "cluster.num_workers=2", "train.global_batch_size=4",
        "train.micro_batch_size=2", "precision=emulated", "precision.hp_dtype=fp32",
        "precision.formats.activations=", "precision.formats.weights=",
        "precision.formats.gradients=", f"precision.formats.comm_grads={FORMAT}",
        "parallel.bucket_cap_mb=1000"])  # one bucket
    grads = _grads(run)
    if rank == 0:
        out.put({n: g.numpy() for n, g in grads.items()})
    close_distributed()


def test_ddp_sends_gradients_rounded_to_the_comm_format():
    (got,) = spawn_ranks(_rank, 2)
    reduced = {n: torch.from_numpy(g) for n, g in got.items()}

    # the same step in one process, full precision
    run = compose_run_config(["model=tiny", "data=text", "cluster.num_workers=1",
                              "train.global_batch_size=2", "train.micro_batch_size=2"])
    local = _grads(run)
    fmt = parse_format(FORMAT)
    amax = max(g.abs().max() for g in local.values())
    scale = tensor_scale(amax, fmt)
    for name, g in local.items():
        expected = quantize(g * scale, fmt, saturate=True) / scale
        torch.testing.assert_close(reduced[name], expected, rtol=1e-6, atol=0, msg=name)
    # and the rounding is real: a 1-bit mantissa changes most gradients
    changed = sum(int((reduced[n] != g).sum()) for n, g in local.items())
    assert changed > 0.5 * sum(g.numel() for g in local.values())
