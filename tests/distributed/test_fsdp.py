"""Sharded data parallel on gloo: ZeRO-1/2/3 and HSDP train exactly like one process.

Each world size is spawned once (module fixtures) and runs every case in turn, so the file
pays for two process start-ups; a case that raises comes back as its traceback and fails
only its own test.
"""

from __future__ import annotations

import dataclasses
import traceback
from datetime import timedelta

import pytest
import torch
import torch.nn.functional as F

from conftest import rank0_unless_failed, rank_env, spawn_ranks
from trainlab.config import compose_run_config
from trainlab.distributed import close_distributed

pytestmark = pytest.mark.distributed

STEPS = 5
GLOBAL_BATCH = 4  # sequences per optimizer step, split evenly across the ranks
SEQ_LEN = 32
VOCAB = 256
CASES_2 = ("zero3", "zero2", "zero1", "bf16", "fp8", "fp8_all_gather", "fp8_only_group")
CASES_4 = ("hsdp",)
# eps 1e-6 (as test_layouts): Adam's m / (sqrt(v) + eps) turns the summation-order rounding of
# an element whose gradients are ~0 into a step of up to lr, which no tolerance on the
# parameters can tell from a real difference (with 1e-8 one such element of one init did)
RUN = compose_run_config(["model=tiny", "optim.warmup_steps=2", "optim.grad_clip=0.5", "optim.eps=1e-6"])


def _batches() -> tuple[torch.Tensor, torch.Tensor]:
    """[STEPS, GLOBAL_BATCH, SEQ_LEN] inputs and targets of a learnable rule (next = this + 7)."""
    g = torch.Generator().manual_seed(1)
    start = torch.randint(0, VOCAB, (STEPS, GLOBAL_BATCH, 1), generator=g)
    seq = (start + 7 * torch.arange(SEQ_LEN + 1)) % VOCAB
    return seq[..., :-1], seq[..., 1:]


def _model(run):
    from trainlab.models import build_model

    torch.manual_seed(0)
    return build_model(run.model, vocab_size=VOCAB)


def _train(model, optimizer, scheduler, *, rank: int, world: int, params=None) -> dict:
    """The trainer's step (loss, backward, global-norm clip, step) on this rank's slice of
    each global batch; returns the global loss and grad-norm curves, the final full
    parameters, this rank's bytes after the last step (before zero_grad) and whether the
    first block's parameters stayed gathered from forward to backward."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from trainlab.parallel.fsdp import sharded_bytes

    params = list(params if params is not None else model.parameters())
    inputs, targets = _batches()
    per = GLOBAL_BATCH // world
    losses, norms, nbytes, gathered = [], [], {}, None
    for step in range(STEPS):
        x = inputs[step, rank * per:(rank + 1) * per]
        y = targets[step, rank * per:(rank + 1) * per]
        loss = F.cross_entropy(model(x).float().flatten(0, 1), y.flatten())
        if step == 0 and hasattr(model, "layers"):  # between forward and backward
            gathered = not isinstance(model.layers[0].attention.wq.weight, DTensor)
        loss.backward()
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        torch.nn.utils.clip_grads_with_norm_(params, RUN.optim.grad_clip, norm)
        optimizer.step()
        scheduler.step()
        if step == STEPS - 1:
            nbytes = sharded_bytes(model, optimizer)
        optimizer.zero_grad(set_to_none=True)
        global_loss = loss.detach().clone()
        if dist.is_initialized():
            dist.all_reduce(global_loss)
            global_loss /= world
        losses.append(float(global_loss))
        norms.append(float(norm))
    full = {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().float().numpy().copy()
            for n, p in getattr(model, "module", model).named_parameters()}
    return {"losses": losses, "norms": norms, "params": full, "bytes": nbytes,
            "first_block_gathered_for_backward": gathered,
            "param_dtypes": sorted({str(p.dtype) for p in params})}


def _optimizer(model, run):
    from trainlab.engine.schedule import build_optimizer

    return build_optimizer(model, run.optim, max_steps=STEPS)


def _fp8_layers(model) -> list[str]:
    """Linears whose both dims are multiples of 16 (what torch._scaled_mm takes)."""
    return [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)
            and m.in_features % 16 == 0 and m.out_features % 16 == 0]


# ---------------------------------------------------------------------------------------
def _case(name: str, rank: int, world: int, run):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.nn.parallel import DistributedDataParallel as DDP

    from trainlab.parallel.fsdp import HSDP_DIM_NAMES, apply_fsdp, apply_zero1

    model = _model(run)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
    if name in ("zero3", "zero2"):
        apply_fsdp(model, mesh=mesh, reshard_after_forward=name == "zero3")
    elif name == "hsdp":
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=HSDP_DIM_NAMES)
        apply_fsdp(model, mesh=mesh)
    elif name == "bf16":
        apply_fsdp(model, mesh=mesh, param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    elif name == "zero1":
        from trainlab.engine.schedule import lr_factor

        model = DDP(model)
        base, _ = _optimizer(model.module, run)  # the engine's groups (decay / no decay)
        optimizer = apply_zero1(type(base), base.param_groups)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(
            s, warmup_steps=run.optim.warmup_steps, max_steps=STEPS, min_lr_ratio=run.optim.min_lr_ratio))
        out = _train(model, optimizer, scheduler, rank=rank, world=world)
        out["local_state_tensors"] = sum(len(s) for s in optimizer.optim.state.values())
        return out
    elif name in ("fp8", "fp8_all_gather"):
        _to_fp8(model, _fp8_layers(model), all_gather=name == "fp8_all_gather")
        apply_fsdp(model, mesh=mesh)
        out = _train(model, *_optimizer(model, run), rank=rank, world=world)
        out["weight_types"] = sorted({type(m.weight.to_local()).__name__ for m in model.modules()
                                      if type(m).__name__ == "Float8Linear"})
        return out
    elif name == "fp8_only_group":
        return _fp8_only_group(mesh)
    return _train(model, *_optimizer(model, run), rank=rank, world=world)


def _to_fp8(model, layers: list[str], *, all_gather: bool) -> None:
    if not all_gather:
        from trainlab.precision.fp8 import convert_torchao

        convert_torchao(model, "fp8_tensorwise", layers=layers, emulate=False)
        return
    from torchao.float8 import convert_to_float8_training

    from trainlab.precision.fp8 import torchao_config

    config = dataclasses.replace(torchao_config("fp8_tensorwise", emulate=False),
                                 enable_fsdp_float8_all_gather=True)
    convert_to_float8_training(model, config=config, module_filter_fn=lambda _m, fqn: fqn in layers)


def _fp8_only_group(mesh) -> dict:
    """A block made of Float8Linears only: apply_fsdp refuses it; fully_shard alone fails
    in the first all-gather (gloo has no float8). Runs last: the failed step leaves FSDP's
    state undefined."""
    from torch.distributed.fsdp import fully_shard

    from trainlab.parallel.fsdp import apply_fsdp

    def blocks():
        torch.manual_seed(0)
        net = torch.nn.Module()
        net.layers = torch.nn.ModuleList([torch.nn.Linear(64, 64, bias=False)])
        _to_fp8(net, ["layers.0"], all_gather=True)
        net.forward = lambda x: net.layers[0](x)
        return net

    out = {}
    try:
        apply_fsdp(blocks(), mesh=mesh)
        out["refused"] = ""
    except ValueError as e:
        out["refused"] = str(e)
    net = blocks()
    fully_shard(net.layers[0], mesh=mesh)
    try:
        net(torch.randn(4, 64)).sum().backward()
        out["raw_error"] = ""
    except RuntimeError as e:
        out["raw_error"] = str(e)
    return out


def _worker(rank: int, world: int, port: int, out, cases: tuple[str, ...]) -> None:
    rank_env(rank, world, port)
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    results = {}
    for name in cases:
        try:
            results[name] = _case(name, rank, world, RUN)
        except Exception:  # noqa: BLE001 - reported to the test, from every rank
            results[name] = traceback.format_exc()
    out.put((rank, results))
    # no barrier: the last case's all-gather failed on purpose, and a barrier waits on it
    close_distributed(barrier=False)


def _spawn(world: int, cases: tuple[str, ...]) -> dict:
    return rank0_unless_failed(spawn_ranks(_worker, world, cases, results=world))


@pytest.fixture(scope="module")
def single():
    """The reference: one process, the whole global batch, fp32."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model = _model(RUN)
    try:
        return _train(model, *_optimizer(model, RUN), rank=0, world=1)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def two_ranks() -> dict:
    return _spawn(2, CASES_2)


@pytest.fixture(scope="module")
def four_ranks() -> dict:
    return _spawn(4, CASES_4)


def _result(results: dict, name: str) -> dict:
    got = results[name]
    assert isinstance(got, dict), f"case {name} raised on {got}"
    return got


def _assert_matches(got: dict, want: dict) -> None:
    assert want["losses"][-1] < want["losses"][0]  # the reference trains at all
    assert got["losses"] == pytest.approx(want["losses"], rel=1e-5)
    # the global grad norm (DTensor grads for FSDP) is what clipping used: the same
    assert got["norms"] == pytest.approx(want["norms"], rel=1e-5)
    assert want["norms"][0] > RUN.optim.grad_clip  # so clipping really acted
    assert got["params"].keys() == want["params"].keys()
    for name, value in want["params"].items():
        torch.testing.assert_close(torch.from_numpy(got["params"][name]), torch.from_numpy(value),
                                   rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")


# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["zero3", "zero2", "zero1"])
def test_two_ranks_match_one_process_with_the_same_global_batch(case, single, two_ranks):
    _assert_matches(_result(two_ranks, case), single)


def test_zero2_keeps_blocks_gathered_from_forward_to_backward_and_zero3_does_not(two_ranks):
    assert _result(two_ranks, "zero2")["first_block_gathered_for_backward"] is True
    assert _result(two_ranks, "zero3")["first_block_gathered_for_backward"] is False


@pytest.mark.slow  # 4 ranks; fsdp and its zero forms on 2 stay in the gate
def test_hsdp_two_by_two_matches_one_process(single, four_ranks):
    _assert_matches(_result(four_ranks, "hsdp"), single)


def test_zero3_keeps_half_the_parameters_and_optimizer_state_per_rank(single, two_ranks):
    one, per_rank = single["bytes"], _result(two_ranks, "zero3")["bytes"]
    # every dim 0 of the tiny model is even, so the shards are exact halves; AdamW's scalar
    # `step` tensors (4 bytes a parameter, replicated) are all that is left over: 1%
    for key in ("params", "grads", "optim_state"):
        assert per_rank[key] == pytest.approx(one[key] / 2, rel=0.01), key


def test_zero1_shards_only_the_optimizer_state(single, two_ranks):
    one, got = single["bytes"], _result(two_ranks, "zero1")
    per_rank = got["bytes"]
    assert per_rank["params"] == one["params"]
    assert per_rank["grads"] == one["grads"]
    # whole tensors are assigned to ranks (sorted-greedy by size): close to half, not exact
    assert per_rank["optim_state"] == pytest.approx(one["optim_state"] / 2, rel=0.05)
    assert 0 < got["local_state_tensors"] < sum(1 for _ in single["params"]) * 3


def test_bf16_params_fp32_reduce_trains_close_to_fp32(single, two_ranks):
    got = _result(two_ranks, "bf16")
    assert all(map(torch.isfinite, torch.tensor(got["losses"])))
    assert got["losses"][-1] < got["losses"][0]
    assert got["param_dtypes"] == ["torch.float32"]  # the sharded master weights stay fp32
    assert got["losses"] == pytest.approx(single["losses"], rel=1e-3)


def test_fp8_tensorwise_trains_under_fsdp_on_gloo(two_ranks):
    got = _result(two_ranks, "fp8")
    assert got["weight_types"] == ["Tensor"]  # high-precision weights are all-gathered
    assert all(map(torch.isfinite, torch.tensor(got["losses"])))
    assert got["losses"][-1] < got["losses"][0]


def test_fp8_all_gather_works_on_gloo_when_groups_mix_dtypes(two_ranks):
    """Each group has fp32 norm weights besides the fp8 ones: FSDP2 all-gathers bytes."""
    plain, fp8_gathered = _result(two_ranks, "fp8"), _result(two_ranks, "fp8_all_gather")
    assert fp8_gathered["weight_types"] == ["WeightWithDynamicFloat8CastTensor"]
    # tensorwise scaling from the all-reduced amax: the same fp8 weights either way
    assert fp8_gathered["losses"] == pytest.approx(plain["losses"], rel=1e-5)


def test_an_fp8_only_group_is_refused_before_gloo_fails_on_it(two_ranks):
    got = _result(two_ranks, "fp8_only_group")
    assert "Invalid scalar type" in got["raw_error"]  # what torch 2.13's gloo does with float8
    assert "layers.0" in got["refused"] and "enable_fsdp_float8_all_gather=False" in got["refused"]
