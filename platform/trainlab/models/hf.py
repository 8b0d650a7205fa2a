"""model=hf: a Hugging Face causal LM of the Llama family (llama, mistral, qwen2, qwen3) under trainlab's
model anatomy (any other family: models.hf_any).

    model = build_hf_model(cfg.model)          # under torch.device("meta"), like the presets
    logits = model(tokens)                     # [B, T] -> [B, T, V], as Transformer

`HFCausalLM` holds transformers' own modules (its decoder layers, norms, embedding, head and
rotary table) under the names trainlab's Transformer uses at the top: ``tok_embeddings``,
``layers``, ``norm``, ``output``. Everything that shards, splits, casts or probes a model by
those names (FSDP2 per block, the pipeline split, activation checkpointing, compile, the FP8
module filter, per-layer numerics, NaN injection) then applies unchanged, and inside a block the
names are the model's own (``layers.3.self_attn.q_proj``, ``layers.3.mlp.down_proj``).
`hf_key` maps a name back to the checkpoint's (``model.layers.3.self_attn.q_proj.weight``).

The forward is the decoder loop of transformers' LlamaModel with no cache and no mask (SDPA's
causal kernel), written once here so a pipeline stage can run its share of it; the tests hold it
equal to transformers' own forward for every family in config.hf_model.HF_FAMILIES.
"""

from __future__ import annotations

import dataclasses
import types

import torch
from torch import nn

from trainlab.config.hf_model import config_json_path, own_loop
from trainlab.config.schema import ModelConfig
from trainlab.models.args import ModelArgs, resolve_dims
from trainlab.models.block_names import HF_LLAMA_BLOCK
from trainlab.models.hf_config_file import load_hf_config
from trainlab.models.init import Fill, fill_parameter, normal, ones

_TOP = {"tok_embeddings": "embed_tokens", "layers": "layers", "norm": "norm"}
"""trainlab's top-level name -> the name under the causal LM's base model (`base_model_prefix`)."""


def quiet_transformers() -> None:
    """What transformers prints that is not trainlab's to say: its progress bars (a tiny model's save
    or load). torchao's kernel-loading lines, which importing transformers triggers, are dropped
    for every entry point (vocab.quiet)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def hf_config(cfg: ModelConfig):
    """transformers' config of model=hf (read from the local folder or file; never the hub, never
    running code from the folder: models.hf_config_file), with SDPA attention: trainlab's loop
    passes no mask and relies on SDPA's causal kernel."""
    quiet_transformers()
    value, field = cfg.hf_source()
    config = load_hf_config(config_json_path(value, field), field=field, value=value)
    config._attn_implementation = "sdpa"
    config.use_cache = False
    return config


class HFCausalLM(nn.Module):
    """A transformers causal LM as trainlab trains it: tokens -> logits, blocks in ``layers``.

    Built on the meta device, then sharded/split and given storage by `models.init.materialize`,
    which calls `init_weights` (transformers' init: N(0, initializer_range) weights, zero biases,
    unit norms, each from its own name's generator) and the rotary table's `init_buffers`. A
    pretrained model's weights are then loaded over them (models.hf_weights).
    """

    block_names = HF_LLAMA_BLOCK

    def __init__(self, lm: nn.Module, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.config = lm.config
        self.base_prefix = lm.base_model_prefix
        base = getattr(lm, self.base_prefix)
        self.tok_embeddings = base.embed_tokens
        self.layers = base.layers
        self.norm = base.norm
        self.output = lm.lm_head
        self.rotary = base.rotary_emb
        # transformers' rotary module owns non-persistent buffers (inv_freq) that a meta-device
        # build leaves empty: it recomputes them, as its own __init__ does, when materialised
        self.rotary.init_buffers = types.MethodType(_init_rotary_buffers, self.rotary)
        if args.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def checkpoint_key(self, name: str) -> str:
        """trainlab's parameter name -> the checkpoint's (hf_key)."""
        return hf_key(name, base_prefix=self.base_prefix)

    def blocks(self) -> list[nn.Module]:
        """The decoder layers in order: all of them, or a pipeline stage's share (a ModuleDict
        keyed by their index in the full model, as Transformer.blocks)."""
        if isinstance(self.layers, nn.ModuleDict):
            return list(self.layers.values())
        return list(self.layers)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, T] -> logits [B, T, V]; a pipeline stage without an embedding takes the
        previous stage's hidden state and one without the head returns its own."""
        t = tokens.shape[1]
        assert t <= self.args.max_seq_len, (
            f"sequence length {t} exceeds the model's context {self.args.max_seq_len}")
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        position_ids = torch.arange(t, device=h.device).unsqueeze(0)
        position_embeddings = self.rotary(h, position_ids)
        for layer in self.blocks():
            h = layer(h, attention_mask=None, position_ids=position_ids,
                      position_embeddings=position_embeddings)
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None else h

    @torch.no_grad()
    def init_weights(self, *, seed: int | None = None) -> None:
        """transformers' initialisation, each parameter from its own (seed, name) generator so
        every layout gets the one-process values (models.init)."""
        if seed is None:
            seed = int(torch.randint(0, 2**62, (), device="cpu"))
        fills = self._param_fills()
        for name, param in self.named_parameters():
            fill_parameter(param, fills[name], seed=seed, name=name)
        for module in self.modules():
            if module is not self and hasattr(module, "init_buffers"):
                module.init_buffers()

    def _param_fills(self) -> dict[str, Fill]:
        std = self.args.init_std
        fills: dict[str, Fill] = {}
        for prefix, module in self.named_modules():
            for pname, _ in module.named_parameters(recurse=False):
                name = f"{prefix}.{pname}" if prefix else pname
                if pname == "bias":
                    fills[name] = lambda t, _g: t.zero_()
                elif isinstance(module, (nn.Linear, nn.Embedding)):
                    fills[name] = normal(std)
                else:  # the RMSNorms (transformers: weight = ones)
                    assert pname == "weight" and "norm" in type(module).__name__.lower(), (
                        f"no init rule for {name} ({type(module).__name__})")
                    fills[name] = ones()
        return fills


@torch.no_grad()
def _init_rotary_buffers(rotary: nn.Module) -> None:
    # what transformers' rotary __init__ computes (LlamaRotaryEmbedding and its copies)
    if rotary.rope_type == "default":
        inv_freq, rotary.attention_scaling = rotary.compute_default_rope_parameters(rotary.config)
    else:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        inv_freq, rotary.attention_scaling = ROPE_INIT_FUNCTIONS[rotary.rope_type](rotary.config, None)
    rotary.inv_freq.copy_(inv_freq.to(rotary.inv_freq.device))
    rotary.original_inv_freq.copy_(inv_freq.to(rotary.original_inv_freq.device))


def build_hf_model(cfg: ModelConfig, *, vocab_size: int, num_layers: int | None = None) -> nn.Module:
    """model=hf's model from its config, on the current default device (meta: shapes only): the
    Llama family under trainlab's decoder loop, any other causal LM under its own (models.hf_any).
    `num_layers`: only the first so many decoder layers (a driver's check of a model of any depth,
    models.hf_checks: building every layer of a 100,000-layer config takes minutes even on meta)."""
    from transformers import AutoModelForCausalLM

    args = resolve_dims(cfg, vocab_size=vocab_size)
    config = hf_config(cfg)
    if num_layers is not None and num_layers < args.n_layers:
        args = dataclasses.replace(args, n_layers=num_layers)
        if isinstance(getattr(config, "layer_types", None), list):  # one entry per layer (sliding or full)
            config.layer_types = config.layer_types[:num_layers]
        config.num_hidden_layers = num_layers
    if not own_loop(args.hf_family):
        from trainlab.models.hf_any import build_any_causal_lm

        return build_any_causal_lm(config, args)
    lm = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa",
                                          trust_remote_code=False)
    return HFCausalLM(lm, args)


def hf_key(name: str, *, base_prefix: str = "model") -> str:
    """trainlab's parameter name -> the Hugging Face checkpoint's ('layers.0.mlp.up_proj.weight'
    -> 'model.layers.0.mlp.up_proj.weight', 'output.weight' -> 'lm_head.weight')."""
    top, _, rest = name.partition(".")
    if top == "output":
        return f"lm_head.{rest}"
    if top in _TOP:
        return f"{base_prefix}.{_TOP[top]}.{rest}"
    raise KeyError(f"{name} is not a parameter of a Hugging Face causal LM")


__all__ = ["HFCausalLM", "build_hf_model", "hf_config", "hf_key", "quiet_transformers"]
