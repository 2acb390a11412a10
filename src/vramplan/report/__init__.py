"""The report: per-GPU bytes, integers, with stable key names that scripts read.

``peak_allocated_bytes`` is what ``torch.cuda.max_memory_allocated()`` would report,
``peak_reserved_bytes`` what ``max_memory_reserved()`` would, and ``device_used_bytes``
what nvidia-smi would show for the process (reserved + memory outside the allocator).
``breakdown`` is the content of memory at the peak and sums to peak_allocated_bytes;
``breakdown_detail`` splits each part further and sums to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

BREAKDOWN_KEYS = (
    "weights", "gradients", "optimizer_states", "master_weights", "activations", "kv_cache", "temporaries", "other",
)
OUTSIDE_KEYS = ("cuda_context", "workspaces", "communication", "managed")
# A "fits" with less headroom than this share of the capacity is shown as tight: what nvidia-smi shows
# was predicted with a median error of 9.2% over 30 published runs (benchmarks/validation_results.md),
# so a smaller headroom is within the estimate's own error.
TIGHT_HEADROOM_FRACTION = 0.10


class PerGpu(BaseModel):
    model_config = ConfigDict(frozen=True)

    capacity_bytes: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    device_used_bytes: int
    headroom_bytes: int
    peak_phase: str
    breakdown: dict[str, int]
    breakdown_detail: dict[str, dict[str, int]] = Field(default_factory=dict)
    outside_allocator: dict[str, int]
    phases: dict[str, int] = Field(default_factory=dict)
    # the calibrated band (report/band.py): None until ``with_band`` has set it
    peak_allocated_bytes_low: int | None = None
    peak_allocated_bytes_high: int | None = None
    peak_reserved_bytes_low: int | None = None
    peak_reserved_bytes_high: int | None = None
    device_used_bytes_low: int | None = None
    device_used_bytes_high: int | None = None
    # cached bytes the caching allocator may keep beyond peak_reserved_bytes by a stated mechanism that the
    # reserved estimate does not follow (analytic/ssm_state.py ``split_product_excess_bytes``): added to the high
    # bounds of reserved and device-used bytes, not to the point estimate
    reserved_excess_high_bytes: int = 0
    # training: each phase of the job (load, peft preparation, first step, training step, evaluation,
    # checkpoint save; docs/lifecycle.md) -> allocated_bytes, reserved_bytes, device_used_bytes at its peak;
    # the peak_* figures above are the maxima over them
    lifecycle: dict[str, dict[str, int]] = Field(default_factory=dict)
    lifecycle_peak_phase: str = ""  # the lifecycle phase where device_used_bytes peaks


class Host(BaseModel):
    model_config = ConfigDict(frozen=True)

    offloaded_bytes: int = 0
    nvme_bytes: int = 0
    load_peak_bytes: int = 0  # host RAM one process holds at the model load's peak (training)
    # CUDA managed memory (paged optimizer states) that does not fit beside the rest and is paged out to
    # host RAM by the driver (``managed_in_capacity``)
    managed_paged_out_bytes: int = 0


def managed_in_capacity(outside: Mapping[str, int], reserved_bytes: int, capacity_bytes: int) -> tuple[dict[str, int], int]:
    """``outside`` with its ``managed`` bytes cut to what fits beside the rest of the device, and the bytes
    paged out to host RAM.

    Paged optimizers (bitsandbytes ``PagedAdamW``...) allocate their states with ``cudaMallocManaged``;
    when the GPU runs out of memory the unified-memory driver evicts managed pages to host RAM instead of
    failing (bitsandbytes docs, "Paged optimizers": "automatically evicted to CPU RAM when GPU memory
    runs out"; QLoRA, arXiv 2305.14314 sec. 3, "Paged Optimizers").  So managed memory never makes a job
    run out of memory: it holds what the rest leaves free, the remainder lives on the host (slower).

    >>> managed_in_capacity({"cuda_context": 5, "managed": 50}, 80, 100)
    ({'cuda_context': 5, 'managed': 15}, 35)
    """
    managed = outside.get("managed", 0)
    rest = reserved_bytes + sum(v for k, v in outside.items() if k != "managed")
    resident = min(managed, max(0, capacity_bytes - rest))
    return {**outside, "managed": resident} if "managed" in outside else dict(outside), managed - resident


class ServeBlock(BaseModel):
    model_config = ConfigDict(frozen=True)

    kv_cache_bytes: int = 0
    num_gpu_blocks: int = 0
    max_concurrency: int = 0
    max_model_len_that_fits: int = 0
    # the calibrated band of the KV pool, and the max_model_len requests its bounds hold (report/band.py)
    kv_cache_bytes_low: int | None = None
    kv_cache_bytes_high: int | None = None
    max_concurrency_low: int | None = None
    max_concurrency_high: int | None = None
    # one serving report for every engine (serve/report.py): which engine, what it holds, and why it would
    # not start, in the engine's own words, with the change that makes it start
    engine: str = ""
    weights_bytes: int = 0
    kv_cache_tokens: int = 0
    host_bytes: int = 0
    starts: bool = True
    start_problem: str = ""
    start_fix: str = ""
    # engines other than vLLM (serve/llamacpp.py): weights on the GPU and left on the host, the compute
    # buffer; null for the other engines
    weights_gpu_bytes: int | None = None
    weights_host_bytes: int | None = None
    compute_buffer_bytes: int | None = None
    # starts by the point estimate, but the start-up may run out of memory (vLLM: the CUDA-graph capture after
    # the KV cache, whose band outgrows the room outside gpu_memory_utilization); the verdict is then MAY NOT FIT
    start_risk: str = ""
    start_risk_fix: str = ""


class Report(BaseModel):
    model_config = ConfigDict(frozen=True)

    engine: str
    fits: bool
    per_gpu: PerGpu
    host: Host = Field(default_factory=Host)
    serve: ServeBlock = Field(default_factory=ServeBlock)
    assumptions: list[str] = Field(default_factory=list)
    scenario: dict[str, Any] = Field(default_factory=dict)
    model: dict[str, Any] = Field(default_factory=dict)
    gpu: dict[str, Any] = Field(default_factory=dict)
    # FITS / MAY NOT FIT / DOES NOT FIT: ``fits`` judged on the band's high bound (report/band.py)
    verdict: Literal["FITS", "MAY NOT FIT", "DOES NOT FIT"] | None = None
    band: dict[str, Any] = Field(default_factory=dict)

    @property
    def tight(self) -> bool:
        """Fits, but with less headroom than ``TIGHT_HEADROOM_FRACTION`` of the capacity."""
        pg = self.per_gpu
        return self.fits and pg.headroom_bytes < TIGHT_HEADROOM_FRACTION * pg.capacity_bytes

    def check(self) -> None:
        """Raise if the breakdown does not add up (an internal invariant)."""
        pg = self.per_gpu
        if sum(pg.breakdown.values()) != pg.peak_allocated_bytes:
            raise AssertionError("breakdown does not sum to peak_allocated_bytes")
        for key, parts in pg.breakdown_detail.items():
            if parts and sum(parts.values()) != pg.breakdown.get(key, 0):
                raise AssertionError(f"breakdown_detail[{key}] does not sum to breakdown[{key}]")
        if pg.peak_reserved_bytes < pg.peak_allocated_bytes:
            raise AssertionError("reserved < allocated")
        if pg.device_used_bytes != pg.peak_reserved_bytes + sum(
            v for k, v in pg.outside_allocator.items() if k != "managed"
        ) + pg.outside_allocator.get("managed", 0):
            raise AssertionError("device_used != reserved + outside_allocator")

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def flatten(doc: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists and scalars are leaves."""
    out: dict[str, Any] = {}
    for key, value in doc.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, path + "."))
        else:
            out[path] = value
    return out
