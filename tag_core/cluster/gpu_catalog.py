"""GPU catalog: peak compute, memory and memory bandwidth per device type.

The cost model uses these figures for roofline estimates (an op profiled on one device
type, estimated on another) and for memory capacity (OOM). Figures are public NVIDIA
spec-sheet numbers. `tflops` is dense FP32 on the CUDA cores (no tensor cores), because
the profiles and the emitted graphs train in FP32; `fp16_tflops` is the dense FP16
tensor-core peak where one exists, kept for reference only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tag_core.errors import TagInputError


@dataclass(frozen=True)
class GpuType:
    name: str
    tflops: float  # peak dense FP32, TFLOP/s
    mem_gb: float  # device memory, GB (10^9 bytes, as on spec sheets)
    mem_bw_gbps: float  # memory bandwidth, GB/s (bytes, not bits)
    fp16_tflops: float | None = None  # dense FP16 tensor-core peak; not used by the cost model

    @property
    def mem_bytes(self) -> int:
        return int(self.mem_gb * 1e9)

    @property
    def flops_per_s(self) -> float:
        return self.tflops * 1e12

    @property
    def mem_bw_bytes_per_s(self) -> float:
        return self.mem_bw_gbps * 1e9

    def to_dict(self) -> dict:
        out = {"name": self.name, "tflops": self.tflops, "mem_gb": self.mem_gb, "mem_bw_gbps": self.mem_bw_gbps}
        if self.fp16_tflops is not None:
            out["fp16_tflops"] = self.fp16_tflops
        return out


# SXM variants for V100/A100/H100/H200 (the NVLink boxes these clusters are made of);
# P100 is the PCIe card the TAG testbed used; A10, A30 and L40S are the PCIe cards of shared clusters
# (the UCI HPC3 Slurm fixture has A30 and L40S nodes beside V100 and A100). The host CPU entry is a generic figure:
# profiles measured on this machine's CPU are stored with device_type "cpu".
_ENTRIES = (
    GpuType("V100-16GB", tflops=15.7, mem_gb=16, mem_bw_gbps=900, fp16_tflops=125),
    GpuType("V100-32GB", tflops=15.7, mem_gb=32, mem_bw_gbps=900, fp16_tflops=125),
    GpuType("P100-16GB", tflops=9.3, mem_gb=16, mem_bw_gbps=732, fp16_tflops=18.7),
    GpuType("GTX1080Ti", tflops=11.34, mem_gb=11, mem_bw_gbps=484),
    GpuType("T4", tflops=8.1, mem_gb=16, mem_bw_gbps=320, fp16_tflops=65),
    GpuType("A10", tflops=31.2, mem_gb=24, mem_bw_gbps=600, fp16_tflops=125),
    GpuType("A30", tflops=10.3, mem_gb=24, mem_bw_gbps=933, fp16_tflops=165),
    GpuType("L40S", tflops=91.6, mem_gb=48, mem_bw_gbps=864, fp16_tflops=362),
    GpuType("A100-40GB", tflops=19.5, mem_gb=40, mem_bw_gbps=1555, fp16_tflops=312),
    GpuType("A100-80GB", tflops=19.5, mem_gb=80, mem_bw_gbps=2039, fp16_tflops=312),
    GpuType("H100-80GB", tflops=67.0, mem_gb=80, mem_bw_gbps=3350, fp16_tflops=989),
    GpuType("H200-141GB", tflops=67.0, mem_gb=141, mem_bw_gbps=4800, fp16_tflops=989),
    GpuType("cpu", tflops=1.0, mem_gb=64, mem_bw_gbps=50),
)

CATALOG: dict[str, GpuType] = {gpu.name: gpu for gpu in _ENTRIES}
CATALOG_BY_LOWER = {name.lower(): gpu for name, gpu in CATALOG.items()}


def lookup_gpu(name: str, where: str = "gpu") -> GpuType:
    """The catalog entry for `name`, case-insensitively; TagInputError if unknown."""
    gpu = CATALOG_BY_LOWER.get(name.strip().lower()) if isinstance(name, str) else None
    if gpu is None:
        known = ", ".join(CATALOG)
        raise TagInputError(where, f"unknown GPU type {name!r}; known: {known} (or give an object with name, tflops, mem_gb, mem_bw_gbps)")
    return gpu


def is_catalog_entry(gpu: GpuType) -> bool:
    """True when `gpu` is exactly a catalog entry (so JSON can name it instead of spelling it out)."""
    return CATALOG.get(gpu.name) == gpu


# Family token -> catalog names of that family. Order matters only for readability.
_FAMILIES: dict[str, tuple[str, ...]] = {
    "h200": ("H200-141GB",),
    "h100": ("H100-80GB",),
    "a100": ("A100-40GB", "A100-80GB"),
    "v100": ("V100-16GB", "V100-32GB"),
    "p100": ("P100-16GB",),
    "t4": ("T4",),
    "a10": ("A10",),
    "a30": ("A30",),
    "l40s": ("L40S",),
}


def _slug(text: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug or "unknown"


def normalise_device_name(description: str) -> str:
    """Map a TF/CUDA device description to a catalog name, else a lowercase slug.

    Accepts bare names ("Tesla V100-SXM2-32GB", "NVIDIA H100 80GB HBM3") and TF's
    `physical_device_desc` ("device: 0, name: NVIDIA H200, pci bus id: ..."). Within a
    family the entry with the nearest memory size wins; without a size, the smallest.
    """
    text = description or ""
    # TF's physical_device_desc: keep only the "name: ..." part.
    match = re.search(r"name:\s*([^,]+)", text)
    if match:
        text = match.group(1)
    lowered = text.lower().strip()
    if lowered in CATALOG_BY_LOWER:
        return CATALOG_BY_LOWER[lowered].name
    tokens = re.findall(r"[a-z0-9]+", lowered)
    mem = re.search(r"(\d+)\s*gb\b", lowered)
    mem_gb = float(mem.group(1)) if mem else None

    for family, names in _FAMILIES.items():
        if family in tokens:
            candidates = [CATALOG[n] for n in names]
            if mem_gb is None:
                return min(candidates, key=lambda g: g.mem_gb).name
            return min(candidates, key=lambda g: (abs(g.mem_gb - mem_gb), g.mem_gb)).name
    # "GTX 1080 Ti" / "1080Ti" but not a plain "GTX 1080".
    joined = "".join(tokens)
    if "1080ti" in joined:
        return "GTX1080Ti"
    if "cpu" in tokens:
        return "cpu"
    return _slug(text)
