"""The GPU spec: one accelerator's memory and speed facts, from catalog/data/gpus.json."""

from __future__ import annotations

from dataclasses import dataclass, field

from vramplan.units import GiB


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

    @classmethod
    def custom(cls, capacity_gib: float) -> GpuSpec:
        """A device outside the catalog, known only by the capacity the user gives (in GiB)."""
        total = int(capacity_gib * GiB)
        return cls(name=f"custom-{capacity_gib:g}GiB", total_memory_bytes=total, nominal_memory_bytes=total)

    @property
    def generation(self) -> str:
        return self.architecture
