"""FP8's speed defaults on CUDA: FP8 modes compile by default (train.compile=auto), keep the
linears too small for FP8 in bf16 (keep_hp 'small'), win against compiled bf16 where the
GEMMs are big enough (model=1b, 8,192 tokens per micro-batch), and on 2+ GPUs FSDP2 gathers
their weights in float8 over NCCL."""

from __future__ import annotations

import pytest
import torch

from conftest import RecordingTracker, rank_env, reporting_to, spawn_ranks
from trainlab import names
from trainlab.config import compose_run_config
from trainlab.engine.run import run_trial
from trainlab.plan.here import plan_here

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

MARKOV = ["data=markov", "data.vocab_size=4096", "train.eval_every=0", "cluster.device=cuda"]


def _fp8_gpu() -> None:
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs FP8 tensor cores (SM 8.9+)")


def _trial(overrides: list[str], tmp_path) -> tuple:
    tracker = RecordingTracker()
    run = compose_run_config([*MARKOV, "cluster.num_workers=1", f"output_dir={tmp_path}", *overrides])
    return run_trial(plan_here(run), tracker_factory=lambda *_: tracker), tracker


def test_fp8_compiles_by_default_and_keeps_small_linears_in_bf16(tmp_path):
    _fp8_gpu()
    # vocabulary 256, 2 of 125m's layers and 60 steps of 2,048 tokens: test_gpu_engine's size, which
    # gets past the corpus's unigram entropy (12 layers stay on the plateau near ln 256 that long)
    result, tracker = _trial(["model=125m", "model.n_layers=2", "precision=fp8_tensorwise", "data.vocab_size=256",
                              "train.max_steps=60", "train.seq_len=256", "train.global_batch_size=8",
                              "train.micro_batch_size=8", "train.eval_batches=4"], tmp_path)
    assert result.status == names.STATUS_FINISHED
    assert result.final_val_loss < result.extra["unigram_entropy"], (result.final_val_loss, result.extra)
    assert tracker.tags[names.TAG_COMPILE] == "model"  # auto, one process: the whole model
    # 125m's blocks: only w1/w3 (768 -> 2048) pass torchao's tensorwise size filter; 2 blocks of
    # 7 linears and the output head
    assert tracker.tags[names.TAG_FP8_LAYERS] == "4/15"
    assert tracker.tags[names.TAG_HP_LAYERS].startswith("small: layers.0.attention.wq,")


@pytest.mark.slow  # two whole-model compiles of 1b: the acceptance table's headline measures the same
def test_fp8_tensorwise_beats_bf16_where_its_gemms_are_big_enough(tmp_path):
    """model=1b at M = 4 x 2048 tokens per GEMM, both compiled (auto): FP8's winning regime
    (torchao: tensorwise pays from about M, K, N = 4096; 80 of 113 linears pass its filter)."""
    _fp8_gpu()
    rates = {}
    for precision in ("bf16", "fp8_tensorwise"):
        result, tracker = _trial(["model=1b", f"precision={precision}", "train.max_steps=30",
                                  "train.global_batch_size=4", "train.micro_batch_size=4",
                                  "train.seq_len=2048", "train.numerics_every=0"], tmp_path / precision)
        assert result.status == names.STATUS_FINISHED
        assert tracker.tags[names.TAG_COMPILE] == "model"
        rates[precision] = result.tokens_per_s
    print(f"fp8/bf16 on model=1b: {rates['fp8_tensorwise'] / rates['bf16']:.2f}x")
    assert rates["fp8_tensorwise"] > rates["bf16"], rates


def _nccl_fsdp(rank: int, world: int, port: int, out, layouts: dict) -> None:
    rank_env(rank, world, port)
    got = {}
    with reporting_to(out):
        for name, overrides in layouts.items():
            tracker = RecordingTracker()
            run = compose_run_config([*MARKOV, "model=125m", "precision=fp8_tensorwise", "train.max_steps=10",
                                      "train.global_batch_size=8", "train.micro_batch_size=4",
                                      "train.seq_len=256", "train.checkpoint_every=0",
                                      f"cluster.num_workers={world}", *overrides])
            result = run_trial(plan_here(run), tracker_factory=lambda *_, t=tracker: t)
            got[name] = {"status": result.status, "losses": [v for _, v in tracker.series(names.LOSS)],
                         "tags": dict(tracker.tags)}
        if rank == 0:
            out.put(got)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (NCCL)")
def test_fsdp_all_gathers_fp8_weights_in_float8_over_nccl(tmp_path):
    _fp8_gpu()
    layouts = {"fsdp": ["parallel=fsdp", f"output_dir={tmp_path}/fsdp"],
               "ddp": ["parallel=ddp", f"output_dir={tmp_path}/ddp"]}
    (got,) = spawn_ranks(_nccl_fsdp, 2, layouts, timeout=900)
    assert isinstance(got, dict), got
    fsdp, ddp = got["fsdp"], got["ddp"]
    assert fsdp["status"] == ddp["status"] == names.STATUS_FINISHED
    assert fsdp["tags"][names.TAG_FP8_ALL_GATHER] == "true"
    assert fsdp["tags"][names.TAG_COMPILE] == "block"  # auto under FSDP2
    assert ddp["tags"][names.TAG_FP8_ALL_GATHER].startswith("false: no FSDP2")
    # the same tensorwise-scaled weights either way; compiled kernels differ in rounding only
    assert fsdp["losses"] == pytest.approx(ddp["losses"], rel=2e-2)
