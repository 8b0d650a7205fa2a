"""Pipeline parallel on 2 gloo ranks: the stages train exactly like the single-process model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import rank_env, spawn_ranks
from trainlab import names
from trainlab.config import compose_run_config
from trainlab.config.layout_types import bubble_fraction
from trainlab.distributed import close_distributed
from trainlab.models import build_model
from trainlab.parallel.pp import SCHEDULES, check_pp, split_stages
from trainlab.plan.here import plan_here

pytestmark = pytest.mark.distributed

PP, MICRO, BATCH, SEQ, VOCAB, STEPS, SEED = 2, 4, 8, 32, 256, 5, 0
OVERRIDES = ["model=tiny", "model.n_layers=4", "data=markov",
             "optim.warmup_steps=1", "optim.grad_clip=0.5"]  # a clip that bites: norms start ~0.9
CASES = [("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2)]  # (schedule, virtual stages)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def _model(run) -> nn.Module:
    torch.manual_seed(SEED)
    return build_model(run.model, vocab_size=VOCAB)


def _batches(n: int, seed: int = 1) -> torch.Tensor:
    """[n, BATCH, SEQ + 1] token windows: inputs are [:, :-1], targets [:, 1:]."""
    return torch.randint(0, VOCAB, (n, BATCH, SEQ + 1), generator=torch.Generator().manual_seed(seed))


def _pp_rank(rank: int, world: int, port: int, out) -> None:
    """One pipeline rank: every schedule in CASES for STEPS AdamW steps, results on `out`."""
    rank_env(rank, world, port)
    import torch.distributed as dist

    from trainlab.engine.schedule import build_optimizer
    from trainlab.parallel.pp import build_pipeline, clip_grad_norm_, global_grad_norm

    dist.init_process_group("gloo")
    run = compose_run_config(OVERRIDES)
    *train, val = _batches(STEPS + 1)
    results = {}
    for schedule, virtual in CASES:
        pipe = build_pipeline(_model(run), mesh_or_group=None, pp_rank=rank, pp_size=PP,
                              schedule=schedule, n_microbatches=MICRO, loss_fn=loss_fn,
                              device=torch.device("cpu"), virtual_stages=virtual)
        optimizer, lr_sched = build_optimizer(nn.ModuleList(pipe.stages), run.optim, max_steps=STEPS)
        r = dict(losses=[], norms=[], clipped=[], busy=[], theory=pipe.bubble_fraction_theory)
        for x in train:
            optimizer.zero_grad(set_to_none=True)
            r["losses"].append(pipe.step(x[:, :-1], x[:, 1:]).item())
            r["busy"].append(pipe.last_busy_fraction)
            r["norms"].append(clip_grad_norm_(pipe.stages, max_norm=run.optim.grad_clip, group=pipe.group))
            r["clipped"].append(global_grad_norm(pipe.stages, pipe.group))
            optimizer.step()
            lr_sched.step()
        r["val"] = pipe.eval(val[:, :-1], val[:, 1:]).item()
        # numpy, not tensors: a tensor on a Queue lives in this process's shared memory.
        r["params"] = {k: v.detach().numpy().copy() for s in pipe.stages for k, v in s.state_dict().items()}
        results[schedule] = r
    out.put((rank, results))
    close_distributed()


def _reference(run) -> dict:
    """The same steps in one process on the full batch."""
    from trainlab.engine.schedule import build_optimizer

    model = _model(run)
    optimizer, lr_sched = build_optimizer(model, run.optim, max_steps=STEPS)
    *train, val = _batches(STEPS + 1)
    r = dict(losses=[], norms=[])
    for x in train:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x[:, :-1]), x[:, 1:])
        loss.backward()
        r["losses"].append(loss.item())
        r["norms"].append(torch.nn.utils.clip_grad_norm_(model.parameters(), run.optim.grad_clip).item())
        optimizer.step()
        lr_sched.step()
    with torch.no_grad():
        r["val"] = loss_fn(model(val[:, :-1]), val[:, 1:]).item()
    r["params"] = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    return r


@pytest.fixture(scope="module")
def trained():
    by_rank = dict(spawn_ranks(_pp_rank, PP, results=PP, timeout=180))
    return by_rank, _reference(compose_run_config(OVERRIDES))


# --- training equivalence -------------------------------------------------------------
@pytest.mark.parametrize("schedule", [s for s, _ in CASES])
def test_pipeline_trains_like_one_process_on_the_full_batch(trained, schedule):
    by_rank, ref = trained
    first, last = by_rank[0][schedule], by_rank[PP - 1][schedule]
    assert first["losses"] == last["losses"]          # the last stage's loss reached every rank
    assert first["norms"] == last["norms"]            # one global norm, all-reduced over the stages
    assert first["losses"] == pytest.approx(ref["losses"], rel=1e-5)
    assert first["norms"] == pytest.approx(ref["norms"], rel=1e-5)
    assert max(ref["norms"]) > 0.5 and first["clipped"] == pytest.approx(
        [min(n, 0.5) for n in first["norms"]], rel=1e-5)  # clipping acted, on the global norm
    assert first["val"] == pytest.approx(ref["val"], rel=1e-5)  # forward-only pass too
    # The stages hold the full model between them, under its own parameter names.
    assert not first["params"].keys() & last["params"].keys()
    params = {**first["params"], **last["params"]}
    assert params.keys() == ref["params"].keys()
    moved = _model(compose_run_config(OVERRIDES)).state_dict()
    for name, value in ref["params"].items():
        np.testing.assert_allclose(params[name], value, rtol=1e-5, atol=1e-5, err_msg=name)
    assert any(not np.allclose(v, moved[k].numpy(), atol=1e-4) for k, v in params.items())


@pytest.mark.parametrize("schedule,virtual", CASES)
def test_bubble_in_theory_and_measured(trained, schedule, virtual):
    by_rank, _ = trained
    for rank in range(PP):
        r = by_rank[rank][schedule]
        assert r["theory"] == pytest.approx((PP - 1) / (virtual * MICRO + PP - 1))
        assert all(0.0 < b <= 1.0 for b in r["busy"]), r["busy"]


# --- stages without processes ---------------------------------------------------------
@pytest.mark.parametrize("virtual", [1, 2])
def test_stages_partition_the_model_and_chain_to_its_logits(virtual):
    run = compose_run_config(OVERRIDES)
    full = _model(run)
    per_rank = [split_stages(full, pp_rank=r, pp_size=PP, virtual_stages=virtual) for r in range(PP)]
    in_order = [per_rank[i % PP][i // PP] for i in range(PP * virtual)]  # stage i lives on rank i % pp
    keys = [set(s.state_dict()) for s in in_order]
    assert sum(map(len, keys)) == len(set().union(*keys))  # disjoint
    assert set().union(*keys) == set(full.state_dict())
    assert isinstance(full.layers, nn.ModuleList) and len(full.layers) == 4  # full model left whole
    x = _batches(1)[0, :, :-1]
    h = x
    with torch.no_grad():
        for stage in in_order:
            h = stage(h)
        torch.testing.assert_close(h, full(x), rtol=0, atol=0)


@pytest.mark.parametrize("fields,named", [
    (dict(n_layers=3), ["model.n_layers=3", "parallel.pp=2"]),
    (dict(n_layers=4, virtual_stages=4, schedule="interleaved_1f1b"),
     ["model.n_layers=4", "parallel.pp_virtual_stages=4"]),
    (dict(batch=6), ["batch=6", "parallel.pp_microbatches=4"]),
    (dict(n_microbatches=1, schedule="1f1b"), ["parallel.pp_schedule=1f1b", "parallel.pp_microbatches"]),
    (dict(virtual_stages=2, schedule="1f1b"), ["parallel.pp_virtual_stages=2", "interleaved_1f1b"]),
    (dict(n_microbatches=5, schedule="interleaved_1f1b"), ["parallel.pp_microbatches=5"]),
    (dict(schedule="zero_bubble"), ["parallel.pp_schedule='zero_bubble'", *SCHEDULES]),
])
def test_check_pp_names_the_field_and_value(fields, named):
    layout = dict(n_layers=4, pp=PP, virtual_stages=1, batch=BATCH, n_microbatches=MICRO, schedule="gpipe")
    with pytest.raises(ValueError) as err:
        check_pp(**{**layout, **fields})
    for text in named:
        assert text in str(err.value)


def test_check_pp_accepts_the_layouts_torch_runs():
    for schedule, virtual in CASES:
        check_pp(n_layers=4, pp=PP, virtual_stages=virtual, batch=BATCH, n_microbatches=MICRO,
                 schedule=schedule)
    check_pp(n_layers=4, pp=PP, batch=BATCH, n_microbatches=1, schedule="gpipe")  # gpipe: m < pp is fine
    assert bubble_fraction(pp=PP, n_microbatches=1) > bubble_fraction(pp=PP, n_microbatches=MICRO)


# --- what follows the stages: precision state, probes, NaN injection -------------------
TRIAL = ["model=tiny", "model.n_layers=4", "data=markov", "train.max_steps=6",
         "train.global_batch_size=8", "train.micro_batch_size=2", "train.seq_len=32",
         "train.eval_every=0", "train.numerics_every=3", "optim.warmup_steps=2"]
FP8_DELAYED = ["precision=fp8_delayed", "precision.fp8_impl=emulated", "precision.hp_dtype=fp32",
               "precision.keep_hp=[output,unaligned]"]  # tiny: convert the linears too small to pay
PIPELINE = ["parallel=pp", "parallel.pp_schedule=1f1b"]  # 2 stages of 2 blocks, 4 micro-batches


def _trial(rank: int, world: int, port: int, out, overrides: list[str]) -> None:
    """One rank of a trial through run_trial; rank 0 puts (every logged metric by step,
    status, diverged step) on `out`."""
    rank_env(rank, world, port)
    from conftest import RecordingTracker, reporting_to
    from trainlab.engine.run import run_trial

    run = compose_run_config([*overrides, f"cluster.num_workers={world}"])
    tracker = RecordingTracker()
    with reporting_to(out):
        result = run_trial(plan_here(run), tracker_factory=lambda *_: tracker)
        if rank == 0:
            out.put((tracker.metrics, result.status, result.diverged_step))


def _run_trial(world: int, overrides: list[str]):
    (got,) = spawn_ranks(_trial, world, [*TRIAL, *overrides], timeout=300)
    assert not isinstance(got, str), got  # a rank's error
    return got


def _series(metrics, key: str) -> list[float]:
    return [m[key] for _, m in metrics if key in m]


def _cast_layers(metrics, step: int) -> set[str]:
    """The layers the numerics probe reported at `step` (num/<layer>/<tensor>/<stat>)."""
    details = [names.detail_of(k) for s, m in metrics if s == step for k in m]
    return {d[1] for d in details if d and d[0] == names.DETAIL_LAYER and not d[2].startswith("swiglu/")}


@pytest.mark.slow  # the pipeline layouts stay in the gate; FP8 delayed across stages here
def test_fp8_delayed_pipeline_scales_the_stages_and_trains_like_one_process():
    """The delayed scales, the probes and the amax reduction follow the stage copies: every
    stage's layers cast with scales from their own amaxes (off 1 after the first step, where
    a scale of 1 flushes most gradients to zero in e5m2), and the numerics of both stages
    reach rank 0's tracker under the model's layer names, as one process reports them."""
    one, one_status, _ = _run_trial(1, FP8_DELAYED)
    pp, pp_status, _ = _run_trial(2, [*FP8_DELAYED, *PIPELINE])
    assert one_status == pp_status == names.STATUS_FINISHED
    assert _series(pp, names.LOSS) == pytest.approx(_series(one, names.LOSS), rel=1e-3)
    linears = ("attention.wq", "attention.wk", "attention.wv", "attention.wo",
               "feed_forward.w1", "feed_forward.w2", "feed_forward.w3")
    layers = {f"layers.{i}.{linear}" for i in range(4) for linear in linears}
    for step in (1, 3, 6):  # the sampled steps: every fp8 layer of both stages
        assert _cast_layers(pp, step) == _cast_layers(one, step) == layers, step
    # step 1, same weights: each layer's first micro-batch, not torch's first pass over a stage
    # on uninitialized tensors (to learn its shapes), which must leave no trace in any layer
    first = {k: v for s, m in one if s == 1 for k, v in m.items() if k.endswith("/input/amax")}
    assert {k: v for s, m in pp if s == 1 for k, v in m.items() if k in first} == pytest.approx(first, rel=1e-5)
    for layer in ("layers.0.attention.wq", "layers.3.feed_forward.w2"):  # one of each stage
        for kind in names.CAST_TENSORS:
            scales = _series(pp, names.cast_metric(layer, kind, names.CAST_SCALE))
            assert scales[0] == 1.0 and all(1.0 != s < float("inf") for s in scales[1:]), (layer, kind, scales)
            if kind != "grad_output":  # the pipeline's gradients reach the casts n_microbatches x larger
                # the same amaxes as one process's, up to how step 1's scale-1 casts differ
                assert scales == pytest.approx(
                    _series(one, names.cast_metric(layer, kind, names.CAST_SCALE)), rel=0.1), (layer, kind)
    flushed = names.cast_max_metric("grad_output", names.CAST_UNDERFLOW)
    for metrics in (one, pp):
        assert max(_series(metrics, flushed)[1:]) < 0.01  # with scale 1 it was ~0.9
    # pooled over both stages (step 1's update differs: its scale-1 casts flush differently)
    for key in (names.UPDATE_TO_WEIGHT, names.UPDATE_TO_WEIGHT_MAX):
        assert _series(pp, key)[1:] == pytest.approx(_series(one, key)[1:], rel=1e-2), key
    for _, m in pp:  # maxima over the layers of both stages
        if names.NUM_SWIGLU_AMAX in m:
            assert m[names.NUM_SWIGLU_AMAX] == max(m[names.swiglu_metric(i, "amax")] for i in range(4))
            amax = names.cast_max_metric("grad_output", names.CAST_AMAX)
            assert m[amax] == max(m[names.cast_metric(x, "grad_output", names.CAST_AMAX)] for x in layers)


def test_nan_injected_into_the_last_stage_ends_the_pipelined_trial():
    """debug.inject_nan hooks the module where it runs: here a block of the second stage."""
    _, status, diverged_step = _run_trial(2, [*PIPELINE, "debug.inject_nan=layers.3.feed_forward@2"])
    assert status == names.STATUS_DIVERGED and diverged_step == 2
