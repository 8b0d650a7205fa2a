"""model=hf through the real trainer on gloo: a Hugging Face Llama and Qwen2, fine-tuned from
their save_pretrained weights, train like one process in every layout (fp32), and each layout
composes with a low-precision mode (close to the fp32 curve, not on it), as the presets do in
test_layouts.py. The pretrained weights are loaded into the sharded / split model, so a wrong
slice, a missed name or a random init would move the curve."""

from __future__ import annotations

import pytest
import torch

from hf_checks import RUN, export_overrides, transformers_first_loss, transformers_logits
from spawn_cases import selected_cases, spawn_cases, trial_curves_case
from trainlab import names

pytestmark = pytest.mark.distributed

EVERY_ALIGNED = ["precision.keep_hp=[output,unaligned]"]

LAYOUTS = {  # case: (family, world, overrides)
    "llama_fsdp": ("llama", 2, ["parallel=fsdp"]),
    "llama_zero1": ("llama", 2, ["parallel=zero1"]),
    "llama_tp": ("llama", 2, ["parallel=tp"]),
    "llama_tp_sp": ("llama", 2, ["parallel=tp", "parallel.sequence_parallel=true"]),
    "llama_pp_1f1b": ("llama", 2, ["parallel=pp", "parallel.pp_schedule=1f1b"]),
    "llama_ac_block": ("llama", 2, ["parallel=fsdp", "parallel.activation_checkpoint=block"]),
    "qwen2_fsdp": ("qwen2", 2, ["parallel=fsdp"]),
    "qwen2_tp": ("qwen2", 2, ["parallel=tp"]),
}
WITH_PRECISION = {
    "llama_fsdp_bf16": ("llama", ["parallel=fsdp", "precision=bf16"]),
    "llama_ddp_fp16": ("llama", ["parallel=ddp", "precision=fp16"]),
    "llama_zero1_fp8_delayed": ("llama", ["parallel=zero1", "precision=fp8_delayed", "precision.hp_dtype=fp32",
                                          *EVERY_ALIGNED]),
    "llama_pp_fp8_tensorwise": ("llama", ["parallel=pp", "precision=fp8_tensorwise", "precision.hp_dtype=fp32",
                                          *EVERY_ALIGNED]),
    "qwen2_tp_emulated": ("qwen2", ["parallel=tp", "precision=emulated", "precision.hp_dtype=fp32"]),
}


def _overrides(hf_models, family: str, extra: list[str]) -> list[str]:
    return [*RUN, f"model.pretrained={hf_models[family]}", *extra]


EXPORTS = {"fsdp": ["parallel=fsdp"], "tp": ["parallel=tp"], "pp": ["parallel=pp", "parallel.pp_schedule=gpipe"]}
"""Layouts whose train.export=hf is loaded back by transformers (each holds the model differently)."""


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    return tmp_path_factory.mktemp("exports")


@pytest.fixture(scope="module")
def references(request, hf_models, exports):
    """One process per family the selected tests compare with (the step-0 and export tests: llama)."""
    wanted = selected_cases(request)
    families = {"llama"} | {LAYOUTS[c][0] for c in wanted if c in LAYOUTS} | {
        WITH_PRECISION[c][0] for c in wanted if c in WITH_PRECISION}
    cases = {f: _overrides(hf_models, f, []) for f in sorted(families)}
    cases["llama"] += export_overrides(exports, "one")
    return spawn_cases(trial_curves_case, 1, cases, timeout=300)


@pytest.fixture(scope="module")
def two_ranks(request, hf_models, exports):
    wanted = selected_cases(request)
    cases = {k: _overrides(hf_models, fam, o) for k, (fam, w, o) in LAYOUTS.items() if k in wanted}
    cases |= {k: _overrides(hf_models, fam, o) for k, (fam, o) in WITH_PRECISION.items() if k in wanted}
    cases |= {f"export_{k}": _overrides(hf_models, "llama", [*o, *export_overrides(exports, k)])
              for k, o in EXPORTS.items() if k in selected_cases(request, "export_case")}
    return spawn_cases(trial_curves_case, 2, cases, timeout=300)


GATE = ("llama_fsdp", "llama_pp_1f1b")
"""In the gate tier: the model sharded and the model staged (its own decoder loop cut in two); the
other layouts (tensor parallel, Qwen2's biased q/k/v, ...) in the slow tier, to keep the gate's time."""


@pytest.mark.parametrize("case", [c if c in GATE else pytest.param(c, marks=pytest.mark.slow) for c in LAYOUTS])
def test_hf_model_trains_like_one_process_in_every_layout(references, two_ranks, case):
    family = LAYOUTS[case][0]
    ref_train, ref_val, _ = references[family].result()
    train, val, status = two_ranks[case].result()
    assert status == names.STATUS_FINISHED
    assert train == pytest.approx(ref_train, rel=1e-5)
    assert val == pytest.approx(ref_val, rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(WITH_PRECISION))
def test_hf_model_layout_composes_with_a_precision_mode(references, two_ranks, case):
    ref_train, _, _ = references[WITH_PRECISION[case][0]].result()
    train, _, status = two_ranks[case].result()
    assert status == names.STATUS_FINISHED
    assert train == pytest.approx(ref_train, rel=2e-2)
    assert train != pytest.approx(ref_train, rel=1e-6)


def test_step_zero_loss_is_transformers_loss_on_the_same_batch(references, hf_models):
    """The first step's loss (before any update) equals transformers' own forward and loss on
    the batch trainlab drew: the fine-tune starts from the checkpoint, not from an init."""
    train, _, _ = references["llama"].result()
    assert train[0] == pytest.approx(transformers_first_loss(_overrides(hf_models, "llama", []), hf_models["llama"]),
                                     abs=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("export_case", list(EXPORTS))
def test_export_from_every_layout_loads_into_transformers_as_the_trained_model(references, two_ranks, exports,
                                                                              hf_models, export_case):
    """train.export=hf from a sharded (fsdp), column/row-split (tp) or staged (pp) model gives the
    save_pretrained folder of the one-process run's trained model: transformers loads each to the
    same logits, which are not the starting checkpoint's (the export holds what was trained)."""
    references["llama"].result()
    assert two_ranks[f"export_{export_case}"].result()[2] == names.STATUS_FINISHED
    one = transformers_logits(exports / "one" / names.ARTIFACT_HF_MODEL)
    exported = transformers_logits(exports / export_case / names.ARTIFACT_HF_MODEL)
    assert torch.allclose(exported, one, atol=1e-4, rtol=0)
    assert not torch.allclose(transformers_logits(hf_models["llama"]), one, atol=1e-3)
