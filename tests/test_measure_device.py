"""The GPU path's logic, with the CUDA counters and NVML behind fakes (no GPU here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from vramplan.measure.device import CudaReadings, nvml_process_used_bytes, read_after


@dataclass
class FakeMemory:
    """A DeviceMemory whose counters the test sets; records the calls it gets."""

    allocated: int = 0
    reserved: int = 0
    active: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0
    peak_active: int = 0
    capacity: int = 16 * 2**30
    used: int | None = None
    name: str = "fake-cuda"
    device_name: str = "Fake GPU"
    calls: list[str] = field(default_factory=list)

    def synchronize(self) -> None:
        self.calls.append("synchronize")

    def reset_peak(self) -> None:
        self.calls.append("reset_peak")
        self.peak_allocated, self.peak_reserved, self.peak_active = self.allocated, self.reserved, self.active

    def allocated_bytes(self) -> int:
        return self.allocated

    def reserved_bytes(self) -> int:
        return self.reserved

    def active_bytes(self) -> int:
        return self.active

    def max_allocated_bytes(self) -> int:
        return self.peak_allocated

    def max_reserved_bytes(self) -> int:
        return self.peak_reserved

    def max_active_bytes(self) -> int:
        return self.peak_active

    def capacity_bytes(self) -> int:
        return self.capacity

    def process_used_bytes(self) -> int | None:
        return self.used

    def empty_cache(self) -> None:
        self.calls.append("empty_cache")


def test_read_after_synchronizes_and_reads_peaks() -> None:
    mem = FakeMemory(peak_allocated=3_000, peak_reserved=4_096, peak_active=3_500, reserved=4_096,
                     used=4_096 + 400 * 2**20)
    r = read_after(mem)
    assert mem.calls == ["synchronize"]
    assert r == CudaReadings(3_000, 4_096, 3_500, 4_096 + 400 * 2**20, 4_096, 16 * 2**30)
    assert r.outside_allocator_bytes == 400 * 2**20  # NVML used - reserved = the CUDA context here


def test_outside_allocator_unknown_without_nvml() -> None:
    assert CudaReadings(1, 2, 2, None, 2, 10).outside_allocator_bytes is None


class FakeNvml:
    """pynvml's functions as the measure code calls them."""

    def __init__(self, procs: list[Any], uuid_ok: bool = True, init_fails: bool = False) -> None:
        self.procs = procs
        self.uuid_ok = uuid_ok
        self.init_fails = init_fails
        self.handles: list[Any] = []
        self.shutdown = False

    def nvmlInit(self) -> None:
        if self.init_fails:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        self.shutdown = True

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Any:
        if not self.uuid_ok:
            raise RuntimeError("Not Found")
        self.handles.append(("uuid", uuid))
        return ("uuid", uuid)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self.handles.append(("index", index))
        return ("index", index)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        return self.procs


def test_nvml_finds_this_pid() -> None:
    nvml = FakeNvml([SimpleNamespace(pid=11, usedGpuMemory=1), SimpleNamespace(pid=42, usedGpuMemory=5 * 2**30)])
    assert nvml_process_used_bytes(0, "abcd-ef", pid=42, nvml=nvml) == 5 * 2**30
    assert nvml.handles == [("uuid", "GPU-abcd-ef")] and nvml.shutdown


def test_nvml_pid_missing_or_unattributed() -> None:
    assert nvml_process_used_bytes(0, None, pid=42, nvml=FakeNvml([SimpleNamespace(pid=1, usedGpuMemory=9)])) is None
    hidden = FakeNvml([SimpleNamespace(pid=42, usedGpuMemory=None)])  # drivers in some containers
    assert nvml_process_used_bytes(0, None, pid=42, nvml=hidden) is None
    assert nvml_process_used_bytes(0, None, pid=42, nvml=FakeNvml([], init_fails=True)) is None


def test_nvml_index_follows_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    nvml = FakeNvml([SimpleNamespace(pid=7, usedGpuMemory=123)], uuid_ok=False)
    # torch's cuda:1 is the machine's GPU 1 in "3,1"; torch's cuda:0 is GPU 3
    assert nvml_process_used_bytes(0, "x", pid=7, nvml=nvml) == 123
    assert nvml.handles[-1] == ("index", 3)
    nvml_process_used_bytes(1, None, pid=7, nvml=nvml)
    assert nvml.handles[-1] == ("index", 1)


TINY_GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 1000, "n_positions": 128,
             "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}


def test_measure_with_cuda_counters_reports_the_allocator_and_nvml() -> None:
    """The GPU path end to end, with the counters injected: the step itself runs on the CPU."""
    pytest.importorskip("transformers")
    from vramplan.measure.result import CUDA_MEASURED
    from vramplan.measure.run import measure

    doc = {"model": TINY_GPT2, "hardware": {"gpu": "T4"},
           "train": {"micro_batch_size": 1, "seq_len": 16, "precision": "fp32", "optimizer": "sgd"}}
    cpu = measure(doc, device="cpu")
    gap, context = 4_096, 400 * 2**20
    mem = FakeMemory()
    original_reset = mem.reset_peak

    def reset_then_run() -> None:  # after the reset, the step "allocates" the tracker's peak + a gap
        original_reset()
        mem.peak_allocated = cpu.peak_allocated_bytes + gap
        mem.peak_reserved = mem.reserved = 2 * 2**20 + cpu.peak_allocated_bytes
        mem.peak_active = cpu.peak_allocated_bytes + gap
        mem.used = mem.reserved + context

    mem.reset_peak = reset_then_run  # type: ignore[method-assign]
    res = measure(doc, device="cpu", memory=mem)
    assert mem.calls[:2] == ["synchronize", "reset_peak"] and mem.calls[-1] == "synchronize"
    assert res.measured == CUDA_MEASURED
    assert res.peak_allocated_bytes == cpu.peak_allocated_bytes + gap
    assert res.breakdown_detail["other"]["allocator rounding, cuBLAS workspaces, untracked"] == gap
    assert sum(res.breakdown.values()) == res.peak_allocated_bytes
    assert res.peak_reserved_bytes == mem.reserved and res.peak_active_bytes == mem.peak_active
    assert res.device_used_bytes == mem.used and res.outside_allocator_bytes == context
    names = [row.part for row in res.rows]
    assert names[-2:] == ["peak reserved", "device used (NVML)"]
    # on CUDA nothing is left out of the prediction (cuBLAS workspaces exist there)
    assert res.excluded_predicted == {} and res.predicted_peak_bytes == res.prediction.per_gpu.peak_allocated_bytes
