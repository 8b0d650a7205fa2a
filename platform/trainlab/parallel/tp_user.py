"""model.tp_plan: a tensor-parallel plan written in config, for a model trainlab has no plan for.

    model.tp_plan={layers.*.mlp.fc:colwise,layers.*.mlp.proj:rowwise}

The same form as transformers' ``base_model_tp_plan``: a module path pattern (dot-separated,
each name matched like a shell glob, so ``*`` is one whole name such as a block index) -> a
style. A listed module must be an nn.Linear and gets torch's style with its defaults, so plain
tensors flow between modules as in transformers' own tensor parallelism:

- colwise: ColwiseParallel(), weight and bias sharded on the output features; its output is
  this rank's slice of the features (a plain tensor), e.g. this rank's heads;
- rowwise: RowwiseParallel(), weight sharded on the input features; it takes this rank's
  slice and returns the output all-reduced, a plain tensor equal on every rank.

Every other parameter becomes a Replicate DTensor, because trainlab's grad-norm, clipping,
optimizer and FSDP over (dp, tp) expect every parameter of a tensor-parallel model to be a
DTensor: each module that owns parameters itself gets `_ReplicateOwn`, which replicates those
(not its buffers, not its children's) and runs its forward on Replicate DTensors, giving back
plain tensors. A module that owns parameters and has children with parameters cannot be
handled so (its own code would mix the two kinds) and is refused, unless it is listed.

What follows from plain tensors between modules: a parameter read outside its module's call
(``self.wpe.weight[:T]``) is a DTensor there, and torch refuses to add it to a plain
activation: call the module instead (``self.wpe(positions)``).
"""

from __future__ import annotations

from collections.abc import Mapping
from fnmatch import fnmatchcase

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel
from torch.utils._pytree import tree_map

from trainlab.config.schema import TP_STYLES

FIELD = "model.tp_plan"


def matches(pattern: str, path: str) -> bool:
    """Whether module `path` fits `pattern`: as many names, each matched like a shell glob."""
    want, have = pattern.split("."), path.split(".")
    return len(want) == len(have) and all(fnmatchcase(h, w) for w, h in zip(want, have))


def resolve(model: nn.Module, plan: Mapping[str, str]) -> dict[str, str]:
    """Module path -> "colwise" | "rowwise" for every module a pattern of `plan` matches.

    Raises:
        ValueError: a style that is not known, a pattern matching no module, a match that is
            not an nn.Linear, or one module given both styles.
    """
    paths = [name for name, _ in model.named_modules() if name]
    out: dict[str, str] = {}
    for pattern, style in plan.items():
        if style not in TP_STYLES:
            raise ValueError(f"{FIELD}.{pattern}={style!r} is not a tensor-parallel style; choose one of "
                             f"{', '.join(TP_STYLES)}")
        hits = [p for p in paths if matches(pattern, p)]
        if not hits:
            linears = [p for p in paths if isinstance(model.get_submodule(p), nn.Linear)][:4]
            raise ValueError(f"{FIELD}: {pattern!r} matches no module of {type(model).__name__}; write paths as "
                             f"named_modules() names them, * for one whole name (its linears: {', '.join(linears)}, ...)")
        for path in hits:
            module = model.get_submodule(path)
            if not isinstance(module, nn.Linear):
                raise ValueError(f"{FIELD}: {pattern!r} matches {path}, a {type(module).__name__}, not an nn.Linear "
                                 f"(only linears are sharded); narrow {pattern!r} to linears or remove it")
            if out.get(path, style) != style:
                raise ValueError(f"{FIELD}: {path} is given both {out[path]} and {style} (by {pattern!r}); "
                                 "give each linear one style")
            out[path] = style
    return out


def check_divisible(model: nn.Module, styles: Mapping[str, ParallelStyle], tp: int) -> None:
    """Each colwise linear's out_features and each rowwise one's in_features of `styles` (what
    `user_tp_plan` made) split into `tp` equal shards (ValueError naming the module and the fix)."""
    for path, parallel_style in styles.items():
        if not isinstance(parallel_style, (ColwiseParallel, RowwiseParallel)):
            continue  # replicated
        linear = model.get_submodule(path)
        style = "colwise" if isinstance(parallel_style, ColwiseParallel) else "rowwise"
        side, size = ("out_features", linear.out_features) if style == "colwise" else ("in_features",
                                                                                       linear.in_features)
        if size % tp:
            raise ValueError(f"{FIELD}: {path} is {style} but its {side}={size} is not divisible by parallel.tp={tp}; "
                             f"set parallel.tp to a divisor of {size} or leave {path} out of {FIELD}")


def user_tp_plan(model: nn.Module, plan: Mapping[str, str]) -> dict[str, ParallelStyle]:
    """Module path ("" = the model) -> its style under `plan` (model.tp_plan): the listed
    linears' ColwiseParallel / RowwiseParallel, `_ReplicateOwn` for every other module owning
    parameters itself. What apply_tp applies and the memory estimate reads.

    Raises:
        ValueError: as `resolve`, or a module owning parameters with children that own some.
    """
    resolved = resolve(model, plan)
    styles: dict[str, ParallelStyle] = {
        path: ColwiseParallel() if style == "colwise" else RowwiseParallel() for path, style in resolved.items()}
    sharded = {id(p): path for path in resolved for p in model.get_submodule(path).parameters(recurse=False)}
    replicate = _ReplicateOwn()  # one instance: a parameter two modules share is replicated once
    for path, module in model.named_modules():
        if path in resolved or next(module.parameters(recurse=False), None) is None:
            continue
        tied = next((sharded[id(p)] for p in module.parameters(recurse=False) if id(p) in sharded), None)
        if tied is not None:
            raise ValueError(f"{FIELD}: {tied} shares a parameter with {path or type(model).__name__} (tied weights), "
                             f"which sharding it would untie; leave {tied} out of {FIELD}")
        nested = next((f"{path}.{n}" if path else n for n, c in module.named_children()
                       if next(c.parameters(), None) is not None), None)
        if nested is not None:
            where = path or f"the model itself ({type(model).__name__})"
            raise ValueError(f"{FIELD}: {where} owns parameters and has children with parameters ({nested}), which "
                             "cannot be replicated apart; move its own parameters into a child module, or list it "
                             f"in {FIELD} if it is a linear")
        styles[path] = replicate
    return styles


class _ReplicateOwn(ParallelStyle):
    """A module's own parameters (not its buffers, not its children's) as Replicate DTensors;
    its tensor inputs (positional and keyword) become Replicate DTensors and its DTensor
    outputs plain tensors again, so the code around it sees plain tensors only."""

    def __init__(self) -> None:
        self._done: dict[int, nn.Parameter] = {}

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        for name, param in list(module.named_parameters(recurse=False)):
            if isinstance(param, DTensor):
                continue
            replicated = self._done.get(id(param))
            if replicated is None:
                replicated = self._done[id(param)] = nn.Parameter(
                    distribute_tensor(param.data, device_mesh, [Replicate()], src_data_rank=self.src_data_rank),
                    requires_grad=param.requires_grad)
            module.register_parameter(name, replicated)

        def to_replicate(t):
            if isinstance(t, DTensor):
                return t if all(p.is_replicate() for p in t.placements) else t.redistribute(
                    device_mesh, [Replicate()])
            if not isinstance(t, torch.Tensor):
                return t
            return DTensor.from_local(t, device_mesh, [Replicate()], run_check=False)

        def inputs(_mod, args, kwargs):
            return tree_map(to_replicate, args), tree_map(to_replicate, kwargs)

        def outputs(_mod, _args, out):
            return tree_map(lambda t: t.to_local() if isinstance(t, DTensor) else t, out)

        module.register_forward_pre_hook(inputs, with_kwargs=True)
        module.register_forward_hook(outputs)
        return module


__all__ = ["check_divisible", "matches", "resolve", "user_tp_plan"]
