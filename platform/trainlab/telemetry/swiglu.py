"""SwiGLU outlier telemetry: the activation and weight signals of late FP8 divergence.

Fishman et al. ("Scaling FP8 training to trillion-token LLMs", ICLR 2025) trace late FP8
divergence to channels whose gate (w1) and up (w3) weight rows align over training: the
SwiGLU output silu(w1 x) * (w3 x) of such a channel grows quadratically into an outlier
that the down projection's input cast must absorb. Two signals, both per block:

- activation (`SwigluMonitor`): amax of the SwiGLU output and amax / rms, the outlier
  ratio, sampled through each FeedForward's ``swiglu_tap`` (a Hugging Face MLP's
  ``down_proj`` input) only while armed;
- weights (`w13_alignment`): the largest |cos| between a channel's w1 and w3 rows, which
  rises before the outliers do.

    monitor = SwigluMonitor(model)
    monitor.arm()                      # before the forwards of a sampled step
    ...forward/backward of every micro-batch...
    metrics = monitor.collect() | w13_alignment(model)
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from trainlab.models.block_names import HF_LLAMA_BLOCK
from trainlab.models.transformer import FeedForward
from trainlab.names import (
    NUM_SWIGLU_ALIGNMENT,
    NUM_SWIGLU_AMAX,
    NUM_SWIGLU_OUTLIER,
    swiglu_metric,
)
from trainlab.telemetry.sharded import full


@dataclass(frozen=True)
class _Swiglu:
    """One block's SwiGLU MLP by role: its gate and up projections and where its output h shows."""

    gate: nn.Module
    up: nn.Module
    tap: nn.Module
    """Transformer: the identity ``swiglu_tap`` (h is its output); a Hugging Face MLP: the down
    projection (h is its input)."""
    h_is_input: bool


def _as_swiglu(module: nn.Module) -> _Swiglu | None:
    if isinstance(module, FeedForward):
        return _Swiglu(module.w1, module.w3, module.swiglu_tap, h_is_input=False)
    names = HF_LLAMA_BLOCK  # transformers' LlamaMLP and its copies: down(act(gate(x)) * up(x))
    gate, up, down = (getattr(module, n.rsplit(".", 1)[-1], None) for n in (names.gate, names.up, names.down))
    if all(isinstance(m, nn.Module) for m in (gate, up, down)):
        return _Swiglu(gate, up, down, h_is_input=True)
    return None


def _feed_forwards(model: nn.Module) -> list[tuple[int, _Swiglu]]:
    """Every SwiGLU MLP with its block index, through any wrapper (DDP's ``module``,
    torch.compile's ``_orig_mod``): found by what it holds, indexed by the number after
    ``layers`` in its name (its position among them when the name has none)."""
    found = []
    mlps = [(n, s) for n, m in model.named_modules() if (s := _as_swiglu(m)) is not None]
    for position, (name, mlp) in enumerate(mlps):
        parts = name.split(".")
        index = next((int(nxt) for part, nxt in zip(parts, parts[1:])
                      if part == "layers" and nxt.isdigit()), position)
        found.append((index, mlp))
    return sorted(found, key=lambda pair: pair[0])


class SwigluMonitor:
    """Samples SwiGLU outputs of every block on demand (bounded cost: hooks only while armed).

    Per block and armed forward, the hook reduces the SwiGLU output h to two device
    scalars (amax and amax / rms, both in float32) and keeps the running max over the
    armed forwards (micro-batches, and activation-checkpointing recomputes, which see the
    same h). Nothing syncs with the host until `collect`, which reads everything at once.

    torch.compile: dynamo does not guard on module hooks by default
    (``torch._dynamo.config.skip_nnmodule_hook_guards``), so a compiled model keeps the
    hook state of its first compile: hooks armed later are never called (`collect` then
    warns and returns {}), hooks present then keep running after `collect` (values stay
    right, arm() resets them). Set that flag to False before compiling to get one extra
    graph for the armed state instead.
    """

    def __init__(self, model: nn.Module) -> None:
        self._blocks = _feed_forwards(model)
        self._handles: list[RemovableHandle] = []
        self._amax: dict[int, torch.Tensor] = {}
        self._ratio: dict[int, torch.Tensor] = {}

    @property
    def armed(self) -> bool:
        return bool(self._handles)

    def arm(self) -> None:
        """Hook every ``swiglu_tap`` for the forwards until `collect` (no-op when armed)."""
        if self.armed:
            return
        self._amax.clear()
        self._ratio.clear()
        for index, mlp in self._blocks:
            hook = self._hook(index)
            self._handles.append(
                mlp.tap.register_forward_pre_hook(lambda m, inputs, hook=hook: hook(m, inputs[0]))
                if mlp.h_is_input else mlp.tap.register_forward_hook(lambda m, _i, out, hook=hook: hook(m, out)))

    def _hook(self, index: int):
        @torch.compiler.disable  # run eagerly under torch.compile: no recompile per block
        def record(module: nn.Module, h: torch.Tensor) -> None:
            if not module.training:  # not a training forward (e.g. parallel.pp's shape pass)
                return
            with torch.no_grad():
                h = full(h.detach()).float()
                amax = h.abs().amax()
                # All-zero h: rms 0, ratio 0/tiny = 0 rather than nan.
                rms = h.pow(2).mean().sqrt().clamp_min(torch.finfo(torch.float32).tiny)
                ratio = amax / rms
                if index in self._amax:
                    amax = torch.maximum(self._amax[index], amax)
                    ratio = torch.maximum(self._ratio[index], ratio)
                self._amax[index], self._ratio[index] = amax, ratio
        return record

    def collect(self) -> dict[str, float]:
        """Remove the hooks and return per-block amax and outlier_ratio plus their max
        over blocks (NUM_SWIGLU_AMAX, NUM_SWIGLU_OUTLIER); {} if no armed forward ran."""
        was_armed = self.armed
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if not self._amax:
            if was_armed and self._blocks:
                warnings.warn(
                    "SwigluMonitor was armed but saw no SwiGLU output: no forward ran, or "
                    "the model is torch.compile'd without "
                    "torch._dynamo.config.skip_nnmodule_hook_guards=False", stacklevel=2)
            return {}
        indices = sorted(self._amax)
        stacked = torch.stack([torch.stack((self._amax[i], self._ratio[i])) for i in indices])
        values = stacked.tolist()  # the one host sync
        self._amax.clear()
        self._ratio.clear()
        out: dict[str, float] = {}
        for index, (amax, ratio) in zip(indices, values):
            out[swiglu_metric(index, "amax")] = amax
            out[swiglu_metric(index, "outlier_ratio")] = ratio
        out[NUM_SWIGLU_AMAX] = max(amax for amax, _ in values)
        out[NUM_SWIGLU_OUTLIER] = max(ratio for _, ratio in values)
        return out


@torch.no_grad()
def w13_alignment(model: nn.Module) -> dict[str, float]:
    """Per block, the max over channels c of |cos(w1.weight[c], w3.weight[c])|, and its max
    over blocks as NUM_SWIGLU_ALIGNMENT; {} for a model without FeedForwards.

    Reads ``.weight``, so plain and FP8-converted linears work alike; computed in float32
    whatever the parameter dtype. ~0 (order 1/sqrt(dim)) at random init, 1 for a channel
    whose gate and up rows are parallel.
    """
    blocks = _feed_forwards(model)
    if not blocks:
        return {}
    per_block = []
    for _, mlp in blocks:
        w1 = full(mlp.gate.weight).float()
        w3 = full(mlp.up.weight).float()
        eps = torch.finfo(torch.float32).tiny
        cos = (w1 * w3).sum(-1) / (w1.norm(dim=-1) * w3.norm(dim=-1)).clamp_min(eps)
        per_block.append(cos.abs().amax().clamp(max=1.0))  # rounding can give 1 + ulp
    values = torch.stack(per_block).tolist()
    out = {swiglu_metric(index, "w13_alignment"): v for (index, _), v in zip(blocks, values)}
    out[NUM_SWIGLU_ALIGNMENT] = max(values)
    return out
