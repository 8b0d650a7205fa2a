"""Per-layer numerics of every low-precision cast, sampled every N steps at bounded cost.

For each low-precision linear (the recipe's `casts`) and each tensor it casts (input
activation, weight, incoming gradient) the probe measures, on one micro-batch of the
sampled step: amax, the scale the recipe applies, the fraction of non-zero values the cast
turns into zero (underflow) and the fraction it saturates or turns into inf/NaN (overflow:
values that round beyond the format's range, not the fp32 product's last bit above it).
Hooks exist only while armed; tensors above 2**20 elements are subsampled for the counts.
"""

from __future__ import annotations

import torch
from torch import nn

from trainlab import names
from trainlab.precision.fake_cast import CastStats, cast_limits, cast_stats, tensor_scale
from trainlab.precision.policy import CastSpec
from trainlab.telemetry.sharded import full
from trainlab.telemetry.stages import sum_over_stages
from trainlab.vocab.format_names import FloatFormat


def _scale(x: torch.Tensor, fmt: FloatFormat, spec: CastSpec, module: nn.Module, kind: str):
    if not spec.scaled:
        return 1.0
    if spec.scaling == "delayed":
        return module.current_scales()[kind]
    x = x.detach().float()
    amax = x.abs().amax(dim=-1, keepdim=True) if spec.scaling == "row" else x.abs().amax()
    return tensor_scale(amax, fmt, power_of_2=spec.power_of_2)


class NumericsProbe:
    def __init__(self, casts: list[tuple[str, nn.Module, CastSpec]]) -> None:
        self.casts = casts
        self._scaled = {name for name, _, spec in casts if spec.scaled}  # their scales: num/min/<tensor>/scale
        self._handles: list = []
        self._seen: dict[tuple[str, str], tuple[CastStats, torch.Tensor | None]] = {}
        """(layer, tensor kind) -> its cast statistics and, for fp16 gradients, the counts
        pooled into the gradient-underflow fractions."""
        self.loss_scale: float = 1.0

    def arm(self, *, loss_scale: float | None = None) -> None:
        """Watch the next micro-batch's casts (first micro-batch of the step only)."""
        self.loss_scale = loss_scale or 1.0
        self._seen.clear()
        for name, module, spec in self.casts:
            self._handles.append(module.register_forward_pre_hook(self._input_hook(name, spec, module)))
            self._handles.append(module.register_forward_hook(self._output_hook(name, spec, module)))

    # hooks run eagerly under torch.compile (graph breaks on sampled steps only), instead of
    # being traced once per layer name and recompiling past dynamo's limit
    def _input_hook(self, name: str, spec: CastSpec, module: nn.Module):
        @torch.compiler.disable
        def hook(m, args):
            # forwards of an eval-mode module are no training casts (torch's pipeline runs
            # one on uninitialized tensors to learn a stage's shapes: parallel.pp)
            if m.training and spec.input is not None and (name, "input") not in self._seen:
                self._seen[(name, "input")] = self._measure(args[0], spec.input, spec, module, "input")
        return hook

    def _output_hook(self, name: str, spec: CastSpec, module: nn.Module):
        @torch.compiler.disable
        def hook(m, _args, output):
            if not m.training or spec.grad_output is None or not (torch.is_tensor(output) and output.requires_grad):
                return

            def on_grad(grad):
                if (name, "grad_output") not in self._seen:
                    self._seen[(name, "grad_output")] = self._measure(grad, spec.grad_output, spec,
                                                                      module, "grad_output")
            output.register_hook(on_grad)
        return hook

    def _measure(self, x: torch.Tensor, fmt: FloatFormat, spec: CastSpec, module: nn.Module, kind: str):
        x = full(x.detach())
        stats = cast_stats(x, fmt, _scale(x, fmt, spec, module, kind))
        counts = None
        if spec.scaling == "loss" and kind == "grad_output":
            # pooled over layers: [non-zero values, flushed at the loss scale used, flushed had
            # the loss not been scaled (what fp16 without scaling sees)]
            # quantize(g, fmt) == 0 exactly where |g| <= flush (fake_cast.cast_limits), no rounding
            flush = cast_limits(fmt)[0]
            g = x.detach().float().abs()
            n_zero = torch.count_nonzero(g == 0)
            counts = torch.stack([g.numel() - n_zero,
                                  torch.count_nonzero(g <= flush) - n_zero,
                                  torch.count_nonzero(g.div_(self.loss_scale) <= flush) - n_zero])
        return stats, counts

    def collect(self, *, group=None) -> dict[str, float]:
        """Remove the hooks; the sampled metrics (per layer, plus the max over layers).
        `group`: the pipeline group (a collective), whose stages' gradients are pooled into
        the underflow fractions (telemetry.stages merges the rest)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        metrics: dict[str, float] = {}
        for name, module, spec in self.casts:
            if spec.weight is not None and self._seen:
                w = module.weight
                self._seen[(name, "weight")] = self._measure(w, spec.weight, spec, module, "weight")
        pooled = []
        for (layer, kind), (stats, counts) in self._seen.items():
            for stat in names.CAST_STATS:
                value = float(getattr(stats, stat))
                metrics[names.cast_metric(layer, kind, stat)] = value
                if stat != names.CAST_SCALE:
                    key = names.cast_max_metric(kind, stat)
                    metrics[key] = max(metrics.get(key, value), value)
                elif layer in self._scaled:  # the per-layer scales live in the detail table; this stays a metric
                    key = names.cast_min_metric(kind, stat)
                    metrics[key] = min(metrics.get(key, value), value)
            if counts is not None:
                pooled.append(counts)
        counts = [*torch.stack(pooled).sum(0).tolist(), 1] if pooled else [0, 0, 0, 0]
        if group is not None:  # every stage's, even where this one pooled nothing
            counts = sum_over_stages(counts, group=group)
        nonzero, flushed, flushed_unscaled, pooling = counts
        if pooling:
            metrics[names.NUM_GRAD_UNDERFLOW] = flushed / max(nonzero, 1)
            metrics[names.NUM_GRAD_UNDERFLOW_UNSCALED] = flushed_unscaled / max(nonzero, 1)
        self._seen.clear()
        return metrics
