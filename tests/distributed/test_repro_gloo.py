"""Reproducibility across device sets on gloo: the checksums of real trials, compare's
reproducibility report on them, and the rank-order gradient sum of train.deterministic."""

from __future__ import annotations

import pytest
import torch

from conftest import RecordingTracker, rank_env, reporting_to, spawn_ranks
from trainlab import names
from trainlab.compare.records import Trial
from trainlab.compare.repro import reproducibility
from trainlab.distributed import close_distributed
from trainlab.plan.here import plan_here

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # 11-47 s of gloo groups: the gate keeps under 15 min

TINY = ["model=tiny", "data=markov", "train.max_steps=5", "train.global_batch_size=8",
        "train.micro_batch_size=2", "train.seq_len=32", "train.eval_every=0", "train.eval_batches=2",
        "optim.warmup_steps=2", "train.numerics_every=0"]


def _trials(rank: int, world: int, port: int, out, runs: list[list[str]]) -> None:
    """One rank of several trials in turn through run_trial, in one process group (spawning
    ranks costs more than these trials); rank 0 reports what a compare Trial holds of each."""
    rank_env(rank, world, port)

    from trainlab.config import compose_run_config, flatten
    from trainlab.engine.run import run_trial

    reports = []
    with reporting_to(out):
        for overrides in runs:
            run = compose_run_config([*TINY, *overrides, f"cluster.num_workers={world}", "cluster.device=cpu"])
            tracker = RecordingTracker()
            result = run_trial(plan_here(run), tracker_factory=lambda *_, t=tracker: t)
            reports.append(dict(extra=result.extra, tags=tracker.tags, status=result.status,
                                params={k: str(v) for k, v in flatten(run).items()},
                                metrics={k: tuple(tracker.series(k))
                                         for k in (names.LOSS, names.VAL_LOSS, names.PARAM_NORM)}))
        if rank == 0:
            out.put(reports)


def _run(world: int, runs: list[list[str]]) -> list[dict]:
    (got,) = spawn_ranks(_trials, world, runs, timeout=240)
    assert isinstance(got, list), got
    return got


def _as_trial(name: str, got: dict) -> Trial:
    return Trial(run_id=name, label=name, status=got["status"], seed="0", params=got["params"],
                 params_sha=got["tags"][names.TAG_PARAMS_SHA],
                 loss_curve_sha=got["tags"][names.TAG_LOSS_CURVE_SHA], metrics=got["metrics"])


DETERMINISTIC = ["parallel=ddp", "train.deterministic=true"]


LAYOUTS = {"fsdp": ["parallel=fsdp"], "tp": ["parallel=tp"],
           "pp": ["parallel=pp", "model.n_layers=4", "parallel.pp_schedule=1f1b"]}


@pytest.fixture(scope="module")
def singles():
    """One process: the 2-layer model, and the 4-layer one the pipeline cuts into stages."""
    return _run(1, [["parallel=ddp"], ["parallel=ddp", "model.n_layers=4"]])


@pytest.fixture
def single(singles):
    return singles[0]


@pytest.fixture(scope="module")
def two_ranks():
    """2 ranks: DDP plain, then deterministic twice (set_deterministic resets between them),
    then the sharded and split layouts."""
    return _run(2, [["parallel=ddp"], DETERMINISTIC, DETERMINISTIC, *LAYOUTS.values()])


@pytest.fixture
def ddp(two_ranks):
    return two_ranks[0]


def test_deterministic_runs_on_two_ranks_have_identical_checksums(two_ranks):
    _, first, second, *_ = two_ranks
    for got in (first, second):
        assert got["status"] == names.STATUS_FINISHED
        # the tags logged are the trial's own checksums, and they are SHA-256 hex digests
        assert got["tags"][names.TAG_PARAMS_SHA] == got["extra"][names.TAG_PARAMS_SHA]
        assert len(got["tags"][names.TAG_PARAMS_SHA]) == len(got["tags"][names.TAG_LOSS_CURVE_SHA]) == 64
    assert first["tags"][names.TAG_PARAMS_SHA] == second["tags"][names.TAG_PARAMS_SHA]
    assert first["tags"][names.TAG_LOSS_CURVE_SHA] == second["tags"][names.TAG_LOSS_CURVE_SHA]
    assert first["metrics"][names.LOSS] == second["metrics"][names.LOSS]
    # not a constant: the parameters the checksum covers moved from their initial values
    assert first["tags"][names.TAG_PARAMS_SHA] != _init_sha()


def _init_sha() -> str:
    from trainlab.config import compose_run_config
    from trainlab.data import build_corpus
    from trainlab.engine.run import seed_everything
    from trainlab.models import build_model
    from trainlab.telemetry.checksum import params_checksum

    run = compose_run_config(TINY)
    corpus = build_corpus(run.data)
    seed_everything(run.seed)
    return params_checksum([build_model(run.model, vocab_size=corpus.vocab_size)]).sha256


def test_one_process_and_two_rank_ddp_compare_reports_the_measured_difference(single, ddp):
    assert single["status"] == ddp["status"] == names.STATUS_FINISHED
    a, b = dict(single["metrics"][names.LOSS]), dict(ddp["metrics"][names.LOSS])
    assert a.keys() == b.keys() and len(a) == 5
    expected = max(abs(a[s] - b[s]) for s in a)
    assert expected < 1e-4 * max(a.values())  # the same math: equal up to rounding
    # whatever is true of the bits, the checksums say it: equal curves <=> equal loss checksums
    same_curve = list(single["metrics"][names.LOSS]) == list(ddp["metrics"][names.LOSS])
    same_sha = single["tags"][names.TAG_LOSS_CURVE_SHA] == ddp["tags"][names.TAG_LOSS_CURVE_SHA]
    assert same_curve == same_sha

    (group,) = reproducibility([_as_trial("single", single), _as_trial("ddp", ddp)])
    assert len(group.runs) == 2
    assert group.differs_in == ("cluster.num_workers",)  # the device set, nothing else
    assert group.loss_curves_identical == same_sha
    assert group.params_identical == (single["tags"][names.TAG_PARAMS_SHA] == ddp["tags"][names.TAG_PARAMS_SHA])
    assert group.max_abs_dloss == expected
    norms = single["extra"][names.PARAM_NORM], ddp["extra"][names.PARAM_NORM]
    assert group.rel_d_param_norm == pytest.approx(abs(norms[0] - norms[1]) / max(norms))
    assert group.rel_d_param_norm < 1e-5
    # a run of other math (another seed) is not in the group
    other = _as_trial("seed1", {**ddp, "params": {**ddp["params"], "seed": "1"}})
    (again,) = reproducibility([_as_trial("single", single), _as_trial("ddp", ddp), other])
    assert len(again.runs) == 2


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_sharded_and_split_layouts_checksum_the_same_full_model(singles, two_ranks, layout):
    """FSDP's and tensor parallel's DTensors are gathered, the pipeline's stages merged by name:
    the same math as one process, to rounding; compare groups them with it."""
    got = two_ranks[3 + list(LAYOUTS).index(layout)]
    ref = singles[1] if layout == "pp" else singles[0]
    assert got["status"] == names.STATUS_FINISHED
    assert got["extra"][names.PARAM_NORM] == pytest.approx(ref["extra"][names.PARAM_NORM], rel=1e-6)
    (group,) = reproducibility([_as_trial("one", ref), _as_trial(layout, got)])
    assert "parallel.name" in group.differs_in
    assert group.rel_d_param_norm < 1e-6
    assert group.params_identical == (got["tags"][names.TAG_PARAMS_SHA] == ref["tags"][names.TAG_PARAMS_SHA])


# -- the rank-order sum ---------------------------------------------------------------------
def _ordered_rank(rank: int, world: int, port: int, out) -> None:
    """DDP gradients with the ordered hook and with the backend's all-reduce, on the same data;
    and the ordered mean of known per-rank tensors against the sum computed here in rank order."""
    rank_env(rank, world, port)
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from trainlab.parallel.comm import register_comm_hook
    from trainlab.parallel.ordered_reduce import ordered_allreduce_mean

    dist.init_process_group("gloo")
    grads = {}
    for ordered in (False, True):
        torch.manual_seed(0)
        model = DDP(nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4)), bucket_cap_mb=0.001)
        if ordered:
            assert register_comm_hook(model, comm_dtype="fp32", backend="gloo", ordered=True) == "ordered"
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(100 + rank))  # per-rank data
        model(x).square().mean().backward()
        grads[ordered] = [p.grad.clone() for p in model.parameters()]

    # values whose sum depends on the order: large and small magnitudes per rank
    def part(r: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(r)
        return torch.randn(1000, generator=g) * 10.0 ** (3 * r - 3)

    mine = part(rank)
    ordered_allreduce_mean(mine)
    expected = part(0).clone()
    for r in range(1, world):
        expected += part(r)
    expected /= world
    out.put((rank, [g.numpy() for g in grads[False]], [g.numpy() for g in grads[True]],
             bool(torch.equal(mine, expected))))
    close_distributed()


def test_ordered_reduction_equals_all_reduce_and_sums_in_rank_order():
    world = 3  # with 2 ranks any order is the same sum: 3 makes the order observable
    by_rank = {r: rest for r, *rest in spawn_ranks(_ordered_rank, world, results=world, timeout=120)}
    plain0, ordered0, _ = by_rank[0]
    for r in range(world):
        plain, ordered, exact = by_rank[r]
        assert exact, f"rank {r}: the ordered mean is not ((x0 + x1) + x2) / 3 bit for bit"
        for p, o, p0, o0 in zip(plain, ordered, plain0, ordered0):
            assert abs(p).max() > 0
            torch.testing.assert_close(torch.from_numpy(o), torch.from_numpy(p), rtol=1e-6, atol=1e-7)
            assert (p == p0).all() and (o == o0).all()  # every rank holds the same mean
