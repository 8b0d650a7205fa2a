"""The README's layouts that no other test trains through the real trainer (run_trial), and what
train.deterministic does inside a trial, on gloo.

zero2, hsdp, GPipe and interleaved 1F1B train the loss curve of DDP with the same global batch
and seed (fp32; DDP's is one process's, tests/distributed/test_layouts.py and test_repro_gloo.py),
each rank holding the share of the parameters its layout gives it (`sys/param_gb`, the largest
rank's; DDP holds the whole model). test_fsdp.py and test_pp.py match these layouts against one
process too, but with their own training loop; these trials go through run_trial as a Ray worker
or torchrun does. train.deterministic=true: inside the trial torch's deterministic algorithms and
cuDNN's deterministic mode are on and CUBLAS_WORKSPACE_CONFIG is set, DDP sums its gradient
buckets in rank order (parallel.ordered_reduce's hook runs on every rank), and a sharded layout
warns that its collectives keep the backend's order.

Each world size is spawned once and trains its trials one after another (spawns cost more than
these trials); a trial that raises comes back as its traceback and fails only its own test.
"""

from __future__ import annotations

import os
import traceback

import pytest

from conftest import RecordingTracker, rank_env, spawn_ranks
from trainlab import names
from trainlab.distributed import close_distributed
from trainlab.plan.here import plan_here

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # 2 spawns, 8 trials: ~80 s on 2 busy cores

TINY = ["model=tiny", "data=markov", "train.max_steps=6", "train.global_batch_size=8",
        "train.micro_batch_size=2", "train.seq_len=32", "train.eval_every=3", "train.eval_batches=4",
        "optim.warmup_steps=2", "optim.eps=1e-6", "train.numerics_every=0"]
FOUR_LAYERS = ["model.n_layers=4"]  # the model the pipelines cut into stages
DETERMINISTIC = ["train.deterministic=true"]

TWO = {
    "ddp": ["parallel=ddp"],
    "ddp_4": ["parallel=ddp", *FOUR_LAYERS],
    "zero2": ["parallel=zero2"],
    "gpipe": ["parallel=pp", *FOUR_LAYERS, "parallel.pp_schedule=gpipe"],
    # 2 ranks x 2 virtual stages = 4 stages of one block; 4 micro-batches, a multiple of the 2 ranks
    "interleaved_1f1b": ["parallel=pp", *FOUR_LAYERS, "parallel.pp_schedule=interleaved_1f1b",
                         "parallel.pp_virtual_stages=2"],
    "ddp_deterministic": ["parallel=ddp", *DETERMINISTIC],
    "zero2_deterministic": ["parallel=zero2", *DETERMINISTIC],
}
FOUR = {"hsdp": ["parallel=hsdp"]}  # shards of 2 ranks, 2 replicas


class FlagsTracker(RecordingTracker):
    """Rank 0's tracker, which also notes torch's deterministic switches each time the trial
    logs: what the trial ran under, read inside it."""

    def __init__(self):
        super().__init__()
        self.flags: set[tuple] = set()

    def log_metrics(self, metrics, *, step):
        import torch

        self.flags.add((torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
                        os.environ.get("CUBLAS_WORKSPACE_CONFIG")))
        super().log_metrics(metrics, step=step)


def _trials(rank: int, world: int, port: int, out, trials: dict[str, list[str]], root: str) -> None:
    """Every trial of `trials` in turn, in one process group. Each rank reports, per trial, how
    often DDP's rank-order hook ran here; rank 0 also what its tracker saw and the warnings."""
    rank_env(rank, world, port)
    os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)  # what the trial sets, not what the test had

    from trainlab.config import compose_run_config
    from trainlab.engine.run import run_trial
    from trainlab.events import WARNING
    from trainlab.parallel import ordered_reduce

    calls = [0]
    real_hook = ordered_reduce.ordered_allreduce_hook

    def counted_hook(state, bucket):  # the real hook, counted (comm.py imports it when registering)
        calls[0] += 1
        return real_hook(state, bucket)

    ordered_reduce.ordered_allreduce_hook = counted_hook
    reports = {}
    for name, overrides in trials.items():
        try:
            run = compose_run_config([*TINY, *overrides, f"cluster.num_workers={world}", "cluster.device=cpu",
                                      f"output_dir={root}/{world}/{name}"])
            tracker, warnings, before = FlagsTracker(), [], calls[0]
            result = run_trial(plan_here(run), tracker_factory=lambda *_, t=tracker: t,
                               progress=lambda e, w=warnings: w.append(e.message) if e.kind == WARNING else None)
            reports[name] = {"hook_calls": calls[0] - before, "status": result.status}
            if rank == 0:
                reports[name] |= {"train": [v for _, v in tracker.series(names.LOSS)],
                                  "val": [v for _, v in tracker.series(names.VAL_LOSS)],
                                  "param_gb": tracker.series(names.PARAM_GB)[-1][1],
                                  "flags": tracker.flags, "warnings": warnings}
        except Exception:
            reports[name] = traceback.format_exc()
    out.put((rank, reports))
    close_distributed()


def _spawn(trials: dict[str, list[str]], world: int, root) -> dict[int, dict]:
    got = spawn_ranks(_trials, world, trials, str(root), results=world, timeout=420)
    return dict(got)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict[int, dict[int, dict]]:
    """{world: {rank: {trial: report}}} for worlds 2 and 4."""
    root = tmp_path_factory.mktemp("trial_layouts")
    return {world: _spawn(trials, world, root) for world, trials in ((2, TWO), (4, FOUR))}


def _report(ranks, world: int, name: str, rank: int = 0) -> dict:
    got = ranks[world][rank][name]
    if isinstance(got, str):
        pytest.fail(f"{name} on rank {rank} of {world}:\n{got}")
    assert got["status"] == names.STATUS_FINISHED, got
    return got


@pytest.mark.parametrize(("world", "name", "shard"), [
    (2, "zero2", 2), (4, "hsdp", 2),  # hsdp on 4 ranks: sharded over 2, replicated over 2 (fsdp: 4)
], ids=["zero2", "hsdp"])
def test_sharded_layout_trains_like_ddp_holding_its_share(ranks, world, name, shard):
    ddp, got = _report(ranks, 2, "ddp"), _report(ranks, world, name)
    assert got["train"] == pytest.approx(ddp["train"], rel=1e-5)
    assert got["val"] == pytest.approx(ddp["val"], rel=1e-5) and len(got["val"]) == 2
    # each rank holds a 1/shard of every parameter (FSDP2 pads a dimension that does not divide)
    assert got["param_gb"] == pytest.approx(ddp["param_gb"] / shard, rel=0.05), (got["param_gb"], ddp["param_gb"])


@pytest.mark.parametrize("name", ["gpipe", "interleaved_1f1b"])
def test_pipeline_schedule_trains_like_ddp_each_rank_holding_its_stages(ranks, name):
    ddp, got = _report(ranks, 2, "ddp_4"), _report(ranks, 2, name)
    assert got["train"] == pytest.approx(ddp["train"], rel=1e-5)
    assert got["val"] == pytest.approx(ddp["val"], rel=1e-5) and len(got["val"]) == 2
    # the largest rank's stages: the embedding or the output head and half the blocks, not the model
    assert 0.3 * ddp["param_gb"] < got["param_gb"] < 0.75 * ddp["param_gb"], (got["param_gb"], ddp["param_gb"])


def test_deterministic_trial_runs_deterministic_kernels_and_ddps_rank_order_sum(ranks):
    plain, det = _report(ranks, 2, "ddp"), _report(ranks, 2, "ddp_deterministic")
    assert det["flags"] == {(True, True, ":4096:8")}, det["flags"]  # at every log, inside the trial
    assert plain["flags"] == {(False, False, None)}, plain["flags"]  # and off again for the next trial
    for rank in (0, 1):  # every gradient bucket of every step, on every rank
        assert _report(ranks, 2, "ddp_deterministic", rank)["hook_calls"] >= 6, ranks[2][rank]
        assert _report(ranks, 2, "ddp", rank)["hook_calls"] == 0
    assert not det["warnings"], det["warnings"]
    # the same math: rank order changes no more than rounding (2 ranks: no order to change at all)
    assert det["train"] == pytest.approx(plain["train"], rel=1e-6)


def test_deterministic_sharded_trial_warns_its_reductions_keep_the_backends_order(ranks):
    got = _report(ranks, 2, "zero2_deterministic")
    assert got["flags"] == {(True, True, ":4096:8")}
    assert got["hook_calls"] == 0  # FSDP2 reduce-scatters; DDP's hook is not there to run
    (warning,) = [w for w in got["warnings"] if "train.deterministic" in w]
    assert "parallel.data_parallel=zero2" in warning and "backend's order" in warning, warning
