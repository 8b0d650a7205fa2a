"""Tensor parallelism with real gloo process groups: 2 TP ranks train like 1 process.

One spawn of 2 ranks runs every distributed case (spawning costs more than the training):
each rank trains the unsharded model as the reference and then its TP=2 copy, from the same
seed on the same batches, the way the trainer steps (clip by the global norm, AdamW).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import every_rank
from trainlab.config import compose_run_config
from trainlab.models import build_model, resolve_dims
from trainlab.models.transformer import Attention, apply_rope, rope_tables
from trainlab.parallel.tp import check_tp, clip_grads_with_norm_

pytestmark = pytest.mark.distributed

WORLD = 2
STEPS = 5
SEQ = 16
# (name, model overrides, vocab): plain MHA, and GQA with a vocabulary tp does not divide.
CASES = [("mha", ["model.n_kv_heads=4"], 256), ("gqa", ["model.n_kv_heads=2"], 255)]


def _run_config(overrides):
    # optim.eps=1e-6: AdamW steps by m / (sqrt(v) + eps), so a gradient entry near eps moves
    # by an amount its last bits decide, and TP sums each matmul in a different order. At
    # the default 1e-8 that alone leaves parameters up to ~2.4e-5 apart after 5 steps
    # (under 1% of their movement); at 1e-6 they agree within ~7e-7 and the check is
    # about the sharding, not the rounding.
    return compose_run_config(["model=tiny", "optim.warmup_steps=1", "optim.eps=1e-6",
                               *overrides])


def _train(model, run, batches):
    """The trainer's step on one micro-batch: loss on full logits, global-norm clip, AdamW."""
    from trainlab.engine.schedule import build_optimizer

    optimizer, scheduler = build_optimizer(model, run.optim, max_steps=STEPS)
    losses, norms, clipped = [], [], []
    for batch in batches:
        x, y = batch[:, :-1], batch[:, 1:]
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x).float().flatten(0, 1), y.flatten())
        loss.backward()
        params = [p for p in model.parameters() if p.requires_grad]
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        clip_grads_with_norm_(params, run.optim.grad_clip, norm)
        clipped.append(float(torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])))
        optimizer.step()
        scheduler.step()
        losses.append(float(loss.detach()))
        norms.append(float(norm))  # a Replicate DTensor under TP: float() works as is
    return losses, norms, clipped


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _swiglu_amax(model, x) -> dict[str, float]:
    from trainlab.telemetry.swiglu import SwigluMonitor, w13_alignment

    monitor = SwigluMonitor(model)
    monitor.arm()
    with torch.no_grad():
        model(x)
    return {k: v for k, v in monitor.collect().items() if "amax" in k} | w13_alignment(model)


def _rank_main() -> dict:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from trainlab.parallel.tp import apply_tp

    mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("tp",))
    out: dict = {}
    for name, overrides, vocab in CASES:
        run = _run_config(overrides)

        def build(run=run, vocab=vocab):
            torch.manual_seed(0)
            return build_model(run.model, vocab_size=vocab)

        g = torch.Generator().manual_seed(1)  # the same batches on every TP rank
        batches = [torch.randint(0, vocab, (2, SEQ + 1), generator=g) for _ in range(STEPS)]
        ref = build()
        init = {n: p.detach().clone() for n, p in ref.named_parameters()}
        ref_taps = _swiglu_amax(ref, batches[0][:, :-1])
        ref_losses, ref_norms, _ = _train(ref, run, batches)
        final = dict(ref.named_parameters())
        out[name] = {"ref_losses": ref_losses, "ref_norms": ref_norms,
                     "grad_clip": run.optim.grad_clip,
                     "moved": max(float((final[n] - init[n]).abs().max()) for n in init)}
        for sp in (False, True):
            model = apply_tp(build(), mesh=mesh, sequence_parallel=sp)
            placements = {n: getattr(p, "placements", None) for n, p in model.named_parameters()}
            taps = _swiglu_amax(model, batches[0][:, :-1])
            # a tap sees this rank's MLP channels: the max over ranks is the model's amax
            amax = {k: torch.tensor(v) for k, v in taps.items() if "amax" in k}
            for v in amax.values():
                dist.all_reduce(v, op=dist.ReduceOp.MAX)
            losses, norms, clipped = _train(model, run, batches)
            diff = max(float((_full(p.detach()) - final[n].detach()).abs().max())
                       for n, p in model.named_parameters())
            out[name][sp] = {"losses": losses, "norms": norms, "clipped": clipped, "param_diff": diff,
                             "placements": placements,
                             "taps": {k: float(v) for k, v in amax.items()}
                             | {k: v for k, v in taps.items() if "amax" not in k},
                             "ref_taps": ref_taps}
            if sp:  # an uneven split of the sequence is refused before any collective runs
                try:
                    model(batches[0][:, :-2])
                except ValueError as e:
                    out[name]["uneven_error"] = str(e)
    try:
        torch.manual_seed(0)
        apply_tp(build_model(_run_config(["model.smooth_swiglu=true"]).model, vocab_size=256),
                 mesh=mesh)
    except ValueError as e:
        out["smooth_error"] = str(e)
    return out


@pytest.fixture(scope="module")
def tp_runs() -> dict:
    return every_rank(_rank_main, WORLD)


@pytest.mark.parametrize("case", [name for name, _, _ in CASES])
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp_sp"])
def test_tp2_trains_like_one_process(tp_runs, case, sp):
    for rank, result in tp_runs.items():
        one, two = result[case], result[case][sp]
        assert len(two["losses"]) == STEPS
        assert max(one["ref_norms"]) > one["grad_clip"]  # clipping by the global norm is exercised
        assert one["moved"] > 100 * 1e-5                  # parameters really moved
        for a, b in zip(one["ref_losses"], two["losses"]):
            assert b == pytest.approx(a, rel=1e-5), (rank, one["ref_losses"], two["losses"])
        for a, b in zip(one["ref_norms"], two["norms"]):
            assert b == pytest.approx(a, rel=1e-5)
        # every gradient clipped, the norms' Partial ones included (torch 2.11's foreach
        # multiply skipped those: parameters then ended 1.2e-4 away from one process's)
        for norm, after in zip(two["norms"], two["clipped"]):
            assert after == pytest.approx(min(norm, one["grad_clip"]), rel=1e-5)
        assert two["param_diff"] < 1e-5, (rank, two["param_diff"])


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp_sp"])
def test_every_parameter_is_a_dtensor_sharded_by_the_plan(tp_runs, sp):
    placements = {n: str(p) for n, p in tp_runs[0]["mha"][sp]["placements"].items()}
    assert "None" not in placements.values()  # no plain tensor left for foreach ops to trip on
    for name, placement in placements.items():
        if name.endswith(("wq.weight", "wk.weight", "wv.weight", "w1.weight", "w3.weight",
                          "output.weight", "tok_embeddings.weight")):
            assert placement == "(Shard(dim=0),)", name
        elif name.endswith(("wo.weight", "w2.weight")):
            assert placement == "(Shard(dim=1),)", name
        else:
            assert name.endswith("norm.weight") and placement == "(Replicate(),)", name


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp_sp"])
def test_swiglu_taps_and_alignment_still_work(tp_runs, sp):
    for result in tp_runs.values():
        got, ref = result["gqa"][sp]["taps"], result["gqa"][sp]["ref_taps"]
        assert got.keys() == ref.keys() and ref
        for key in ref:
            assert got[key] == pytest.approx(ref[key], rel=1e-5), key


def test_sequence_parallel_refuses_a_sequence_tp_does_not_divide(tp_runs):
    for result in tp_runs.values():
        msg = result["mha"]["uneven_error"]
        assert "parallel.tp=2" in msg and "train.seq_len" in msg


def test_apply_tp_refuses_smooth_swiglu(tp_runs):
    for result in tp_runs.values():
        assert "model.smooth_swiglu" in result["smooth_error"]
        assert "parallel.tp=2" in result["smooth_error"]


# --- no process group needed ------------------------------------------------------------
def _args(**model):
    run = _run_config([f"model.{k}={v}" for k, v in model.items()])
    return resolve_dims(run.model, vocab_size=256)


def test_check_tp_names_the_field_that_tp_does_not_divide():
    with pytest.raises(ValueError, match=r"model\.n_heads=4 .*parallel\.tp=3"):
        check_tp(_args(), 3)
    with pytest.raises(ValueError, match=r"model\.n_kv_heads=2 .*parallel\.tp=4"):
        check_tp(_args(n_kv_heads=2), 4)
    with pytest.raises(ValueError, match=r"model\.ffn_dim=98 .*parallel\.tp=4"):
        check_tp(_args(ffn_dim=98), 4)
    check_tp(_args(), 4)          # 4 heads, 192 MLP channels: fine
    check_tp(_args(n_kv_heads=1), 1)


def test_unsharded_attention_matches_a_per_head_reference():
    """Attention.forward takes head counts from its projections; unsharded it is still
    plain grouped-query attention (query head h reads key/value head h // n_rep)."""
    torch.manual_seed(0)
    args = _args(n_kv_heads=2)
    attn = Attention(args)
    x = torch.randn(2, 8, args.dim)
    t = x.shape[1]
    cos, sin = rope_tables(head_dim=args.head_dim, max_seq_len=t, theta=args.rope_theta)
    dh, rep = args.head_dim, args.n_heads // args.n_kv_heads
    q = apply_rope(attn.wq(x).view(2, t, args.n_heads, dh).transpose(1, 2), cos, sin)
    k = apply_rope(attn.wk(x).view(2, t, args.n_kv_heads, dh).transpose(1, 2), cos, sin)
    v = attn.wv(x).view(2, t, args.n_kv_heads, dh).transpose(1, 2)
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    heads = []
    for h in range(args.n_heads):
        scores = (q[:, h] @ k[:, h // rep].transpose(-1, -2)) / dh ** 0.5
        heads.append(scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v[:, h // rep])
    expected = attn.wo(torch.stack(heads, dim=2).reshape(2, t, args.dim))
    torch.testing.assert_close(attn(x, cos, sin), expected, rtol=1e-5, atol=1e-6)
