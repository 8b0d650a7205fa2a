"""Warm gangs: a trial gives the same bits after other trials in the same processes as first.

Two gloo ranks, one process each, run trial after trial through the real engine
(engine.run.run_trial) in one world group, as a warm gang's workers do, with
engine.isolation.GangState.after_trial between trials. The trials in between change what a
trial can change in a process: precision (bf16 autocast, fp16 with its loss scaler, torchao's
FP8 module swap, the project's delayed FP8), layout (FSDP2, tensor parallel, HSDP with its
sub-group), train.deterministic, train.compile.
"""

from __future__ import annotations

import time

import pytest

from conftest import rank_env, reporting_to, spawn_ranks
from trainlab.plan.here import plan_here

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # 8-25 s of gloo groups: the gate keeps under 15 min

TINY = ["model=tiny", "data=markov", "train.max_steps=3", "train.global_batch_size=4",
        "train.micro_batch_size=2", "train.seq_len=16", "train.eval_every=0", "train.checkpoint_every=0",
        "train.numerics_every=2", "cluster.device=cpu", "tracking=none"]
X = ["parallel=ddp", "precision=fp32", "train.compile=true", "train.compile_unit=block"]
"""The trial that runs first in fresh processes and again at the end: compiled, the hard case
(dynamo's caches outlive a trial), fp32 DDP."""
BETWEEN = {
    "bf16 fsdp": ["parallel=fsdp", "precision=bf16"],
    "tp": ["parallel=tp"],
    "hsdp": ["parallel=hsdp"],  # on 2 ranks: a shard group of one rank beside the world
    "deterministic": ["parallel=ddp", "train.deterministic=true"],
    "fp16 scaler": ["parallel=ddp", "precision=fp16"],
    "fp8 torchao fsdp": ["parallel=fsdp", "precision=fp8_tensorwise", "precision.fp8_impl=emulated",
                         "precision.hp_dtype=fp32", "precision.keep_hp=[output]"],
    "fp8 delayed": ["parallel=ddp", "precision=fp8_delayed", "precision.hp_dtype=fp32",
                    "precision.keep_hp=[output]"],
}
COMPILED_BF16 = ["parallel=ddp", "precision=bf16", "train.compile=true", "train.compile_unit=block"]
RECOMPILE_LIMIT = 2
"""dynamo's recompile_limit for the gang (8 by default). Each compiled config leaves 2 cache
entries on TransformerBlock.forward (train and eval) until torch._dynamo.reset(): on a gang
without it the 5th distinct compiled config ran eager. 2 stands in for 8, so that one trial
fills it."""
SEQUENCE = [("x", X, True), *((name, o, True) for name, o in BETWEEN.items()),
            ("compiled bf16", COMPILED_BF16, False),  # no after_trial: the leak shows on the next x
            ("x", X, True), ("x", X, True)]


def _gang(rank: int, world: int, port: int, out, trials: list[tuple[str, list[str], bool]],
          recompile_limit: int | None) -> None:
    """One worker of a warm gang: the world group first (Ray Train makes it before the worker's
    function runs), then GangState.capture(), then each (name, overrides, after_trial?) in turn.
    Each rank reports, per trial, its checksums and what differed from capture before
    after_trial; and at the end the groups left and what still differs."""
    rank_env(rank, world, port)
    import torch
    import torch.distributed as dist

    from trainlab import names
    from trainlab.config import compose_run_config
    from trainlab.engine.isolation import GangState
    from trainlab.engine.run import run_trial

    with reporting_to(out):
        dist.init_process_group("gloo")
        if recompile_limit is not None:  # a setting of the gang, made before capture: it stays
            torch._dynamo.config.recompile_limit = recompile_limit
        state = GangState.capture()
        report = []
        for name, overrides, restore in trials:
            start = time.perf_counter()
            result = run_trial(plan_here(compose_run_config([*TINY, *overrides, f"cluster.num_workers={world}"])))
            changed = state.changed()
            if restore:
                state.after_trial()
            report.append(dict(name=name, status=result.status, changed=changed, s=time.perf_counter() - start,
                               sha=(result.extra[names.TAG_LOSS_CURVE_SHA], result.extra[names.TAG_PARAMS_SHA])))
        from torch.distributed.distributed_c10d import _world

        out.put(dict(rank=rank, trials=report, left=state.changed(), modules=_live_modules(),
                     groups=[g is dist.GroupMember.WORLD for g in _world.pg_map]))


def _live_modules() -> list[str]:
    """The nn.Modules alive in this process that hold a tensor (a trial's model, if anything
    kept it; dynamo keeps the graphs it compiled, GraphModules without tensors)."""
    import gc

    from torch import nn

    return sorted({type(o).__name__ for o in gc.get_objects()
                   if isinstance(o, nn.Module) and (any(o.parameters()) or any(o.buffers()))})


def _by_name(report: dict) -> dict[str, list[dict]]:
    trials: dict[str, list[dict]] = {}
    for t in report["trials"]:
        trials.setdefault(t["name"], []).append(t)
    return trials


@pytest.fixture(scope="module")
def gang() -> list[dict]:
    """Each rank's report of SEQUENCE, run once for the tests below."""
    reports = spawn_ranks(_gang, 2, SEQUENCE, RECOMPILE_LIMIT, results=2, timeout=300)
    for report in reports:
        assert [t["status"] for t in report["trials"]] == ["finished"] * len(SEQUENCE), report["trials"]
    return reports


def test_a_trial_gives_the_same_bits_after_other_trials_on_a_warm_gang(gang):
    for report in gang:
        rank, by_name = report["rank"], _by_name(report)
        first, _, again = by_name["x"]
        assert again["sha"] == first["sha"], (
            f"rank {rank}: trial x after {[*BETWEEN, 'compiled bf16']} gave other loss-curve / parameter "
            "checksums than first in fresh processes")
        # what the trials really left behind, each put back before the next trial
        assert {"env:CUBLAS_WORKSPACE_CONFIG", "flag:use_deterministic_algorithms"} <= set(
            by_name["deterministic"][0]["changed"])
        assert {"config:torch._dynamo.config.skip_nnmodule_hook_guards", "dynamo:compiled code cached"} <= set(
            by_name["compiled bf16"][0]["changed"])
        assert any(c.startswith("group:") for c in by_name["hsdp"][0]["changed"]), by_name["hsdp"][0]
        # and after the last after_trial: the world is the only group, nothing else differs
        assert report["groups"] == [True], f"rank {rank}: groups left {report['groups']} (True: the world)"
        assert report["left"] == [], f"rank {rank}: still differs from gang start: {report['left']}"
        assert report["modules"] == [], f"rank {rank}: a trial's modules outlived it: {report['modules']}"


def test_without_after_trial_a_compiled_trial_leaks_into_the_next(gang):
    """x right after the compiled bf16 trial, without after_trial between: dynamo's cache still
    holds the bf16 trial's entries, x cannot compile (recompile_limit) and runs eager."""
    for report in gang:
        first, leaked, _ = _by_name(report)["x"]
        assert leaked["sha"] != first["sha"], (
            f"rank {report['rank']}: x after a compiled trial without after_trial gave the same bits "
            "(no leak shown)")
