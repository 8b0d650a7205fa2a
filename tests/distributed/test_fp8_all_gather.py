"""FP8 with FSDP2 through the real trainer on gloo: fp8_tensorwise all-gathers its FP8 weights in
float8 (torchao's enable_fsdp_float8_all_gather, scales precomputed after each optimizer step),
trains like the same trial without it, sends half the bytes per FP8 weight, and says so in
the `fp8_all_gather` tag.

Both ranks run every case in turn in one spawn (the file pays for one start-up); a case that
raises comes back as its traceback and fails only its own test.
"""

from __future__ import annotations

import traceback

import pytest

from conftest import RecordingTracker, finish_reporting, rank0_unless_failed, rank_env, spawn_ranks
from trainlab import names
from trainlab.distributed import close_distributed
from trainlab.plan.here import plan_here
from trainlab.precision.capability import cpu_rowwise_scaled_mm

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # 8-25 s of gloo groups: the gate keeps under 15 min

TINY = ["model=tiny", "data=markov", "train.max_steps=4", "train.global_batch_size=4",
        "train.micro_batch_size=2", "train.seq_len=32", "train.eval_every=0", "train.eval_batches=2",
        "train.numerics_every=2", "train.checkpoint_every=0", "cluster.device=cpu",
        # tiny's linears are all too small for FP8 to pay: convert every aligned one
        "precision.keep_hp=[output,unaligned]"]
CASES = {
    # fp32 everywhere else: the two runs differ only in what is all-gathered
    "fsdp_fp8": ["parallel=fsdp", "precision=fp8_tensorwise", "precision.hp_dtype=fp32"],
    "ddp_fp8": ["parallel=ddp", "precision=fp8_tensorwise", "precision.hp_dtype=fp32"],
    # bytes: bf16 parameters against fp8 weights + bf16 rest
    "fsdp_bf16": ["parallel=fsdp", "precision=bf16"],
    "fsdp_fp8_bf16": ["parallel=fsdp", "precision=fp8_tensorwise", "precision.hp_dtype=bf16"],
    # emulated where torch's CPU _scaled_mm has no rowwise scales (2.11): the all-gather
    # decision is the same either way
    "fsdp_rowwise": ["parallel=fsdp", "precision=fp8_rowwise", "precision.hp_dtype=fp32",
                     *([] if cpu_rowwise_scaled_mm() else ["precision.fp8_impl=emulated"])],
}
BYTES = {"unsigned char": 1, "c10::Float8_e4m3fn": 1, "c10::BFloat16": 2, "c10::Half": 2, "float": 4}


def _all_gather_bytes(prof) -> list[int]:
    """Bytes each rank received per all-gather, from the profiled c10d ops (what FSDP2 sent:
    a group whose dtypes differ goes as one uint8 buffer)."""
    out = []
    for event in prof.profiler.kineto_results.events():
        if event.name() == "c10d::_allgather_base_":
            (numel,), dtype = event.shapes()[0], event.dtypes()[0]
            out.append(numel * BYTES[dtype])
    return out


def _case(overrides: list[str], world: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from trainlab.config import compose_run_config
    from trainlab.distributed import setup_distributed
    from trainlab.engine.run import _layer_tags, build_trainer
    from trainlab.plan.trial_plan import Where, plan_trial

    run = compose_run_config([*TINY, *overrides, f"cluster.num_workers={world}"])
    tracker = RecordingTracker()
    trainer = build_trainer(plan_trial(run, Where(device="cpu")), setup_distributed("cpu"), tracker=tracker)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        result = trainer.train()
    fp8 = [m for m in trainer.model.modules() if type(m).__name__ == "Float8Linear"]
    return {"status": result.status, "losses": [v for _, v in tracker.series(names.LOSS)],
            "val_loss": result.final_val_loss, "tags": _layer_tags(trainer.recipe),
            "weight_types": sorted({type(getattr(m.weight, "_local_tensor", m.weight)).__name__ for m in fp8}),
            "all_gather_bytes": _all_gather_bytes(prof),
            "probed": tracker.steps_with(names.NUM_PREFIX)}


def _preempted_and_resumed(world: int, out_dir: str) -> dict:
    """CASES' fsdp_fp8 stopped by SIGTERM after step 2 (checkpointed), then run again: it
    resumes from that checkpoint (weights loaded into the float8-gathering shards)."""
    from trainlab.config import compose_run_config
    from trainlab.engine.run import run_trial

    got = {}
    for name, extra in (("preempted", ["debug.inject_fault=sigterm@2"]), ("resumed", [])):
        run = compose_run_config([*TINY, *CASES["fsdp_fp8"], *extra, "train.checkpoint_every=2",
                                  f"output_dir={out_dir}", f"cluster.num_workers={world}"])
        tracker = RecordingTracker()
        result = run_trial(plan_here(run), tracker_factory=lambda *_, tracker=tracker: tracker)
        got[name] = {"status": result.status, "losses": [v for _, v in tracker.series(names.LOSS)],
                     "val_loss": result.final_val_loss}
    return got


def _worker(rank: int, world: int, port: int, out, out_dir: str) -> None:
    rank_env(rank, world, port)

    results = {}
    for name, overrides in CASES.items():
        try:
            results[name] = _case(overrides, world)
        except Exception:  # noqa: BLE001 - reported to the test
            results[name] = traceback.format_exc()
    try:
        results["resume"] = _preempted_and_resumed(world, out_dir)
    except Exception:  # noqa: BLE001 - reported to the test
        results["resume"] = traceback.format_exc()
    out.put((rank, results))  # every rank's: a case that raised on rank 1 only must fail too
    close_distributed()
    finish_reporting(out)


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict:
    return rank0_unless_failed(spawn_ranks(_worker, 2, str(tmp_path_factory.mktemp("fp8_all_gather")),
                                           results=2, timeout=600))


def _result(cases: dict, name: str) -> dict:
    got = cases[name]
    assert isinstance(got, dict), f"case {name} raised on {got}"
    return got


def test_fsdp_fp8_tensorwise_all_gathers_float8_and_trains_like_without_it(cases):
    fsdp, ddp = _result(cases, "fsdp_fp8"), _result(cases, "ddp_fp8")
    assert fsdp["status"] == ddp["status"] == names.STATUS_FINISHED
    assert fsdp["tags"][names.TAG_FP8_ALL_GATHER] == "true"
    assert fsdp["tags"][names.TAG_FP8_LAYERS] == "14/15"
    # the sharded weights carry torchao's float8 all-gather hooks
    assert fsdp["weight_types"] == ["WeightWithDynamicFloat8CastTensor"]
    assert ddp["weight_types"] == ["Parameter"]  # plain: DDP gathers nothing
    assert ddp["tags"][names.TAG_FP8_ALL_GATHER].startswith("false: no FSDP2")
    # tensorwise scales from the all-reduced amax (precomputed after each step): the same fp8
    # weights as casting the whole fp32 weight, so the same curve
    assert fsdp["losses"][-1] < fsdp["losses"][0]
    assert fsdp["losses"] == pytest.approx(ddp["losses"], rel=1e-5)
    assert fsdp["val_loss"] == pytest.approx(ddp["val_loss"], rel=1e-5)
    assert fsdp["probed"] == [1, 2, 4]  # the numerics probes ran on the float8-gathered weights


def test_float8_all_gather_sends_one_byte_per_fp8_weight_element(cases):
    """Per block, bf16 sends 2 bytes per parameter; fp8_tensorwise 1 per FP8 weight element
    (plus the bf16 norms) in the same all-gathers: about half."""
    bf16, fp8 = _result(cases, "fsdp_bf16"), _result(cases, "fsdp_fp8_bf16")
    assert fp8["tags"][names.TAG_FP8_ALL_GATHER] == "true"
    assert len(fp8["all_gather_bytes"]) == len(bf16["all_gather_bytes"]) > 0
    block_bf16, block_fp8 = max(bf16["all_gather_bytes"]), max(fp8["all_gather_bytes"])
    assert block_fp8 / block_bf16 == pytest.approx(0.5, abs=0.01)
    assert sum(fp8["all_gather_bytes"]) < 0.6 * sum(bf16["all_gather_bytes"])


def test_rowwise_gathers_its_weights_in_high_precision_and_says_why(cases):
    rowwise = _result(cases, "fsdp_rowwise")
    assert rowwise["status"] == names.STATUS_FINISHED
    assert rowwise["weight_types"] == ["Tensor"]
    tag = rowwise["tags"][names.TAG_FP8_ALL_GATHER]
    assert tag.startswith("false:") and "tensorwise" in tag


def test_a_preempted_float8_all_gather_trial_resumes_onto_the_same_curve(cases):
    whole, runs = _result(cases, "fsdp_fp8"), _result(cases, "resume")
    assert runs["preempted"]["status"] == names.STATUS_PREEMPTED
    assert runs["resumed"]["status"] == names.STATUS_FINISHED
    assert runs["preempted"]["losses"] + runs["resumed"]["losses"] == pytest.approx(whole["losses"], rel=1e-6)
    assert runs["resumed"]["val_loss"] == pytest.approx(whole["val_loss"], rel=1e-6)
