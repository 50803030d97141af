"""Catalog of accelerator types: peak throughput, memory and links, each with its source.

`cluster.gpu` names an entry here. An unknown name is accepted only when the
user gives `cluster.peak_tflops` (and, for step-time estimates, the
bandwidths): we never guess a peak.

Bandwidths are per GPU and per direction, in GB/s (1e9 bytes/s).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class GpuSpec:
    name: str
    peak_tflops: dict  # dtype -> dense TFLOP/s (no 2:4 sparsity)
    memory_gb: float
    intra_node_gbps: float  # NVLink, per GPU, one direction
    inter_node_gbps: float  # network, per GPU, one direction
    source: str
    # Host (CPU) RAM of the node class this GPU ships in (the DGX system), in GB; the planner's host-memory check
    # (launcher/plan/host.py) plans against it unless cluster.host_memory_gb says what the site's nodes have.
    host_memory_gb: Optional[float] = None
    host_source: str = ""


# What a GPU sustains per operator (GEMM, attention, memory-bound, links) is its profile, not a catalog
# number: launcher/plan/profile.py (built-in, cited) or a file from `launcher calibrate`.

# A100 SXM: NVIDIA A100 Tensor Core GPU datasheet (2021): bf16/fp16 312, tf32 156, fp32 19.5 TFLOP/s dense;
# NVLink 3 600 GB/s total = 300 GB/s per direction; DGX A100 has 8x 200 Gb/s HDR InfiniBand = 25 GB/s per GPU.
_A100 = dict(peak_tflops={"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
             intra_node_gbps=300.0, inter_node_gbps=25.0)
# H100 SXM5: NVIDIA H100 datasheet: bf16/fp16 989.4, tf32 494.7, fp32 66.9 TFLOP/s dense (the sheet's
# 1979 is with sparsity); NVLink 4 900 GB/s total = 450 per direction; DGX H100 8x 400 Gb/s NDR = 50 GB/s per GPU.
_H100 = dict(peak_tflops={"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
             intra_node_gbps=450.0, inter_node_gbps=50.0)

# Host RAM per node, the DGX system each GPU ships in ("System Memory" in NVIDIA's datasheets). 1 TB = 1000 GB
# here: the sheets' "2TB" is 2 TiB of DIMMs, and the OS and page cache take part of it, so the round decimal
# figure is the cautious reading. Sites with other nodes (HGX servers with 1 TB, 512 GB nodes) set
# cluster.host_memory_gb.
# - DGX A100 datasheet (2020): 1TB with the 320GB system (8x A100 40GB), 2TB with the 640GB system (8x A100 80GB).
# - DGX H100 datasheet (2023): 2TB.
# - DGX H200 datasheet (2024): 2TB.
_DGX_A100_320 = dict(host_memory_gb=1000.0, host_source="NVIDIA DGX A100 datasheet: 1TB system memory (DGX A100 320GB)")
_DGX_A100_640 = dict(host_memory_gb=2000.0, host_source="NVIDIA DGX A100 datasheet: 2TB system memory (DGX A100 640GB)")
_DGX_H100 = dict(host_memory_gb=2000.0, host_source="NVIDIA DGX H100 datasheet: 2TB system memory")
_DGX_H200 = dict(host_memory_gb=2000.0, host_source="NVIDIA DGX H200 datasheet: 2TB system memory")

CATALOG: dict[str, GpuSpec] = {
    "a100-40gb": GpuSpec("a100-40gb", memory_gb=40.0, source="NVIDIA A100 datasheet (SXM4 40GB)", **_A100, **_DGX_A100_320),
    "a100-80gb": GpuSpec("a100-80gb", memory_gb=80.0, source="NVIDIA A100 datasheet (SXM4 80GB)", **_A100, **_DGX_A100_640),
    "h100-80gb": GpuSpec("h100-80gb", memory_gb=80.0, source="NVIDIA H100 datasheet (SXM5 80GB)", **_H100, **_DGX_H100),
    # H200 SXM: same Hopper compute as H100 SXM, 141 GB HBM3e (NVIDIA H200 datasheet).
    "h200": GpuSpec("h200", memory_gb=141.0, source="NVIDIA H200 datasheet (SXM 141GB)", **_H100, **_DGX_H200),
}

CPU = "cpu"


def lookup(name: str) -> Optional[GpuSpec]:
    """The catalog entry for `name` (case-insensitive), or None for cpu / unknown."""
    return CATALOG.get(name.lower())
