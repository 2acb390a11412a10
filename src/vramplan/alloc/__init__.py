"""PyTorch CUDA caching-allocator model (torch-free): replay allocation events into segments.

Used by the traced engine (reserved bytes and fragmentation from a step's events) and by the
OOM-snapshot reader.  Interface (stable; other modules rely on it):

    replay(events, expandable_segments=False) -> ReplayResult
    replay_compact(stream, expandable_segments=False) -> ReplayResult   (ints: +n alloc, -id-1 free)
    replay_parts(parts, expandable_segments=False) -> ReplayResult      (lists of ints and Repeat runs)

where each event is ``AllocEvent(block_id, nbytes)`` with ``nbytes > 0`` for an allocation and
``nbytes < 0`` for the release of that block.  Optional keyword arguments model a device
capacity (to find the allocation that would run out of memory) and the
``PYTORCH_CUDA_ALLOC_CONF`` options ``max_split_size_mb`` and ``roundup_power2_divisions``.

The rules (``rules.py``, the only place their numbers are written) and the reference allocator
(``caching.py``) follow ``c10/cuda/CUDACachingAllocator.cpp``; ``docs/allocator.md`` has them with
worked examples.  Compact streams, in the default configuration and with ``expandable_segments``,
replay through the C replay (``native.py``, ``_replay.c``, configured from ``rules.py`` at import) where
it was built, and through the reference otherwise.  One stream and one device are modelled.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from vramplan.alloc import native
from vramplan.alloc.caching import (
    AllocatorOutOfMemory,
    Block,
    BlockView,
    CachingAllocator,
    OomInfo,
    SegmentView,
)
from vramplan.alloc.compact import Repeat, expand
from vramplan.alloc.rules import allocation_size, round_size, should_split
from vramplan.units import MiB

__all__ = [
    "AllocEvent",
    "AllocatorSettings",
    "BlockView",
    "CachingAllocator",
    "OomInfo",
    "Repeat",
    "ReplayResult",
    "SegmentView",
    "allocation_size",
    "expand",
    "parse_alloc_conf",
    "replay",
    "replay_compact",
    "replay_parts",
    "round_size",
    "should_split",
]


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
    peak_requested_bytes: int = 0          # max of the sum of live requested (unrounded) bytes
    allocated_at_peak_reserved_bytes: int = 0   # allocated right after reserved reached its peak
    largest_free_block_at_peak_reserved_bytes: int = 0  # largest cached block at that moment
    peak_segments: int = 0      # cudaMalloc segments (expandable: expandable segments) at most
    final_segments: int = 0
    final_largest_free_block_bytes: int = 0
    num_allocs: int = 0
    num_frees: int = 0
    num_device_allocs: int = 0  # cudaMalloc calls (expandable: page-mapping calls)
    num_device_frees: int = 0   # cudaFree calls (expandable: unmapping calls)
    num_alloc_retries: int = 0  # allocations that emptied the cache and retried
    unmatched_frees: int = 0    # free events whose block_id was not live (ignored)
    expandable_segments: bool = False
    oom: OomInfo | None = None  # the first allocation that did not fit capacity_bytes

    @property
    def fragmentation_at_peak_reserved(self) -> float:
        """1 - allocated / reserved at the moment reserved reached its peak (0 when none)."""
        if self.peak_reserved_bytes <= 0:
            return 0.0
        return 1.0 - self.allocated_at_peak_reserved_bytes / self.peak_reserved_bytes

    @property
    def peak_overhead_bytes(self) -> int:
        """peak reserved - peak allocated: what caching and rounding add at the peak."""
        return self.peak_reserved_bytes - self.peak_allocated_bytes


@dataclass(frozen=True)
class AllocatorSettings:
    """The ``PYTORCH_CUDA_ALLOC_CONF`` options the model uses (defaults = PyTorch's)."""

    expandable_segments: bool = False
    max_split_size_bytes: int | None = None   # max_split_size_mb (unlimited by default)
    roundup_power2_divisions: int = 0         # roundup_power2_divisions (off by default)
    garbage_collection_threshold: float = 0.0  # read for reports; not modelled


def parse_alloc_conf(conf: str) -> AllocatorSettings:
    """Read a ``PYTORCH_CUDA_ALLOC_CONF`` string such as ``"expandable_segments:True"``.

    >>> parse_alloc_conf("expandable_segments:True,max_split_size_mb:128")
    AllocatorSettings(expandable_segments=True, max_split_size_bytes=134217728, roundup_power2_divisions=0, garbage_collection_threshold=0.0)

    Options the model does not use (``backend``, ``release_lock_on_cudamalloc``, pinned-memory
    options) are accepted and ignored; a malformed entry raises ``ValueError``.  The per-interval
    form of ``roundup_power2_divisions`` (``[256:1,512:2,...]``) is not supported.
    """
    expandable = False
    max_split: int | None = None
    divisions = 0
    gc = 0.0
    for raw in conf.replace(";", ",").split(","):
        item = raw.strip()
        if not item:
            continue
        key, sep, value = item.partition(":")
        key, value = key.strip(), value.strip()
        if not sep:
            raise ValueError(f"allocator option {item!r} has no ':value'")
        try:
            if key == "expandable_segments":
                if value not in ("True", "False"):
                    raise ValueError(f"expandable_segments must be True or False, got {value!r}")
                expandable = value == "True"
            elif key == "max_split_size_mb":
                max_split = int(value) * MiB
            elif key == "roundup_power2_divisions":
                if value.startswith("["):
                    raise ValueError("per-interval roundup_power2_divisions is not supported")
                divisions = int(value)
            elif key == "garbage_collection_threshold":
                gc = float(value)
        except ValueError as exc:
            raise ValueError(f"allocator option {item!r}: {exc}") from exc
    return AllocatorSettings(expandable, max_split, divisions, gc)


def replay(events: Iterable[AllocEvent], expandable_segments: bool = False, *,
           capacity_bytes: int | None = None, max_split_size_bytes: int | None = None,
           roundup_power2_divisions: int = 0) -> ReplayResult:
    """Replay allocation events through the caching-allocator model.

    ``nbytes == 0`` events are ignored (PyTorch does not call the allocator for empty
    storages); a free of an id that is not live is counted in ``unmatched_frees`` and ignored;
    allocating an id that is already live raises ``ValueError``.  With ``capacity_bytes``, the
    replay stops at the first allocation that cannot be satisfied (as the program would) and
    ``oom`` describes it; the peaks are those reached before it.
    """
    alloc = CachingAllocator(expandable_segments=expandable_segments, capacity_bytes=capacity_bytes,
                             max_split_size_bytes=max_split_size_bytes,
                             roundup_power2_divisions=roundup_power2_divisions)
    live: dict[int, Block] = {}
    unmatched = 0
    oom: OomInfo | None = None
    malloc, free = alloc.malloc, alloc.free
    for index, ev in enumerate(events):
        n = ev.nbytes
        if n > 0:
            bid = ev.block_id
            if bid in live:
                raise ValueError(f"event {index}: block {bid} allocated twice without a free")
            try:
                live[bid] = malloc(n, index, bid)
            except AllocatorOutOfMemory as exc:
                oom = exc.info
                break
        elif n < 0:
            block = live.pop(ev.block_id, None)
            if block is None:
                unmatched += 1
            else:
                free(block)
    return _result(alloc, unmatched, oom)


def replay_compact(stream: Sequence[int], expandable_segments: bool = False, *,
                   capacity_bytes: int | None = None) -> ReplayResult:
    """``replay`` for a compact stream of ints, the form the analytic engine builds.

    ``n > 0`` allocates ``n`` bytes as the next block id (ids count allocations from 0);
    ``n < 0`` frees block ``-n - 1``.  Same results as :func:`replay` on the equivalent
    ``AllocEvent`` list, without the event objects: the C replay (``native``) runs it, default
    configuration or ``expandable_segments``, where it was built and ``VRAMPLAN_NATIVE`` is not ``0``;
    otherwise the reference ``CachingAllocator.run_compact``.

    >>> replay_compact([3 * MiB, 1000, -1, -2]).peak_reserved_bytes == 20 * MiB + 2 * MiB
    True
    """
    if native.available():
        return _native_result(native.replay_stream(stream, capacity_bytes, expandable_segments),
                              expandable_segments)
    alloc = CachingAllocator(expandable_segments=expandable_segments, capacity_bytes=capacity_bytes)
    unmatched, oom = alloc.run_compact(stream)
    return _result(alloc, unmatched, oom)


def replay_parts(parts: Iterable[Sequence[int] | Repeat], expandable_segments: bool = False, *,
                 capacity_bytes: int | None = None) -> ReplayResult:
    """``replay_compact(expand(parts))``: literal event lists and ``Repeat`` runs of windows (block ids
    moved by constant strides from window to window).  The C replay (``native``) expands each run window
    by window in C; otherwise (not built, or ``VRAMPLAN_NATIVE=0``) the reference ``CachingAllocator``
    replays the expanded stream.  Either way every event is replayed.

    >>> replay_parts([[3 * MiB], Repeat([1000, -2], [0, 1], 3)]) == replay_compact([3 * MiB, 1000, -2, 1000, -3, 1000, -4])
    True
    """
    if native.available():
        return _native_result(native.replay_parts(parts, capacity_bytes, expandable_segments),
                              expandable_segments)
    return replay_compact(expand(parts), expandable_segments, capacity_bytes=capacity_bytes)


def _native_result(values: tuple[object, ...], expandable_segments: bool) -> ReplayResult:
    """The C replay's statistics as a ``ReplayResult`` (the same as the reference's, field by field:
    ``tests/test_alloc_native.py``)."""
    fields = dict(zip(native.FIELDS, values, strict=True))
    oom = fields.pop("oom")
    info = OomInfo(**dict(zip(native.OOM_FIELDS, oom, strict=True))) if isinstance(oom, tuple) else None
    return ReplayResult(**fields, expandable_segments=expandable_segments, oom=info)  # type: ignore[arg-type]


def _result(alloc: CachingAllocator, unmatched: int, oom: OomInfo | None) -> ReplayResult:
    """The reference model's statistics as a ``ReplayResult``."""
    return ReplayResult(
        peak_allocated_bytes=alloc.peak_allocated_bytes,
        peak_reserved_bytes=alloc.peak_reserved_bytes,
        final_allocated_bytes=alloc.allocated_bytes,
        final_reserved_bytes=alloc.reserved_bytes,
        peak_requested_bytes=alloc.peak_requested_bytes,
        allocated_at_peak_reserved_bytes=alloc.allocated_at_peak_reserved_bytes,
        largest_free_block_at_peak_reserved_bytes=alloc.largest_free_at_peak_reserved_bytes,
        peak_segments=alloc.peak_segments,
        final_segments=alloc.segments,
        final_largest_free_block_bytes=alloc.largest_free_block(),
        num_allocs=alloc.num_allocs,
        num_frees=alloc.num_frees,
        num_device_allocs=alloc.num_device_alloc,
        num_device_frees=alloc.num_device_free,
        num_alloc_retries=alloc.num_alloc_retries,
        unmatched_frees=unmatched,
        expandable_segments=alloc.expandable,
        oom=oom,
    )
