"""Activation checkpointing: same loss and gradients, same names, less memory held for backward."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from trainlab import names
from trainlab.config import compose_run_config
from trainlab.engine.run import build_trainer
from trainlab.models import build_model
from trainlab.parallel import unwrap
from trainlab.parallel.activation_checkpoint import apply_activation_checkpointing, is_checkpointed
from trainlab.parallel.pp import split_stages
from trainlab.plan.trial_plan import Where, plan_trial

pytestmark = pytest.mark.usefixtures("one_thread")

TRAIN = ["model=tiny", "data=markov", "train.max_steps=3", "train.global_batch_size=4",
         "train.micro_batch_size=4", "train.seq_len=32", "cluster.num_workers=1", "cluster.device=cpu"]


def tiny(*overrides: str):
    torch.manual_seed(0)
    return build_model(compose_run_config(["model=tiny", *overrides]).model, vocab_size=256)


def tokens(batch: int = 4, seq_len: int = 32) -> torch.Tensor:
    return torch.randint(0, 256, (batch, seq_len + 1), generator=torch.Generator().manual_seed(1))


def loss_of(model, tok: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(tok[:, :-1]).flatten(0, 1), tok[:, 1:].flatten())


def saved_activation_bytes(model, tok: torch.Tensor) -> int:
    """Bytes of the distinct storages autograd keeps for backward, parameters and buffers
    excluded. A checkpointed block's inputs count: torch saves them through an autograd
    function outside the checkpoint's own hooks."""
    persistent = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    held: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in persistent:
            held[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_of(model, tok)
    loss.backward()
    return sum(held.values())


# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["block", "selective"])
def test_same_loss_gradients_and_names(mode):
    plain, ckpt = tiny(), tiny()
    n_layers = plain.args.n_layers
    count = apply_activation_checkpointing(ckpt, mode)
    assert count == (n_layers if mode == "block" else n_layers // 2)
    assert [is_checkpointed(b) for b in ckpt.layers] == [
        mode == "block" or i % 2 == 1 for i in range(n_layers)]
    # nothing renamed or re-typed: probes, keep_hp globs and checkpoints go by these
    assert ckpt.state_dict().keys() == plain.state_dict().keys()
    assert [n for n, _ in ckpt.named_modules()] == [n for n, _ in plain.named_modules()]
    assert [type(m) for m in ckpt.modules()] == [type(m) for m in plain.modules()]

    tok = tokens()
    ref, out = loss_of(plain, tok), loss_of(ckpt, tok)
    ref.backward()
    out.backward()
    assert out.item() == ref.item()
    for (name, p), q in zip(plain.named_parameters(), ckpt.parameters()):
        assert p.grad is not None and torch.equal(p.grad, q.grad), name


def test_selective_counts_odd_blocks_of_the_full_model():
    model = tiny("model.n_layers=5")
    assert apply_activation_checkpointing(copy.deepcopy(model), "selective") == 2  # 1, 3: floor(5/2)
    assert apply_activation_checkpointing(model, "block") == 5
    assert apply_activation_checkpointing(model, "block") == 5  # twice = once
    assert apply_activation_checkpointing(tiny(), "none") == 0
    with pytest.raises(ValueError, match="parallel.activation_checkpoint"):
        apply_activation_checkpointing(model, "full")


def test_pipeline_stage_keeps_full_model_indices_and_deepcopy_keeps_wrapping():
    model = tiny("model.n_layers=4")
    later, = split_stages(model, pp_rank=1, pp_size=2)  # blocks "2", "3" in a ModuleDict
    assert apply_activation_checkpointing(later, "selective") == 1
    assert [k for k, b in later.layers.items() if is_checkpointed(b)] == ["3"]
    # a copy recomputes its own block, not the original's
    copied = copy.deepcopy(later)
    assert copied.layers["3"].forward.__self__ is copied.layers["3"]


def test_block_holds_much_less_for_backward_selective_in_between():
    tok = tokens()
    held = {}
    for mode in ("none", "block", "selective"):
        model = tiny()
        apply_activation_checkpointing(model, mode)
        held[mode] = saved_activation_bytes(model, tok)
    ratio = held["none"] / held["block"]
    print(f"bytes held for backward: {held} (none / block = {ratio:.1f}x)")
    assert held["block"] < held["selective"] < held["none"]
    assert ratio > 3, held  # measured 5.6x on model=tiny, B=4, T=32 (logits dominate what is left)
    # each checkpointed block saves the same: selective (half of the blocks) lands midway
    assert held["selective"] == pytest.approx((held["none"] + held["block"]) / 2, rel=0.02)


def test_hooks_inside_a_block_run_again_in_the_recompute():
    """Documented behaviour: submodule forward hooks (numerics probes) see the recompute too."""
    calls = {}
    for mode in ("none", "block"):
        model = tiny()
        apply_activation_checkpointing(model, mode)
        calls[mode] = []
        model.layers[0].attention.wq.register_forward_hook(
            lambda _m, _a, out, mode=mode: calls[mode].append(out.detach().clone()))
        loss_of(model, tokens()).backward()
    assert len(calls["none"]) == 1 and len(calls["block"]) == 2
    assert all(torch.equal(calls["none"][0], c) for c in calls["block"])  # the same values


def test_numerics_probes_report_the_same_with_checkpointing(dist_info):
    """Emulated FP8 casts sampled on a step: every cast statistic (input, weight and gradient
    of each linear) is what the plain model reports, though the hooks ran twice."""
    numerics = {}
    for mode in ("none", "block"):
        run = compose_run_config([*TRAIN, "precision=emulated", f"parallel.activation_checkpoint={mode}"])
        trainer = build_trainer(plan_trial(run, Where(device=dist_info.device.type)), dist_info)
        numerics[mode] = trainer.train_step(trainer.batches.next_step(), sample=True).numerics
    probed = names.cast_metric("layers.0.attention.wq", "grad_output", names.CAST_STATS[0])
    assert probed in numerics["none"], sorted(numerics["none"])
    assert numerics["block"].keys() == numerics["none"].keys()
    for key, value in numerics["none"].items():
        assert numerics["block"][key] == pytest.approx(value, rel=1e-6, abs=1e-9), key


@pytest.mark.parametrize("mode", ["block", "selective"])
def test_trainer_run_finishes_with_the_same_loss(mode, dist_info):
    results = {}
    for ac in ("none", mode):
        trainer = build_trainer(plan_trial(compose_run_config([*TRAIN, f"parallel.activation_checkpoint={ac}"]), Where(device=dist_info.device.type)),
                                dist_info)
        # parallelize() applied it: the trainer's model is the checkpointed one
        assert sum(is_checkpointed(b) for b in unwrap(trainer.model).layers) == (
            0 if ac == "none" else apply_activation_checkpointing(tiny(), ac))
        results[ac] = trainer.train()
    assert results[mode].steps == 3
    assert results[mode].final_loss == pytest.approx(results["none"].final_loss, rel=1e-6)



def test_a_rollback_goes_back_further_when_the_retry_diverged_before_a_newer_checkpoint(tmp_path):
    from trainlab.config.checkpoints import Checkpoint
    from trainlab.engine.rollback import Rollback

    ckpts = [Checkpoint(tmp_path / f"step_{s:08d}", s) for s in (4, 8)]
    first = Rollback()
    assert first.target(ckpts).step == 8 and first.target([]) is None  # newest; none: step 0
    retried = Rollback(count=1, back_to=8)  # diverged again with no checkpoint past step 8
    assert retried.target(ckpts).step == 4
    assert Rollback(count=2, back_to=4).target(ckpts[:1]) is None  # nothing older: from the start
    # a retry that got past its checkpoint and saved a newer one goes back to that
    assert retried.target([*ckpts, Checkpoint(tmp_path / "step_00000012", 12)]).step == 12


def test_rollbacks_compound_the_learning_rate_and_keep_the_fallback_precision():
    from trainlab.config import compose_run_config
    from trainlab.engine.rollback import Rollback

    run = compose_run_config(["model=tiny", "precision=fp16", "train.on_divergence=rollback",
                              "train.rollback_lr_factor=0.5", "train.rollback_precision=bf16"])
    once = Rollback().next(run, diverged_at=30, back_to=20)
    twice = once.next(run, diverged_at=25, back_to=10)
    assert (twice.count, twice.lr_scale, twice.precision, twice.back_to) == (2, 0.25, "bf16", 10)
    assert twice.history == "step 30 -> 20 (lr x0.5, bf16); step 25 -> 10 (lr x0.25, bf16)"
    assert Rollback.from_state(twice.as_state()) == twice
