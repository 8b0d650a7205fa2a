"""The memory estimate's counted state equals what every rank of a real gloo trial holds.

For each layout (ddp, zero1, zero2, fsdp, hsdp, tp, tp+sp, GPipe, 1F1B, interleaved 1F1B, dp_tp,
dp_pp, fsdp_tp) and each precision mode on ddp and fsdp, every rank builds the real trainer
(engine.run.build_trainer), trains two steps, and compares on its own rank:
parallel.fsdp.sharded_bytes (parameters, gradients, optimizer state: what the rank/* metrics
log) and the FP8 scale state it holds (fp8_delayed's buffers, torchao's precomputed scales)
with trainlab.estimate.memory_model.rank_memories(run)[rank], made from the config alone. Rank 0
returns every rank's pair, so a failure shows each rank's numbers.
"""

from __future__ import annotations

import pytest

from spawn_cases import selected_cases, spawn_cases

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # 11-47 s of gloo groups: the gate keeps under 15 min

TINY = ["model=tiny", "data=markov", "train.max_steps=2", "train.global_batch_size=8",
        "train.micro_batch_size=2", "train.seq_len=32", "train.eval_batches=4", "train.numerics_every=0",
        "cluster.device=cpu", "precision.init_scale=1024"]  # fp16: no overflow-skipped first step
FOUR_LAYERS = ["model.n_layers=4"]
UNEVEN_VOCAB = ["data.vocab_size=66"]  # rows that split unevenly over 4 ranks (17, 17, 17, 15)
FP8 = ["precision.hp_dtype=fp32", "precision.keep_hp=[output,unaligned]"]  # tiny's linears in FP8 anyway

LAYOUTS = {  # case: (world, overrides)
    "ddp": (2, ["parallel=ddp"]),
    "zero1": (2, ["parallel=zero1", *UNEVEN_VOCAB]),
    "zero2": (2, ["parallel=zero2"]),
    "fsdp": (2, ["parallel=fsdp"]),
    "tp": (2, ["parallel=tp"]),
    "tp_sp": (2, ["parallel=tp", "parallel.sequence_parallel=true"]),
    "gpipe": (2, ["parallel=pp", *FOUR_LAYERS, "parallel.pp_schedule=gpipe"]),
    "1f1b": (2, ["parallel=pp", *FOUR_LAYERS, "parallel.pp_schedule=1f1b"]),
    "interleaved_1f1b": (2, ["parallel=pp", *FOUR_LAYERS, "parallel.pp_schedule=interleaved_1f1b",
                             "parallel.pp_virtual_stages=2"]),
    "fsdp_4_uneven": (4, ["parallel=fsdp", *UNEVEN_VOCAB]),
    "hsdp": (4, ["parallel=hsdp", *UNEVEN_VOCAB]),
    "dp_tp": (4, ["parallel=dp_tp"]),
    "dp_pp": (4, ["parallel=dp_pp", *FOUR_LAYERS]),
    "fsdp_tp": (4, ["parallel=fsdp_tp", *UNEVEN_VOCAB]),
}
PRECISIONS = {
    "fp32": [], "bf16": ["precision=bf16"], "fp16": ["precision=fp16"],
    "bf16_pure": ["precision=bf16_pure"],  # Kahan buffers (the default bf16_update)
    "bf16_pure_stochastic": ["precision=bf16_pure", "precision.bf16_update=stochastic"],
    "bf16_pure_plain": ["precision=bf16_pure", "precision.bf16_update=plain"],
    "fp8_delayed": ["precision=fp8_delayed", *FP8],
    "fp8_tensorwise": ["precision=fp8_tensorwise", *FP8],  # on fsdp: float8 all-gather, precomputed scales
    "fp8_rowwise": ["precision=fp8_rowwise", *FP8],
    "fp8_rowwise_gw_hp": ["precision=fp8_rowwise_gw_hp", *FP8],
    "emulated": ["precision=emulated", "precision.hp_dtype=fp32"],
    "fp8_moments": ["optim.exp_avg_dtype=e4m3", "optim.exp_avg_sq_dtype=e5m2"],
    "bf16_moments": ["precision=bf16", "optim.exp_avg_dtype=bf16"],
}
CASES = {**{k: v for k, v in LAYOUTS.items()},
         **{f"{layout}_{p}": (2, [f"parallel={layout}", *o]) for layout in ("ddp", "fsdp")
            for p, o in PRECISIONS.items() if p != "fp32"}}
GATE = {"fsdp_4_uneven", "zero1", "tp_sp", "1f1b", "fsdp_bf16_pure", "fsdp_fp8_tensorwise"}
"""The gate's share (one spawn per world size): the other cases are slow."""


def _measured_vs_estimated(rank: int, world: int, overrides: list[str]) -> list[dict]:
    """A spawn_cases case: this rank's real bytes after two steps next to the estimate's;
    every rank's pair gathered to rank 0."""
    import torch
    import torch.distributed as dist

    from trainlab.config import compose_run_config
    from trainlab.distributed import setup_distributed
    from trainlab.engine.run import build_trainer
    from trainlab.estimate.memory_model import rank_memories
    from trainlab.parallel.fsdp import sharded_bytes
    from trainlab.plan.derive_layout import plan_layout
    from trainlab.plan.trial_plan import Where, plan_trial
    from trainlab.precision.fp8_delayed import DelayedScalingFp8Linear

    run = compose_run_config([*TINY, *overrides, f"cluster.num_workers={world}"])
    estimate = rank_memories(run, trial_layout=plan_layout(run), device_type="cpu")
    trainer = build_trainer(plan_trial(run, Where(device="cpu")), setup_distributed("cpu"))
    for _ in range(2):
        trainer.train_step(trainer.batches.next_step())
    got = sharded_bytes(trainer.model, trainer.optimizer)
    fp8 = sum(b.numel() * b.element_size() for m in trainer.model.modules()
              if isinstance(m, DelayedScalingFp8Linear) for b in m.buffers(recurse=False))
    for p in trainer.model.parameters():  # torchao float8 all-gather's scale of each weight
        local = getattr(p, "_local_tensor", p)
        scale = getattr(local, "_precomputed_scale", None)
        if isinstance(scale, torch.Tensor):
            fp8 += scale.numel() * scale.element_size()
    mine = estimate[rank]
    pair = {"rank": rank, "measured": (got["params"], got["grads"], got["optim_state"], fp8),
            "estimated": (mine.params, mine.grads, mine.optim_state, mine.fp8_state)}
    pairs = [None] * world
    dist.all_gather_object(pairs, pair)
    return pairs


def _spawn(world: int, request) -> dict:
    wanted = selected_cases(request)
    cases = {k: o for k, (w, o) in CASES.items() if w == world and k in wanted}
    return spawn_cases(_measured_vs_estimated, world, cases, timeout=300) if cases else {}


@pytest.fixture(scope="module")
def two_ranks(request):
    return _spawn(2, request)


@pytest.fixture(scope="module")
def four_ranks(request):
    return _spawn(4, request)


@pytest.mark.parametrize("case", [pytest.param(c, marks=() if c in GATE else pytest.mark.slow) for c in CASES])
def test_counted_state_equals_every_ranks_real_bytes(request, case):
    world = CASES[case][0]
    pairs = request.getfixturevalue("two_ranks" if world == 2 else "four_ranks")[case].result()
    assert len(pairs) == world
    for pair in pairs:
        assert pair["measured"][2] > 0, f"rank {pair['rank']}: no optimizer state after two steps: {pair}"
    table = "\n".join(f"rank {p['rank']}: measured {p['measured']} estimated {p['estimated']} "
                      "(params, grads, optim_state, fp8_state)" for p in pairs)
    assert all(p["measured"] == p["estimated"] for p in pairs), table
    if case.endswith("fp8_delayed") or case == "fsdp_fp8_tensorwise":
        assert all(p["measured"][3] > 0 for p in pairs), f"{case} holds no FP8 scale state:\n{table}"
