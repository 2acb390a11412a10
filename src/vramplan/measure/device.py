"""Reading a GPU's memory counters: torch.cuda's caching allocator and NVML, behind one small interface.

Three numbers answer three questions (they are the report's three totals):

* ``torch.cuda.max_memory_allocated()``: the most bytes held by live tensors (what the
  breakdown sums to; the analytic ``peak_allocated_bytes``);
* ``torch.cuda.max_memory_reserved()``: the most bytes the caching allocator held from the
  driver, cached free blocks included (``peak_reserved_bytes``);
* NVML's used memory for this process (``nvmlDeviceGetComputeRunningProcesses``, what
  ``nvidia-smi`` prints per process): reserved plus the CUDA context, cuBLAS/cuDNN handles and
  NCCL buffers outside PyTorch (``device_used_bytes``).

``memory_stats()["active_bytes.all.peak"]`` is also read: *active* counts blocks in use,
including those freed on the host but still owed to a pending kernel on another stream.

The counters sit behind ``DeviceMemory`` so that the logic around them (reset, read, subtract)
is tested without a GPU; ``CudaMemory`` is the real implementation and ``nvml_process_used_bytes``
is the NVML query (``pynvml`` is injectable).

Sources: PyTorch "CUDA semantics: memory management" and ``torch.cuda.memory_stats`` docs;
NVML API reference, ``nvmlDeviceGetComputeRunningProcesses`` (``usedGpuMemory`` is
``None`` when the driver cannot attribute memory to the process, e.g. in some containers).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["CudaMemory", "CudaReadings", "DeviceMemory", "nvml_process_used_bytes", "read_after"]


class DeviceMemory(Protocol):
    """The caching allocator's counters for one device, and NVML's view of this process."""

    name: str

    def synchronize(self) -> None: ...
    def reset_peak(self) -> None: ...
    def allocated_bytes(self) -> int: ...
    def reserved_bytes(self) -> int: ...
    def active_bytes(self) -> int: ...
    def max_allocated_bytes(self) -> int: ...
    def max_reserved_bytes(self) -> int: ...
    def max_active_bytes(self) -> int: ...
    def capacity_bytes(self) -> int: ...
    def process_used_bytes(self) -> int | None: ...
    def empty_cache(self) -> None: ...


@dataclass(frozen=True)
class CudaReadings:
    """What one measured step left in the counters."""

    peak_allocated_bytes: int
    peak_reserved_bytes: int
    peak_active_bytes: int
    device_used_bytes: int | None  # NVML, this process, read after the step
    reserved_now_bytes: int
    capacity_bytes: int

    @property
    def outside_allocator_bytes(self) -> int | None:
        """NVML used - reserved, both read after the step: CUDA context, library handles, NCCL."""
        if self.device_used_bytes is None:
            return None
        return max(0, self.device_used_bytes - self.reserved_now_bytes)


def read_after(mem: DeviceMemory) -> CudaReadings:
    """Read the counters after a step that ran between ``mem.reset_peak()`` and now."""
    mem.synchronize()
    return CudaReadings(
        peak_allocated_bytes=mem.max_allocated_bytes(),
        peak_reserved_bytes=mem.max_reserved_bytes(),
        peak_active_bytes=mem.max_active_bytes(),
        device_used_bytes=mem.process_used_bytes(),
        reserved_now_bytes=mem.reserved_bytes(),
        capacity_bytes=mem.capacity_bytes(),
    )


def _nvml_handle(nvml: Any, uuid: str | None, index: int) -> Any:
    if uuid:
        text = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
        # NVML raises its own error classes; fall back to the index
        with contextlib.suppress(Exception):
            return nvml.nvmlDeviceGetHandleByUUID(text)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    entries = [v.strip() for v in visible.split(",") if v.strip()]
    if entries and index < len(entries) and entries[index].isdigit():
        index = int(entries[index])
    return nvml.nvmlDeviceGetHandleByIndex(index)


def nvml_process_used_bytes(index: int = 0, uuid: str | None = None, pid: int | None = None,
                            nvml: Any = None) -> int | None:
    """NVML's used memory for this process on one device, or None if NVML cannot tell.

    ``nvml`` is the ``pynvml`` module (from ``nvidia-ml-py``), injectable for tests.
    """
    if nvml is None:
        try:
            import pynvml as nvml_module  # type: ignore[import-untyped,import-not-found,unused-ignore]
        except ImportError:
            return None
        nvml = nvml_module
    pid = os.getpid() if pid is None else pid
    try:
        nvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver, no NVML
        return None
    try:
        handle = _nvml_handle(nvml, uuid, index)
        for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if int(proc.pid) == pid:
                used = proc.usedGpuMemory
                return int(used) if used is not None else None
        return None
    except Exception:  # noqa: BLE001
        return None
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


class CudaMemory:
    """``DeviceMemory`` over ``torch.cuda`` and NVML for one CUDA device."""

    def __init__(self, index: int = 0, nvml: Any = None) -> None:
        import torch

        self._torch = torch
        self.index = index
        self.name = f"cuda:{index}"
        self._nvml = nvml
        props = torch.cuda.get_device_properties(index)
        self.device_name = str(props.name)
        self._capacity = int(props.total_memory)
        raw_uuid = getattr(props, "uuid", None)
        self._uuid = str(raw_uuid) if raw_uuid is not None else None

    def synchronize(self) -> None:
        self._torch.cuda.synchronize(self.index)

    def reset_peak(self) -> None:
        self._torch.cuda.reset_peak_memory_stats(self.index)

    def allocated_bytes(self) -> int:
        return int(self._torch.cuda.memory_allocated(self.index))

    def reserved_bytes(self) -> int:
        return int(self._torch.cuda.memory_reserved(self.index))

    def active_bytes(self) -> int:
        return int(self._torch.cuda.memory_stats(self.index).get("active_bytes.all.current", 0))

    def max_allocated_bytes(self) -> int:
        return int(self._torch.cuda.max_memory_allocated(self.index))

    def max_reserved_bytes(self) -> int:
        return int(self._torch.cuda.max_memory_reserved(self.index))

    def max_active_bytes(self) -> int:
        return int(self._torch.cuda.memory_stats(self.index).get("active_bytes.all.peak", 0))

    def capacity_bytes(self) -> int:
        return self._capacity

    def process_used_bytes(self) -> int | None:
        return nvml_process_used_bytes(self.index, self._uuid, nvml=self._nvml)

    def empty_cache(self) -> None:
        self._torch.cuda.empty_cache()
