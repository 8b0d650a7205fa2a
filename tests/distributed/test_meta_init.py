"""The model is built on the meta device and each rank initialises only its own part of the
layout: no rank ever holds the unsharded model, and every layout starts from exactly the
weights one process starts from (models.init)."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from conftest import rank_env, reporting_to, spawn_ranks
from trainlab.telemetry.peak_memory import rss_gb

pytestmark = pytest.mark.distributed

BASE = ["model=tiny", "model.n_layers=4", "data=markov", "train.global_batch_size=8",
        "train.micro_batch_size=2", "train.seq_len=32", "train.eval_every=0", "tracking=none"]
# tiny's linears are too small for FP8 to pay (keep_hp 'small'): convert them anyway
ALL_LINEARS = "precision.keep_hp=[output,unaligned]"
FP8_DELAYED = ["precision=fp8_delayed", "precision.hp_dtype=fp32", ALL_LINEARS]
FP8_TENSORWISE = ["precision=fp8_tensorwise", "precision.hp_dtype=fp32", ALL_LINEARS]
CASES = {  # case: (layout, precision)
    "ddp": (["parallel=ddp"], []),
    "zero1_fp8_delayed": (["parallel=zero1"], FP8_DELAYED),
    "fsdp": (["parallel=fsdp"], []),
    "fsdp_fp8_tensorwise": (["parallel=fsdp"], FP8_TENSORWISE),
    "fsdp_bf16_pure": (["parallel=fsdp"], ["precision=bf16_pure"]),
    "tp": (["parallel=tp", "parallel.sequence_parallel=true"], []),
    "pp": (["parallel=pp"], []),
}
# ~200 MB of fp32 weights in equal blocks (the largest parameter is ~6 % of the model)
BIG = ["model=tiny", "model.dim=1024", "model.n_heads=8", "model.n_kv_heads=8", "model.ffn_dim=2816",
       "model.n_layers=4", "data=markov", "train.global_batch_size=4", "train.micro_batch_size=1",
       "train.seq_len=16", "train.eval_every=0", "tracking=none", "parallel=fsdp"]


def _build(overrides: list[str], dist_info):
    from trainlab.config import compose_run_config
    from trainlab.engine.run import build_trainer
    from trainlab.plan.trial_plan import Where, plan_trial
    from trainlab.telemetry import peak_flops
    from trainlab.telemetry.peak_flops import Peak

    run = compose_run_config([*overrides, f"cluster.num_workers={dist_info.world_size}"])
    with pytest.MonkeyPatch.context() as mp:  # the CPU matmul probe measures nothing used here
        mp.setattr(peak_flops, "cpu_probe_peak", lambda dtype, **_: Peak(1e11, f"probe:cpu:{dtype}"))
        return build_trainer(plan_trial(run, Where(device=dist_info.device.type)), dist_info)


def _initial_state(trainer) -> dict[str, tuple[str, np.ndarray]]:
    """Every parameter and buffer of the whole model as this layout starts it, as (dtype, its
    values in float32, exact for bf16): a collective, DTensors are gathered and pipeline stages
    collected from every rank. Numpy: tensors on a queue would outlive their sender's memory."""
    import torch.distributed as dist

    from trainlab.telemetry.sharded import full

    roots = trainer.pipeline.stages if trainer.pipeline is not None else [trainer.raw_model]
    state = {name: (str(t.dtype), full(t.detach()).float().numpy()) for root in roots
             for name, t in [*root.named_parameters(), *root.named_buffers()]}
    if trainer.pipeline is None or not dist.is_initialized():
        return state
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, state)
    return {name: t for part in every for name, t in part.items()}


def _initial_states(rank: int, world: int, port: int, out) -> None:
    rank_env(rank, world, port)
    from trainlab.distributed import setup_distributed

    with reporting_to(out):
        dist_info = setup_distributed("cpu")
        states = {case: _initial_state(_build([*BASE, *layout, *precision], dist_info))
                  for case, (layout, precision) in CASES.items()}
        if rank == 0:
            out.put(states)


def test_every_layout_starts_from_the_one_process_weights(dist_info):
    (states,) = spawn_ranks(_initial_states, 2, timeout=600)
    for case, (_, precision) in CASES.items():
        reference = _initial_state(_build([*BASE, *precision], dist_info))  # one process
        got = states[case]
        assert got.keys() == reference.keys(), case
        for name, (dtype, want) in reference.items():
            assert got[name][0] == dtype, f"{case}: {name}"
            assert np.array_equal(got[name][1], want), f"{case}: {name}"
    # the values are a real init: seeded, not what the memory held
    fsdp = {name: values for name, (_, values) in states["fsdp"].items()}
    assert (fsdp["layers.0.attention_norm.weight"] == 1).all()
    assert 0.015 < fsdp["layers.0.attention.wq.weight"].std() < 0.025  # N(0, init_std)
    fp8 = {name: values for name, (_, values) in states["zero1_fp8_delayed"].items()}
    assert (fp8["layers.0.attention.wq.scale"] == 1).all() and (fp8["layers.0.attention.wq.amax_history"] == 0).all()
    assert states["fsdp_bf16_pure"]["output.weight"][0] == "torch.bfloat16"


def _build_growth(rank: int, world: int, port: int, out) -> None:
    rank_env(rank, world, port)
    from trainlab.distributed import setup_distributed
    from trainlab.parallel.fsdp import sharded_bytes
    from trainlab.telemetry.peak_memory import peak_memory_gb, reset_peak_memory

    with reporting_to(out):
        dist_info = setup_distributed("cpu")
        # a tiny build first: what any build costs once (imports, the corpus, gloo) is not counted
        _build([*BIG, "model.dim=64", "model.ffn_dim=128", "model.n_heads=4", "model.n_kv_heads=4"], dist_info)
        gc.collect()
        assert reset_peak_memory(dist_info.device)
        start = rss_gb()
        trainer = _build(BIG, dist_info)
        growth = peak_memory_gb(dist_info.device) - start
        full = sum(p.numel() * p.element_size() for p in trainer.model.parameters()) / 1e9
        out.put({"rank": rank, "growth_gb": growth, "full_gb": full,
                 "shard_gb": sharded_bytes(trainer.model)["params"] / 1e9})


@pytest.mark.skipif(rss_gb() is None, reason="needs /proc (Linux) to read the resident set")
def test_an_fsdp_rank_never_holds_the_unsharded_model():
    """4 FSDP2 ranks of a ~200 MB model: building one rank's trainer raises its peak resident
    memory by its quarter plus one parameter at a time, not by the whole model (which it was
    when every rank built the full fp32 model and sharded it afterwards)."""
    results = spawn_ranks(_build_growth, 4, results=4, timeout=600)
    for r in results:
        assert r["full_gb"] > 0.15
        assert r["shard_gb"] == pytest.approx(r["full_gb"] / 4, rel=0.05)
        assert r["growth_gb"] < 0.5 * r["full_gb"], r
