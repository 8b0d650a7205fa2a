"""model=hf beyond the Llama family: any transformers causal LM (GPT-NeoX, Gemma, Phi, ...), run by
its own forward.

    model = build_any_causal_lm(config, args)   # under torch.device("meta"), like the presets
    logits = model(tokens)                      # [B, T] -> [B, T, V]: transformers' forward

trainlab writes its own decoder loop only for the Llama family (models.hf), where pipeline
stages need it. Every other architecture keeps transformers' forward, and `HFAnyCausalLM`
registers the causal LM's modules once each under names the layers above read: its decoder
layers (the ModuleList of its ``_no_split_modules`` class) as ``layers``, its output head as
``output``, everything else under its own last name (``embed_in``, ``final_layer_norm``). So
FSDP2 shards one group per decoder layer, activation checkpointing and compile work per layer,
the precision recipes convert its linears by name and keep ``output`` in high precision, and
the causal LM itself, unregistered, runs the same module objects. `checkpoint_key` maps a name
back to the checkpoint's (``layers.0.attention.dense.weight`` -> ``gpt_neox.layers.0.attention.
dense.weight``). What it cannot do: a pipeline split (its forward is one call) and a
tensor-parallel plan of its own (give one in model.tp_plan).

Initial values are transformers' own ``_init_weights``, run per module on full-size host tensors
under a generator seeded by (seed, module name), then cut to this rank's shard: the same numbers
in every layout, as models.init promises for the presets.
"""

from __future__ import annotations

import torch
from torch import nn

from trainlab.models.args import ModelArgs
from trainlab.models.init import fill_parameter, global_shape, param_seed


class HFAnyCausalLM(nn.Module):
    """A transformers causal LM as trainlab trains it: tokens -> logits, decoder layers in ``layers``."""

    initializes_buffers = True
    """init_weights sets the buffers too (transformers' _init_weights: rotary tables, scales)."""

    def __init__(self, lm: nn.Module, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.config = lm.config
        self.__dict__["lm"] = lm  # not a submodule: its modules are registered below, once each
        self._hf_paths: dict[str, str] = {}
        layers_path = decoder_layers_path(lm)
        head = lm.get_output_embeddings()
        head_path = next((n for n, m in lm.named_modules() if m is head), None)
        if head_path is None:
            raise ValueError(f"{type(lm).__name__} has no output head (get_output_embeddings); model=hf trains "
                             "causal language models (AutoModelForCausalLM)")
        own = {layers_path: "layers", head_path: "output"}
        self._saved_as, self._converted = saved_names(lm)
        for path, module in lm.named_modules():
            if not path or any(path.startswith(p + ".") for p in self._hf_paths.values()):
                continue  # the causal LM itself, or inside a module registered already
            if any(p.startswith(path + ".") for p in own):  # an ancestor of the layers or the head
                _check_holds_nothing(module, path)
                continue
            name = own.get(path) or _free_name(path, taken=self._hf_paths)
            self._hf_paths[name] = path
            self.add_module(name, module)

    def blocks(self) -> list[nn.Module]:
        """The decoder layers in order (as Transformer.blocks)."""
        return list(self.layers)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=tokens, use_cache=False).logits

    def get_input_embeddings_weight(self) -> torch.Tensor:
        return self.lm.get_input_embeddings().weight

    def checkpoint_key(self, name: str) -> str:
        """trainlab's parameter name -> the checkpoint's, as transformers saves it ('output.weight' ->
        'lm_head.weight' in memory -> 'embed_out.weight' in a GPT-NeoX checkpoint)."""
        top, _, rest = name.partition(".")
        if top not in self._hf_paths:
            raise KeyError(f"{name} is not a parameter of this {type(self.lm).__name__}")
        in_memory = f"{self._hf_paths[top]}.{rest}"
        if in_memory in self._converted:
            raise ValueError(
                f"{type(self.lm).__name__} stores {in_memory} converted (transformers reshapes it on load), so "
                "trainlab cannot read or write it shard by shard: train this family from model.config (random "
                "init) without train.export, or use a Llama-family model")
        return self._saved_as.get(in_memory, in_memory)

    @torch.no_grad()
    def init_weights(self, *, seed: int | None = None) -> None:
        """transformers' `_init_weights` of every module, on its full-size parameters drawn from
        (seed, module name); this rank keeps its shard of each. Buffers are set in place."""
        if seed is None:
            seed = int(torch.randint(0, 2**62, (), device="cpu"))
        for name, module in self.named_modules():
            direct = dict(module.named_parameters(recurse=False))
            if not direct and next(module.buffers(recurse=False), None) is None:
                continue
            full = {k: nn.Parameter(torch.empty(global_shape(p), dtype=torch.float32)) for k, p in direct.items()}
            for k, p in full.items():
                module._parameters[k] = p
            try:
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(param_seed(seed, name))
                    self.lm._init_weights(module)
            finally:
                for k, p in direct.items():
                    module._parameters[k] = p
            for k, p in direct.items():
                fill_parameter(p, lambda t, _g, src=full[k]: t.copy_(src), seed=seed, name=f"{name}.{k}")


def saved_names(lm: nn.Module) -> tuple[dict[str, str], set[str]]:
    """({name in memory: name in the checkpoint}, names transformers converts beyond a rename) of
    `lm`'s parameters: transformers v5 renames some modules on load (GPT-NeoX's embed_out is its
    lm_head) and reverts the renames on save_pretrained; its own mapping says which."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import (
        PrefixChange,
        WeightConverter,
        WeightRenaming,
        rename_source_key,
    )

    forward = [t for t in get_model_conversion_mapping(lm, add_legacy=False) if not isinstance(t, PrefixChange)]
    reverse = [t.reverse_transform() for t in forward[::-1]]
    renamings = [t for t in reverse if isinstance(t, WeightRenaming)]
    converters = [t for t in reverse if isinstance(t, WeightConverter)]
    saved, converted = {}, set()
    for name, _ in lm.named_parameters():
        key, converter = rename_source_key(name, renamings, converters, reverse=True)
        saved[name] = key
        if converter is not None:
            converted.add(name)
    return saved, converted


def decoder_layers_path(lm: nn.Module) -> str:
    """Where `lm` keeps its decoder layers: the ModuleList whose children are its
    ``_no_split_modules`` class (transformers' own answer to "what is one block")."""
    kinds = set(getattr(lm, "_no_split_modules", None) or ())
    for path, module in lm.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) and all(
                type(child).__name__ in kinds for child in module):
            return path
    raise ValueError(
        f"{type(lm).__name__} declares no list of decoder layers (_no_split_modules={sorted(kinds)}); trainlab "
        "shards, checkpoints and compiles a model per decoder layer: use model=custom with a builder that "
        "returns the model with its blocks in .layers")


def _check_holds_nothing(module: nn.Module, path: str) -> None:
    held = [n for n, _ in (*module.named_parameters(recurse=False), *module.named_buffers(recurse=False))]
    if held:
        raise ValueError(f"{type(module).__name__} at {path or 'the top'} holds {', '.join(held)} itself, "
                         "beside its decoder layers; model=hf cannot place them: use model=custom")


def _free_name(path: str, *, taken: dict[str, str]) -> str:
    name = path.rsplit(".", 1)[-1]
    return name if name not in taken and name not in ("layers", "output") else path.replace(".", "_")


def check_architecture(cfg) -> None:
    """model=hf of a family outside the Llama family, built on the meta device on the driver (its
    first decoder layers only: models.hf_checks.shallow_model): a model_type transformers does not
    know, or a model without a list of decoder layers, is refused before Ray starts (ValueError
    naming the field)."""
    from trainlab.models.hf_checks import shallow_model

    shallow_model(cfg)


def build_any_causal_lm(config, args: ModelArgs) -> HFAnyCausalLM:
    """`config`'s causal LM (transformers' AutoModelForCausalLM) on the current default device."""
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa",
                                          trust_remote_code=False)
    return HFAnyCausalLM(lm, args)


__all__ = ["HFAnyCausalLM", "build_any_causal_lm", "check_architecture", "decoder_layers_path", "saved_names"]
