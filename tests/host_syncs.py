"""Counting the host syncs a training step makes: the points where the host would wait for a GPU.

On CPU nothing waits, so what is counted is what would wait on a GPU, made by trainlab's own
code (the first frame outside torch's dispatch wrappers is under trainlab/):
- a tensor read to the host: item(), tolist(), float() / int() / bool(), numpy(); except a tensor
  born on the host (a factory call without a device, e.g. a flag for a gloo vote), which is a
  host tensor on a GPU machine too;
- a tensor made from host data on a device, torch.tensor / torch.as_tensor with device=...: a
  blocking host-to-device copy;
- torch.cuda.synchronize, and Event.synchronize on an event the device has not passed.
Syncs inside torch itself (GradScaler's found-inf check, DTensor) are not counted here; on a GPU,
tests/gpu counts every sync with torch.cuda.set_sync_debug_mode.
"""

from __future__ import annotations

import sys
import weakref
from collections import Counter

import torch
from torch.overrides import TorchFunctionMode

_READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.__float__,
          torch.Tensor.__int__, torch.Tensor.__bool__, torch.Tensor.__index__}
_COPIES_IN = {torch.tensor, torch.as_tensor}
_FACTORIES = {torch.tensor, torch.as_tensor, torch.zeros, torch.ones, torch.full, torch.empty}
_WRAPPERS = ("torch/overrides.py", "torch/_tensor.py", "torch/utils/_python_dispatch.py", __file__)


def _caller() -> str | None:
    """file:line of the first frame outside torch's dispatch wrappers and this module."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.endswith(_WRAPPERS):
        frame = frame.f_back
    return None if frame is None else f"{frame.f_code.co_filename}:{frame.f_lineno}"


def _ours(site: str | None) -> bool:
    return site is not None and "/trainlab/" in site


class HostSyncs(TorchFunctionMode):
    """A context: `count` host syncs made by trainlab code so far, `sites` where (file:line)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.sites: Counter[str] = Counter()
        self._host_born: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
        self._patched: list[tuple[object, str, object]] = []

    def _hit(self, site: str | None) -> None:
        if _ours(site):
            self.count += 1
            self.sites[site.rsplit("/", 1)[-1]] += 1

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in _READS and args and self._host_born.get(id(args[0])) is not args[0]:
            self._hit(_caller())
        elif func in _COPIES_IN and kwargs.get("device") is not None and not isinstance(args[0], torch.Tensor):
            self._hit(_caller())
        if func in _FACTORIES and kwargs.get("device") is None and isinstance(out, torch.Tensor) \
                and out.device.type == "cpu":
            self._host_born[id(out)] = out
        return out

    def __enter__(self):
        def counted_sync(*args, _orig=torch.cuda.synchronize, **kwargs):
            self._hit(_caller())
            return _orig(*args, **kwargs)

        def counted_event_sync(event, _orig=torch.cuda.Event.synchronize):
            if not event.query():
                self._hit(_caller())
            return _orig(event)

        for owner, name, fn in ((torch.cuda, "synchronize", counted_sync),
                                (torch.cuda.Event, "synchronize", counted_event_sync)):
            self._patched.append((owner, name, getattr(owner, name)))
            setattr(owner, name, fn)
        return super().__enter__()

    def __exit__(self, *exc):
        for owner, name, fn in reversed(self._patched):
            setattr(owner, name, fn)
        self._patched.clear()
        return super().__exit__(*exc)
