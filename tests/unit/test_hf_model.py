"""model=hf: transformers' Llama-family models as trainlab's model. The decoder loop equals
transformers' own forward, the counts equal the live model's, the pretrained weights are what
transformers loads, and what cannot work is refused with the field and the fix."""

from __future__ import annotations

import pytest
import torch

from trainlab.config.schema import ModelConfig
from trainlab.models import build_model, count_params, flops_per_token, num_params, resolve_dims
from trainlab.models.hf_demo import write_demo_model
from trainlab.models.hf_weights import load_pretrained
from trainlab.models.init import materialize
from trainlab.parallel.tp import check_tp

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {f: write_demo_model(root / f, family=f, vocab_size=300, seed=i) for i, f in enumerate(FAMILIES)}


def _trainlab_model(folder, *, seed=3):
    cfg = ModelConfig(name="hf", pretrained=str(folder))
    with torch.device("meta"):
        model = build_model(cfg, vocab_size=300)
    materialize(model, device="cpu", seed=seed)
    return cfg, model


@pytest.mark.parametrize("family", FAMILIES)
def test_pretrained_model_gives_transformers_logits(saved, family):
    from transformers import AutoModelForCausalLM

    _, model = _trainlab_model(saved[family])
    tokens = torch.randint(0, 300, (2, 24), generator=torch.Generator().manual_seed(0))
    before = model(tokens)
    assert load_pretrained(model, str(saved[family])) == len(list(model.parameters()))
    reference = AutoModelForCausalLM.from_pretrained(saved[family], dtype=torch.float32)
    with torch.no_grad():
        expected = reference(input_ids=tokens).logits
        assert torch.allclose(model(tokens), expected, atol=1e-5, rtol=0)
        assert not torch.allclose(before, expected, atol=1e-3)  # the load replaced the random init


@pytest.mark.parametrize("family", FAMILIES)
def test_counts_are_the_models_own(saved, family):
    """Parameter count from the config equals the live model's; MFU's FLOPs per token equal the
    built-in model's accounting for an equal Llama shape (6N + attention)."""
    cfg, model = _trainlab_model(saved[family])
    args = resolve_dims(cfg, vocab_size=300)
    assert count_params(args) == num_params(model)
    attention = 12 * args.n_layers * args.n_heads * args.head_dim * 128
    assert flops_per_token(args, seq_len=128) == 6 * num_params(model, exclude_embedding=True) + attention


def test_llama_counts_equal_the_same_shape_of_trainlabs_own_model(saved):
    hf = resolve_dims(ModelConfig(name="hf", pretrained=str(saved["llama"])), vocab_size=300)
    own = resolve_dims(ModelConfig(name="own", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=192,
                                   max_seq_len=512), vocab_size=300)
    assert count_params(hf) == count_params(own)
    assert flops_per_token(hf, seq_len=256) == flops_per_token(own, seq_len=256)


def test_random_init_is_the_same_in_every_process_and_follows_the_seed(saved):
    _, a = _trainlab_model(saved["qwen2"], seed=5)
    _, b = _trainlab_model(saved["qwen2"], seed=5)
    _, c = _trainlab_model(saved["qwen2"], seed=6)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
        if "norm" not in name and "bias" not in name:
            assert not torch.equal(pa, pc), name
    assert a.layers[0].self_attn.q_proj.bias.abs().sum() == 0  # transformers' init: zero biases


def test_config_dims_fill_the_model_section(saved):
    cfg = ModelConfig(name="hf", config=str(saved["qwen3"] / "config.json"))
    assert (cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim, cfg.vocab_size) == \
        (64, 2, 4, 2, 16, 192, 300)


def test_hub_name_without_local_copy_is_refused_with_the_way_to_get_one(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"model.pretrained='meta-llama/Llama-3.2-1B' is not a path on this machine: "
                                         r"it names a Hugging Face Hub model, and trainlab downloads nothing; "
                                         r"make a local copy first \(`hf download meta-llama/Llama-3.2-1B --local-dir"):
        ModelConfig(name="hf", pretrained="meta-llama/Llama-3.2-1B")


def test_hub_name_with_a_cached_snapshot_names_the_folder(tmp_path, monkeypatch):
    from huggingface_hub import constants

    snapshot = tmp_path / "hub" / "models--org--tiny" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=f"use the copy in the Hugging Face cache: model.config={snapshot}"):
        ModelConfig(name="hf", config="org/tiny")


@pytest.mark.parametrize("given, says", [
    ({}, "needs one of model.config"),
    ({"config": "x.json", "pretrained": "d"}, "not both"),
    ({"smooth_swiglu": True, "config": "x.json"}, "model.smooth_swiglu=false"),
])
def test_model_hf_fields_are_checked(given, says):
    with pytest.raises(ValueError, match=says):
        ModelConfig(name="hf", **given)


def test_config_without_a_model_type_is_refused(tmp_path):
    (tmp_path / "config.json").write_text('{"hidden_size": 64}')
    with pytest.raises(ValueError, match="has no model_type; point it at a config.json saved by transformers"):
        ModelConfig(name="hf", config=str(tmp_path))


def test_preset_with_a_hugging_face_path_is_told_to_use_model_hf():
    with pytest.raises(ValueError, match=r"model.pretrained is set but model=tiny; .* model=hf"):
        ModelConfig(name="tiny", pretrained="/x")


def test_folder_without_safetensors_is_refused(tmp_path, saved):
    (tmp_path / "config.json").write_text((saved["llama"] / "config.json").read_text())
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    cfg, model = _trainlab_model(saved["llama"])
    with pytest.raises(ValueError, match=r"holds no \*.safetensors weights \(found: config.json, pytorch_model.bin\)"):
        load_pretrained(model, str(tmp_path))


@pytest.mark.parametrize("family, says", [("qwen3", "per-head query/key norms"), ("llama", None)])
def test_tensor_parallel_refuses_what_it_cannot_shard(saved, family, says):
    args = resolve_dims(ModelConfig(name="hf", pretrained=str(saved[family])), vocab_size=300)
    if says:
        with pytest.raises(ValueError, match=says):
            check_tp(args, 2)
    else:
        check_tp(args, 2)


def test_export_loads_into_transformers_with_the_same_logits(saved, tmp_path):
    from transformers import AutoModelForCausalLM

    from trainlab.models.hf_export import export_hf

    cfg, model = _trainlab_model(saved["qwen2"], seed=11)  # a random init: not the saved weights
    out = export_hf(model, cfg=cfg, out_dir=tmp_path / "hf_model", trial_hash="t")
    tokens = torch.randint(0, 300, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)(input_ids=tokens).logits
        assert torch.equal(loaded, model(tokens))


def test_export_needs_a_hugging_face_model():
    from trainlab.config import compose_run_config
    from trainlab.config.validate import check_run

    with pytest.raises(ValueError, match="train.export=hf saves a Hugging Face model; model=tiny"):
        check_run(compose_run_config(["model=tiny", "train.export=hf"]))


def test_swiglu_telemetry_reads_the_hugging_face_mlp(saved):
    """The late-FP8-divergence signals (SwiGLU output amax and outlier ratio, gate/up row
    alignment) come from a Hugging Face MLP as from trainlab's own, under its block indices."""
    from trainlab.names import swiglu_metric
    from trainlab.telemetry.swiglu import SwigluMonitor, w13_alignment

    _, model = _trainlab_model(saved["llama"])
    seen = {}
    mlp = model.layers[1].mlp
    mlp.register_forward_hook(lambda m, inputs, _out: seen.setdefault("x", inputs[0].detach()))
    monitor = SwigluMonitor(model)
    monitor.arm()
    model(torch.randint(0, 300, (2, 16)))
    metrics = monitor.collect()
    h = mlp.act_fn(mlp.gate_proj(seen["x"])) * mlp.up_proj(seen["x"])
    assert metrics[swiglu_metric(1, "amax")] == pytest.approx(h.abs().max().item(), rel=1e-6)
    assert swiglu_metric(0, "outlier_ratio") in metrics
    aligned = w13_alignment(model)
    assert set(aligned) >= {swiglu_metric(0, "w13_alignment"), swiglu_metric(1, "w13_alignment")}
    assert 0 < aligned[swiglu_metric(0, "w13_alignment")] < 1


def test_a_tokenizer_bigger_than_the_model_is_refused_with_the_models_own_tokenizer_as_the_fix(saved):
    from trainlab.config.validate import check_vocab_fits

    with pytest.raises(ValueError, match=r"vocab_size=300 in its config.json\) is smaller than the corpus vocabulary "
                                         r"\(512, data.tokenizer='t'\).*data.tokenizer=MODEL_DIR"):
        check_vocab_fits(ModelConfig(name="hf", pretrained=str(saved["llama"])), 512, source=", data.tokenizer='t'")


def test_pretrained_folder_without_weights_is_refused_before_ray(tmp_path, saved):
    from trainlab.config import compose_run_config
    from trainlab.launch.preflight import check_data

    (tmp_path / "config.json").write_text((saved["llama"] / "config.json").read_text())
    with pytest.raises(ValueError, match=r"holds no \*.safetensors weights"):
        check_data(compose_run_config(["model=hf", f"model.pretrained={tmp_path}", "data=text"]))
