"""model=hf beyond the Llama family (GPT-NeoX, Gemma, Phi: transformers' own forward, models.hf_any)
through the real trainer on gloo: fine-tuned from their save_pretrained weights, each trains like one
process when sharded per decoder layer (FSDP2, with activation checkpointing), replicated (DDP) or
with ZeRO-1; composes with bf16 and FP8; starts from transformers' own loss; and its train.export=hf
from a sharded run loads back into transformers as the trained model."""

from __future__ import annotations

import pytest
import torch

from hf_checks import RUN, export_overrides, transformers_first_loss, transformers_logits
from spawn_cases import selected_cases, spawn_cases, trial_curves_case
from trainlab import names

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # the unit tests in the gate build and run them


LAYOUTS = {  # case: (family, overrides)
    "gpt_neox_fsdp": ("gpt_neox", ["parallel=fsdp"]),
    "gpt_neox_ddp": ("gpt_neox", ["parallel=ddp"]),
    "gemma_fsdp_checkpointed": ("gemma", ["parallel=fsdp", "parallel.activation_checkpoint=block"]),
    "phi_zero1": ("phi", ["parallel=zero1"]),
    # a random init (transformers' own, per module from (seed, name)) is the one process's, sharded
    "gpt_neox_init_fsdp": ("gpt_neox_init", ["parallel=fsdp"]),
    # tensor parallel from a plan in config: the model's own base_model_tp_plan (GPT-NeoX's fused
    # query_key_value holds whole heads per column block, [heads, 3, head_dim], so colwise cuts by heads)
    "gpt_neox_tp_plan": ("gpt_neox", ["parallel=tp", "model.tp_plan={layers.*.attention.query_key_value:colwise,"
                                      "layers.*.attention.dense:rowwise,layers.*.mlp.dense_h_to_4h:colwise,"
                                      "layers.*.mlp.dense_4h_to_h:rowwise}"]),
    "gemma_fsdp_tp_plan": ("gemma", ["parallel=fsdp_tp", "model.tp_plan={"
                                     "layers.*.self_attn.q_proj:colwise,layers.*.self_attn.k_proj:colwise,"
                                     "layers.*.self_attn.v_proj:colwise,layers.*.self_attn.o_proj:rowwise,"
                                     "layers.*.mlp.gate_proj:colwise,layers.*.mlp.up_proj:colwise,"
                                     "layers.*.mlp.down_proj:rowwise}"]),
}
WITH_PRECISION = {
    "gpt_neox_fsdp_bf16": ("gpt_neox", ["parallel=fsdp", "precision=bf16"]),
    "gemma_ddp_fp8_tensorwise": ("gemma", ["parallel=ddp", "precision=fp8_tensorwise", "precision.hp_dtype=fp32",
                                           "precision.keep_hp=[output,unaligned]"]),
}


def _overrides(hf_models, family: str, extra: list[str]) -> list[str]:
    """A fine-tune of `family`'s saved model; 'FAMILY_init': its config from transformers' random init."""
    if family.endswith("_init"):
        return [*RUN, f"model.config={hf_models[family.removesuffix('_init')]}", *extra]
    return [*RUN, f"model.pretrained={hf_models[family]}", *extra]


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    return tmp_path_factory.mktemp("exports")


@pytest.fixture(scope="module")
def references(request, hf_models, exports):
    wanted = selected_cases(request)
    families = {"gpt_neox"} | {LAYOUTS[c][0] for c in wanted if c in LAYOUTS} | {
        WITH_PRECISION[c][0] for c in wanted if c in WITH_PRECISION}
    cases = {f: _overrides(hf_models, f, []) for f in sorted(families)}
    cases["gpt_neox"] += export_overrides(exports, "one")
    return spawn_cases(trial_curves_case, 1, cases, timeout=300)


FOUR_RANKS = ("gemma_fsdp_tp_plan",)
"""Cases of 4 ranks (dp x tp); the rest run on 2."""


@pytest.fixture(scope="module")
def two_ranks(request, hf_models, exports):
    wanted = selected_cases(request)
    cases = {k: _overrides(hf_models, fam, o) for k, (fam, o) in {**LAYOUTS, **WITH_PRECISION}.items()
             if k in wanted}
    four = {k: cases.pop(k) for k in FOUR_RANKS if k in cases}
    cases["export_fsdp"] = _overrides(hf_models, "gpt_neox", ["parallel=fsdp", *export_overrides(exports, "fsdp")])
    outcomes = spawn_cases(trial_curves_case, 2, cases, timeout=300)
    return outcomes | (spawn_cases(trial_curves_case, 4, four, timeout=300) if four else {})


@pytest.mark.parametrize("case", list(LAYOUTS))
def test_other_family_trains_like_one_process(references, two_ranks, case):
    ref_train, ref_val, status = references[LAYOUTS[case][0]].result()
    assert status == names.STATUS_FINISHED
    assert ref_train[-1] < ref_train[0]  # it learns
    train, val, status = two_ranks[case].result()
    assert status == names.STATUS_FINISHED
    assert train == pytest.approx(ref_train, rel=1e-5)
    assert val == pytest.approx(ref_val, rel=1e-5)


@pytest.mark.parametrize("case", list(WITH_PRECISION))
def test_other_family_composes_with_a_precision_mode(references, two_ranks, case):
    ref_train, _, _ = references[WITH_PRECISION[case][0]].result()
    train, _, status = two_ranks[case].result()
    assert status == names.STATUS_FINISHED
    assert train == pytest.approx(ref_train, rel=2e-2)
    assert train != pytest.approx(ref_train, rel=1e-6)


def test_step_zero_loss_is_transformers_loss(references, hf_models):
    train, _, _ = references["gpt_neox"].result()
    assert train[0] == pytest.approx(transformers_first_loss(_overrides(hf_models, "gpt_neox", []), hf_models["gpt_neox"]),
                                     abs=1e-5)


def test_export_from_fsdp_loads_into_transformers_as_the_trained_model(references, two_ranks, exports, hf_models):
    references["gpt_neox"].result()
    assert two_ranks["export_fsdp"].result()[2] == names.STATUS_FINISHED
    one = transformers_logits(exports / "one" / names.ARTIFACT_HF_MODEL)
    assert torch.allclose(transformers_logits(exports / "fsdp" / names.ARTIFACT_HF_MODEL), one, atol=1e-4, rtol=0)
    assert not torch.allclose(transformers_logits(hf_models["gpt_neox"]), one, atol=1e-3)
