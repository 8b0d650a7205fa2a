"""The trials `trainlab bench estimate` runs on this CPU machine: every layout, both CPU models, every precision.

A case is one trial: a name for the table, its world size (gloo ranks) and the Hydra overrides
that make it. The full matrix covers
- every layout (conf/parallel) on 2 ranks, or 4 where it needs them (hsdp, dp_tp, dp_pp,
  fsdp_tp: on 2 ranks their data-parallel degree would be 1), with tensor parallel also under
  sequence parallel and the pipeline under each schedule, on `tiny` and `small`;
- every precision mode (conf/precision) on ddp and fsdp (`tiny`, 2 ranks);
- activation checkpointing and a smaller micro-batch on `small` (the activation model).
--quick is a smoke size: four cases on 2 ranks, the tiny model, three steps.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainlab.config import CONF_DIR


@dataclass(frozen=True)
class Case:
    name: str
    """model/layout/precision[/variant] x world: the table's row label, unique in a matrix."""
    world: int
    """gloo ranks (cluster.num_workers)."""
    overrides: tuple[str, ...]
    """Hydra overrides of the trial (besides the bench's fixed ones and cluster.num_workers)."""


TWO_RANK_LAYOUTS = {
    "ddp": (), "zero1": (), "zero2": (), "fsdp": (), "tp": (),
    "tp_sp": ("parallel=tp", "parallel.sequence_parallel=true"),
    "pp_1f1b": ("parallel=pp", "parallel.pp_schedule=1f1b"),
    "pp_gpipe": ("parallel=pp", "parallel.pp_schedule=gpipe"),
    "pp_interleaved": ("parallel=pp", "parallel.pp_schedule=interleaved_1f1b"),
}
"""Layouts on 2 ranks: name -> overrides (() = parallel=<name>)."""
FOUR_RANK_LAYOUTS = {"hsdp": (), "dp_tp": (), "dp_pp": (), "fsdp_tp": (),
                     "ddp_x4": ("parallel=ddp",), "fsdp_x4": ("parallel=fsdp",)}
"""Layouts whose data-parallel degree needs 4 ranks, and ddp / fsdp on 4 (the time model's world
size). Their micro-batch is 4, so that the global batch of 16 splits over 4 data-parallel ranks
(hsdp) and a pipeline's 2 data-parallel ranks get 2 micro-batches (1f1b needs >= pp)."""
FOUR_RANK_FIXED = ("train.micro_batch_size=4",)
MODELS = ("tiny", "small")
PRECISION_LAYOUTS = ("ddp", "fsdp")
VARIANTS = {
    "fsdp/ac_block": ("parallel=fsdp", "parallel.activation_checkpoint=block"),
    "ddp/ac_selective": ("parallel=ddp", "parallel.activation_checkpoint=selective"),
    "ddp/micro4": ("parallel=ddp", "train.micro_batch_size=4"),
}
"""The activation model's knobs, on `small` (2 ranks)."""


def precisions() -> list[str]:
    """Every precision mode conf/precision has (fp32 first: the layouts' default)."""
    names = sorted(p.stem for p in (CONF_DIR / "precision").glob("*.yaml"))
    return ["fp32", *(n for n in names if n != "fp32")]


def full_matrix() -> list[Case]:
    cases: list[Case] = []
    for model in MODELS:
        for layout, extra in TWO_RANK_LAYOUTS.items():
            cases.append(Case(f"{model}/{layout}/fp32", 2, (f"model={model}", *(extra or (f"parallel={layout}",)))))
        for layout, extra in FOUR_RANK_LAYOUTS.items():
            cases.append(Case(f"{model}/{layout}/fp32", 4,
                              (f"model={model}", *(extra or (f"parallel={layout}",)), *FOUR_RANK_FIXED)))
    for layout in PRECISION_LAYOUTS:
        for precision in precisions()[1:]:  # fp32 is above
            cases.append(Case(f"tiny/{layout}/{precision}", 2,
                              ("model=tiny", f"parallel={layout}", f"precision={precision}")))
    for variant, extra in VARIANTS.items():
        cases.append(Case(f"small/{variant}/fp32", 2, ("model=small", *extra)))
    return cases


def quick_matrix() -> list[Case]:
    return [Case(f"tiny/{layout}/{precision}", 2, ("model=tiny", f"parallel={layout}", f"precision={precision}"))
            for layout, precision in (("ddp", "fp32"), ("fsdp", "fp32"), ("zero1", "bf16"), ("tp", "fp32"))]


def steps_for(*, quick: bool) -> int:
    """Optimizer steps per trial: the first is warm-up (not timed, peak reset after it)."""
    return 3 if quick else 8


def by_world(cases: list[Case]) -> dict[int, list[Case]]:
    """Cases grouped by world size (one spawned group each), in matrix order."""
    out: dict[int, list[Case]] = {}
    for c in cases:
        out.setdefault(c.world, []).append(c)
    return out
