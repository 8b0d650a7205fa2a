"""What the GPU acceptance run trains, in which processes, and how long it will take, decided
before it starts.

The model is the largest preset whose fp32 training state and activations fit the device's
memory and whose table fits the time budget with at least MIN_STEPS steps; the steps are as
many as keep the table inside its budget (at most MAX_STEPS). Both come from matmul rates
measured on this device (not datasheets), the model's FLOPs per token, and the per-process,
per-mode and compile seconds below (measured on an H200; every run measures them again per
mode and prints them beside these estimates). Modes share a process where
engine.isolation.fresh_gang_reason allows it. Estimates only plan the run: every number the
run reports is measured.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field

import torch

from trainlab.models import ModelArgs, count_params, flops_per_token, resolve_dims

PRESETS = ("7b", "1b", "350m", "125m")
"""Candidates for the table's model, largest first."""
STATE_BYTES_PER_PARAM = 16
"""fp32 weight, gradient and AdamW's two moments."""
MEMORY_FRACTION = 0.8
"""Of the device's memory, what the estimate may fill: the rest is headroom for the CUDA
context, allocator fragmentation and compile workspaces."""
TABLE_DATA = ("data=text", "data.val_fraction=0.1")
"""The table's corpus (Hydra overrides; the one place to change it). The text corpus: the
Python language reference, byte-level (vocabulary 256), ~466 K tokens; with val_fraction 0.1,
~205 training and 22 validation windows of 2048 tokens (8 eval batches of 4 sequences are
capped to 5), so MAX_STEPS x 4 sequences is about two passes. Real text keeps the loss falling
over the table's steps; `data=markov` (vocabulary 256) sat on its loss plateau within 60 steps,
where a val-loss comparison between modes is knife-edged."""
HEADLINE_MODES = ("bf16", "fp8_tensorwise", "fp8_rowwise", "fp8_delayed")
"""The first command's table: FP8 against its bf16 reference."""
LATER_MODES = ("bf16", "fp16", "fp32+tf32", "fp32")
"""A later command's table (bf16 again: the reference, on the same tokens as the headline)."""
TABLE_MODES = ("fp32", "fp32+tf32", "bf16", "fp16", "fp8_tensorwise", "fp8_rowwise", "fp8_delayed")
"""Every mode the table knows, most precise first."""
RUN_ORDER = ("bf16", "fp8_tensorwise", "fp8_rowwise", "fp8_delayed", "fp16", "fp32+tf32", "fp32")
"""The table trains the modes of the targets first, so a budget that runs out cuts the rest."""
COMPILE_UNIT = "block"
"""train.compile_unit of the table (train.compile stays auto: the engine decides which modes
compile). Per block, as torchtitan: one graph that every block reuses compiles in about the
same time at any depth (measured 1b below); a whole-model graph grows with the layers."""
MODE_DTYPE = {"fp32": "fp32", "fp32+tf32": "tf32", "bf16": "bf16", "fp16": "fp16", "bf16_pure": "bf16"}
"""The matmul dtype of each mode whose speed the estimate takes from a measured rate; FP8
modes are estimated from bf16's (FP8_GAIN) since their attention and hp layers stay bf16."""
MAX_STEPS = 100
"""Steps per mode at most: tokens/s is a median over steps (60 are plenty); the rest is for
the val-loss comparison, within two passes over TABLE_DATA's text."""
MIN_STEPS = 20
"""Fewer steps than this and the val losses say nothing: a smaller model is chosen instead."""

# ---- what a lease costs ----------------------------------------------------------------------
# Measured on one H200 on 2026-11-27 (torch 2.11.0+cu130, torchao 0.18.0, Python 3.12):
# matmul TFLOP/s at 8192^3 bf16 739, fp8 1391; the 1b table (974M params, 60 steps x 4 x 2048
# tokens, 54.5 TFLOP a step, compiled per block, markov vocab 256): bf16 68,017 tok/s (452
# model TFLOP/s, MFU 45.7 %), fp8_tensorwise 77,474 (1.14x), fp8_rowwise 69,116 (1.02x);
# training 20-22 s a mode, of which ~7 s the 60 steady steps; the whole command (wheel install,
# env, one process for 4 modes, one of which crashed at its compile) 151 s wall. The plan's
# earlier guesses (efficiency 0.5, 45 s compile, 30 s process start) estimated 64 s a mode.
MODEL_EFFICIENCY = 0.6
"""A training step's model FLOP/s over the bare matmul rate (H200 bf16 1b: 452 / 739 = 0.61)."""
FP8_GAIN = 1.1
"""FP8 tokens/s over bf16's that the estimate assumes (H200 1b: tensorwise 1.14x, rowwise 1.02x)."""
COMPILE_S = 25.0
"""Seconds a compiled mode pays beyond its build and steady steps: the first step's torch.compile
of the training graph (the table's `compile s`: 11.0-12.9 s on the H200, 1b per block, second
run) and the validation graph's compile and the trial's end (~12 s more: those modes took 40-43 s
in all, `mode s`, where 14 s here estimated 30-31 s)."""


@dataclass(frozen=True)
class Costs:
    """Estimated seconds of the run's fixed parts, per device type."""

    env_s: float
    """This command before the table: imports, CUDA, the matmul probe, composing the plan."""
    process_s: float
    """Starting one torchrun process: Python, torch, CUDA, the engine's imports."""
    setup_s: float
    """Each mode in a running process: corpus, model build, host-side init, the estimate..."""
    setup_s_per_bparam: float
    """... plus this per billion parameters (models.init fills the weights on the host)."""
    compile_s: float
    """Each compiled mode: COMPILE_S."""

    def mode_setup_s(self, params: int) -> float:
        return self.setup_s + self.setup_s_per_bparam * params / 1e9


COSTS = {
    # H200 2026-11-27: 151 s = ~20 s wheels and env + one process (~15 s to start) + three 1b
    # modes of ~33 s (12 s setup + 21 s training) + a crashed compile
    "cuda": Costs(env_s=15.0, process_s=20.0, setup_s=3.0, setup_s_per_bparam=9.0, compile_s=COMPILE_S),
    # this repository's 2-core CI machine, --quick (tiny, eager)
    "cpu": Costs(env_s=10.0, process_s=15.0, setup_s=3.0, setup_s_per_bparam=9.0, compile_s=COMPILE_S),
}


@dataclass(frozen=True)
class Sizing:
    model: str
    params: int
    flops_per_token: float
    seq_len: int
    micro_batch: int
    memory_gb: float
    """Estimated peak of the fp32 mode: state plus one micro-batch's activations."""

    @property
    def flops_per_step(self) -> float:
        return self.flops_per_token * self.micro_batch * self.seq_len


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
    return fitting(memory_gb, vocab_size=vocab_size, seq_len=seq_len, micro_batch=micro_batch,
                   presets=presets)[0]


def fitting(memory_gb: float, *, vocab_size: int, seq_len: int, micro_batch: int,
            presets: tuple[str, ...] = PRESETS) -> list[Sizing]:
    """The presets whose estimate fits MEMORY_FRACTION of `memory_gb`, largest first (the
    smallest alone where none does)."""
    sizes = [size_of(p, vocab_size=vocab_size, seq_len=seq_len, micro_batch=micro_batch) for p in presets]
    return [s for s in sizes if s.memory_gb <= MEMORY_FRACTION * memory_gb] or sizes[-1:]


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


def table_seconds(modes, *, steps: int, eval_batches: int, sizing: Sizing, rates: dict[str, float | None],
                  costs: Costs, compiled: set[str]) -> dict[str, float]:
    """Estimated seconds of each mode's run in a process already started: building the corpus
    and model, compile, the steps and the validation pass (a forward is about a third of a
    training step)."""
    out = {}
    for mode in modes:
        step = step_seconds(mode, flops_per_step=sizing.flops_per_step, rates=rates) or 0.0
        out[mode] = (costs.mode_setup_s(sizing.params) + (costs.compile_s if mode in compiled else 0.0)
                     + (steps + eval_batches / 3) * step)
    return out


def fit_steps(modes, *, budget_s: float, max_steps: int, min_steps: int, **kw) -> int:
    """The most steps (at most max_steps, at least min_steps) whose table estimate fits budget_s."""
    def total(steps: int) -> float:
        return sum(table_seconds(modes, steps=steps, **kw).values())

    if total(max_steps) <= budget_s or total(min_steps) > budget_s:
        return max_steps if total(max_steps) <= budget_s else min_steps
    lo, hi = min_steps, max_steps  # total(lo) fits, total(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if total(mid) <= budget_s else (lo, mid)
    return lo


# ---- processes -------------------------------------------------------------------------------
@dataclass
class Group:
    """Modes that one torchrun process trains one after another."""

    modes: list[str]
    why: str = ""
    """Why these needed a process of their own ('' for the first): fresh_gang_reason's words."""
    configs: list = field(default_factory=list, repr=False)


def group_modes(configs: dict, *, device: str) -> list[Group]:
    """`configs` (mode -> RunConfig, in run order) into processes: each mode joins the first
    process whose modes so far engine.isolation.fresh_gang_reason lets it follow (as a warm
    gang's pool picks trials), else starts one of its own."""
    from trainlab.engine.isolation import fresh_gang_reason

    groups: list[Group] = []
    for mode, run in configs.items():
        reasons = [fresh_gang_reason(ran=g.configs, run=run, device=device) for g in groups]
        joined = next((g for g, why in zip(groups, reasons) if not why), None)
        if joined is None:
            groups.append(Group([mode], why=reasons[-1].removeprefix("fresh gang: ") if reasons else "",
                                configs=[run]))
        else:
            joined.modes.append(mode)
            joined.configs.append(run)
    return groups


def run_order(modes) -> list[str]:
    return sorted(modes, key=lambda m: RUN_ORDER.index(m) if m in RUN_ORDER else len(RUN_ORDER))


# ---- the table's plan ------------------------------------------------------------------------
@dataclass(frozen=True)
class TablePlan:
    sizing: Sizing
    steps: int
    seconds: dict[str, float]
    """Each mode's estimate in its running process (table_seconds)."""
    total_s: float
    """The whole command: env, each process's start, every mode."""
    budget_s: float

    @property
    def fits(self) -> bool:
        return self.total_s <= self.budget_s


def plan_table(candidates: list[Sizing], modes, *, processes: int, budget_s: float, costs: Costs,
               steps: int = 0, max_steps: int = MAX_STEPS, min_steps: int = MIN_STEPS, **kw) -> TablePlan:
    """The first of `candidates` (largest first) whose table fits `budget_s` with at least
    min_steps steps (`steps` > 0: exactly those), with as many steps as fit; else the last
    candidate at min_steps (or `steps`), over the budget (the caller says so)."""
    fixed = costs.env_s + processes * costs.process_s
    for i, sizing in enumerate(candidates):
        last = i == len(candidates) - 1
        n = steps or fit_steps(modes, budget_s=budget_s - fixed, max_steps=max_steps, min_steps=min_steps,
                               sizing=sizing, costs=costs, **kw)
        seconds = table_seconds(modes, steps=n, sizing=sizing, costs=costs, **kw)
        total = fixed + sum(seconds.values())
        if total <= budget_s or last:
            return TablePlan(sizing=sizing, steps=n, seconds=seconds, total_s=total, budget_s=budget_s)
    raise AssertionError("plan_table: no candidates")


def timeout_for(budget_s: float) -> int:
    """The device tool's timeout_s for a command whose Python part gets `budget_s`: the
    wrapper's wheel install and Python's start come before it (LEASE_MARGIN_S)."""
    return int(math.ceil((budget_s + LEASE_MARGIN_S) / 10) * 10)


BUDGET_S = 280.0
"""Each command's budget (--budget-s): a 5-minute command with its wheel install."""
LATER_BUDGET_S = 540.0
"""The later command's: at most 10 minutes a command."""
LEASE_MARGIN_S = 45.0
"""What a command needs beyond its budget: installing the carried wheels (~5 s), Python and
torch starting, the device tool's own start and fetching $OUT."""
LEASE_S = 900.0
"""One lease of the GPU machine, starting it (~90-120 s) included."""
LEASE_START_S = 120.0
"""Starting the GPU machine, out of the lease (90-120 s measured)."""
TESTS_MIN_S = 120.0
"""What a command that also runs the tests keeps for them (the tests' own command gets the rest
of its budget: they are stopped at its end, their names and reasons kept)."""


def overhead_seconds(sizing: Sizing, *, steps: int, repeats: int, rates: dict[str, float | None],
                     costs: Costs, compiled: bool) -> float:
    """Estimated seconds of the overhead part: a process, a warm-up round of each loop and
    `repeats` of both, each building its model; each loop's compile once (warm-up)."""
    step = step_seconds("bf16" if rates.get("bf16") else "fp32", flops_per_step=sizing.flops_per_step,
                        rates=rates) or 0.0
    loops = 2 * (repeats + 1)
    return (costs.process_s + loops * (costs.mode_setup_s(sizing.params) + steps * step)
            + (2 * costs.compile_s if compiled else 0.0))


def lease_commands(*, model: str, steps: int, later_s: float | None, tests_select: str) -> list[dict]:
    """The two commands of one lease, each with the timeout_s to give the device tool, then the
    later ones (`model` and `steps`: the headline's, so a later table trains the same tokens)."""
    t = timeout_for(BUDGET_S)
    sized = f"--model {model} --steps {steps}" if model else "--model M --steps N (as the first command printed)"
    rows = "fp16 / fp32+tf32 / fp32 rows on the headline's tokens, engine vs bare loop"
    return [
        {"when": "1st", "command": "bash .ci/gpu-accept", "timeout_s": t,
         "what": f"env + table ({', '.join(HEADLINE_MODES)}): the headline"},
        {"when": "2nd", "command": "bash .ci/gpu-accept --parts tests", "timeout_s": t,
         "what": f"pytest tests/gpu -m '{tests_select}' -v, JUnit XML to $OUT/gpu-tests.xml"},
        {"when": "later", "command": f"bash .ci/gpu-accept --parts table,overhead --modes {','.join(LATER_MODES)} "
                                     f"{sized} --budget-s {LATER_BUDGET_S:.0f}",
         "timeout_s": timeout_for(LATER_BUDGET_S), "what": rows + (f" (est {later_s:.0f} s)" if later_s else "")},
        {"when": "later", "command": "bash .ci/gpu-accept --parts tests --tests multi_gpu", "timeout_s": t,
         "what": "multi-GPU layouts, on a machine with 2+ GPUs"},
    ]
