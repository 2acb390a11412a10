"""PyTorch's CUDA caching allocator: from allocated bytes to reserved bytes.

Rules (c10/cuda/CUDACachingAllocator.cpp, PyTorch "CUDA semantics" notes):
every request is rounded up to a multiple of 512 B; requests of at most 1 MiB are
served from 2 MiB segments (the small pool); larger requests below 10 MiB get a
20 MiB segment; requests of 10 MiB and more get a segment rounded up to 2 MiB.
Freed blocks stay cached (reserved) for reuse.

The analytic engine knows the tensors alive at the peak, not their order, so it
counts the rounding of each one and assumes cached free blocks are reused perfectly
(no fragmentation between phases).  The traced engine replays the real event order.
"""

from __future__ import annotations

from vramplan.units import MiB, round_up

ROUND_BYTES = 512
SMALL_SIZE = 1 * MiB
SMALL_SEGMENT = 2 * MiB
LARGE_SEGMENT = 20 * MiB
MIN_LARGE_ALLOC = 10 * MiB
ROUND_LARGE = 2 * MiB


def rounded_request(nbytes: int) -> int:
    """What ``max_memory_allocated`` counts for one tensor: its size rounded to 512 B."""
    return round_up(max(nbytes, 1), ROUND_BYTES)


def segment_bytes(nbytes: int) -> int:
    """The segment cudaMalloc'd for a request that finds no cached block."""
    size = rounded_request(nbytes)
    if size <= SMALL_SIZE:
        return SMALL_SEGMENT
    if size < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return round_up(size, ROUND_LARGE)


def reserved_for(tensor_sizes: list[tuple[int, int]]) -> int:
    """Reserved bytes for ``(size, count)`` tensors alive together, packed into fresh segments.

    Large tensors (>= 10 MiB) get their own 2 MiB-rounded segment; mid-size tensors share
    20 MiB segments; small ones share 2 MiB segments.
    """
    total = 0
    mid = small = 0
    for size, count in tensor_sizes:
        r = rounded_request(size)
        if r >= MIN_LARGE_ALLOC:
            total += round_up(r, ROUND_LARGE) * count
        elif r > SMALL_SIZE:
            mid += r * count
        else:
            small += r * count
    total += round_up(mid, LARGE_SEGMENT) + round_up(small, SMALL_SEGMENT)
    return total
