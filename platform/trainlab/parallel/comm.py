"""What the data-parallel gradient all-reduce sends: DDP communication hooks.

parallel.comm_dtype casts each gradient bucket for the all-reduce (fp16 / bf16: half the bytes
of fp32), averages it, and casts the result back into the fp32 gradients. parallel.powersgd_rank
replaces the all-reduce of each weight matrix by PowerSGD's rank-r factors (with error feedback:
what one step's compression drops is added back into the next step's gradient).

What torch 2.13 accepts (read in torch/nn/parallel/distributed.py and ddp_comm_hooks/):
- fp16_compress_hook and fp16_compress_wrapper(powerSGD_hook) run on gloo and NCCL.
- DDP.register_comm_hook refuses torch's bf16_compress_hook and bf16_compress_wrapper by
  *function name* unless torch is a CUDA build with NCCL >= 2.10 (or XPU with XCCL): TypeError
  "BF16 all reduce communication hook required CUDA 11+ and NCCL 2.10+ ...", raised at
  registration, whatever the process group's backend is.
- gloo itself all-reduces bfloat16 tensors (SUM and AVG, checked with two ranks). So on gloo
  bf16 uses :func:`bf16_compress_hook_gloo`, the same cast-average-cast as torch's hook: the
  tensor gloo sends is bf16 (2 bytes an element), not an fp32 emulation of bf16 rounding.
  bf16 with PowerSGD has no such hook here; where torch refuses its wrapper, :func:`check_comm`
  refuses the combination (fp16 with PowerSGD runs everywhere).
- fp16 with PowerSGD is torch's fp16_compress_wrapper: PowerSGD then computes its factors, and
  keeps its error-feedback memory, in fp16.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

from trainlab.config.schema import COMM_DTYPES

BACKENDS = ("gloo", "nccl")


def torch_allows_bf16_hooks() -> bool:
    """Whether DDP accepts torch's own bf16 hooks in this build (the check DDP makes)."""
    if not dist.is_available():
        return False
    cuda_build = torch.version.cuda is not None or torch.version.hip is not None
    try:
        nccl = dist.is_nccl_available() and torch.cuda.nccl.version() >= (2, 10)
    except (RuntimeError, AttributeError):  # a CUDA build whose NCCL cannot be loaded
        nccl = False
    xccl = (getattr(dist, "is_xccl_available", lambda: False)()
            and hasattr(torch, "xpu") and torch.xpu.is_available())
    return (cuda_build and nccl) or xccl


def _build() -> str:
    return f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none'})"


def check_comm(comm_dtype: str, powersgd_rank: int, backend: str, *, powersgd_start_iter: int = 2) -> None:
    """Refuse, before any worker starts, what the backend or this torch build cannot run.

    Raises ValueError naming parallel.comm_dtype / parallel.powersgd_rank, the value and the fix."""
    if comm_dtype not in COMM_DTYPES:
        raise ValueError(f"parallel.comm_dtype={comm_dtype!r} is not known; choose one of "
                         f"{', '.join(COMM_DTYPES)}")
    if isinstance(powersgd_rank, bool) or not isinstance(powersgd_rank, int) or powersgd_rank < 0:
        raise ValueError(f"parallel.powersgd_rank={powersgd_rank!r} must be an integer >= 0 "
                         "(0 = off, r = rank-r PowerSGD); set e.g. parallel.powersgd_rank=2")
    if backend not in BACKENDS:
        raise ValueError(f"process-group backend {backend!r} has no communication hooks here; "
                         f"choose one of {', '.join(BACKENDS)}")
    if powersgd_rank and powersgd_start_iter < 2:
        # PowerSGDState's own rule: error feedback and warm start need two plain steps first,
        # while DDP settles its buckets.
        raise ValueError(f"powersgd_start_iter={powersgd_start_iter} must be >= 2 with "
                         f"parallel.powersgd_rank={powersgd_rank}: PowerSGD's error feedback needs "
                         "two plain all-reduce steps first")
    if comm_dtype != "bf16" or torch_allows_bf16_hooks():
        return
    if powersgd_rank:
        raise ValueError(
            f"parallel.comm_dtype=bf16 with parallel.powersgd_rank={powersgd_rank}: torch's bf16 "
            f"PowerSGD wrapper needs a CUDA build with NCCL >= 2.10 and this is {_build()}; set "
            "parallel.comm_dtype=fp16 (PowerSGD in fp16 runs on gloo) or run on GPUs with NCCL")
    if backend == "nccl":
        raise ValueError(
            f"parallel.comm_dtype=bf16 on NCCL needs NCCL >= 2.10 in a CUDA build and this is "
            f"{_build()}; set parallel.comm_dtype=fp16")


# no annotations: under `from __future__ import annotations` they are strings, which DDP's
# hook check compares with dist.GradBucket and refuses
def bf16_compress_hook_gloo(process_group, bucket):
    """torch's bf16_compress_hook under another name, for gloo: DDP refuses torch's by name in
    builds without NCCL >= 2.10 although gloo reduces bf16. The bucket is cast to bf16, divided
    by the world size, all-reduced as bf16, and copied back into the fp32 bucket."""
    group = process_group if process_group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    compressed = buffer.to(torch.bfloat16).div_(group.size())

    def decompress(fut):
        buffer.copy_(fut.value()[0])
        return buffer

    return dist.all_reduce(compressed, group=group, async_op=True).get_future().then(decompress)


def register_comm_hook(ddp_model, *, comm_dtype: str, powersgd_rank: int = 0, backend: str,
                       powersgd_start_iter: int = 2, ordered: bool = False, group=None) -> str:
    """Register the hook for parallel.comm_dtype / parallel.powersgd_rank on a DDP model and
    return a short description for a tag ("fp32", "bf16", "powersgd:r2+fp16", "ordered+fp16").

    powersgd_start_iter: PowerSGD compresses from this synchronising backward pass on (counted
    from 0; an optimizer step when micro-batches run under no_sync); before it, buckets are
    all-reduced whole, in comm_dtype. ordered (train.deterministic): buckets are summed in rank
    order (parallel.ordered_reduce), sent in comm_dtype. `group`: DDP's process group, the
    data-parallel one (None = the world); every hook averages over it (a hook's state of None
    would mean the world, which in a hybrid layout also holds tensor- or pipeline-parallel
    peers). DDP allows one hook per model: call this once."""
    check_comm(comm_dtype, powersgd_rank, backend, powersgd_start_iter=powersgd_start_iter)
    if ordered and powersgd_rank:
        raise ValueError(f"train.deterministic=true with parallel.powersgd_rank={powersgd_rank}: DDP "
                         "takes one communication hook; set parallel.powersgd_rank=0")
    if comm_dtype == "fp32" and not powersgd_rank and not ordered:
        return "fp32"
    what = f"parallel.comm_dtype={comm_dtype} parallel.powersgd_rank={powersgd_rank}" + (
        " train.deterministic=true" if ordered else "")
    if not hasattr(ddp_model, "register_comm_hook"):
        warnings.warn(f"{what} ignored: the model is not data parallel (one worker sends nothing)",
                      stacklevel=2)
        return "fp32"
    if getattr(ddp_model, "_comm_hooks", None):  # DDP raises a bare RuntimeError otherwise
        raise ValueError(f"{what}: DDP takes one communication hook and this model has one already "
                         "(precision.formats.comm_grads registers one); use one or the other")

    if ordered:
        from trainlab.parallel.ordered_reduce import SEND_DTYPES, ordered_allreduce_hook

        ddp_model.register_comm_hook({"group": group, "comm_dtype": SEND_DTYPES[comm_dtype]},
                                     ordered_allreduce_hook)
        return "ordered" + ("" if comm_dtype == "fp32" else f"+{comm_dtype}")

    if powersgd_rank:
        state = powerSGD_hook.PowerSGDState(
            process_group=group, matrix_approximation_rank=powersgd_rank,
            start_powerSGD_iter=powersgd_start_iter)  # error feedback and warm start: on
        hook = powerSGD_hook.powerSGD_hook
        if comm_dtype == "fp16":
            hook = default_hooks.fp16_compress_wrapper(hook)
        elif comm_dtype == "bf16":  # check_comm let it through: torch accepts its wrapper
            hook = default_hooks.bf16_compress_wrapper(hook)
        ddp_model.register_comm_hook(state, hook)
        return f"powersgd:r{powersgd_rank}" + ("" if comm_dtype == "fp32" else f"+{comm_dtype}")

    if comm_dtype == "fp16":
        hook = default_hooks.fp16_compress_hook
    elif backend == "gloo":
        hook = bf16_compress_hook_gloo
    else:
        hook = default_hooks.bf16_compress_hook
    ddp_model.register_comm_hook(group, hook)
    return comm_dtype


__all__ = ["BACKENDS", "COMM_DTYPES", "bf16_compress_hook_gloo", "check_comm", "register_comm_hook",
           "torch_allows_bf16_hooks"]
