"""FP8 linears with delayed per-tensor scaling, as Transformer Engine does it.

torchao's Float8Linear only scales from the current tensor's amax, which puts an amax
reduction (and, across ranks, a collective) in front of every cast. Delayed scaling takes
each cast's scale from the maximum of an amax *history* of previous steps instead, so the
cast never waits; the amax of the current step is only recorded.

Update order (one optimizer step t):
  1. every forward/backward of step t casts with `scale`, computed from histories up to t-1
     (all ones at t=0, while the history is still zeros), and records the amax it saw into
     `running_amax` (max over the micro-batches of the step);
  2. after backward, `update_delayed_scales(model, group=dp_group)` all-reduces (MAX) the
     running amaxes of every layer in one collective over the data-parallel group, rolls them
     into `amax_history` (column 0 = newest), recomputes `scale` and zeroes `running_amax`;
     those scales serve step t+1.

Formats: input and weight in float8_e4m3fn, grad_output in float8_e5m2 (TE's "hybrid").
Casts saturate (clamp to +-finfo.max) so a stale scale clips outliers instead of making
inf/NaN. Forwards in eval mode or under no_grad record nothing (evaluation must not move
the training scales).

`torch._scaled_mm` requirements. CPU torch 2.13 (measured): both operands 2-D; any layout
and any sizes; e4m3/e5m2 in any combination; scale_a/scale_b float32 tensors with one
element (0-dim, [1] or [1, 1]; bf16/fp64 scales or python floats are rejected); the scales
are *dequantization* factors (1/scale). CUDA (what TE and torchao work around) further needs
mat1 row-major, mat2 column-major, mat1.size(1) and both dims of mat2 multiples of 16, and
not e5m2 x e5m2. `_scaled_mm_fp8` below always produces those layouts and zero-pads the
contraction dim (exact) so the weight-gradient GEMM, whose contraction is over tokens,
works for any token count; in/out features must be multiples of 16, which the caller's
module filter guarantees.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
ROWS = ("input", "weight", "grad_output")
_INPUT, _WEIGHT, _GRAD_OUTPUT = 0, 1, 2


@functools.cache
def _fp8_max(device: torch.device) -> torch.Tensor:
    """[3] largest finite value of each row's format, made on `device` once per process:
    the per-step update then copies nothing from the host (a host tensor's .to(device)
    would be one host-to-device copy per layer per step)."""
    return torch.tensor([torch.finfo(E4M3).max, torch.finfo(E4M3).max, torch.finfo(E5M2).max],
                        device=device)


def _to_fp8(t: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Saturating cast of t * scale (fp32 math): a stale scale clips, never overflows."""
    bound = torch.finfo(dtype).max
    return (t.float() * scale).clamp(-bound, bound).to(dtype)


def _record_amax(running: torch.Tensor, row: int, t: torch.Tensor) -> None:
    """Fold this tensor's amax into the step's running max, without a host sync."""
    running[row] = torch.maximum(running[row], t.detach().abs().amax().float())


def _inverse(scale: torch.Tensor, row: int) -> torch.Tensor:
    """The dequantization factor of one row: a 0-dim tensor of its own. Not ``inv[row]`` of one
    reciprocal [3]: compiled on CUDA (torch 2.11, H200), inductor's _scaled_mm lowering failed
    an assertion on scales that are views into one buffer (SliceView / ReinterpretView);
    torchao passes each scale as its own tensor, as this does."""
    return scale[row].reciprocal()


def _scaled_mm_fp8(a: torch.Tensor, a_inv: torch.Tensor, b: torch.Tensor, b_inv: torch.Tensor,
                   out_dtype: torch.dtype, emulate: bool) -> torch.Tensor:
    """(a / a_scale) @ (b / b_scale) for fp8 a [M, K], b [K, N]; a_inv, b_inv are 0-dim fp32."""
    if emulate:  # same fp8 values, high-precision GEMM (torchao's emulate does the same)
        return torch.mm(a.float() * a_inv, b.float() * b_inv).to(out_dtype)
    pad = -a.shape[1] % 16
    if pad:  # zero rows/cols along K add nothing to the product
        a, b = F.pad(a, (0, pad)), F.pad(b, (0, 0, 0, pad))
    # CUDA layouts: mat1 row-major, mat2 column-major (no copy when already so)
    return torch._scaled_mm(a.contiguous(), b.t().contiguous().t(), scale_a=a_inv, scale_b=b_inv,
                            out_dtype=out_dtype)


class _DelayedFp8Matmul(torch.autograd.Function):
    """x @ w.t() with all three GEMMs in fp8; saves the fp8 x and w, not the high-precision ones."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, running: torch.Tensor,
                out_dtype: torch.dtype, emulate: bool, record: bool) -> torch.Tensor:
        if record:
            _record_amax(running, _INPUT, x)
            _record_amax(running, _WEIGHT, weight)
        scale = scale.detach().clone()  # the scale this step used, even if the buffer moves
        x_fp8 = _to_fp8(x, scale[_INPUT], E4M3)
        w_fp8 = _to_fp8(weight, scale[_WEIGHT], E4M3)
        ctx.save_for_backward(x_fp8, w_fp8)
        ctx.scale, ctx.running, ctx.emulate, ctx.record = scale, running, emulate, record
        ctx.x_dtype, ctx.w_dtype = x.dtype, weight.dtype
        return _scaled_mm_fp8(x_fp8, _inverse(scale, _INPUT), w_fp8.t(), _inverse(scale, _WEIGHT),
                              out_dtype, emulate)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        x_fp8, w_fp8 = ctx.saved_tensors
        inv_x, inv_w, inv_go = (_inverse(ctx.scale, row) for row in (_INPUT, _WEIGHT, _GRAD_OUTPUT))
        if ctx.record:
            _record_amax(ctx.running, _GRAD_OUTPUT, grad_out)
        go_fp8 = _to_fp8(grad_out, ctx.scale[_GRAD_OUTPUT], E5M2)
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            grad_x = _scaled_mm_fp8(go_fp8, inv_go, w_fp8, inv_w,
                                    grad_out.dtype, ctx.emulate).to(ctx.x_dtype)
        if ctx.needs_input_grad[1]:  # fp32 out: the weight gradient is accumulated
            grad_w = _scaled_mm_fp8(go_fp8.t(), inv_go, x_fp8, inv_x,
                                    torch.float32, ctx.emulate).to(ctx.w_dtype)
        return grad_x, grad_w, None, None, None, None, None


class DelayedScalingFp8Linear(nn.Linear):
    """nn.Linear whose three matmuls run in FP8 with delayed per-tensor scaling.

    Buffers (so checkpoints carry them): `amax_history` [3, history_len] (rows: input,
    weight, grad_output; column 0 newest), `scale` [3], `running_amax` [3] (this step's max).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None,
                 *, history_len: int = 16, margin: int = 0, emulate: bool = False) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        if history_len < 1:
            raise ValueError(f"history_len must be >= 1, got {history_len}")
        if margin < 0:
            raise ValueError(f"margin must be >= 0 (a power-of-two headroom), got {margin}")
        self.history_len, self.margin, self.emulate = history_len, margin, emulate
        self._init_fp8_buffers(self.weight.device)

    def _init_fp8_buffers(self, device: torch.device) -> None:
        kw = dict(device=device, dtype=torch.float32)
        self.register_buffer("amax_history", torch.zeros(3, self.history_len, **kw))
        self.register_buffer("scale", torch.ones(3, **kw))
        self.register_buffer("running_amax", torch.zeros(3, **kw))

    @torch.no_grad()
    def init_buffers(self) -> None:
        """The state before any step: no amax seen, scales 1 (after a meta-device build)."""
        self.amax_history.zero_()
        self.scale.fill_(1.0)
        self.running_amax.zero_()

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, history_len: int = 16, margin: int = 0,
                    emulate: bool = False) -> DelayedScalingFp8Linear:
        """Wrap `linear`'s own Parameter objects (optimizer state and tying survive)."""
        new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta",
                  dtype=linear.weight.dtype, history_len=history_len, margin=margin, emulate=emulate)
        new.weight = linear.weight
        new.bias = linear.bias
        new._init_fp8_buffers(linear.weight.device)
        new.train(linear.training)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device_type = x.device.type
        autocast = torch.is_autocast_enabled(device_type)
        out_dtype = torch.get_autocast_dtype(device_type) if autocast else x.dtype  # what nn.Linear gives
        record = self.training and torch.is_grad_enabled()
        with torch.autocast(device_type, enabled=False):  # the GEMMs pick their own precision
            y = _DelayedFp8Matmul.apply(x.reshape(-1, self.in_features), self.weight, self.scale,
                                        self.running_amax, out_dtype, self.emulate, record)
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y + self.bias.to(out_dtype) if self.bias is not None else y

    @torch.no_grad()
    def _push_amax(self, amax: torch.Tensor) -> None:
        """Roll this step's (already reduced) amax into the history and recompute the scales."""
        self.amax_history.copy_(torch.roll(self.amax_history, shifts=1, dims=1))
        self.amax_history[:, 0] = amax
        hist_max = self.amax_history.amax(dim=1)
        new = _fp8_max(hist_max.device) / hist_max / 2**self.margin
        # keep the old scale while nothing was seen (first step) or an amax went inf/NaN
        self.scale.copy_(torch.where((hist_max > 0) & torch.isfinite(hist_max), new, self.scale))
        self.running_amax.zero_()

    def current_scales(self) -> dict[str, float]:
        """Scales the next forward/backward will cast with (host sync: for logging)."""
        return dict(zip(ROWS, self.scale.tolist()))

    def last_amax(self) -> dict[str, float]:
        """Amax of the step most recently pushed by `update_delayed_scales` (after the all-reduce)."""
        return dict(zip(ROWS, self.amax_history[:, 0].tolist()))

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, history_len={self.history_len}, margin={self.margin}, "
                f"emulate={self.emulate}")


def convert_to_delayed_fp8(model: nn.Module, *, module_filter: Callable[[nn.Linear, str], bool],
                           history_len: int = 16, margin: int = 0, emulate: bool = False) -> list[str]:
    """Swap in DelayedScalingFp8Linear for each nn.Linear the filter accepts; returns their names.

    The filter must keep in/out features multiples of 16 for CUDA's _scaled_mm.
    """
    chosen = [(name, mod) for name, mod in model.named_modules()
              if isinstance(mod, nn.Linear) and not isinstance(mod, DelayedScalingFp8Linear)
              and module_filter(mod, name)]
    for name, mod in chosen:  # replace after the walk: named_modules must not see a moving tree
        if not name:
            raise ValueError("the model itself is an nn.Linear: wrap it in a container to convert it")
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, DelayedScalingFp8Linear.from_linear(
            mod, history_len=history_len, margin=margin, emulate=emulate))
    return [name for name, _ in chosen]


@torch.no_grad()
def update_delayed_scales(model: nn.Module, *, group=None, reduce: bool = True) -> None:
    """Once per optimizer step, after backward: reduce, record and rescale every fp8 layer.

    All layers' running amaxes go through ONE all-reduce (MAX) over `group` (None: the world),
    the data-parallel group, so its ranks always cast with identical scales. reduce=False:
    this process's amaxes only, for a rank without data-parallel peers (its world may hold
    pipeline stages, whose layers are others). Layers must share one device.
    """
    layers = [m for m in model.modules() if isinstance(m, DelayedScalingFp8Linear)]
    if not layers:
        return
    flat = torch.cat([m.running_amax for m in layers])
    if reduce and dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(flat, op=dist.ReduceOp.MAX, group=group)
    for layer, amax in zip(layers, flat.split(3)):
        layer._push_amax(amax)
