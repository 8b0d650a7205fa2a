"""model.tp_plan held to one rank's shapes before anything starts: on the meta device, no process group.

Plain tensors flow between the modules of a plan from config (parallel.tp_user): torch's
ColwiseParallel() returns this rank's slice of a linear's output features (weight Shard(0), output
Shard(-1) as a local tensor), RowwiseParallel() takes such a slice (input Shard(-1), weight Shard(1))
and returns the whole output. So a rank computes with the shapes the model has when each colwise
linear is Linear(in, out / tp) and each rowwise one Linear(in / tp, out), the sizes dividing
(tp_user.check_divisible, checked first). The model's forward on the meta device with those swapped
in fails where a rank's would, in no time and without a process group: a query sharded while keys and
values stay whole (attention's head counts differ), an output projection left whole (its input is a
slice), a colwise head whose logits nothing gathers (a rank returns a slice of the vocabulary).

A refusal names the plan's entry, the module whose forward breaks, and the linears to shard with it,
as torchtitan's Llama plan shards wq/wk/wv with wo and w1/w3 with w2: those that read the same input
as a colwise linear are colwise with it, the next linear of their module (the one reading their
output) is rowwise. The plan it gives has passed this same check. A forward that reads values on the
meta device (transformers' mask checks) runs under FakeTensorMode, which they skip; one that fails
there too is not checked here. Alike blocks (a 7b's 32) are run once: under a second for any size.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from contextlib import contextmanager, nullcontext

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from trainlab.parallel.tp_user import FIELD, check_divisible, matches, resolve, user_tp_plan

Calls = dict[str, tuple[int, object]]
"""Linear path -> (the order of its first call, the tensor it was called on)."""


def check_plan_shapes(model: nn.Module, plan: Mapping[str, str], tp: int, *, seq_len: int) -> None:
    """ValueError naming model.tp_plan's entry, what breaks and a plan that passes, unless one rank
    of `tp` runs `model`'s forward on [1, seq_len] tokens under `plan` with consistent shapes and
    returns the shape the unsharded model returns. `plan` has passed check_divisible."""
    with _distinct_blocks(model, resolve(model, plan)):  # a 7b's 32 alike blocks: one runs, in a tenth of the time
        _check(model, plan, tp, seq_len=seq_len)


def _check(model: nn.Module, plan: Mapping[str, str], tp: int, *, seq_len: int) -> None:
    for fake in (False, True):  # FakeTensorMode where meta tensors are not enough (transformers reads a mask's values)
        forward = _forward(model, seq_len, fake=fake)
        baseline = _linear_calls(model, forward)
        if baseline is not None:
            break
    else:
        return  # its forward needs values: the ranks will tell
    calls, want = baseline
    resolved = resolve(model, plan)
    failing, error, got = _sharded_forward(model, resolved, tp, forward)
    if error is None and got == want:
        return
    entries = _implicated(plan, resolved, calls, failing)
    fix, added = _a_plan_that_fits(model, plan, resolved, calls, entries, tp, forward=forward, want=want)
    what = f"{failing or type(model).__name__} fails on one rank's shapes ({_first_line(error)})" if error else (
        f"{type(model).__name__} returns {_shape_text(got)} on one rank instead of {_shape_text(want)}")
    head = ", ".join(f"{p} is {plan[p]}" for p in entries)
    rule = ("the linears that read a colwise linear's input are colwise with it, and the next one of their "
            "module, reading their output, rowwise")
    if fix is not None and added:
        missing = ", ".join(f"{k} {v}" for k, v in added.items())
        raise ValueError(f"{FIELD}: {head}, but {missing} {'is' if len(added) == 1 else 'are'} missing: {what}; "
                         f"{rule}; give '{as_override(fix)}'")
    if fix is not None:
        raise ValueError(f"{FIELD}: {head}, but no linear after {'it' if len(entries) == 1 else 'them'} takes "
                         f"the slice it returns: {what}; leave {', '.join(entries)} out: give '{as_override(fix)}'")
    if error is None:
        rule = "a colwise linear returns its slice of the features, which a rowwise linear after it must take"
    raise ValueError(f"{FIELD}: {head}, but the linears around {'it' if len(entries) == 1 else 'them'} are not "
                     f"sharded to match: {what}; {rule}; fix {FIELD} so, or shard by data instead (parallel=fsdp)")


def as_override(plan: Mapping[str, str]) -> str:
    """`plan` as the command line writes it (quote it there: braces, commas and * are the shell's too)."""
    return f"{FIELD}={{" + ",".join(f"{k}:{v}" for k, v in plan.items()) + "}"


# ---------------------------------------------------------------- one rank's forward, on meta


@contextmanager
def _distinct_blocks(model: nn.Module, resolved: Mapping[str, str]):
    """`model.layers` (an nn.ModuleList) holding, while in the block, only the first of each kind
    of block: alike blocks (the same modules and linear sizes, the same styles in the plan) meet
    the same shapes. Their indices stay theirs (layers.7 is still layers.7); iterating over
    `layers`, as a model's forward does, runs the kept ones in order."""
    layers = getattr(model, "layers", None)
    if type(layers) is not nn.ModuleList or len(layers) < 2:
        yield
        return
    kept: dict[tuple, tuple[str, nn.Module]] = {}
    for index, block in layers.named_children():
        styles = tuple(sorted((p.split(".", 2)[2], s) for p, s in resolved.items() if p.split(".")[:2] == ["layers", index]))
        shape = tuple((n, type(m).__name__, getattr(m, "in_features", 0), getattr(m, "out_features", 0))
                      for n, m in block.named_modules())
        kept.setdefault((styles, shape), (index, block))
    trimmed = nn.ModuleList()
    trimmed._modules = OrderedDict(kept.values())  # their own indices: paths and messages name the real blocks
    model.layers = trimmed
    try:
        yield
    finally:
        model.layers = layers


def _device(model: nn.Module) -> torch.device:
    first = next(model.parameters(), None)
    return first.device if first is not None else torch.device("meta")


def _output_shape(out) -> tuple[int, ...] | None:
    """The logits' shape of what a forward returned (a tensor, a tuple, a ModelOutput)."""
    out = getattr(out, "logits", out)
    if isinstance(out, (tuple, list)) and out:
        out = out[0]
    return tuple(out.shape) if isinstance(out, torch.Tensor) else None


def _forward(model: nn.Module, seq_len: int, *, fake: bool) -> Callable[[], object]:
    """The model's forward on [1, seq_len] tokens, without gradients, on its parameters' device
    (meta), under FakeTensorMode if `fake`."""
    tokens = torch.zeros(1, seq_len, dtype=torch.long, device=_device(model))

    def run():
        with FakeTensorMode(allow_non_fake_inputs=True) if fake else nullcontext(), torch.no_grad(), _quiet(fake):
            return model(tokens)
    return run


@contextmanager
def _quiet(fake: bool):
    """FakeTensorMode logs each failing op's traceback at ERROR: the shape error is ours to report, in one line."""
    log = logging.getLogger(FakeTensorMode.__module__)
    was = log.disabled
    log.disabled = was or fake
    try:
        yield
    finally:
        log.disabled = was


def _linear_calls(model: nn.Module, forward: Callable[[], object]) -> tuple[Calls, tuple[int, ...] | None] | None:
    """Every linear's first call in the unsharded forward, and its output's shape; None where the
    forward does not run on these tokens (a model that reads values, on meta)."""
    calls: Calls = {}

    def record(path):
        def hook(_module, args):
            calls.setdefault(path, (len(calls), args[0] if args else None))  # the tensor kept: its id stays its own
        return hook

    handles = [m.register_forward_pre_hook(record(p)) for p, m in model.named_modules() if isinstance(m, nn.Linear)]
    try:
        out = forward()
    except Exception:  # noqa: BLE001 - any failure of the unsharded forward means: not checkable here
        return None
    finally:
        for h in handles:
            h.remove()
    return calls, _output_shape(out)


def _sharded_forward(model: nn.Module, resolved: Mapping[str, str], tp: int,
                     forward: Callable[[], object]) -> tuple[str, Exception | None, tuple[int, ...] | None]:
    """(the innermost module the forward failed in, its error, None) or ("", None, output shape) of
    one rank's forward: each listed linear swapped for its shard's shape, put back after."""
    swapped = []
    for path, style in resolved.items():
        linear = model.get_submodule(path)
        parent, _, name = path.rpartition(".")
        owner = model.get_submodule(parent)
        i, o = (linear.in_features, linear.out_features // tp) if style == "colwise" else (
            linear.in_features // tp, linear.out_features)
        shard = nn.Linear(i, o, bias=linear.bias is not None, device=linear.weight.device, dtype=linear.weight.dtype)
        setattr(owner, name, shard)
        swapped.append((owner, name, linear))
    stack: list[str] = []  # the modules whose forward runs now, outermost first

    def enter(path):
        def hook(_module, _args) -> None:
            stack.append(path)
        return hook

    def leave(_module, _args, _out) -> None:  # returns None: the output stays the module's
        stack.pop()

    handles = []
    for path, module in model.named_modules():
        handles += [module.register_forward_pre_hook(enter(path)), module.register_forward_hook(leave)]
    try:
        return "", None, _output_shape(forward())
    except Exception as e:  # noqa: BLE001 - the shape error a rank would meet
        return (stack[-1] if stack else ""), e, None
    finally:
        for h in handles:
            h.remove()
        for owner, name, linear in reversed(swapped):
            setattr(owner, name, linear)


# ---------------------------------------------------------------- which entry, and a plan that fits


def _parent(path: str) -> str:
    return path.rpartition(".")[0]


def _entry_of(plan: Mapping[str, str], path: str) -> str:
    return next(pattern for pattern in plan if matches(pattern, path))


def _implicated(plan: Mapping[str, str], resolved: Mapping[str, str], calls: Calls, failing: str) -> list[str]:
    """The plan's entries the failure is about: those whose module holds the failing one (or is
    it); for a wrong output, the colwise ones whose module has no linear after them."""
    if failing:
        hit = [p for p in resolved if failing == p or (failing == _parent(p) or failing.startswith(_parent(p) + ".")
                                                       if _parent(p) else not failing)]
    else:
        hit = [p for p, s in resolved.items() if s == "colwise" and not _partners(p, s, calls)[1]]
    entries = list(dict.fromkeys(_entry_of(plan, p) for p in hit or resolved))
    return entries


def _partners(path: str, style: str, calls: Calls) -> tuple[list[str], list[str]]:
    """(colwise, rowwise) linears of `path`'s module that a `style` `path` needs: for colwise, the
    linears reading its input, and the next one of the module after them; for rowwise, the linears
    reading the input of the one called just before it."""
    parent = _parent(path)
    own = sorted((p for p in calls if _parent(p) == parent), key=lambda p: calls[p][0])
    if path not in own:
        return [], []
    if style == "colwise":
        group = [p for p in own if calls[p][1] is calls[path][1]]
        after = [p for p in own if calls[p][0] > calls[group[-1]][0] and p not in group]
        return group, after[:1]
    before = [p for p in own if calls[p][0] < calls[path][0]]
    if not before:
        return [], [path]
    return [p for p in own if calls[p][1] is calls[before[-1]][1]], [path]


def _a_plan_that_fits(model: nn.Module, plan: Mapping[str, str], resolved: Mapping[str, str], calls: Calls,
                      entries: list[str], tp: int, *, forward: Callable[[], object],
                      want: tuple[int, ...] | None) -> tuple[dict[str, str] | None, dict[str, str]]:
    """A plan that passes every check, and the entries it adds: `plan` with each implicated entry's
    partners added (as patterns of the entry's form), else `plan` without the implicated entries
    (nothing added); (None, {}) where neither passes (or the second would leave no plan)."""
    grown, added = dict(plan), {}
    for entry in entries:
        path = next(p for p in resolved if matches(entry, p))
        colwise, rowwise = _partners(path, plan[entry], calls)
        prefix = entry.rpartition(".")[0]
        for p, style in [(p, "colwise") for p in colwise] + [(p, "rowwise") for p in rowwise]:
            name = p.rpartition(".")[2]
            key = f"{prefix}.{name}" if prefix else name
            if grown.get(key) != style:
                grown[key] = added[key] = style
    shrunk = {k: v for k, v in plan.items() if k not in entries}
    for candidate in ([grown] if added else []) + ([shrunk] if shrunk else []):
        if _passes(model, candidate, tp, forward=forward, want=want):
            return candidate, added if candidate is grown else {}
    return None, {}


def _passes(model: nn.Module, plan: Mapping[str, str], tp: int, *, forward: Callable[[], object],
            want: tuple[int, ...] | None) -> bool:
    try:
        check_divisible(model, user_tp_plan(model, plan), tp)
    except ValueError:
        return False
    _, error, got = _sharded_forward(model, resolve(model, plan), tp, forward)
    return error is None and got == want


def _first_line(error: Exception | None) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200]}" if text else type(error).__name__


def _shape_text(shape: tuple[int, ...] | None) -> str:
    return "no tensor" if shape is None else f"logits of shape [{', '.join(map(str, shape))}]"


__all__ = ["as_override", "check_plan_shapes"]
