"""The GPU spec: one accelerator's memory and speed facts, from catalog/data/gpus.json."""

from __future__ import annotations

from dataclasses import dataclass, field

from vramplan.units import GiB

__all__ = ["GpuSpec", "cuda_capability"]


def cuda_capability(text: str) -> tuple[int, int] | None:
    """A CUDA compute capability, ``"10.0"`` as (10, 0); None for an AMD GPU's architecture name (``"gfx942"``) or a
    capability the catalog does not give."""
    major, _, minor = text.partition(".")
    return (int(major), int(minor or 0)) if major.isdigit() and (minor or "0").isdigit() else None


@dataclass(frozen=True)
class GpuSpec:
    name: str
    vendor: str = "nvidia"
    architecture: str = "unknown"
    compute_capability: str = ""
    nominal_memory_bytes: int = 0
    total_memory_bytes: int = 0  # torch.cuda.get_device_properties().total_memory
    hbm_bytes_per_s: int = 0
    dense_flops_per_s: dict[str, int | None] = field(default_factory=dict)
    interconnect: str = "pcie"
    interconnect_bytes_per_s: int = 0
    host_link: str = ""
    host_link_bytes_per_s: int = 0
    l2_bytes: int = 0
    smem_per_sm_bytes: int = 0
    sm_count: int = 0
    aliases: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    notes: str = ""
    # software stack, not a catalog fact: set from the scenario's hardware.cuda_module_loading
    cuda_module_loading: str = "lazy"
    # set from the scenario's hardware.memory_in_use_gib: bytes other processes hold on the device, already
    # taken out of total_memory_bytes (which is then this job's capacity)
    in_use_by_others_bytes: int = 0

    @property
    def cuda_capability(self) -> tuple[int, int] | None:
        """The compute capability as a pair (``cuda_capability``); None off CUDA or when not given."""
        return cuda_capability(self.compute_capability)

    @classmethod
    def custom(cls, capacity_gib: float) -> GpuSpec:
        """A device outside the catalog, known only by the capacity the user gives (in GiB)."""
        total = int(capacity_gib * GiB)
        return cls(name=f"custom-{capacity_gib:g}GiB", total_memory_bytes=total, nominal_memory_bytes=total)

    @property
    def device_total_bytes(self) -> int:
        """The device's whole memory (``torch.cuda.mem_get_info()[1]``), other processes' share included."""
        return self.total_memory_bytes + self.in_use_by_others_bytes

    def report_block(self) -> dict[str, str | int]:
        """The report's ``gpu`` entry: the device's name and whole memory, and what other processes hold of it
        when the scenario says (the per-GPU ``capacity_bytes`` is what they leave)."""
        out: dict[str, str | int] = {"name": self.name, "total_memory_bytes": self.device_total_bytes}
        if self.in_use_by_others_bytes:
            out["in_use_by_others_bytes"] = self.in_use_by_others_bytes
        return out

    @property
    def generation(self) -> str:
        return self.architecture
