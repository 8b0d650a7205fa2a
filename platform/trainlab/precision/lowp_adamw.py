"""AdamW whose two moments are stored in low precision (bf16 or per-tensor scaled FP8).

The FP8 trillion-token study (Fishman et al., "Scaling FP8 training to trillion-token LLMs",
ICLR 2025) keeps the first moment in E4M3 and the second in E5M2, a quarter of fp32's
optimizer memory. Each step dequantizes a moment to float32, updates it and uses it in
float32, then stores it back; only what is carried to the next step is rounded.

FP8 storage keeps a per-tensor float32 scale, ``finfo(dtype).max / amax`` (1 when the moment
is all zero): the largest element lands on the format's largest value and is exact, the
others keep 2 (E5M2) or 3 (E4M3) mantissa bits down to the smallest subnormal at that scale.

Second-moment underflow guard. A positive second moment below half the smallest subnormal
at its tensor's scale rounds to 0: E5M2 loses ``v < amax(v) * 2**-32.8``, while the E4M3 first
moment keeps ``|m| > amax(m) * 2**-18.8``. As v ~ g**2, an element whose gradients are about
2**-16.4 to 2**-18.8 of its tensor's largest (a rare token's embedding row) keeps m != 0
while v reads back as 0; at its next step without gradient the update is m / eps instead of
m / sqrt(v), sqrt(v) / eps times too large. Measured (tests/unit/test_lowp_adamw.py and the
project's Transformer): a Zipfian bag-of-words embedding moves 300-700x lr in one step, the
Transformer's token embedding (vocab 4096, clipped gradients) 68x; fp32 state: ~1x. Guard:
a positive second moment is rounded up to the smallest subnormal, never to 0. A stored 0
then means "no gradient yet", the stored v is never below the true one for those elements,
so their step is damped, never inflated (measured max step with the guard: 1.1-1.4x lr, as
with fp32 state). Storing sqrt(v) would also avoid the underflow but doubles the relative
error of every denominator to fix a few elements.

Known limitation, not corrected: with round-to-nearest, a per-step change of v below half
an E5M2 ulp (6-12 %) is lost, so v can lag its EMA: beta2 = 0.95's 5 % decay never registers
on its own, and with beta2 = 0.999 the early (1 - beta2) * g**2 increments stop registering.
On an MLP after 200 steps the median stored v was 4.7x (beta2 0.95) and 0.53x (0.999) the
fp32 EMA; final losses still land within 0.9-1.1x of fp32 state (beta2 0.95). Stochastic
rounding would fix it at the cost of a random stream in the state.

bf16 parameters (precision=bf16_pure). The update is computed in float32, then the parameter
is stored back in bf16 one of three ways (`bf16_update`):

- plain: round to nearest. A change below half a bf16 ulp (2**-9 of the weight) is lost, so
  once Adam's step (~lr) falls below ~0.002 x |w| late in a cosine, most weights stop moving
  (every norm weight near 1 is frozen from lr < 0.0039).
- stochastic: round away from zero with probability (dropped bits) / 2**16, torchao's
  ``_fp32_to_bf16_sr`` bit for bit given the same 16 random bits; unbiased, so small updates
  are kept in expectation. The bits come from a generator seeded by (seed, the parameter's
  step, its index), not the global stream: data-parallel replicas round alike, and a resumed
  run draws what the uninterrupted one drew, with no generator state to checkpoint.
- kahan: a bf16 buffer ``kahan_comp`` per parameter holds what rounding dropped; the fp32
  master weight is ``p + kahan_comp`` (about 16 significant bits). The next step updates the
  master and rounds again, so nothing is lost and it is deterministic (Zamirai et al.,
  "Revisiting BFloat16 Training", 2020). Saved with the moments, so a checkpoint keeps it.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import chain
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from trainlab.vocab.precision import BF16_UPDATES

STATE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16,
                "e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_DTYPE_KEYS = ("exp_avg_dtype", "exp_avg_sq_dtype")
_F32_MAX = torch.finfo(torch.float32).max


def state_dtype(name: str) -> torch.dtype:
    """The torch dtype of a moment storage name; ValueError naming the choices otherwise."""
    try:
        return STATE_DTYPES[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown optimizer state dtype {name!r}; choose one of {', '.join(STATE_DTYPES)}"
        ) from None


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes held by every tensor in the optimizer's state (moments, scales, step counters)."""
    return sum(v.numel() * v.element_size()
               for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v))


def _smallest_subnormal(dtype: torch.dtype) -> float:
    info = torch.finfo(dtype)
    return info.smallest_normal * info.eps  # eps = 2**-mantissa_bits


def _load(state: dict[str, Any], key: str) -> torch.Tensor:
    """The moment in float32; the stored tensor itself (updated in place) when it is fp32."""
    stored = state[key]
    if stored.dtype == torch.float32:
        return stored
    value = stored.float()
    if stored.dtype in _FP8:
        value.div_(state[f"{key}_scale"])
    return value


def _store(state: dict[str, Any], key: str, value: torch.Tensor, dtype: torch.dtype, *,
           keep_positive: bool) -> None:
    """Round `value` into `dtype` storage; `keep_positive`: positive values never become 0."""
    state.pop(f"{key}_scale", None)
    if dtype not in _FP8:
        if value is not state[key]:
            state[key] = value.to(dtype)
        return
    fmax = torch.finfo(dtype).max
    amax = value.abs().amax()
    scale = torch.where(amax > 0, fmax / amax, 1.0).clamp_(max=_F32_MAX)  # fp32 0-dim tensor
    scaled = (value * scale).clamp_(-fmax, fmax)  # rounding never overflows to NaN
    if keep_positive:
        scaled = torch.where(scaled > 0, scaled.clamp(min=_smallest_subnormal(dtype)), scaled)
    state[key] = scaled.to(dtype)
    state[f"{key}_scale"] = scale


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank (updated in place), any other tensor itself."""
    return t.to_local() if isinstance(t, DTensor) else t


def bf16_stochastic_round(x: torch.Tensor, *, generator: torch.Generator | None = None) -> torch.Tensor:
    """float32 -> bfloat16, rounding away from zero with probability (low 16 bits) / 2**16.

    Bit for bit torchao.optim.quant_utils._fp32_to_bf16_sr given the same 16 random bits r per
    element (`generator` supplies them): it rounds away iff r < the low 16 bits, which is when
    adding 0xFFFF - r to the float's bits carries into the upper 16 (one bf16 ulp further from
    zero, in int32 sign-magnitude; inf past the largest finite, as torchao). The carry form,
    torchao's own faster alternative, is ~2x cheaper than its torch.where on CPU."""
    assert x.dtype == torch.float32, x.dtype
    bits = torch.randint(0, 1 << 16, x.shape, device=x.device, dtype=torch.int32, generator=generator)
    bits.neg_().add_(0xFFFF).add_(x.view(torch.int32)).bitwise_and_(-0x10000)
    return bits.view(torch.float32).bfloat16()  # exact: the low 16 bits are zero


def _sr_seed(seed: int, step: int, index: int) -> int:
    """One generator seed per (run seed, parameter step, parameter index): a resumed run and
    every data-parallel replica draw the same bits for the same parameter and step."""
    return ((seed * 1_000_003 + step) * 1_000_033 + index) % (1 << 63)


class LowPrecisionAdamW(torch.optim.Optimizer):
    """torch.optim.AdamW's update with the moments stored as `exp_avg_dtype` / `exp_avg_sq_dtype`.

    Names are keys of STATE_DTYPES ("fp32", "bf16", "e4m3", "e5m2"); param groups may set
    their own. With both "fp32" it is bit-identical to ``torch.optim.AdamW(foreach=False)``.
    Parameters may be float32 or bfloat16: bf16 ones are updated in float32, then stored as
    `bf16_update` says (plain, stochastic or kahan; see the module docstring; `seed` seeds
    stochastic rounding). No amsgrad, maximize or sparse gradients.
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, *, exp_avg_dtype: str = "fp32",
                 exp_avg_sq_dtype: str = "fp32", bf16_update: str = "plain", seed: int = 0) -> None:
        if lr < 0 or eps < 0 or weight_decay < 0:
            raise ValueError(f"lr={lr}, eps={eps} and weight_decay={weight_decay} must be >= 0")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas={betas} must each lie in [0, 1)")
        if bf16_update not in BF16_UPDATES:
            raise ValueError(f"bf16_update={bf16_update!r} is not known; choose one of {', '.join(BF16_UPDATES)}")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        exp_avg_dtype=exp_avg_dtype, exp_avg_sq_dtype=exp_avg_sq_dtype)
        super().__init__(params, defaults)
        self.bf16_update = bf16_update
        self.seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Validate a group's storage names before torch registers it."""
        for key in _DTYPE_KEYS:
            state_dtype(param_group.get(key, self.defaults[key]))
        super().add_param_group(param_group)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # groups saved by torch.optim.AdamW have no storage names: use this optimizer's
        super().__setstate__(state)
        for group in self.param_groups:
            for key in _DTYPE_KEYS:
                group.setdefault(key, self.defaults.get(key, "fp32"))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's load, then the stored dtypes put back.

        torch casts every floating state tensor to its parameter's dtype: FP8 moments would
        come back as fp32 (4x the memory) and scales of bf16 parameters rounded to bf16.
        """
        super().load_state_dict(state_dict)
        saved_ids = chain.from_iterable(g["params"] for g in state_dict["param_groups"])
        params = chain.from_iterable(g["params"] for g in self.param_groups)
        for pid, p in zip(saved_ids, params):
            saved = state_dict["state"].get(pid)
            if saved:  # copies, so stepping never writes into the caller's state_dict
                self.state[p] = {k: v.to(device=p.device, copy=True) if torch.is_tensor(v) else v
                                 for k, v in saved.items()}

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        """One AdamW step over every parameter with a gradient; returns closure's loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        index = -1  # the parameter's position over all groups: part of its rounding seed
        for group in self.param_groups:
            lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
            beta1, beta2 = group["betas"]
            m_dtype = state_dtype(group["exp_avg_dtype"])
            v_dtype = state_dtype(group["exp_avg_sq_dtype"])
            for p in group["params"]:
                index += 1
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("LowPrecisionAdamW does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    for key, dtype in (("exp_avg", m_dtype), ("exp_avg_sq", v_dtype)):
                        state[key] = torch.zeros_like(p, dtype=dtype,
                                                      memory_format=torch.preserve_format)
                        if dtype in _FP8:
                            state[f"{key}_scale"] = torch.tensor(1.0, device=p.device)
                    if self.bf16_update == "kahan" and p.dtype == torch.bfloat16:
                        state["kahan_comp"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                step = state["step"].item()

                # the same operations, in the same order, as torch's single-tensor AdamW
                grad = p.grad.float()
                param = p if p.dtype == torch.float32 else p.float()
                if "kahan_comp" in state:  # the master weight: what rounding dropped, added back
                    param.add_(state["kahan_comp"])
                if wd != 0:
                    param.mul_(1 - lr * wd)
                exp_avg = _load(state, "exp_avg").lerp_(grad, 1 - beta1)
                exp_avg_sq = _load(state, "exp_avg_sq").mul_(beta2)
                exp_avg_sq.addcmul_(grad, grad, value=1 - beta2)
                step_size = lr / (1 - beta1 ** step)
                bias_correction2_sqrt = (1 - beta2 ** step) ** 0.5
                denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
                param.addcdiv_(exp_avg, denom, value=-step_size)
                if param is not p:
                    self._store_param(p, param, state, seed=_sr_seed(self.seed, int(step), index))

                _store(state, "exp_avg", exp_avg, m_dtype, keep_positive=False)
                _store(state, "exp_avg_sq", exp_avg_sq, v_dtype, keep_positive=True)
        return loss

    def _store_param(self, p: torch.Tensor, master: torch.Tensor, state: dict[str, Any], *,
                     seed: int) -> None:
        """Round the float32 `master` into the low-precision parameter `p` (in place)."""
        if "kahan_comp" in state:
            p.copy_(master)  # to nearest; the remainder is exact in fp32, rounded once to bf16
            state["kahan_comp"].copy_(master.sub_(p))
        elif self.bf16_update == "stochastic" and p.dtype == torch.bfloat16:
            local = _local(master)
            generator = self._generators.get(local.device)
            if generator is None:
                generator = self._generators[local.device] = torch.Generator(local.device)
            _local(p).copy_(bf16_stochastic_round(local, generator=generator.manual_seed(seed)))
        else:
            p.copy_(master)
