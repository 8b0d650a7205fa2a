"""model=hf beyond the Llama family: GPT-NeoX, Gemma and Phi run by transformers' own forward
(models.hf_any). The pretrained weights are transformers', under the names its checkpoints use;
the init is the same in every process; the blocks are where FSDP, checkpointing and compile look;
MFU counts the module; what trainlab cannot do with them is refused before Ray with the fix."""

from __future__ import annotations

import json

import pytest
import torch

from trainlab.config.hf_model import TESTED_OTHER_FAMILIES
from trainlab.config.schema import ModelConfig
from trainlab.models import build_model, num_params
from trainlab.models.hf_demo import write_demo_model
from trainlab.models.hf_weights import load_pretrained, pretrained_state
from trainlab.models.init import materialize


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_any")
    return {f: write_demo_model(root / f, family=f, vocab_size=300, seed=i) for i, f in enumerate(TESTED_OTHER_FAMILIES)}


def _model(folder, *, seed=3):
    cfg = ModelConfig(name="hf", pretrained=str(folder))
    with torch.device("meta"):
        model = build_model(cfg, vocab_size=300)
    materialize(model, device="cpu", seed=seed)
    return cfg, model


TOKENS = torch.randint(0, 300, (2, 24), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("family", TESTED_OTHER_FAMILIES)
def test_pretrained_model_gives_transformers_logits(saved, family):
    from transformers import AutoModelForCausalLM

    _, model = _model(saved[family])
    before = model(TOKENS)
    assert load_pretrained(model, str(saved[family])) == len(list(model.parameters()))
    reference = AutoModelForCausalLM.from_pretrained(saved[family], dtype=torch.float32)
    with torch.no_grad():
        expected = reference(input_ids=TOKENS).logits
        assert torch.equal(model(TOKENS), expected)
        assert not torch.allclose(before, expected, atol=1e-3)  # the load replaced the random init


def test_names_are_the_checkpoints_and_blocks_sit_in_layers(saved):
    """GPT-NeoX's head is lm_head in memory but embed_out in its checkpoints (transformers renames
    it on load and back on save): trainlab reads and writes the checkpoint's names."""
    from safetensors import safe_open

    _, model = _model(saved["gpt_neox"])
    with safe_open(str(saved["gpt_neox"] / "model.safetensors"), "pt") as f:
        assert set(pretrained_state(model)) == set(f.keys())
    assert model.checkpoint_key("output.weight") == "embed_out.weight"
    assert model.checkpoint_key("layers.1.attention.dense.weight") == "gpt_neox.layers.1.attention.dense.weight"
    assert model.layers is model.lm.gpt_neox.layers and len(model.layers) == 2
    assert num_params(model) == num_params(model.lm)  # every module registered once


def test_random_init_is_the_same_in_every_process_and_follows_the_seed(saved):
    _, a = _model(saved["gemma"], seed=5)
    _, b = _model(saved["gemma"], seed=5)
    _, c = _model(saved["gemma"], seed=6)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
        if "norm" not in name:
            assert not torch.equal(pa, pc), name
    # transformers' own init of the family: Gemma's RMSNorm gains start at 0 (it scales by 1 + w)
    assert a.norm.weight.abs().sum() == 0
    assert torch.isfinite(a(TOKENS)).all()


def test_checkpointed_blocks_give_the_same_loss_and_gradients(saved):
    from trainlab.parallel.activation_checkpoint import apply_activation_checkpointing

    losses, grads = [], []
    for checkpointed in (False, True):
        _, model = _model(saved["phi"])
        if checkpointed:
            assert apply_activation_checkpointing(model, "block") == 2
        loss = model(TOKENS).logsumexp(-1).mean()
        loss.backward()
        losses.append(loss.item())
        grads.append(model.layers[0].mlp.fc1.weight.grad.clone())
    assert losses[0] == losses[1]
    assert torch.equal(grads[0], grads[1])


def test_mfu_counts_the_modules_parameters_and_attention(saved):
    from trainlab.models.accounting import model_flops_per_token

    cfg, model = _model(saved["gpt_neox"])
    embedding = model.embed_in.weight.numel()
    expected = 6 * (num_params(model) - embedding) + 12 * 2 * 4 * 16 * 128
    assert model_flops_per_token(cfg, model, vocab_size=300, seq_len=128) == expected


def test_gpt2_style_keys_fill_the_model_section(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "gpt2", "n_embd": 64, "n_layer": 3, "n_head": 4, "n_inner": None, "n_positions": 128,
         "vocab_size": 300, "layer_norm_epsilon": 1e-5}))
    cfg = ModelConfig(name="hf", config=str(tmp_path))
    assert (cfg.dim, cfg.n_layers, cfg.n_heads, cfg.ffn_dim, cfg.max_seq_len, cfg.norm_eps) == (64, 3, 4, 256, 128, 1e-5)
    assert cfg.runs_transformers_forward()


def _run(saved, family, *extra):
    from trainlab.config import compose_run_config

    return compose_run_config(["model=hf", f"model.pretrained={saved[family]}", "data=text", *extra])


@pytest.mark.parametrize("layout, says", [
    (["parallel=pp"], r"parallel.pp=2 with a gpt_neox model: trainlab cuts only the Llama family .* use parallel.pp=1 "
                      r"with parallel.data_parallel=fsdp"),
    (["parallel=tp"], r"parallel.tp=2 with a gpt_neox model: .*knows the Llama family's names only; give this "
                      r"model's plan in model.tp_plan"),
])
def test_layouts_it_cannot_cut_are_refused_with_the_alternative(saved, layout, says):
    from trainlab.plan.derive_layout import check_parallel

    with pytest.raises(ValueError, match=says):
        check_parallel(_run(saved, "gpt_neox", *layout))


def test_estimate_counts_the_models_own_state(saved):
    """trainlab estimate sizes another family from its meta-device model: the parameters it shards
    are the live model's, its FLOPs per token are MFU's."""
    from trainlab.estimate.shape import model_shape
    from trainlab.models.accounting import model_flops_per_token

    cfg, model = _model(saved["phi"])
    shape = model_shape(_run(saved, "phi"))
    assert shape.params == num_params(model)
    assert shape.block_params == num_params(model.layers[1])
    assert shape.model_flops_per_token(32) == model_flops_per_token(cfg, model, vocab_size=300, seq_len=32)


def test_an_architecture_transformers_does_not_know_is_refused_before_ray(tmp_path):
    from trainlab.models.hf_any import check_architecture

    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "not_a_real_arch", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "vocab_size": 300}))
    cfg = ModelConfig(name="hf", config=str(tmp_path))
    with pytest.raises(ValueError, match=rf"model.config='{tmp_path}': transformers cannot build a causal LM from its "
                                         r"config.json .*AutoModelForCausalLM knows"):
        check_architecture(cfg)


def test_export_loads_into_transformers_with_the_same_logits(saved, tmp_path):
    from transformers import AutoModelForCausalLM

    from trainlab.models.hf_export import export_hf

    cfg, model = _model(saved["gpt_neox"], seed=11)  # a random init: not the saved weights
    out = export_hf(model, cfg=cfg, out_dir=tmp_path / "hf_model", trial_hash="t")
    with torch.no_grad():
        loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)(input_ids=TOKENS).logits
        assert torch.equal(loaded, model(TOKENS))


def test_estimate_command_shows_the_family(saved, capsys):
    from trainlab.estimate_command import main

    main(["model=hf", f"model.pretrained={saved['gpt_neox']}", "data=text", "parallel=fsdp"])
    out = capsys.readouterr().out
    assert "fits" in out and "MFU" in out


def test_estimate_command_says_what_it_cannot_size_in_one_line(capsys):
    from trainlab.estimate_command import main

    with pytest.raises(SystemExit) as stop:
        main(["model=custom", "model._target_=custom_model.build"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.startswith("error: model._target_='custom_model.build': trainlab estimates")
