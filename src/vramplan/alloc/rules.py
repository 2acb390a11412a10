"""The numeric rules of PyTorch's CUDA caching allocator: the only place they are written.

Source: ``c10/cuda/CUDACachingAllocator.cpp`` (PyTorch 2.x, ``DeviceCachingAllocator``; no single
commit is pinned: the six ``k`` constants have the same values in every 2.x release).  The constants
``kMinBlockSize``, ``kSmallSize``, ``kSmallBuffer``, ``kLargeBuffer``, ``kMinLargeAlloc`` and
``kRoundLarge``, and the functions ``round_size``, ``roundup_power2_next_division``,
``get_allocation_size`` and ``should_split`` are transcribed here with the same names and the same
arithmetic; ``CUDAAllocatorConfig`` gives the default of
``max_non_split_rounding_size``, ``ExpandableSegment`` the page sizes and the reserved address range.
``docs/allocator.md`` walks through them with worked examples.

Every model of the allocator reads its numbers from here: the reference ``caching.CachingAllocator``
imports them, and the C replay (``_replay.c``) receives them from ``native.py`` at import
(``_replay.configure``) instead of defining its own.  ``docs/checklists/allocator-rule.md`` lists
what to touch when a rule changes.
"""

from __future__ import annotations

from typing import Final

from vramplan.units import MiB, round_up

__all__ = [
    "ADDRESS_BASE",
    "DEFAULT_ADDRESS_SPACE",
    "EXPANDABLE_LARGE_PAGE",
    "EXPANDABLE_SMALL_PAGE",
    "K_LARGE_BUFFER",
    "K_MIN_BLOCK_SIZE",
    "K_MIN_LARGE_ALLOC",
    "K_ROUND_LARGE",
    "K_SMALL_BUFFER",
    "K_SMALL_SIZE",
    "MAX_NON_SPLIT_ROUNDING",
    "SEGMENT_ALIGN",
    "allocation_size",
    "expandable_address_space",
    "is_small",
    "round_size",
    "roundup_power2_next_division",
    "should_split",
]

# "all sizes are rounded to at least 512 bytes"
K_MIN_BLOCK_SIZE: Final = 512
# "largest 'small' allocation is 1 MiB": requests up to and including 1 MiB use the small pool
K_SMALL_SIZE: Final = 1 * MiB
# "'small' allocations are packed in 2 MiB blocks"
K_SMALL_BUFFER: Final = 2 * MiB
# "'large' allocations may be packed in 20 MiB blocks"
K_LARGE_BUFFER: Final = 20 * MiB
# "allocations between 1 and 10 MiB may use kLargeBuffer"
K_MIN_LARGE_ALLOC: Final = 10 * MiB
# "round up large allocations to 2 MiB"
K_ROUND_LARGE: Final = 2 * MiB

# expandable_segments:True maps physical memory in pages of these sizes
# (Note [Expandable Segments]: "we use 2MiB pages for our small pool and 20MiB pages for our
# large pool"; ExpandableSegment is built with kSmallBuffer or kLargeBuffer as segment_size_).
EXPANDABLE_SMALL_PAGE: Final = K_SMALL_BUFFER
EXPANDABLE_LARGE_PAGE: Final = K_LARGE_BUFFER

# CUDAAllocatorConfig: max_non_split_rounding_size defaults to kLargeBuffer ("Allow oversized block
# size to be rounded up but within a limit" in get_free_block, only read when max_split_size is set)
MAX_NON_SPLIT_ROUNDING: Final = K_LARGE_BUFFER

# The modelled addresses.  Not PyTorch rules but the model's own choices, written once here because
# best fit breaks ties between equal-size cached blocks by address, so every model must lay segments
# out alike: the first segment starts at ADDRESS_BASE (any value works) and each next one at the
# previous end rounded up to SEGMENT_ALIGN (cudaMalloc returns 2 MiB-aligned addresses for large
# requests).  DEFAULT_ADDRESS_SPACE is an expandable segment's virtual range when no capacity is given.
ADDRESS_BASE: Final = 1 << 40
SEGMENT_ALIGN: Final = 2 * MiB
DEFAULT_ADDRESS_SPACE: Final = 1 << 47


def roundup_power2_next_division(size: int, divisions: int) -> int:
    """Round ``size`` up to the next of ``divisions`` equal steps between two powers of two.

    ``roundup_power2_next_division`` in the allocator (used when
    ``PYTORCH_CUDA_ALLOC_CONF=roundup_power2_divisions:N`` is set).

    >>> roundup_power2_next_division(1200, 4)   # steps 1024, 1280, 1536, 1792 -> 1280
    1280
    >>> roundup_power2_next_division(4096, 4)   # powers of two are kept
    4096
    """
    if size & (size - 1) == 0:
        return size
    if divisions < 2:
        raise ValueError("roundup_power2_divisions needs 2 or more divisions")
    power2_floor = 1 << (size.bit_length() - 1)
    # power2_floor >> (63 - countLeadingZeros(divisions)) == power2_floor >> floor(log2(divisions))
    power2_division = power2_floor >> (divisions.bit_length() - 1)
    if power2_division == 0:
        return power2_floor << 1
    floor = size & ~(power2_division - 1)
    return size if floor == size else floor + power2_division


def round_size(size: int, roundup_power2_divisions: int = 0) -> int:
    """The block size the allocator hands out for a request of ``size`` bytes.

    ``round_size``: below 512 B -> 512 B; otherwise a multiple of 512 B, unless
    ``roundup_power2_divisions`` (off by default) asks for power-of-two steps.

    >>> round_size(1), round_size(512), round_size(513), round_size(600 * 1024)
    (512, 512, 1024, 614400)
    """
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    div = roundup_power2_divisions
    if div > 1 and size > K_MIN_BLOCK_SIZE * div:
        return roundup_power2_next_division(size, div)
    return K_MIN_BLOCK_SIZE * ((size + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE)


def is_small(rounded: int) -> bool:
    """``get_pool``: rounded requests of at most 1 MiB go to the small pool."""
    return rounded <= K_SMALL_SIZE


def allocation_size(rounded: int) -> int:
    """Bytes asked of ``cudaMalloc`` when no cached block fits (``get_allocation_size``).

    Small pool: a 2 MiB segment; 1 MiB < size < 10 MiB: a 20 MiB segment (to be split and
    shared); 10 MiB and more: the size rounded up to 2 MiB.

    >>> [allocation_size(n) // 2**20 for n in (4096, 5 * 2**20, 10 * 2**20, 12 * 2**20 + 1)]
    [2, 20, 10, 14]
    """
    if rounded <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if rounded < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * ((rounded + K_ROUND_LARGE - 1) // K_ROUND_LARGE)


def expandable_address_space(capacity_bytes: int | None) -> int:
    """The virtual range one expandable segment reserves (``ExpandableSegment``'s constructor sizes it
    for ``totalGlobalMem + totalGlobalMem / 8``, in whole ``kLargeBuffer`` pages, at least one page).

    >>> expandable_address_space(80 * 2**30) // 2**20, expandable_address_space(None) == 2**47
    (92160, True)
    """
    if capacity_bytes is None:
        return DEFAULT_ADDRESS_SPACE
    return max(round_up(capacity_bytes + capacity_bytes // 8, K_LARGE_BUFFER), K_LARGE_BUFFER)


def should_split(block_size: int, rounded: int, small_pool: bool, expandable: bool,
                 max_split_size: int | None = None) -> bool:
    """Whether a block of ``block_size`` serving ``rounded`` bytes is split (``should_split``).

    Small pool (and every pool with expandable segments): split when the remainder is at least
    512 B.  Large pool: split only when the remainder is *more than* 1 MiB and the request is
    below ``max_split_size`` (unlimited by default); otherwise the whole block is handed out and
    the remainder counts as allocated.

    >>> should_split(20 * 2**20, 19 * 2**20, False, False)   # remainder exactly 1 MiB: no split
    False
    >>> should_split(20 * 2**20, 5 * 2**20, False, False)
    True
    >>> should_split(2 * 2**20, 2 * 2**20 - 512, True, False)   # small pool: 512 B remainder splits
    True
    """
    remaining = block_size - rounded
    if small_pool or expandable:
        return remaining >= K_MIN_BLOCK_SIZE
    below_max = max_split_size is None or rounded < max_split_size
    return below_max and remaining > K_SMALL_SIZE
