"""Per-rank telemetry on gloo: a straggler shows in rank 0's busy fraction and the straggler
ratio; FSDP's per-rank bytes are about half of DDP's; one process needs no process group; a
training step between log steps makes one host sync (what would make the host wait for a GPU).

Two ranks are spawned once (module fixture) and run every case in turn; a case that raises
comes back as its traceback and fails only its own test.
"""

from __future__ import annotations

import math
import time
import traceback
from datetime import timedelta

import pytest
import torch
import torch.nn.functional as F

from conftest import rank_env, spawn_ranks
from trainlab import names
from trainlab.config import compose_run_config
from trainlab.distributed import close_distributed

pytestmark = pytest.mark.distributed

WORLD = 2
STEPS = 6
WARMUP = 2  # DDP's step 1 allocates, its step 2 rebuilds its buckets (a broadcast in forward)
STRAGGLE_S = 0.2  # rank 1 sleeps this long inside its compute phase, every step
VOCAB = 256
RUN = compose_run_config(["model=tiny"])


def _model():
    from trainlab.models import build_model

    torch.manual_seed(0)
    return build_model(RUN.model, vocab_size=VOCAB)


def _batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(rank)
    seq = torch.randint(0, VOCAB, (2, 33), generator=g)
    return seq[:, :-1], seq[:, 1:]


def _straggler(rank: int) -> dict:
    """The trainer's step shape under DDP: forward+backward and the optimizer step timed as
    compute, the loss all-reduce outside; rank 1 is slow. Returns the gathered window of the
    steps after WARMUP and the per-step dicts of this rank."""
    from trainlab.distributed import all_reduce_mean
    from trainlab.parallel.ddp import apply_ddp
    from trainlab.telemetry.ranks import RankTimer, gather_rank_metrics, timed_collectives

    device = torch.device("cpu")
    # the engine's DDP: buffers are not broadcast in forward (a wait no instrument sees)
    model = apply_ddp(_model(), device=device, bucket_cap_mb=RUN.parallel.bucket_cap_mb)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    timer = RankTimer(device)
    timer.watch(model)
    x, y = _batch(rank)
    steps, gathered = [], None
    with timed_collectives(into=timer) as comm:
        for step in range(STEPS):
            timer.start_step()
            optimizer.zero_grad(set_to_none=True)
            with timer.compute():
                if rank == 1:
                    time.sleep(STRAGGLE_S)
                loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
                loss.backward()
            with timer.compute():
                optimizer.step()
            all_reduce_mean([float(loss.detach())], device=device)
            timer.end_step()
            steps.append(timer.last_step())
            if step == WARMUP - 1:
                timer.window()  # drop the warm-up steps
        gathered = gather_rank_metrics(timer.window(), device=device)
    return {"gathered": gathered, "steps": steps, "comm": comm}


def _memory(rank: int, world: int) -> dict:
    """memory_metrics after one optimizer step (gradients still there), DDP then FSDP2."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.nn.parallel import DistributedDataParallel as DDP

    from trainlab.parallel.fsdp import apply_fsdp
    from trainlab.telemetry.ranks import gather_rank_metrics, memory_metrics, timed_collectives

    x, y = _batch(rank)
    out = {}
    for kind in ("ddp", "fsdp"):
        model = _model()
        model = DDP(model) if kind == "ddp" else apply_fsdp(
            model, mesh=init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",)))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        with timed_collectives() as comm:  # FSDP2 gathers and scatters from Python
            F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
        optimizer.step()
        out[kind] = gather_rank_metrics(memory_metrics(model, optimizer, "cpu"), device="cpu")
        out[f"{kind}_comm"] = comm
    return out


SYNC_STEPS = 5
SYNC_LAYOUTS = {"ddp": [], "pp": ["parallel=pp", "parallel.pp_microbatches=2"]}


def _syncs(layout: str) -> dict:
    """The real trainer, 2 micro-batches per step, clipping on, logging only the last step:
    the host syncs of each loop iteration (tests/host_syncs.py), counted by a hook that runs
    at the end of each (after the step, its bookkeeping and the last one's preemption vote)."""
    from host_syncs import HostSyncs
    from trainlab.distributed import setup_distributed
    from trainlab.engine.run import build_trainer
    from trainlab.plan.trial_plan import Where, plan_trial

    run = compose_run_config(["model=tiny", "data=markov", "cluster.device=cpu", "cluster.num_workers=2",
                              "tracking=none", "train.seq_len=32", "train.global_batch_size=4",
                              "train.micro_batch_size=1", f"train.max_steps={SYNC_STEPS}",
                              f"train.log_every={SYNC_STEPS}", "train.numerics_every=0",
                              "train.eval_every=0", "train.eval_batches=2", "optim.grad_clip=0.5",
                              *SYNC_LAYOUTS[layout]])
    trainer = build_trainer(plan_trial(run, Where(device="cpu")), setup_distributed("cpu"))
    seen = []
    with HostSyncs() as syncs:
        trainer.add_hook(lambda *_: seen.append((syncs.count, dict(syncs.sites))))
        trainer.train()
    per_step = [b[0] - a[0] for a, b in zip(seen, seen[1:])]  # iterations 2 .. SYNC_STEPS
    return {"per_step": per_step, "sites": seen[-2][1], "losses": list(trainer.losses)}


def _worker(rank: int, world: int, port: int, out) -> None:
    rank_env(rank, world, port)
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    results = {}
    cases = [("straggler", lambda: _straggler(rank)), ("memory", lambda: _memory(rank, world))]
    cases += [(f"syncs_{layout}", lambda layout=layout: _syncs(layout)) for layout in SYNC_LAYOUTS]
    for name, case in cases:
        try:
            results[name] = case()
        except Exception:
            results[name] = traceback.format_exc()
    out.put((rank, results))
    close_distributed()


@pytest.fixture(scope="module")
def two_ranks() -> dict[int, dict]:
    return dict(spawn_ranks(_worker, WORLD, results=WORLD, timeout=120))


def _result(two_ranks, rank: int, case: str):
    res = two_ranks[rank][case]
    if isinstance(res, str):
        pytest.fail(f"rank {rank}, case {case}:\n{res}")
    return res


def test_straggler_shows_in_compute_busy_fraction_and_ratio(two_ranks):
    m = _result(two_ranks, 0, "straggler")["gathered"]
    assert _result(two_ranks, 1, "straggler")["gathered"] is None  # rank 0 only
    r0, r1 = (lambda k, r=r: m[names.rank_metric(r, k)] for r in (0, 1))
    # rank 1's compute carries the sleep; rank 0 waits for it in DDP's all-reduce inside
    # backward, which is counted as waiting, not compute. Bounds a loaded machine cannot break
    # (it stretches every phase: 0.40 s of waiting for a 0.2 s sleep was seen at load 30):
    # the sleep lasts at least STRAGGLE_S, and rank 0 cannot get through the all-reduce before
    # rank 1's gradients exist, STRAGGLE_S after both left the step before.
    assert r1(names.RANK_COMPUTE) >= STRAGGLE_S
    assert r1(names.RANK_COMPUTE) - r0(names.RANK_COMPUTE) > STRAGGLE_S / 2  # the wait is not compute
    assert r0(names.RANK_COMM_WAIT) + r0(names.RANK_COMPUTE) >= 0.9 * STRAGGLE_S
    assert r0(names.RANK_COMM_WAIT) > r1(names.RANK_COMM_WAIT)  # the fast rank is the one waiting
    assert r0(names.RANK_BUSY_FRACTION) < 0.5 and r0(names.RANK_BUSY_FRACTION) < r1(names.RANK_BUSY_FRACTION)
    assert m[names.BUSY_FRACTION_MIN] == r0(names.RANK_BUSY_FRACTION)
    # both ranks end each step together: the straggler shows in compute, not in step time
    assert r0(names.RANK_STEP_TIME) == pytest.approx(r1(names.RANK_STEP_TIME), rel=0.2)
    assert m[names.STEP_TIME_MAX] >= m[names.STEP_TIME_MIN] > STRAGGLE_S
    assert m[names.STRAGGLER_RATIO] > 1.3
    # timed collectives saw the loss all-reduce (outside compute, so not in comm_wait_s)
    assert r0(names.RANK_COMM) > 0
    comm = _result(two_ranks, 0, "straggler")["comm"]
    assert comm["comm_calls"] >= STEPS and comm["comm_untimed_calls"] == 0


def test_every_step_reports_the_same_keys_and_consistent_times(two_ranks):
    for rank in (0, 1):
        for step in _result(two_ranks, rank, "straggler")["steps"]:  # warm-up steps included
            assert set(step) == {names.RANK_STEP_TIME, names.RANK_COMPUTE, names.RANK_BUSY_FRACTION,
                                 names.RANK_COMM_WAIT, names.RANK_COMM}
            assert 0 < step[names.RANK_COMPUTE] <= step[names.RANK_STEP_TIME]
            assert step[names.RANK_BUSY_FRACTION] == pytest.approx(
                step[names.RANK_COMPUTE] / step[names.RANK_STEP_TIME])


def test_fsdp_holds_about_half_the_bytes_of_ddp_per_rank(two_ranks):
    mem = _result(two_ranks, 0, "memory")
    ddp, fsdp = mem["ddp"], mem["fsdp"]
    full = sum(p.numel() * p.element_size() for p in _model().parameters()) / 1e9
    for r in (0, 1):
        key = lambda k, r=r: names.rank_metric(r, k)  # noqa: E731
        assert ddp[key(names.RANK_PARAM_GB)] == pytest.approx(full)  # DDP: a full replica
        assert ddp[key(names.RANK_GRAD_GB)] == pytest.approx(full)
        assert ddp[key(names.RANK_OPTIM_STATE_GB)] == pytest.approx(2 * full, rel=0.01)  # exp_avg(_sq)
        for k in (names.RANK_PARAM_GB, names.RANK_GRAD_GB, names.RANK_OPTIM_STATE_GB):
            assert fsdp[key(k)] / ddp[key(k)] == pytest.approx(0.5, abs=0.05), k
        assert fsdp[key(names.RANK_PEAK_MEM_GB)] > 0
    assert fsdp[names.PARAM_GB] == max(fsdp[names.rank_metric(r, names.RANK_PARAM_GB)] for r in (0, 1))
    assert fsdp[names.PEAK_MEM_GB_MAX] > 0
    # FSDP2's all-gathers and reduce-scatters are Python calls: seen and timed; DDP's bucketed
    # all-reduce runs in its C++ Reducer: not seen
    assert mem["fsdp_comm"]["comm_calls"] > 0 and mem["fsdp_comm"]["comm_s"] > 0
    assert mem["ddp_comm"]["comm_calls"] == 0


@pytest.mark.parametrize("layout", list(SYNC_LAYOUTS))
def test_a_step_between_log_steps_syncs_the_host_once(two_ranks, layout):
    """Loss, gradient norm and finiteness stay on the device through the step (clipping is
    guarded there); the one read is the loss and the norm together, before the update that
    must be skipped if they are not finite. Per-rank times are events on a GPU: no syncs."""
    for rank in (0, 1):
        res = _result(two_ranks, rank, f"syncs_{layout}")
        # iterations 2 .. 4: no log, sample or eval step; the last (5) logs and is not counted
        assert res["per_step"][:-1] == [1] * (SYNC_STEPS - 2), (rank, res["per_step"], res["sites"])
        assert len(res["losses"]) == SYNC_STEPS and all(math.isfinite(x) for x in res["losses"])


def test_world_of_one_needs_no_process_group():
    import torch.distributed as dist

    from trainlab.telemetry.ranks import RankTimer, gather_rank_metrics, memory_metrics

    assert not dist.is_initialized()
    model = _model()
    timer = RankTimer("cpu")
    timer.start_step()
    with timer.compute():
        time.sleep(0.02)
    timer.end_step()
    local = timer.last_step() | memory_metrics(model, None, "cpu")
    m = gather_rank_metrics(local, device="cpu")
    assert m[names.rank_metric(0, names.RANK_COMPUTE)] >= 0.02
    assert m[names.rank_metric(0, names.RANK_PARAM_GB)] == m[names.PARAM_GB] > 0
    assert m[names.STRAGGLER_RATIO] == 1.0
    assert names.rank_metric(0, names.RANK_COMM_WAIT) not in m  # nothing watched: not reported
