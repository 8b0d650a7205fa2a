"""What the GPU acceptance run trains and how long it will take, decided before it starts.

The model is the largest preset whose fp32 training state and activations fit the device's
memory (fp32 is the hungriest mode of the table); the steps are as many as keep the table
inside its share of the time budget, estimated from matmul rates measured on this device
(not datasheets) and the model's FLOPs per token. Estimates only plan the run: every number
the run reports is measured.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import torch

from trainlab.models import ModelArgs, count_params, flops_per_token, resolve_dims

PRESETS = ("7b", "1b", "350m", "125m")
"""Candidates for the table's model, largest first."""
STATE_BYTES_PER_PARAM = 16
"""fp32 weight, gradient and AdamW's two moments."""
MEMORY_FRACTION = 0.8
"""Of the device's memory, what the estimate may fill: the rest is headroom for the CUDA
context, allocator fragmentation and compile workspaces."""
TABLE_MODES = ("fp32", "fp32+tf32", "bf16", "fp16", "fp8_tensorwise", "fp8_rowwise", "fp8_delayed")
"""The table's rows, most precise first."""
MODE_DTYPE = {"fp32": "fp32", "fp32+tf32": "tf32", "bf16": "bf16", "fp16": "fp16", "bf16_pure": "bf16"}
"""The matmul dtype of each mode whose speed the estimate takes from a measured rate; FP8
modes are estimated from bf16's (FP8_GAIN) since their attention and hp layers stay bf16."""
MODEL_EFFICIENCY = 0.5
"""A training step reaches about this fraction of the bare matmul rate (estimates only)."""
FP8_GAIN = 1.2
"""The FP8 speedup over bf16 the estimate assumes (the issue's target; estimates only)."""


@dataclass(frozen=True)
class Sizing:
    model: str
    params: int
    flops_per_token: float
    seq_len: int
    micro_batch: int
    memory_gb: float
    """Estimated peak of the fp32 mode: state plus one micro-batch's activations."""


def fp32_training_gb(args: ModelArgs, *, tokens: int) -> float:
    """Estimated device memory of fp32 training with AdamW on `tokens` tokens per micro-batch."""
    state = STATE_BYTES_PER_PARAM * count_params(args)
    # saved activations per layer and token: the block's input, norms, q/k/v, attention
    # output and projections (~10 x dim) and the SwiGLU's four ffn-wide tensors, in fp32
    acts = 4 * tokens * args.n_layers * (10 * args.dim + 4 * args.ffn_dim)
    logits = 3 * 4 * tokens * args.vocab_size  # logits, their fp32 copy and their gradient
    return (state + acts + logits) / 1e9


@functools.lru_cache(maxsize=None)
def size_of(preset: str, *, vocab_size: int, seq_len: int, micro_batch: int) -> Sizing:
    from trainlab.config import compose_run_config

    model_cfg = compose_run_config([f"model={preset}"]).model
    args = resolve_dims(model_cfg, vocab_size=vocab_size)
    seq = min(seq_len, args.max_seq_len)
    return Sizing(model=preset, params=count_params(args), flops_per_token=flops_per_token(args, seq_len=seq),
                  seq_len=seq, micro_batch=micro_batch,
                  memory_gb=fp32_training_gb(args, tokens=micro_batch * seq))


def largest_fitting(memory_gb: float, *, vocab_size: int, seq_len: int, micro_batch: int,
                    presets: tuple[str, ...] = PRESETS) -> Sizing:
    """The largest of `presets` whose estimate fits MEMORY_FRACTION of `memory_gb` (else the smallest)."""
    sizes = [size_of(p, vocab_size=vocab_size, seq_len=seq_len, micro_batch=micro_batch) for p in presets]
    for s in sizes:
        if s.memory_gb <= MEMORY_FRACTION * memory_gb:
            return s
    return sizes[-1]


def matmul_tflops(device: torch.device, dtype: str, *, n: int, repeats: int = 5) -> float | None:
    """Median TFLOP/s of an n x n x n matmul in `dtype` (bf16, fp16, tf32, fp32 or fp8) on random
    data; None where the device has no such matmul (fp8 on CPU or below SM 8.9)."""
    cuda = device.type == "cuda"
    if dtype == "fp8" and (not cuda or torch.cuda.get_device_capability(device) < (8, 9)):
        return None
    if dtype == "tf32" and not cuda:
        return None
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype, torch.float32)
    a = torch.randn(n, n, device=device).to(torch_dtype)
    b = torch.randn(n, n, device=device).to(torch_dtype)
    if dtype == "fp8":
        one = torch.ones((), device=device)
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t().contiguous().t()

        def fn():
            return torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    else:
        def fn():
            return torch.mm(a, b)
    tf32_before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    try:
        fn()
        times = []
        for _ in range(repeats):
            if cuda:
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            fn()
            if cuda:
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32_before
    return 2 * n**3 / sorted(times)[len(times) // 2] / 1e12


def step_seconds(mode: str, *, flops_per_step: float, rates: dict[str, float | None]) -> float | None:
    """Estimated seconds of one optimizer step of `mode`; None without a measured rate."""
    name = mode.split("+")[0]
    if name.startswith("fp8"):
        bf16 = step_seconds("bf16", flops_per_step=flops_per_step, rates=rates)
        return None if bf16 is None else bf16 / FP8_GAIN
    rate = rates.get(MODE_DTYPE.get(mode, "fp32"))
    return flops_per_step / (rate * 1e12 * MODEL_EFFICIENCY) if rate else None


def table_seconds(modes: list[str], *, steps: int, eval_batches: int, flops_per_step: float,
                  rates: dict[str, float | None], setup_s: float, compile_s: float,
                  compiled: set[str]) -> dict[str, float]:
    """Estimated seconds of each mode's run in a process already started: building the corpus
    and model, compile, the steps and the validation pass (a forward is about a third of a
    training step)."""
    out = {}
    for mode in modes:
        step = step_seconds(mode, flops_per_step=flops_per_step, rates=rates) or 0.0
        out[mode] = setup_s + (compile_s if mode in compiled else 0.0) + (steps + eval_batches / 3) * step
    return out


def fit_steps(modes: list[str], *, budget_s: float, max_steps: int, min_steps: int, **kw) -> int:
    """The most steps (at most max_steps, at least min_steps) whose table estimate fits budget_s."""
    steps = max_steps
    while steps > min_steps and sum(table_seconds(modes, steps=steps, **kw).values()) > budget_s:
        steps = max(min_steps, int(steps * 0.8))
    return steps
