"""Facts about GPUs, in one table that placement, the estimate and MFU all read.

    gpu = by_ray_type("H100")                      # Gpu('H100 SXM', capability=(9, 0), memory_gb=80.0, ...)
    gpu = by_device_name("NVIDIA H100 80GB HBM3")  # the same row, by torch's name for the device
    gpu.peak_tflops["bf16"]                        # 989.0: MFU's denominator and the estimate's peak
    ray_type_of("NVIDIA H100 80GB HBM3")           # 'H100': how Ray names a node of that GPU

Each row is one GPU part. Two names find it:
- the Ray accelerator type (``ray.util.accelerators``: H100, A100, V100, ...), which Ray gives
  every GPU node as the resource ``accelerator_type:<TYPE>`` and which `cluster.nodes` and
  `cluster.accelerator_type` use; a Ray type that names more than one part (Ray's 'H100' does not
  say SXM or PCIe) is read as one of them, and `NOTES` says which;
- the exact name `torch.cuda.get_device_name` reports, never matched by substring: "NVIDIA L40"
  contains "L4" and "NVIDIA H100 NVL" contains "H100", and each is a different chip.
A part that is one chip with two memory sizes (A100 40 and 80 GB) has a row per size under one
label, so that MFU names the same peak row for both.

Numbers are the vendors' datasheet figures. Peaks are dense (no sparsity) TFLOP/s per dtype:
fp32 is the plain FP32 (CUDA core) rate, tf32 is fp32 matmuls on tensor cores (precision.tf32,
SM 8.0+); a part lacking a dtype's tensor cores has no entry for it, and an unknown peak gives no
MFU rather than a guessed one. Memory is in GB (1e9 bytes); HBM is the memory bandwidth in GB/s;
NVLink is per GPU and per direction (half the "bidirectional" figure datasheets print), and a
part without NVLink talks over PCIe (Gen4 x16 32 GB/s, T4 Gen3 16 GB/s). Capability is CUDA
compute capability (NVIDIA's published tables). A row without memory is one the estimate does
not know (placement still routes by its capability).

This module imports nothing of trainlab, so every layer may read it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping


@dataclass(frozen=True)
class Gpu:
    """One GPU part: how Ray and torch name it, and what it offers."""

    label: str
    """The part's name; MFU's peak source names it (table:<label>:<dtype>)."""
    capability: tuple[int, int]
    """CUDA compute capability (major, minor)."""
    ray_types: tuple[str, ...] = ()
    """Ray accelerator types read as this part (none: Ray's name for it is read as another)."""
    device_names: tuple[str, ...] = ()
    """The exact names torch.cuda.get_device_name reports for it."""
    peak_tflops: Mapping[str, float] = field(default_factory=dict)
    """Dense peak TFLOP/s of one device per dtype (fp32, tf32, bf16, fp16, fp8); absent = none."""
    memory_gb: float | None = None
    """Device memory, GB (None: the estimate does not know this part)."""
    hbm_gb_s: float | None = None
    """Memory bandwidth, GB/s."""
    nvlink_gb_s: float | None = None
    """Bandwidth to another device of the node, GB/s per direction (PCIe where no NVLink)."""


def _peaks(**tflops: float) -> Mapping[str, float]:
    return MappingProxyType(tflops)


_HOPPER_SXM = _peaks(bf16=989.0, fp16=989.0, tf32=494.0, fp32=67.0, fp8=1979.0)
_HOPPER_NVL = _peaks(bf16=835.0, fp16=835.0, tf32=418.0, fp32=60.0, fp8=1671.0)
_A100 = _peaks(bf16=312.0, fp16=312.0, tf32=156.0, fp32=19.5)

GPUS: tuple[Gpu, ...] = (
    Gpu("H100 SXM", (9, 0), ("H100",), ("NVIDIA H100 80GB HBM3",), _HOPPER_SXM, 80.0, 3350.0, 450.0),
    Gpu("H100 PCIe", (9, 0), (), ("NVIDIA H100 PCIe",),
        _peaks(bf16=756.0, fp16=756.0, tf32=378.0, fp32=51.0, fp8=1513.0)),
    Gpu("H100 NVL", (9, 0), (), ("NVIDIA H100 NVL",), _HOPPER_NVL),
    Gpu("H200", (9, 0), ("H200",), ("NVIDIA H200",), _HOPPER_SXM, 141.0, 4800.0, 450.0),
    Gpu("H200 NVL", (9, 0), (), ("NVIDIA H200 NVL",), _HOPPER_NVL),
    Gpu("A100", (8, 0), ("A100", "A100-80G"), ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"),
        _A100, 80.0, 2039.0, 300.0),
    Gpu("A100", (8, 0), ("A100-40G",), ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"),
        _A100, 40.0, 1555.0, 300.0),
    Gpu("V100 SXM2", (7, 0), ("V100",), ("Tesla V100-SXM2-16GB", "Tesla V100-SXM2-32GB"),
        _peaks(fp16=125.0, fp32=15.7), 16.0, 900.0, 150.0),
    Gpu("V100 PCIe", (7, 0), (), ("Tesla V100-PCIE-16GB", "Tesla V100-PCIE-32GB"),
        _peaks(fp16=112.0, fp32=14.0)),
    Gpu("L40S", (8, 9), ("L40S",), ("NVIDIA L40S",),
        _peaks(bf16=362.0, fp16=362.0, tf32=183.0, fp32=91.6, fp8=733.0), 48.0, 864.0, 32.0),
    Gpu("L40", (8, 9), (), ("NVIDIA L40",), _peaks(bf16=181.0, fp16=181.0, tf32=90.5, fp32=90.5, fp8=362.0)),
    Gpu("L4", (8, 9), ("L4",), ("NVIDIA L4",),
        _peaks(bf16=121.0, fp16=121.0, tf32=60.0, fp32=30.3, fp8=242.0), 24.0, 300.0, 32.0),
    Gpu("A10G", (8, 6), ("A10G",), ("NVIDIA A10G",),
        _peaks(bf16=70.0, fp16=70.0, tf32=35.0, fp32=31.2), 24.0, 600.0, 32.0),
    Gpu("T4", (7, 5), ("T4",), ("Tesla T4",), _peaks(fp16=65.0, fp32=8.1), 16.0, 320.0, 16.0),
    Gpu("RTX 4090", (8, 9), (), ("NVIDIA GeForce RTX 4090",),
        _peaks(bf16=165.0, fp16=165.0, tf32=82.6, fp32=82.6, fp8=330.0)),
    # known to placement by capability only: no peaks or memory here (no MFU, no estimate)
    Gpu("GB300", (10, 3), ("GB300",)),
    Gpu("B300", (10, 3), ("B300",)),
    Gpu("GB200", (10, 0), ("GB200",)),
    Gpu("B200", (10, 0), ("B200",)),
    Gpu("RTX-PRO-6000", (12, 0), ("RTX-PRO-6000",)),
    Gpu("H20", (9, 0), ("H20",)),
    Gpu("P100", (6, 0), ("P100",)),
    Gpu("P4", (6, 1), ("P4",)),
    Gpu("K80", (3, 7), ("K80",)),
)
"""Every GPU part trainlab knows, one row each."""

_BY_RAY_TYPE = {t: g for g in GPUS for t in g.ray_types}
_BY_DEVICE_NAME = {n: g for g in GPUS for n in g.device_names}
assert len(_BY_RAY_TYPE) == sum(len(g.ray_types) for g in GPUS), "a Ray type names two rows"
assert len(_BY_DEVICE_NAME) == sum(len(g.device_names) for g in GPUS), "a device name names two rows"

RAY_TYPES: tuple[str, ...] = tuple(_BY_RAY_TYPE)
"""Every Ray accelerator type of the table, in its order."""

NOTES: dict[str, str] = {"H100": "H100 read as the H100 SXM (80 GB HBM3); a PCIe or NVL part is slower",
                         "A100": "A100 read as the A100 SXM 80 GB",
                         "V100": "V100 read as the V100 SXM2 16 GB"}
"""What a Ray type that names more than one part is read as (the estimate says so in its notes)."""


def by_ray_type(ray_type: str) -> Gpu | None:
    """The row a Ray accelerator type is read as; None for a type the table does not know."""
    return _BY_RAY_TYPE.get(ray_type)


def by_device_name(device_name: str) -> Gpu | None:
    """The row of this exact torch device name; None for a name the table does not know."""
    return _BY_DEVICE_NAME.get(device_name)


# Ray's own rule for naming an NVIDIA GPU's accelerator type from its device name
# (ray._private.accelerators.nvidia_gpu.NVIDIA_GPU_NAME_PATTERN): "NVIDIA H100 80GB HBM3" -> H100,
# "Tesla V100-SXM2-16GB" -> V100. Repeated here because torchrun runs without Ray.
_NVIDIA_NAME = re.compile(r"\w+\s+((?:[A-Z]+\s+)*[A-Z0-9]*\d[A-Z0-9]*)")


def ray_type_of(device_name: str) -> str:
    """The Ray accelerator type of a CUDA device name, as Ray names the node it runs on."""
    m = _NVIDIA_NAME.match(device_name)
    found = m.group(1).replace(" ", "-") if m else ""
    if len(found) > 1:
        return found
    return re.sub(r"^NVIDIA\s+", "", device_name).strip().replace(" ", "-")


__all__ = ["GPUS", "NOTES", "RAY_TYPES", "Gpu", "by_device_name", "by_ray_type", "ray_type_of"]
