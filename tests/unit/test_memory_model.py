"""trainlab.estimate.memory_model: per-rank bytes of a trial from its config alone.

State (parameters, gradients, optimizer and FP8 state) is counted from the layout's own
decisions; one process here matches parallel.fsdp.sharded_bytes of a real trainer after real
steps (every layout on real gloo ranks: tests/distributed/test_estimate_memory_ranks.py).
Activations and buffers are modelled: each knob a user turns moves them the way it should.
"""

from __future__ import annotations

import pytest
import torch

from trainlab.config import compose_run_config
from trainlab.estimate.memory_model import rank_memories
from trainlab.estimate.shards import chunk_len, zero1_partition
from trainlab.plan.derive_layout import plan_layout

TINY = ["model=tiny", "data=markov", "train.max_steps=2", "train.global_batch_size=8",
        "train.micro_batch_size=2", "train.seq_len=32", "train.numerics_every=0", "cluster.device=cpu"]
FOUR_LAYERS = ["model.n_layers=4"]


def _run(*overrides: str, world: int = 1):
    return compose_run_config([*TINY, f"cluster.num_workers={world}", *overrides])


def _mems(*overrides: str, world: int = 1, device_type: str = "cpu"):
    run = _run(*overrides, world=world)
    return rank_memories(run, trial_layout=plan_layout(run), device_type=device_type)


# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [0, 1, 5, 7, 8, 64, 100, 257])
@pytest.mark.parametrize("parts", [1, 2, 3, 4, 8])
def test_chunk_len_is_torch_chunk_including_empty_pieces(size, parts):
    pieces = torch.arange(size).chunk(parts) if size else ()
    want = [len(p) for p in pieces] + [0] * (parts - len(pieces))
    assert [chunk_len(size, parts, i) for i in range(parts)] == want


def test_zero1_partition_is_largest_first_onto_the_least_loaded_rank_across_groups():
    # group 0: 10, 3, 7 -> 10 to rank 0, 7 to rank 1, 3 to rank 1 (7 < 10); group 1 starts at (10, 10)
    got = zero1_partition([[10, 3, 7], [1, 1]], 2)
    assert got == [[[0], [2, 1]], [[0], [1]]]


# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides", [  # every mode on real ranks: test_estimate_memory_ranks.py
    ["precision=bf16_pure"],  # bf16 parameters, moments and Kahan buffers (the default bf16_update)
    ["precision=fp32", "optim.exp_avg_dtype=e4m3", "optim.exp_avg_sq_dtype=e5m2"],
], ids=["bf16_pure_kahan", "fp8_moments"])
def test_one_process_state_equals_what_a_real_trainer_holds_after_its_steps(overrides):
    from trainlab.distributed import setup_distributed
    from trainlab.engine.run import build_trainer
    from trainlab.parallel.fsdp import sharded_bytes
    from trainlab.plan.trial_plan import Where, plan_trial

    run = _run(*overrides)
    (est,) = rank_memories(run, trial_layout=plan_layout(run), device_type="cpu")
    trainer = build_trainer(plan_trial(run, Where(device="cpu")), setup_distributed("cpu"))
    for _ in range(2):
        trainer.train_step(trainer.batches.next_step())
    got = sharded_bytes(trainer.model, trainer.optimizer)
    assert (est.params, est.grads, est.optim_state) == (got["params"], got["grads"], got["optim_state"])


def test_precision_changes_state_bytes_as_its_dtypes_say():
    fp32, = _mems("precision=fp32")
    pure, = _mems("precision=bf16_pure", "precision.bf16_update=plain")
    kahan, = _mems("precision=bf16_pure")
    lowp, = _mems("precision=fp32", "optim.exp_avg_dtype=e4m3", "optim.exp_avg_sq_dtype=e5m2")
    assert pure.params * 2 == fp32.params and pure.grads * 2 == fp32.grads
    n_params = fp32.params // 4
    assert kahan.optim_state - pure.optim_state == 2 * n_params  # the bf16 Kahan buffer
    n_tensors = (fp32.optim_state - 8 * n_params) // 4  # two fp32 moments per element, a 4-byte step per tensor
    from trainlab.estimate.shards import prepared_model

    model, _ = prepared_model(_run("precision=fp32"), device_type="cpu")
    assert n_tensors == len(list(model.parameters()))
    # e4m3 + e5m2: one byte each per element; per tensor the step and one float32 scale per moment
    assert lowp.optim_state == 2 * n_params + 12 * n_tensors


# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("layout", "world"), [
    (["parallel=fsdp"], 4), (["parallel=zero2"], 2), (["parallel=hsdp"], 4), (["parallel=zero1"], 2),
    (["parallel=tp"], 2), (["parallel=dp_tp"], 4), (["parallel=fsdp_tp"], 4),
    (["parallel=pp", *FOUR_LAYERS], 2), (["parallel=dp_pp", *FOUR_LAYERS], 4),
], ids=["fsdp", "zero2", "hsdp", "zero1", "tp", "dp_tp", "fsdp_tp", "pp", "dp_pp"])
def test_sharded_layouts_hold_exactly_the_model_once_per_replica(layout, world):
    whole, = _mems(*layout[1:])
    mems = _mems(*layout, world=world)
    replicas = {"parallel=hsdp": 2, "parallel=dp_tp": 2, "parallel=dp_pp": 2, "parallel=zero1": 2}.get(layout[0], 1)
    run = _run(*layout, world=world)
    # tensor parallel shards every matrix; each of its 2 ranks holds the RMSNorm gains whole
    norms = (2 * run.model.n_layers + 1) * run.model.dim * 4 if run.parallel.tp == 2 else 0
    assert sum(m.params for m in mems) == replicas * (whole.params + norms)
    if layout[0] != "parallel=zero1":
        assert max(m.params for m in mems) < whole.params
    if layout[0] == "parallel=zero1":  # states split, parameters whole
        assert all(m.params == whole.params for m in mems)
        assert sum(m.optim_state for m in mems) == whole.optim_state


# ---------------------------------------------------------------------------------------
def _saved_bytes(run) -> int:
    """Bytes autograd keeps for backward of one micro-batch's forward of the real model (every
    storage a saved tensor holds, once; parameters and buffers themselves excluded)."""
    from trainlab.data.build_corpus import corpus_vocab_size
    from trainlab.models import build_model
    from trainlab.parallel.activation_checkpoint import apply_activation_checkpointing
    from trainlab.precision.recipes import build_recipe

    torch.manual_seed(0)
    model = build_model(run.model, vocab_size=corpus_vocab_size(run.data))
    recipe = build_recipe(run.precision, device_type="cpu")
    model = recipe.prepare(model)
    if run.parallel.activation_checkpoint != "none":
        apply_activation_checkpointing(model, run.parallel.activation_checkpoint)
    own = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in own:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    x = torch.randint(0, model.args.vocab_size, (run.train.micro_batch_size, run.train.seq_len))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), recipe.autocast():
        model(x)
    return sum(seen.values())


@pytest.mark.parametrize("overrides", [
    ["precision=fp32"], ["precision=bf16"], ["precision=bf16_pure"],
    ["precision=fp16", "precision.fp16_impl=native"], ["precision=fp16"],  # emulated on CPU
    ["precision=fp32", "parallel.activation_checkpoint=block"],
], ids=["fp32", "bf16", "bf16_pure", "fp16_native", "fp16_emulated", "fp32_ac_block"])
def test_block_activations_are_what_autograd_saves_for_backward(overrides):
    """Per block: the difference between a 4- and a 2-block model, as autograd saves it."""
    from trainlab.estimate.activations import block_bytes
    from trainlab.estimate.shards import prepared_model

    base = ["model=small", "train.micro_batch_size=2", "train.seq_len=128", *overrides]
    measured = (_saved_bytes(_run(*base, "model.n_layers=4")) - _saved_bytes(_run(*base, "model.n_layers=2"))) / 2
    run = _run(*base)
    model, recipe = prepared_model(run, device_type="cpu")
    full, kept = block_bytes(run, model=model, recipe=recipe, tokens=2 * 128)
    estimated = kept if run.parallel.activation_checkpoint == "block" else full
    assert estimated == pytest.approx(measured, rel=0.05), (estimated, measured)


def test_activations_follow_checkpointing_sequence_parallel_and_the_pipeline_schedule():
    # 4 blocks: a recomputed block's activations come back in backward, on top of what is kept
    none, = _mems(*FOUR_LAYERS)
    block, = _mems(*FOUR_LAYERS, "parallel.activation_checkpoint=block")
    selective, = _mems(*FOUR_LAYERS, "parallel.activation_checkpoint=selective")
    assert block.activations < selective.activations < none.activations
    tp = _mems(*FOUR_LAYERS, "parallel=tp", world=2)[0]
    sp = _mems(*FOUR_LAYERS, "parallel=tp", "parallel.sequence_parallel=true", world=2)[0]
    assert sp.activations < tp.activations < none.activations
    pipe = ["parallel=pp", *FOUR_LAYERS, "parallel.pp_microbatches=4", "train.global_batch_size=8"]
    gpipe = _mems(*pipe, "parallel.pp_schedule=gpipe", world=2)
    one_f_one_b = _mems(*pipe, "parallel.pp_schedule=1f1b", world=2)
    # GPipe: all 4 micro-batches in flight on both stages; 1F1B: stage 0 holds pp = 2, the last 1
    assert gpipe[0].activations == 2 * one_f_one_b[0].activations == 4 * one_f_one_b[1].activations
