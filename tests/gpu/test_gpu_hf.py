"""model=hf on one CUDA GPU (issue 29): a Hugging Face Llama fine-tuned from its save_pretrained
weights in bf16 and the FP8 recipes (torchao's conversion of its own q/k/v/o and gate/up/down
projections), loaded into the model as it trains on the GPU and exported back. Skipped without
CUDA or without transformers (tests/gpu runs on the GPU machine with .ci/gpu-wheels.sh's wheels)."""

from __future__ import annotations

import pytest
import torch

from conftest import RecordingTracker
from trainlab import names
from trainlab.bench.fp8_vs_bf16 import mode_overrides
from trainlab.config import compose_run_config
from trainlab.engine.run import run_trial
from trainlab.plan.here import plan_here
from trainlab.vocab.precision import spec_of

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
transformers = pytest.importorskip("transformers")

MODES = ["bf16", "fp8_tensorwise", "fp8_rowwise"]
RUN = ["model=hf", "data=text", "train.seq_len=128", "train.micro_batch_size=8", "train.global_batch_size=8",
       "train.max_steps=40", "train.eval_every=0", "train.eval_batches=4", "cluster.device=cuda",
       "cluster.num_workers=1", "precision.keep_hp=[output,unaligned]"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from trainlab.models.hf_demo import write_demo_model

    # width 256: every projection FP8-aligned (multiples of 16), the head kept in bf16
    return write_demo_model(tmp_path_factory.mktemp("hf") / "llama", family="llama", vocab_size=256,
                            hidden_size=256, intermediate_size=768, num_attention_heads=8, num_key_value_heads=4)


@pytest.mark.parametrize("mode", MODES)
def test_hf_llama_fine_tunes_on_the_gpu_in_each_precision(llama, mode, tmp_path):
    need = spec_of(mode).needs_capability(hp_dtype="bf16", emulated=False)
    if torch.cuda.get_device_capability() < need:
        pytest.skip(f"{mode} needs SM {need[0]}.{need[1]}+")
    tracker = RecordingTracker()
    result = run_trial(plan_here(compose_run_config(
        [*RUN, f"model.pretrained={llama}", *mode_overrides(mode), "train.export=hf", f"output_dir={tmp_path}"])),
        tracker_factory=lambda *_: tracker)
    assert result.status == names.STATUS_FINISHED, result.first_nonfinite
    losses = [v for _, v in tracker.series(names.LOSS)]
    assert losses[-1] < losses[0] - 0.2, losses  # it learned
    if spec_of(mode).fp8:  # the model's own projections ran FP8: 2 layers x 7 of them
        lowp, _ = map(int, tracker.tags[names.TAG_FP8_LAYERS].split("/"))
        assert lowp == 14, tracker.tags[names.TAG_FP8_LAYERS]
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / names.ARTIFACT_HF_MODEL,
                                                                 dtype=torch.float32)
    start = transformers.AutoModelForCausalLM.from_pretrained(llama, dtype=torch.float32)
    moved = [(a - b).abs().max().item() for a, b in zip(exported.parameters(), start.parameters())]
    assert max(moved) > 0 and all(torch.isfinite(p).all() for p in exported.parameters())


@pytest.fixture(scope="module")
def gpt_neox(tmp_path_factory):
    from trainlab.models.hf_demo import write_demo_model

    return write_demo_model(tmp_path_factory.mktemp("hf") / "gpt_neox", family="gpt_neox", vocab_size=256,
                            hidden_size=256, intermediate_size=1024, num_attention_heads=8)


@pytest.mark.parametrize("mode", ["bf16", "fp8_tensorwise"])
def test_another_family_fine_tunes_on_the_gpu(gpt_neox, mode, tmp_path):
    """GPT-NeoX (transformers' own forward, models.hf_any): its fused query_key_value, dense and
    MLP linears (biased) run FP8 under torchao's conversion, and it learns."""
    need = spec_of(mode).needs_capability(hp_dtype="bf16", emulated=False)
    if torch.cuda.get_device_capability() < need:
        pytest.skip(f"{mode} needs SM {need[0]}.{need[1]}+")
    tracker = RecordingTracker()
    result = run_trial(plan_here(compose_run_config(
        [*RUN, f"model.pretrained={gpt_neox}", *mode_overrides(mode), "train.export=hf", f"output_dir={tmp_path}"])),
        tracker_factory=lambda *_: tracker)
    assert result.status == names.STATUS_FINISHED, result.first_nonfinite
    losses = [v for _, v in tracker.series(names.LOSS)]
    assert losses[-1] < losses[0] - 0.2, losses
    if spec_of(mode).fp8:  # 2 layers x 4 linears (query_key_value, dense, dense_h_to_4h, dense_4h_to_h)
        lowp, _ = map(int, tracker.tags[names.TAG_FP8_LAYERS].split("/"))
        assert lowp == 8, tracker.tags[names.TAG_FP8_LAYERS]
    assert transformers.AutoModelForCausalLM.from_pretrained(tmp_path / names.ARTIFACT_HF_MODEL) is not None
