"""The Llama-style model, its config resolution, presets and size/FLOP accounting."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from trainlab.config.schema import HF_MODEL_FIELDS, ModelConfig
from trainlab.models import (
    ModelArgs,
    Transformer,
    build_model,
    count_params,
    flops_per_token,
    num_params,
    resolve_dims,
)

CONF_MODEL = Path(__file__).resolve().parents[2] / "conf" / "model"
PRESETS = ("tiny", "small", "125m", "350m", "1b", "7b", "llama3_8b")
BYTE_VOCAB = 256


def tiny_cfg(**overrides) -> ModelConfig:
    fields = dict(name="tiny", dim=64, n_layers=2, n_heads=4, max_seq_len=64)
    fields.update(overrides)
    return ModelConfig(**fields)


def tiny_model(seed: int = 0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    return build_model(tiny_cfg(**overrides), vocab_size=BYTE_VOCAB)


def tokens(b: int = 2, t: int = 16, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, BYTE_VOCAB, (b, t), generator=g)


def load_preset(name: str) -> ModelConfig:
    raw = OmegaConf.to_container(OmegaConf.load(CONF_MODEL / f"{name}.yaml"))
    assert raw.pop("defaults") == ["/model_schema@_here_", "_self_"]
    return ModelConfig(**raw)


# --- config resolution ----------------------------------------------------------------
def test_resolve_dims_fills_sentinels():
    args = resolve_dims(tiny_cfg(), vocab_size=BYTE_VOCAB)
    assert (args.n_kv_heads, args.head_dim, args.vocab_size) == (4, 16, 256)
    assert args.ffn_dim == 192  # 8/3 * 64 = 170.7, rounded up to a multiple of 32
    padded = resolve_dims(tiny_cfg(vocab_size=320, n_kv_heads=2, ffn_dim=100), vocab_size=256)
    assert (padded.vocab_size, padded.n_kv_heads, padded.ffn_dim) == (320, 2, 100)


def test_vocab_smaller_than_corpus_is_a_user_error():
    with pytest.raises(ValueError, match="model.vocab_size=100"):
        build_model(tiny_cfg(vocab_size=100), vocab_size=BYTE_VOCAB)


def test_dictconfig_input_runs_schema_checks():
    structured = OmegaConf.merge(OmegaConf.structured(ModelConfig), {"name": "x", "dim": 66})
    with pytest.raises(ValueError, match="model.dim=66"):
        resolve_dims(structured, vocab_size=BYTE_VOCAB)


# --- forward behaviour -----------------------------------------------------------------
def test_forward_shape_and_dtype():
    model = tiny_model()
    logits = model(tokens(3, 20))
    assert logits.shape == (3, 20, BYTE_VOCAB)
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()


def test_causal_future_tokens_do_not_change_past_logits():
    model = tiny_model().eval()
    x = tokens(2, 24)
    y = x.clone()
    y[:, 15] = (y[:, 15] + 1) % BYTE_VOCAB
    with torch.no_grad():
        lx, ly = model(x), model(y)
    torch.testing.assert_close(lx[:, :15], ly[:, :15], rtol=0, atol=1e-6)
    assert not torch.allclose(lx[:, 15:], ly[:, 15:])


def test_sequence_longer_than_max_seq_len_is_refused():
    model = tiny_model(max_seq_len=16)
    with pytest.raises(AssertionError, match="max_seq_len=16"):
        model(tokens(1, 17))


def test_bf16_autocast_forward_backward():
    model = tiny_model()
    x = tokens(2, 32)
    ref = model(x).detach()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x[:, :-1])
    assert logits.dtype == torch.bfloat16
    # Same function, bf16 rounding only.
    torch.testing.assert_close(logits.float(), ref[:, :-1], rtol=0, atol=0.05)
    loss = F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and g.dtype == torch.float32 and torch.isfinite(g).all()
               for g in grads)


def test_pure_bf16_model_forward_backward():
    model = tiny_model().to(torch.bfloat16)
    x = tokens(2, 32)
    logits = model(x[:, :-1])
    assert logits.dtype == torch.bfloat16
    # RMSNorm computes in fp32 internally but hands back the input dtype.
    assert model.norm(torch.randn(2, 64, dtype=torch.bfloat16)).dtype == torch.bfloat16
    loss = F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad.dtype == torch.bfloat16 and torch.isfinite(p.grad).all()
               for p in model.parameters())


def test_grouped_query_attention_equals_mha_with_shared_heads():
    """GQA with 2 kv heads == MHA whose 4 kv heads are those 2, each used twice."""
    gqa = tiny_model(n_kv_heads=2)
    assert gqa.layers[0].attention.wk.weight.shape == (2 * 16, 64)
    mha = tiny_model(seed=1)
    state = gqa.state_dict()
    for key, value in state.items():
        if key.endswith(("attention.wk.weight", "attention.wv.weight")):
            # Query head h reads kv head h // n_rep: repeat each kv head's rows in place.
            state[key] = value.view(2, 16, 64).repeat_interleave(2, dim=0).reshape(64, 64)
    mha.load_state_dict(state)
    x = tokens(2, 24)
    with torch.no_grad():
        torch.testing.assert_close(gqa(x), mha(x))


# --- init ------------------------------------------------------------------------------
def test_init_is_deterministic_under_a_seed():
    a, b, c = tiny_model(seed=7).state_dict(), tiny_model(seed=7).state_dict(), \
        tiny_model(seed=8).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["layers.0.attention.wq.weight"], c["layers.0.attention.wq.weight"])


def test_init_scales_residual_projections():
    model = tiny_model(dim=128, n_layers=8, n_heads=4)
    block = model.layers[3]
    std, out_std = 0.02, 0.02 / (2 * 8) ** 0.5
    assert block.attention.wq.weight.std().item() == pytest.approx(std, rel=0.05)
    assert model.output.weight.std().item() == pytest.approx(std, rel=0.05)
    assert block.attention.wo.weight.std().item() == pytest.approx(out_std, rel=0.05)
    assert block.feed_forward.w2.weight.std().item() == pytest.approx(out_std, rel=0.05)
    assert torch.equal(block.ffn_norm.weight, torch.ones(128))


def test_meta_construction_then_materialize_matches_eager():
    torch.manual_seed(0)
    with torch.device("meta"):
        model = build_model(tiny_cfg(), vocab_size=BYTE_VOCAB)
    model = model.to_empty(device="cpu")
    torch.manual_seed(0)
    model.init_weights()
    eager = tiny_model(seed=0)
    torch.testing.assert_close(model.rope_cos, eager.rope_cos)
    x = tokens()
    with torch.no_grad():
        assert torch.isfinite(model(x)).all()
        assert model(x).shape == eager(x).shape


# --- presets ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", PRESETS)
def test_preset_yaml_is_explicit_and_valid(name):
    cfg = load_preset(name)
    assert cfg.name == name
    raw = OmegaConf.load(CONF_MODEL / f"{name}.yaml")
    # Every dimension is spelled out, so a preset never silently follows a schema default.
    assert set(raw) - {"defaults"} == {f.name for f in dataclasses.fields(ModelConfig)} - set(HF_MODEL_FIELDS)


def test_presets_compose_through_hydra_schema():
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from trainlab.config.schema import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_MODEL.parent), version_base=None):
        for name in PRESETS:
            composed = compose(config_name=None, overrides=[f"+model={name}"])
            model_cfg = OmegaConf.to_object(composed.model)
            assert isinstance(model_cfg, ModelConfig) and model_cfg == load_preset(name)
    GlobalHydra.instance().clear()


def test_tiny_and_small_param_counts():
    torch.manual_seed(0)
    tiny = build_model(load_preset("tiny"), vocab_size=BYTE_VOCAB)
    small = build_model(load_preset("small"), vocab_size=BYTE_VOCAB)
    # Documented in the YAML headers.
    assert num_params(tiny) == count_params(tiny.args) == 139_584
    assert num_params(small) == count_params(small.args) == 3_344_640
    assert num_params(tiny, exclude_embedding=True) == 139_584 - BYTE_VOCAB * 64


@pytest.mark.parametrize("name,target", [("125m", 125e6), ("350m", 350e6), ("1b", 1e9),
                                         ("7b", 7e9)])
def test_large_presets_land_near_their_names(name, target):
    cfg = load_preset(name)
    args = resolve_dims(cfg, vocab_size=32000)
    n = count_params(args)
    assert abs(n - target) / target < 0.2, f"{name}: {n:,} parameters"
    # The analytic count agrees with the module, built without allocating it.
    with torch.device("meta"):
        model = build_model(cfg, vocab_size=32000)
    assert num_params(model) == n
    if name == "7b":
        assert n == 6_738_415_616  # Llama-2-7B


# --- accounting ------------------------------------------------------------------------
def test_flops_per_token_hand_computed():
    args = ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=4, head_dim=16, ffn_dim=192,
                     vocab_size=256, max_seq_len=256)
    # Per layer: attention 4 * 64^2 = 16384, MLP 3 * 64 * 192 = 36864, norms 128.
    # Without the token embedding: 2 * 53376 + final norm 64 + head 64 * 256 = 123200.
    n = 2 * (16384 + 36864 + 128) + 64 + 64 * 256
    assert n == 123_200 == count_params(args, exclude_embedding=True)
    expected = 6 * n + 12 * 2 * 64 * 128
    assert flops_per_token(args, seq_len=128) == expected == 935_808
    assert flops_per_token(args, seq_len=128) > 6 * count_params(args)
    with pytest.raises(ValueError, match="seq_len"):
        flops_per_token(args, seq_len=0)


# --- learning --------------------------------------------------------------------------
def test_tiny_model_overfits_one_batch():
    model = tiny_model()
    x = tokens(4, 33)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(50):
        logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(torch.log(torch.tensor(256.0)).item(), rel=0.05)
    assert losses[-1] < 0.5 * losses[0], losses[::10]
