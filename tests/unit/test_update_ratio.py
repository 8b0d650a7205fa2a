"""The update-to-weight ratio of a sampled step: measured chunk by chunk, it equals the ratio
from a full copy of the weights, the step it measures is the same step, and it holds no
second copy of the model."""

from __future__ import annotations

import pytest
import torch

from conftest import RecordingTracker
from trainlab import names
from trainlab.config import compose_run_config
from trainlab.engine.run import build_trainer
from trainlab.engine.schedule import build_optimizer
from trainlab.models import build_model
from trainlab.plan.trial_plan import Where, plan_trial
from trainlab.telemetry import UpdateMeter, peak_flops, update_to_weight
from trainlab.telemetry.peak_flops import Peak
from trainlab.telemetry.peak_memory import peak_memory_gb, reset_peak_memory, rss_gb

pytestmark = pytest.mark.usefixtures("one_thread")


def _stepped(optim_overrides: list[str], *, meter: bool):
    """A tiny model after one backward and one AdamW step (weight decay on), with or without
    the meter; returns (model, optimizer, the meter's ratios, the weights before, how many
    optimizer steps ran)."""
    run = compose_run_config(["model=tiny", "optim.weight_decay=0.1", *optim_overrides])
    torch.manual_seed(0)
    model = build_model(run.model, vocab_size=256)
    optimizer, _ = build_optimizer(model, run.optim, max_steps=10)
    tokens = torch.randint(0, 256, (2, 17), generator=torch.Generator().manual_seed(1))
    for _ in range(2):  # the second step has state to read: moments, step counts
        optimizer.zero_grad(set_to_none=True)
        logits = model(tokens[:, :-1])
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
        before = [p.detach().clone() for p in model.parameters()]
        calls = []
        step = optimizer.step
        optimizer.step = lambda *a, step=step, calls=calls, **k: (calls.append(1), step(*a, **k))[1]
        if meter:
            m = UpdateMeter(optimizer, list(model.parameters()))
            with m.measuring():
                optimizer.step()
        else:
            optimizer.step()
        del optimizer.step
    return model, optimizer, (m.result() if meter else None), before, len(calls)


@pytest.mark.parametrize("optim", [[], ["optim.exp_avg_dtype=e4m3", "optim.exp_avg_sq_dtype=e5m2"]],
                         ids=["adamw", "fp8_moments"])
def test_chunked_step_is_the_same_step_and_the_same_ratio(optim):
    plain, plain_opt, _, _, _ = _stepped(optim, meter=False)
    metered, metered_opt, ratios, before, _ = _stepped(optim, meter=True)
    for (name, a), b in zip(plain.named_parameters(), metered.parameters()):
        assert torch.equal(a, b), name  # bit for bit: the optimizer stepped every parameter once
    for a, b in zip(plain_opt.state.values(), metered_opt.state.values()):
        for key in a:
            assert torch.equal(torch.as_tensor(a[key]), torch.as_tensor(b[key])), key
    reference = update_to_weight(list(metered.parameters()), before)  # from a full copy
    assert ratios[names.UPDATE_TO_WEIGHT] == pytest.approx(reference[names.UPDATE_TO_WEIGHT], rel=1e-6)
    assert ratios[names.UPDATE_TO_WEIGHT_MAX] == pytest.approx(reference[names.UPDATE_TO_WEIGHT_MAX], rel=1e-6)
    assert 0 < ratios[names.UPDATE_TO_WEIGHT] < ratios[names.UPDATE_TO_WEIGHT_MAX]


def test_the_meter_steps_in_chunks_of_an_eighth_of_the_model():
    model, optimizer, _, _, calls = _stepped([], meter=True)
    sizes = [p.numel() * p.element_size() for p in model.parameters()]
    chunks = list(UpdateMeter(optimizer, list(model.parameters()))._chunks(list(model.parameters())))
    assert calls == len(chunks) >= 4  # the optimizer's own step ran once per chunk
    assert all(sum(p.numel() * p.element_size() for p in c) <= max(max(sizes), sum(sizes) // 8)
               for c in chunks)
    assert all(p.grad is not None for p in model.parameters())  # hidden gradients are back
    assert _stepped([], meter=False)[4] == 1


def test_a_parameter_without_gradient_counts_with_a_zero_update():
    w, frozen = torch.nn.Parameter(torch.ones(4)), torch.nn.Parameter(torch.full((9,), 2.0))
    optimizer = torch.optim.SGD([w, frozen], lr=0.1)
    w.grad = -torch.ones(4)  # w moves by 0.1 per element; frozen gets no gradient
    meter = UpdateMeter(optimizer, [w, frozen])
    with meter.measuring():
        optimizer.step()
    assert "step" not in vars(optimizer)  # nothing left patched on the instance
    out = meter.result()
    assert out[names.UPDATE_TO_WEIGHT_MAX] == pytest.approx(0.1)
    assert out[names.UPDATE_TO_WEIGHT] == pytest.approx(0.2 / 40 ** 0.5)  # as update_to_weight's test


# ---------------------------------------------------------------------------- memory
BIG = ["model=tiny", "model.dim=1024", "model.n_heads=8", "model.n_kv_heads=8", "model.ffn_dim=2816",
       "model.n_layers=4", "data=markov", "train.global_batch_size=1", "train.micro_batch_size=1",
       "train.seq_len=16", "train.eval_every=0", "train.numerics_every=0", "cluster.num_workers=1",
       "tracking=none"]


@pytest.mark.skipif(rss_gb() is None, reason="needs /proc (Linux) to read the resident set")
def test_a_sampled_step_holds_no_second_copy_of_the_model(dist_info):
    """~200 MB of fp32 weights: a sampled step's peak exceeds a plain step's by far less than
    the model (a full copy of the weights before the step would add all of it)."""
    run = compose_run_config(BIG)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(peak_flops, "cpu_probe_peak", lambda dtype, **_: Peak(1e11, f"probe:cpu:{dtype}"))
        trainer = build_trainer(plan_trial(run, Where(device=dist_info.device.type)), dist_info, tracker=RecordingTracker())
    model_gb = sum(p.numel() * p.element_size() for p in trainer.model.parameters()) / 1e9
    assert model_gb > 0.15
    trainer.train_step(trainer.batches.next_step())  # warm-up: AdamW's state exists from here

    def growth(sample: bool) -> float:
        assert reset_peak_memory(dist_info.device)
        start = rss_gb()
        trainer.train_step(trainer.batches.next_step(), sample=sample)
        return peak_memory_gb(dist_info.device) - start

    plain, sampled = growth(False), growth(True)
    assert sampled - plain < 0.5 * model_gb, (plain, sampled, model_gb)
    # and the sampled step measured something
    assert trainer.train_step(trainer.batches.next_step(), sample=True).numerics[names.UPDATE_TO_WEIGHT] > 0
