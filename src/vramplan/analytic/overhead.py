"""Memory outside the tensors: CUDA context, library workspaces, NCCL buffers.

* CUDA context (driver state, loaded kernels): outside PyTorch's allocator, seen by
  nvidia-smi only.  With lazy module loading (CUDA >= 11.7, PyTorch's default) it is
  "around 400MB" (PyTorch maintainers, pytorch/pytorch#109888; ~300 MB in #107667);
  before lazy loading it exceeded 1000 MB.  We use 400 MiB for every NVIDIA GPU and
  say so in the report; measure yours with ``vramplan measure``.
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

from vramplan.spec.gpu import GpuSpec
from vramplan.units import KiB, MiB

CUDA_CONTEXT_BYTES = 400 * MiB
NCCL_BUFFSIZE_BYTES = 4 * MiB
NCCL_CHANNELS = 16
CUBLAS_WORKSPACE_DEFAULT_BYTES = 2 * 4096 * KiB + 8 * 16 * KiB
CUBLAS_WORKSPACE_HOPPER_BYTES = 8 * 4096 * KiB


def cuda_context_bytes(gpu: GpuSpec) -> int:
    return CUDA_CONTEXT_BYTES


def cublas_workspace_bytes(gpu: GpuSpec, handles: int) -> int:
    """Inside the allocator: one workspace per cuBLAS handle in use."""
    hopper_or_newer = gpu.architecture in ("hopper", "blackwell")
    each = CUBLAS_WORKSPACE_HOPPER_BYTES if hopper_or_newer else CUBLAS_WORKSPACE_DEFAULT_BYTES
    return handles * each


def nccl_bytes(communicators: int) -> int:
    """Outside the allocator: NCCL's per-channel send/receive buffers."""
    return communicators * NCCL_CHANNELS * 2 * NCCL_BUFFSIZE_BYTES
