"""Memory outside the tensors: CUDA context, library workspaces, NCCL buffers.

* CUDA context (driver state, loaded kernel modules): outside PyTorch's allocator, seen by
  nvidia-smi only.  Its size depends more on the software stack than on the GPU: with eager
  module loading (CUDA < 11.7, or ``CUDA_MODULE_LOADING=EAGER``) every kernel of every loaded
  library is copied to the device at start-up (1,343 MiB on a V100 with CUDA 11.2, HF docs
  "model memory anatomy"); with lazy loading (PyTorch's default since 1.13 / CUDA 11.7, the
  driver's default from CUDA 12.2) only the kernels that run are loaded (256 MiB idle on an
  RTX 3090 with cu128, 426 MiB on an RTX 6000 Ada with cu130, about 500 MiB during a workload
  on A100/L40/L40S/H200).  The engine's value is chosen from the published rows in
  ``catalog/data/cuda_context.json`` by ``cuda_context`` below (rule and worked example there),
  for the scenario's ``hardware.cuda_module_loading`` (default lazy); the report says which
  rows were used.  Measure yours with ``vramplan measure``.
* cuBLAS workspace: allocated *through* the caching allocator (so it is in
  ``memory_allocated``), one per (handle, stream).  Default ``CUBLAS_WORKSPACE_CONFIG``
  is ``:4096:2:16:8`` = 2*4096 KiB + 8*16 KiB = 8,320 KiB, and ``:4096:8`` = 32 MiB on
  Hopper and newer (PyTorch docs, "Reproducibility" and CUDA semantics notes).  Training
  uses two handles: the forward thread and the autograd engine's device thread.
* NCCL: each communicator allocates, outside PyTorch, ``NCCL_BUFFSIZE`` (default
  4 MiB) per channel for each ring neighbour it sends to and receives from (NCCL
  environment-variable docs).  We assume 16 channels: 16 * 2 * 4 MiB = 128 MiB per
  communicator (data-, tensor- and pipeline-parallel groups each have one).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from vramplan.catalog.contexts import ContextRow, context_rows
from vramplan.spec.gpu import GpuSpec
from vramplan.units import KiB, MiB

NCCL_BUFFSIZE_BYTES = 4 * MiB
NCCL_CHANNELS = 16
CUBLAS_WORKSPACE_DEFAULT_BYTES = 2 * 4096 * KiB + 8 * 16 * KiB
CUBLAS_WORKSPACE_HOPPER_BYTES = 8 * 4096 * KiB


# Architectures in release order, per vendor: "nearest" below means nearest in this order.
ARCHITECTURE_ORDER = {
    "nvidia": ("pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell"),
    "amd": ("cdna1", "cdna2", "cdna3", "cdna4"),
}


@dataclass(frozen=True)
class ContextChoice:
    """The CUDA context the engine uses, and where it came from."""

    bytes: int
    loading: str  # lazy | eager | n/a (ROCm)
    architecture: str  # the architecture whose rows were used
    rows: tuple[str, ...]  # ids of the rows in catalog/data/cuda_context.json
    fallback: str  # "" when the GPU's own architecture has rows

    def assumption(self) -> str:
        mode = "ROCm (HIP)" if self.loading == "n/a" else f"{self.loading} module loading"
        text = (f"CUDA context {self.bytes / MiB:,.1f} MiB, {mode}: median of {len(self.rows)} published "
                f"{self.architecture} row(s) in catalog/data/cuda_context.json ({', '.join(self.rows)})")
        return text + (f"; {self.fallback}" if self.fallback else "")


def _median_bytes(values: list[int]) -> int:
    """Median, the lower-rounded mean of the middle two for an even count."""
    v = sorted(values)
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) // 2


def cuda_context(architecture: str, vendor: str = "nvidia", loading: str = "lazy",
                 rows: tuple[ContextRow, ...] | None = None) -> ContextChoice:
    """The context size for one architecture and module-loading mode, from the published rows.

    Rule: the median of the rows measured on that architecture with that loading mode (ROCm rows,
    ``module_loading: n/a``, serve either mode on AMD GPUs).  With no such row, the nearest
    architecture of the same vendor (``ARCHITECTURE_ORDER``; on a tie the newer one) that has
    rows; for an architecture outside the order (a custom GPU), the median of all the vendor's
    rows for that mode.  The fallback is stated in the report's assumptions.

    Worked example with the shipped rows: turing, lazy -> four T4 OOM-message rows of
    109,062,390 / 128,849,019 / 132,277,862 / 141,715,046 B; median = (128,849,019 +
    132,277,862) // 2 = 130,563,440 B (124.5 MiB).  Volta, lazy -> no volta lazy row; turing is
    one step away -> the same 130,563,440 B.  Volta, eager -> 419,430,400 (PyTorch 1.1) and
    1,408,237,568 B (CUDA 11.2) -> 913,833,984 B (871.5 MiB).  Pascal has no row: lazy -> volta
    (one step) has no lazy row, turing (two steps) -> 130,563,440 B; eager -> volta's 913,833,984 B.
    """
    rows = context_rows() if rows is None else rows
    mode = "n/a" if vendor == "amd" else loading
    usable = [r for r in rows if r.vendor == vendor and r.module_loading == mode]
    by_arch: dict[str, list[ContextRow]] = {}
    for r in usable:
        by_arch.setdefault(r.architecture, []).append(r)
    order = ARCHITECTURE_ORDER.get(vendor, ())
    fallback = ""
    if architecture in by_arch:
        chosen = by_arch[architecture]
        used = architecture
    elif architecture in order and by_arch:
        pos = order.index(architecture)
        candidates = [a for a in order if a in by_arch]
        used = min(candidates, key=lambda a: (abs(order.index(a) - pos), -order.index(a)))
        chosen = by_arch[used]
        fallback = (f"assumption: no published {mode} row for {architecture}, so the nearest architecture "
                    f"with rows ({used}) is used")
    elif usable:
        chosen = usable
        used = f"{vendor} (all architectures)"
        fallback = (f"assumption: architecture {architecture!r} has no place in the {vendor} order, so the "
                    f"median of all {vendor} {mode} rows is used")
    else:
        raise ValueError(f"no published CUDA-context row for vendor {vendor!r} and loading {mode!r}")
    return ContextChoice(bytes=_median_bytes([r.bytes for r in chosen]), loading=mode, architecture=used,
                         rows=tuple(r.id for r in chosen), fallback=fallback)


# rows measured after a PyTorch training step or generate call had loaded its kernels (this project's GPU runs)
AFTER_WORKLOAD = "nvml_process_minus_reserved"


@lru_cache(maxsize=256)
def _shipped_choice(architecture: str, vendor: str, loading: str, at_start: bool) -> ContextChoice:
    rows = context_rows()
    if at_start:
        rows = tuple(r for r in rows if r.measured != AFTER_WORKLOAD)
    return cuda_context(architecture, vendor, loading, rows)


def cuda_context_for(gpu: GpuSpec, at_start: bool = False) -> ContextChoice:
    """The choice for a resolved GPU (its architecture, vendor and the scenario's loading mode).

    ``at_start``: the context of a process that reads its free memory before any workload (SGLang's
    ``mem_fraction_static`` of the memory free at start; llama.cpp, which loads no PyTorch kernels): the rows
    measured after a PyTorch workload loaded its kernels lazily are left out (docs/conventions.md)."""
    return _shipped_choice(gpu.architecture, gpu.vendor, gpu.cuda_module_loading, at_start)


def cuda_context_bytes(gpu: GpuSpec, at_start: bool = False) -> int:
    return cuda_context_for(gpu, at_start).bytes


def cublas_workspace_bytes(gpu: GpuSpec, handles: int) -> int:
    """Inside the allocator: one workspace per cuBLAS handle in use."""
    hopper_or_newer = gpu.architecture in ("hopper", "blackwell")
    each = CUBLAS_WORKSPACE_HOPPER_BYTES if hopper_or_newer else CUBLAS_WORKSPACE_DEFAULT_BYTES
    return handles * each


def nccl_bytes(communicators: int) -> int:
    """Outside the allocator: NCCL's per-channel send/receive buffers."""
    return communicators * NCCL_CHANNELS * 2 * NCCL_BUFFSIZE_BYTES
