"""PyTorch CUDA caching-allocator model (torch-free): replay allocation events into segments.

Used by the traced engine (reserved bytes and fragmentation from a step's events) and by the
OOM-snapshot reader.  Interface (stable; other modules rely on it):

    replay(events, expandable_segments=False) -> ReplayResult

where each event is ``AllocEvent(block_id, nbytes)`` with ``nbytes > 0`` for an allocation and
``nbytes < 0`` for the release of that block.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from vramplan.units import round_up

__all__ = ["AllocEvent", "ReplayResult", "replay"]


@dataclass(frozen=True)
class AllocEvent:
    block_id: int
    nbytes: int  # > 0 allocate, < 0 free (the same magnitude as the allocation)


@dataclass(frozen=True)
class ReplayResult:
    peak_allocated_bytes: int   # max over time of sum of rounded live blocks (max_memory_allocated)
    peak_reserved_bytes: int    # max over time of sum of segment sizes (max_memory_reserved)
    final_allocated_bytes: int
    final_reserved_bytes: int


def replay(events: Iterable[AllocEvent], expandable_segments: bool = False) -> ReplayResult:
    """Placeholder model: 512-byte rounding only, every block its own segment (to be replaced)."""
    live: dict[int, int] = {}
    allocated = peak = 0
    for ev in events:
        if ev.nbytes > 0:
            size = round_up(ev.nbytes, 512)
            live[ev.block_id] = size
            allocated += size
            peak = max(peak, allocated)
        else:
            allocated -= live.pop(ev.block_id, 0)
    return ReplayResult(peak, peak, allocated, allocated)
