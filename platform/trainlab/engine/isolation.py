"""Trials one after another in the same worker processes (a warm gang), isolated from each other.

    state = GangState.capture()       # each worker, at gang start, before its first trial
    for run in trials:                # on the driver: fresh_gang_reason(ran=..., run=run, device=...)
        run_trial(plan_here(run), ...)
        state.after_trial()           # each worker, after each trial, on the thread that runs them

A trial must give the same bits whether it runs first in fresh processes or after other trials
in warm ones. What a trial leaves behind in its processes, found in this codebase, torch 2.13
and torchao 0.18, and what `after_trial` does with it:
- RNG: python, numpy, torch CPU (and every CUDA device) back to their states at capture. The
  engine reseeds them at each build (run.seed_everything) and nothing it runs before the seed
  draws in a way that could depend on an earlier trial; restored anyway, so code outside
  build_trainer starts as in a fresh process. DTensor's RNG tracker (a module global made by
  the first random op on a DTensor; models.init fills on the host, so none is made today) is
  dropped.
- torch flags: deterministic algorithms (and warn_only, fill_uninitialized_memory), cuDNN
  deterministic / benchmark / allow_tf32, cuBLAS allow_tf32 (precision.recipes sets it on
  CUDA), float32 matmul precision, default dtype, threads (run_trial sets
  cluster.cpus_per_worker), grad mode, autocast state and cache, anomaly mode. Restored through
  the legacy setters the recipes use: mixing them with torch's new fp32_precision API makes
  torch raise.
- torch.compile: torch._dynamo.reset() drops the compiled code. Without it every compiled trial
  leaves its cache entries on TransformerBlock.forward (2 per config: train and eval), shared by
  all later trials' blocks: the 5th distinct compiled config of a gang hit dynamo's
  recompile_limit (8) and ran eager, silently (measured). Dynamo's, inductor's and every other
  torch config module's values (parallel.compile sets skip_nnmodule_hook_guards) back to
  capture. The on-disk inductor cache stays: a fresh process reads it too. What reset leaves
  (torch 2.13): dynamo's rewritten code and the functions it installed as globals of the
  compiled module (the graph and its kernels, no parameter), until the process ends.
- environment variables back to capture (run_trial sets CUBLAS_WORKSPACE_CONFIG for
  train.deterministic, the tracker factory the store's credentials).
- process groups: every group made since capture (a layout's DeviceMesh sub-groups, the
  gloo group Preemption adds beside NCCL) is destroyed after DTensor's caches, which hold
  meshes and so groups, are emptied (trainlab.distributed.clear_dtensor_caches, as
  close_distributed does); the world group stays.
- memory: garbage collected, CUDA's cached blocks released and its peak reset, so the next
  trial's sys/peak_mem_gb counts only its own tensors (the trainer resets it again at start).
- the stop signals' handlers (events.STOP_SIGNALS; a Trainer installs them on the main thread; a trial that fails between
  its construction and train() never gives it back) and engine.preemption's stop-from-outside
  request and arming.

What stays on purpose: functools caches that are pure functions of their arguments returning
read-only values: data.text.text_corpus and data.markov.markov_corpus (read-only arrays),
config.bounds.field_types, precision.fp8_delayed._fp8_max (constants per device, only read),
torch's and torchao's op and safe-globals registrations (the same in every trial). Python's
warnings registry also stays: a warning shown once per process is not repeated by a later trial
(worker logs only: none of them reaches the tracker).

What cannot be put back, so the trial needs a fresh gang: see `fresh_gang_reason`.
"""

from __future__ import annotations

import gc
import os
import random
import signal
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

from trainlab.config.schema import RunConfig
from trainlab.distributed import clear_dtensor_caches
from trainlab.engine import preemption
from trainlab.events import STOP_SIGNALS
from trainlab.plan.derive_layout import compile_unit
from trainlab.vocab.precision import emulates, spec_of

CUDA_DEFAULT_SEED = 67280421310721
"""c10's default_rng_seed_val: what a CUDA device's generator starts from in a fresh process."""
AUTOCAST_DEVICES = ("cpu", "cuda")


# ---------------------------------------------------------------------------------------
# the flags: (name, read, write), read and written in this order (matmul precision after
# allow_tf32: setting allow_tf32 moves it)
def _deterministic() -> tuple[bool, bool]:
    return torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()


def _set_deterministic(value: tuple[bool, bool]) -> None:
    torch.use_deterministic_algorithms(value[0], warn_only=value[1])


def _autocast() -> tuple:
    return tuple((torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in AUTOCAST_DEVICES)


def _set_autocast(value: tuple) -> None:
    for device, (enabled, dtype) in zip(AUTOCAST_DEVICES, value):
        torch.set_autocast_enabled(device, enabled)
        torch.set_autocast_dtype(device, dtype)


def _set_attr(obj: Any, name: str) -> Callable[[Any], None]:
    return lambda value: setattr(obj, name, value)


_DETERMINISTIC_MODULE = torch.utils.deterministic
FLAGS: tuple[tuple[str, Callable[[], Any], Callable[[Any], None]], ...] = (
    ("use_deterministic_algorithms", _deterministic, _set_deterministic),
    ("deterministic.fill_uninitialized_memory", lambda: _DETERMINISTIC_MODULE.fill_uninitialized_memory,
     _set_attr(_DETERMINISTIC_MODULE, "fill_uninitialized_memory")),
    ("cudnn.deterministic", lambda: torch.backends.cudnn.deterministic,
     _set_attr(torch.backends.cudnn, "deterministic")),
    ("cudnn.benchmark", lambda: torch.backends.cudnn.benchmark, _set_attr(torch.backends.cudnn, "benchmark")),
    ("cudnn.allow_tf32", lambda: torch.backends.cudnn.allow_tf32, _set_attr(torch.backends.cudnn, "allow_tf32")),
    ("cuda.matmul.allow_tf32", lambda: torch.backends.cuda.matmul.allow_tf32,
     _set_attr(torch.backends.cuda.matmul, "allow_tf32")),
    ("float32_matmul_precision", torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
    ("default_dtype", torch.get_default_dtype, torch.set_default_dtype),
    ("num_threads", torch.get_num_threads, torch.set_num_threads),
    ("grad_enabled", torch.is_grad_enabled, torch.set_grad_enabled),
    ("autocast", _autocast, _set_autocast),
    ("autocast_cache_enabled", torch.is_autocast_cache_enabled, torch.set_autocast_cache_enabled),
    ("anomaly", lambda: (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
     lambda value: torch.set_anomaly_enabled(*value)),
)


@dataclass
class GangState:
    """What a worker process looked like before its gang's first trial (`capture`), put back
    after each trial (`after_trial`); one per worker process."""

    flags: dict[str, Any]
    environ: dict[str, str]
    configs: dict[str, dict[str, Any]]
    """torch's config modules (dynamo, inductor, functorch, ...) by module name: their values."""
    groups: set = field(default_factory=set)
    """The process groups that existed at capture (the world, and any the launcher made)."""
    rng: dict[str, Any] = field(default_factory=dict)
    handlers: dict[int, Any] = field(default_factory=dict)
    """The handler of each stop signal (events.STOP_SIGNALS: a Trainer takes them all) at capture
    ({}: captured off the main thread, where none can be set)."""
    preemption: tuple[bool, bool] = (False, False)

    @classmethod
    def capture(cls) -> GangState:
        """This process now: call it at gang start, before the first trial, on the thread that
        will run the trials (torch's config values are per thread)."""
        import torch._dynamo  # noqa: F401 - loads the config modules to snapshot; every trial imports it anyway

        return cls(flags={name: read() for name, read, _ in FLAGS}, environ=dict(os.environ),
                   configs=_configs(), groups=set(_groups()), rng=_rng_states(),
                   handlers={s: signal.getsignal(s) for s in STOP_SIGNALS} if _main_thread() else {},
                   preemption=preemption.outside_state())

    def after_trial(self, *, barrier: bool = True) -> None:
        """Put back what the trial changed (module docstring), so the next trial starts as in a
        fresh process. Every rank calls it after every trial, finished, diverged or failed.
        `barrier=False` where a peer may have failed (the barrier before the groups go would wait
        for it), as for close_distributed."""
        if barrier and dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()  # no rank destroys a group a peer still uses
        clear_dtensor_caches()  # they hold the trial's meshes, and so its groups
        if _compiled_frames():
            torch._dynamo.reset()
        for group in self._new_groups():
            dist.destroy_process_group(group)
        for name, read, write in FLAGS:
            if read() != self.flags[name]:
                write(self.flags[name])
        torch.clear_autocast_cache()
        for name, values in self.configs.items():
            module = sys.modules[name]
            for key, value in _config_diff(module, values).items():
                setattr(module, key, value)
        _restore_environ(self.environ)
        _restore_rng(self.rng)
        for s in self._changed_handlers():
            signal.signal(s, self.handlers[s])
        preemption.restore_outside(self.preemption)
        gc.collect()  # the trial's model, optimizer and graphs are unreachable by now
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()

    def _changed_handlers(self) -> list[int]:
        if not _main_thread():
            return []
        return [s for s, handler in self.handlers.items() if handler is not None and signal.getsignal(s) is not handler]

    def changed(self) -> list[str]:
        """What differs from capture now, by name (values left out: the environment may hold
        credentials); [] right after `after_trial`. For tests and logs."""
        out = [f"flag:{name}" for name, read, _ in FLAGS if read() != self.flags[name]]
        out += [f"config:{name}.{key}" for name, values in self.configs.items()
                for key in _config_diff(sys.modules[name], values)]
        env = dict(os.environ)
        out += [f"env:{k}" for k in sorted(env.keys() | self.environ.keys()) if env.get(k) != self.environ.get(k)]
        out += [f"group:{_group_name(g)}" for g in self._new_groups()]
        out += [f"rng:{k}" for k, v in _rng_states().items() if not _same_rng(v, self.rng.get(k))]
        if _compiled_frames():
            out.append("dynamo:compiled code cached")
        out += [f"signal:{signal.Signals(s).name} handler" for s in self._changed_handlers()]
        if preemption.outside_state() != self.preemption:
            out.append("preemption:outside request")
        return out

    def _new_groups(self) -> list:
        """The groups made since capture; never the world (a gang keeps it, even one that a
        first trial made after capture, as setup_distributed does under torchrun)."""
        return [g for g in _groups() if g not in self.groups and g is not dist.GroupMember.WORLD]


# ---------------------------------------------------------------------------------------
def fresh_gang_reason(*, ran: list[RunConfig], run: RunConfig, device: str) -> str:
    """On the driver, from the configs alone: "" if `run` may follow the trials `ran` (in the
    order they ran) on the same warm gang of `device` ("cpu" or "cuda", as resolved), else why
    not, in one line recorded on the trial's run.

    On CPU every trial may follow any other: after_trial puts back all a trial changes. On CUDA
    two changes outlive it:
    - cuBLAS sizes its workspace from CUBLAS_WORKSPACE_CONFIG once per process, at the first
      matmul (torch's getChosenWorkspaceSize keeps the first value): a gang's kernels are those
      of its first trial's train.deterministic (engine.determinism sets :4096:8 for true).
    - torchao's convert_to_float8_training patches inductor's Triton min/max code generation
      for the rest of the process (torchao.float8._inductor_patch, a workaround for a Triton
      miscompile; its original is gone): a compiled trial that is not a torchao FP8 one would
      run other kernels than in a fresh process. A torchao FP8 trial patches before compiling,
      fresh or warm alike.
    """
    assert device in ("cpu", "cuda"), f"fresh_gang_reason: device {device!r}, resolved to cpu or cuda expected"
    if device == "cpu" or not ran:
        return ""
    first = ran[0]
    if run.train.deterministic != first.train.deterministic:
        return (f"fresh gang: train.deterministic={str(run.train.deterministic).lower()} after "
                f"{str(first.train.deterministic).lower()}: cuBLAS reads CUBLAS_WORKSPACE_CONFIG once per "
                "process, at the gang's first matmul")
    patched = [r.precision.name for r in ran if spec_of(r.precision.name).torchao_recipe]
    if patched and not spec_of(run.precision.name).torchao_recipe and compiles(run, device=device):
        return (f"fresh gang: a compiled {run.precision.name} trial after {patched[0]}, whose torchao FP8 "
                "conversion patched inductor's Triton min/max code generation for the rest of the process")
    return ""


def compiles(run: RunConfig, *, device: str) -> bool:
    """Whether `run` runs torch.compile on `device` (train.compile with auto resolved)."""
    return bool(compile_unit(run, device_type=device, emulated=emulates(run.precision, device_type=device)))


# ---------------------------------------------------------------------------------------
def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _configs() -> dict[str, dict[str, Any]]:
    """The values of every torch config module loaded now (torch.utils._config_module)."""
    from torch.utils._config_module import ConfigModule

    return {name: module.get_config_copy() for name, module in list(sys.modules.items())
            if isinstance(module, ConfigModule)}


def _config_diff(module, values: dict[str, Any]) -> dict[str, Any]:
    """The keys of a config module whose value is not the captured one: key -> captured value."""
    now = module.get_config_copy()
    return {k: v for k, v in values.items() if k in now and not _same(now[k], v)}


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - values without a usable ==
        return a is b


def _restore_environ(saved: dict[str, str]) -> None:
    for key in [k for k in os.environ if k not in saved]:
        del os.environ[key]
    for key, value in saved.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


def _groups() -> list:
    """Every process group of this process (private torch API, 2.13); [] without a world."""
    if not dist.is_initialized():
        return []
    from torch.distributed.distributed_c10d import _world

    return list(_world.pg_map)


def _group_name(group) -> str:
    try:
        return f"{group.group_name}({dist.get_world_size(group)} ranks)"
    except Exception:  # noqa: BLE001 - a name for a message only
        return repr(group)


def _rng_states() -> dict[str, Any]:
    states = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _restore_rng(saved: dict[str, Any]) -> None:
    random.setstate(saved["python"])
    np.random.set_state(saved["numpy"])
    torch.set_rng_state(saved["torch"])
    if torch.cuda.is_initialized():
        if "cuda" in saved:
            torch.cuda.set_rng_state_all(saved["cuda"])
        else:  # CUDA started during a trial: its generators as a fresh process has them
            torch.cuda.manual_seed_all(CUDA_DEFAULT_SEED)
    random_module = sys.modules.get("torch.distributed.tensor._random")
    if random_module is not None and getattr(random_module, "_rng_tracker", None) is not None:
        random_module._rng_tracker = None  # made again, from a fresh state, by the next random DTensor op


def _same_rng(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, list):  # CUDA: one state per device
        return isinstance(b, list) and len(a) == len(b) and all(_same_rng(x, y) for x, y in zip(a, b))
    if isinstance(a, tuple) and len(a) == 5 and isinstance(a[1], np.ndarray):  # numpy's
        return isinstance(b, tuple) and a[0] == b[0] and np.array_equal(a[1], b[1]) and a[2:] == b[2:]
    return a == b


def _compiled_frames() -> int:
    """How many frames dynamo compiled since its last reset (0 when it is not loaded)."""
    convert_frame = sys.modules.get("torch._dynamo.convert_frame")
    return getattr(convert_frame, "FRAME_COUNTER", 0) if convert_frame is not None else 0


__all__ = ["FLAGS", "GangState", "compiles", "fresh_gang_reason"]
