"""A pure-Python model of PyTorch's CUDA caching allocator (one device, one stream).

It follows ``DeviceCachingAllocator`` in ``c10/cuda/CUDACachingAllocator.cpp`` (PyTorch 2.x)
function by function; the C++ names are given in each docstring.  What it keeps:

* two pools of cached free blocks (small: requests <= 1 MiB; large: the rest), each ordered by
  ``(size, address)`` like the C++ ``std::set`` with ``BlockComparatorSize`` (the stream is the
  first key there; this model has one stream);
* best fit (``get_free_block``: the smallest cached block that is large enough, lowest address
  first among equals), with the ``max_split_size`` rules when that option is set;
* a new segment of ``get_allocation_size`` bytes when no cached block fits (``alloc_block``);
* splitting (``should_split``, ``alloc_found_block``) and coalescing of free neighbours in the
  same segment (``free_block``, ``try_merge_blocks``); freed blocks stay cached;
* when a capacity is given and the segment does not fit: release oversize cached blocks if
  ``max_split_size`` is set (``release_available_cached_blocks``), then release every cached
  segment that is entirely free and retry (``release_cached_blocks``), then out of memory;
* ``expandable_segments:True``: one segment per pool that grows by mapping pages (2 MiB for the
  small pool, 20 MiB for the large pool) at its end (``try_allocate_expandable_block``,
  ``map_block``), and on an out-of-memory retry unmaps every fully free page (``unmap_block``).

What it leaves out (stated in docs/allocator.md): several streams in one replay (a side stream's blocks are
replayed as an allocator of their own one level up: ``alloc/compact.py split_pools``, ``analytic/allocator.py
_pooled_reserved``), cross-stream frees (``record_stream`` events), CUDA-graph private pools, ``garbage_collection_threshold`` (off by
default and only active with ``set_per_process_memory_fraction``), free-memory callbacks, and
the real addresses ``cudaMalloc`` returns (segments here get increasing addresses, which only
matters for breaking ties between equal-size cached blocks).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from vramplan.alloc.rules import (
    ADDRESS_BASE,
    EXPANDABLE_LARGE_PAGE,
    EXPANDABLE_SMALL_PAGE,
    K_LARGE_BUFFER,
    MAX_NON_SPLIT_ROUNDING,
    SEGMENT_ALIGN,
    allocation_size,
    expandable_address_space,
    is_small,
    round_size,
    should_split,
)
from vramplan.units import MiB, round_up

__all__ = ["AllocatorOutOfMemory", "Block", "BlockView", "CachingAllocator", "OomInfo", "SegmentView"]


class _Segment:
    """One ``cudaMalloc`` (or one expandable segment's reserved range)."""

    __slots__ = ("base", "page", "released", "size", "small")

    def __init__(self, base: int, size: int, small: bool, page: int) -> None:
        self.base = base
        self.size = size        # cudaMalloc'd bytes; for an expandable segment, its virtual range
        self.small = small
        self.page = page        # 0 for a cudaMalloc segment, the mapping granularity otherwise
        self.released = False


class Block:
    """A piece of a segment: allocated, cached free, or (expandable only) unmapped."""

    __slots__ = ("addr", "allocated", "mapped", "next", "prev", "requested", "seg", "size")

    def __init__(self, addr: int, size: int, seg: _Segment, mapped: bool = True) -> None:
        self.addr = addr
        self.size = size
        self.seg = seg
        self.mapped = mapped
        self.allocated = False
        self.requested = 0
        self.prev: Block | None = None
        self.next: Block | None = None


class _Pool:
    __slots__ = ("free", "page", "small", "unmapped")

    def __init__(self, small: bool) -> None:
        self.small = small
        self.page = EXPANDABLE_SMALL_PAGE if small else EXPANDABLE_LARGE_PAGE
        # cached free blocks as (size, address, block), kept sorted: the C++ BlockComparatorSize
        self.free: list[tuple[int, int, Block]] = []
        # unmapped ranges of expandable segments as (address, block): BlockComparatorAddress
        self.unmapped: list[tuple[int, Block]] = []


@dataclass(frozen=True)
class OomInfo:
    """An allocation the modelled allocator could not satisfy within ``capacity_bytes``.

    Figures are taken where PyTorch raises ``OutOfMemoryError``, i.e. after it has already
    released every cached segment that was entirely free and retried.
    """

    event_index: int
    block_id: int
    requested_bytes: int          # what the program asked for
    rounded_bytes: int            # after round_size (what the OOM trace entry records)
    device_request_bytes: int     # what cudaMalloc was asked (or pages to map, expandable)
    capacity_bytes: int
    allocated_bytes: int          # "X is allocated by PyTorch"
    reserved_bytes: int           # after the retry's release of cached segments
    reserved_before_retry_bytes: int
    cached_released_bytes: int    # what release_cached_blocks gave back before giving up
    largest_free_block_bytes: int  # largest block still cached (inside partly used segments)

    @property
    def reserved_unallocated_bytes(self) -> int:
        """"Y is reserved by PyTorch but unallocated" in PyTorch's OOM message."""
        return self.reserved_bytes - self.allocated_bytes

    @property
    def fits_without_fragmentation(self) -> bool:
        """Would the request fit if every reserved-but-unallocated byte were usable?

        True means the OOM is caused by fragmentation (free bytes exist but not in one piece);
        ``expandable_segments:True`` is the usual cure.  False means the live tensors alone
        leave no room: less memory must be used.
        """
        return self.allocated_bytes + self.rounded_bytes <= self.capacity_bytes


class AllocatorOutOfMemory(Exception):
    """Raised by :meth:`CachingAllocator.malloc` when ``capacity_bytes`` cannot hold a request."""

    def __init__(self, info: OomInfo) -> None:
        super().__init__(f"out of memory: tried to allocate {info.rounded_bytes} bytes")
        self.info = info


@dataclass(frozen=True)
class BlockView:
    address: int
    size: int
    state: str  # "allocated" | "free" | "unmapped"
    requested_size: int = 0


@dataclass(frozen=True)
class SegmentView:
    """A segment as ``torch.cuda.memory_snapshot()`` would list it (mapped ranges only)."""

    address: int
    total_size: int
    segment_type: str  # "small" | "large"
    is_expandable: bool
    blocks: tuple[BlockView, ...] = field(default=())

    @property
    def allocated_size(self) -> int:
        return sum(b.size for b in self.blocks if b.state == "allocated")


class CachingAllocator:
    """Stateful model: ``malloc(nbytes) -> handle``, ``free(handle)``, running statistics.

    ``capacity_bytes`` is the memory the allocator may obtain from the device (total memory
    minus the CUDA context and anything else outside PyTorch); ``None`` means unlimited.
    """

    def __init__(self, expandable_segments: bool = False, capacity_bytes: int | None = None,
                 max_split_size_bytes: int | None = None, roundup_power2_divisions: int = 0,
                 max_non_split_rounding_bytes: int = MAX_NON_SPLIT_ROUNDING) -> None:
        if capacity_bytes is not None and capacity_bytes < 0:
            raise ValueError("capacity_bytes must be >= 0")
        if max_split_size_bytes is not None and max_split_size_bytes <= K_LARGE_BUFFER:
            # CUDAAllocatorConfig: "max_split_size_mb too small, must be > " kLargeBuffer in MiB
            raise ValueError(f"max_split_size must be larger than {K_LARGE_BUFFER // MiB} MiB")
        self.expandable = expandable_segments
        self.capacity = capacity_bytes
        self.max_split = max_split_size_bytes
        self.max_non_split_rounding = max_non_split_rounding_bytes
        self.divisions = roundup_power2_divisions
        self._small = _Pool(True)
        self._large = _Pool(False)
        self._next_addr = ADDRESS_BASE
        self._active: set[Block] = set()
        self._address_space = expandable_address_space(capacity_bytes)
        # statistics (names follow torch.cuda.memory_stats())
        self.allocated_bytes = 0
        self.reserved_bytes = 0
        self.requested_bytes = 0
        self.peak_allocated_bytes = 0
        self.peak_reserved_bytes = 0
        self.peak_requested_bytes = 0
        self.segments = 0
        self.peak_segments = 0
        self.num_device_alloc = 0
        self.num_device_free = 0
        self.num_alloc_retries = 0
        self.num_allocs = 0
        self.num_frees = 0
        self.allocated_at_peak_reserved_bytes = 0
        self.largest_free_at_peak_reserved_bytes = 0
        self._peak_reserved_moved = False
        # called as on_device_event(action, address, nbytes) with the snapshot trace's action
        # names: segment_alloc, segment_free, segment_map, segment_unmap
        self.on_device_event: Callable[[str, int, int], None] | None = None

    # ------------------------------------------------------------------ public API

    def malloc(self, nbytes: int, event_index: int = -1, block_id: int = -1) -> Block:
        """``DeviceCachingAllocator::malloc``: a block of at least ``nbytes`` (> 0)."""
        if nbytes <= 0:
            raise ValueError("malloc needs nbytes > 0 (PyTorch never allocates 0 bytes)")
        rounded = round_size(nbytes, self.divisions)
        pool = self._small if is_small(rounded) else self._large
        block = self._get_free_block(pool, rounded)
        if block is None:
            block = self._alloc_block(pool, rounded)
            if block is None and self._release_available_cached_blocks(pool, rounded):
                block = self._alloc_block(pool, rounded)
            if block is None:
                reserved_before = self.reserved_bytes
                released = self._release_cached_blocks()
                self.num_alloc_retries += 1
                block = self._alloc_block(pool, rounded)
                if block is None:
                    info = OomInfo(
                        event_index=event_index, block_id=block_id, requested_bytes=nbytes,
                        rounded_bytes=rounded, device_request_bytes=self._device_request(pool, rounded),
                        capacity_bytes=self.capacity or 0, allocated_bytes=self.allocated_bytes,
                        reserved_bytes=self.reserved_bytes, reserved_before_retry_bytes=reserved_before,
                        cached_released_bytes=released, largest_free_block_bytes=self.largest_free_block())
                    raise AllocatorOutOfMemory(info)
        block = self._alloc_found_block(pool, block, rounded, nbytes)
        if self._peak_reserved_moved:
            self._peak_reserved_moved = False
            self.allocated_at_peak_reserved_bytes = self.allocated_bytes
            self.largest_free_at_peak_reserved_bytes = self.largest_free_block()
        return block

    def free(self, block: Block) -> None:
        """``DeviceCachingAllocator::free`` + ``free_block``: cache the block, merge neighbours."""
        if not block.allocated:
            raise ValueError("block is not allocated")
        block.allocated = False
        self._active.discard(block)
        self.allocated_bytes -= block.size
        self.requested_bytes -= block.requested
        self.num_frees += 1
        pool = self._small if block.seg.small else self._large
        prev, nxt = block.prev, block.next
        if prev is not None and not prev.allocated and prev.mapped == block.mapped:
            self._merge(pool, block, prev)
        if nxt is not None and not nxt.allocated and nxt.mapped == block.mapped:
            self._merge(pool, block, nxt)
        insort(pool.free, (block.size, block.addr, block))

    def run_compact(self, stream: Sequence[int]) -> tuple[int, OomInfo | None]:
        """Replay a compact event stream; returns (frees of blocks that were not live, first OOM).

        ``stream`` holds ints: ``n > 0`` allocates ``n`` bytes as the next block id (0, 1, 2, ...
        in allocation order), ``n < 0`` frees block ``-n - 1``, ``0`` is ignored.  Event by event through
        :meth:`malloc` and :meth:`free`.  ``replay_compact`` uses this where the C replay (``native``) was
        not built or ``VRAMPLAN_NATIVE=0``; ``tests/test_alloc_native.py`` checks the C replay against it,
        in the default configuration and with ``expandable_segments``.
        """
        live: list[Block | None] = []
        unmatched = 0
        malloc, free = self.malloc, self.free
        for index, n in enumerate(stream):
            if n > 0:
                try:
                    live.append(malloc(n, index, len(live)))
                except AllocatorOutOfMemory as exc:
                    return unmatched, exc.info
            elif n < 0:
                j = -n - 1
                blk = live[j] if j < len(live) else None
                if blk is None:
                    unmatched += 1
                    continue
                live[j] = None
                free(blk)
        return unmatched, None

    def empty_cache(self) -> int:
        """``torch.cuda.empty_cache()``: release cached segments that are entirely free."""
        return self._release_cached_blocks()

    def largest_free_block(self) -> int:
        """Largest cached free block (``cacheInfo`` without the device's free memory)."""
        best = 0
        for pool in (self._small, self._large):
            if pool.free:
                best = max(best, pool.free[-1][0])
        return best

    def cached_free_bytes(self) -> int:
        return sum(t[0] for pool in (self._small, self._large) for t in pool.free)

    def segment_views(self) -> list[SegmentView]:
        """Every mapped segment with its blocks in address order (for tests and reports)."""
        by_seg: dict[_Segment, list[Block]] = {}
        for pool in (self._small, self._large):
            for _, _, b in pool.free:
                by_seg.setdefault(b.seg, []).append(b)
            for _, b in pool.unmapped:
                by_seg.setdefault(b.seg, []).append(b)
        for b in self._active:
            by_seg.setdefault(b.seg, []).append(b)
        out: list[SegmentView] = []
        for seg, blocks in by_seg.items():
            blocks.sort(key=lambda b: b.addr)
            runs: list[list[Block]] = [[]]
            for b in blocks:
                if b.mapped:
                    runs[-1].append(b)
                elif runs[-1]:
                    runs.append([])
            for run in runs:
                if not run:
                    continue
                views = tuple(BlockView(x.addr, x.size, "allocated" if x.allocated else "free",
                                        x.requested) for x in run)
                out.append(SegmentView(run[0].addr, sum(x.size for x in run),
                                       "small" if seg.small else "large", seg.page > 0, views))
        out.sort(key=lambda s: s.address)
        return out

    # ------------------------------------------------------------------ internals

    def _device_request(self, pool: _Pool, rounded: int) -> int:
        if self.expandable:
            return round_up(rounded, pool.page)
        return allocation_size(rounded)

    def _raise_reserved(self, nbytes: int) -> None:
        self.reserved_bytes += nbytes
        if self.reserved_bytes > self.peak_reserved_bytes:
            self.peak_reserved_bytes = self.reserved_bytes
            self._peak_reserved_moved = True

    def _new_segment(self, size: int, small: bool, page: int) -> _Segment:
        seg = _Segment(self._next_addr, size, small, page)
        self._next_addr += round_up(size, SEGMENT_ALIGN)
        self.segments += 1
        self.peak_segments = max(self.peak_segments, self.segments)
        return seg

    def _release_segment(self, seg: _Segment) -> None:
        seg.released = True
        self.segments -= 1

    def _get_free_block(self, pool: _Pool, rounded: int) -> Block | None:
        """``get_free_block``: smallest cached block >= ``rounded`` (lowest address on ties)."""
        free = pool.free
        i = bisect_left(free, (rounded,))
        n = len(free)
        if i == n:
            return None
        if self.expandable:
            # best fit counts a block that ends at unmapped space as large as it could grow
            def grow(b: Block) -> int:
                nx = b.next
                return b.size + (nx.size if nx is not None and not nx.mapped else 0)
            while i + 1 < n and grow(free[i + 1][2]) < grow(free[i][2]):
                i += 1
        size, _, block = free[i]
        if self.max_split is not None:
            # "Do not return an oversized block for a large request"
            if rounded < self.max_split and size >= self.max_split:
                return None
            # "Allow oversized block size to be rounded up but within a limit"
            if rounded >= self.max_split and size >= rounded + self.max_non_split_rounding:
                return None
        del free[i]
        return block

    def _alloc_block(self, pool: _Pool, rounded: int) -> Block | None:
        """``alloc_block``: a new segment from the device, or ``None`` if it does not fit."""
        if self.expandable:
            return self._try_allocate_expandable_block(pool, rounded)
        size = allocation_size(rounded)
        if self.capacity is not None and self.reserved_bytes + size > self.capacity:
            return None
        seg = self._new_segment(size, pool.small, 0)
        self.num_device_alloc += 1
        self._raise_reserved(size)
        if self.on_device_event is not None:
            self.on_device_event("segment_alloc", seg.base, size)
        return Block(seg.base, size, seg)

    def _alloc_found_block(self, pool: _Pool, block: Block, rounded: int, nbytes: int) -> Block:
        """``alloc_found_block``: split off the remainder when ``should_split`` says so."""
        if should_split(block.size, rounded, pool.small, self.expandable, self.max_split):
            remaining = block
            block = Block(remaining.addr, rounded, remaining.seg)
            block.prev = remaining.prev
            if block.prev is not None:
                block.prev.next = block
            block.next = remaining
            remaining.prev = block
            remaining.addr += rounded
            remaining.size -= rounded
            insort(pool.free, (remaining.size, remaining.addr, remaining))
        block.allocated = True
        block.requested = nbytes
        self._active.add(block)
        self.num_allocs += 1
        self.allocated_bytes += block.size
        self.requested_bytes += nbytes
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, self.allocated_bytes)
        self.peak_requested_bytes = max(self.peak_requested_bytes, self.requested_bytes)
        return block

    def _remove_cached(self, pool: _Pool, block: Block) -> None:
        if block.mapped:
            lst = pool.free
            i = bisect_left(lst, (block.size, block.addr))
            assert lst[i][2] is block
            del lst[i]
        else:
            ul = pool.unmapped
            j = bisect_left(ul, (block.addr,))
            assert ul[j][1] is block
            del ul[j]

    def _merge(self, pool: _Pool, dst: Block, src: Block) -> int:
        """``try_merge_blocks``: ``dst`` absorbs its free neighbour ``src`` (same mapped state)."""
        self._remove_cached(pool, src)
        if dst.prev is src:
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return src.size

    def _try_merge(self, pool: _Pool, dst: Block, src: Block | None) -> int:
        if src is None or src.allocated or src.mapped != dst.mapped:
            return 0
        return self._merge(pool, dst, src)

    def _release_available_cached_blocks(self, pool: _Pool, rounded: int) -> bool:
        """``release_available_cached_blocks``: with ``max_split_size`` set, free oversize blocks."""
        if self.max_split is None or self.expandable:
            return False
        key = max(rounded, self.max_split)
        free = pool.free
        i = bisect_left(free, (key,))
        if i < len(free):
            block = free[i][2]
            if block.prev is None and block.next is None:
                self._release_block(pool, block)
                return True
            return False
        released = 0
        j = len(free) - 1
        while released < key and j >= 0 and free[j][0] >= self.max_split:
            block = free[j][2]
            if block.prev is None and block.next is None:
                released += block.size
                self._release_block(pool, block)
            j -= 1
        return released >= key

    def _release_block(self, pool: _Pool, block: Block) -> int:
        """``release_block``: ``cudaFree`` an entirely free, unsplit segment."""
        self._remove_cached(pool, block)
        self.reserved_bytes -= block.size
        self.num_device_free += 1
        self._release_segment(block.seg)
        if self.on_device_event is not None:
            self.on_device_event("segment_free", block.addr, block.size)
        return block.size

    def _release_cached_blocks(self) -> int:
        """``release_cached_blocks``: give back every cached segment that is entirely free.

        With expandable segments, every fully free page of every free block is unmapped
        (``release_blocks`` -> ``unmap_block``).  Returns the bytes given back.
        """
        released = 0
        for pool in (self._large, self._small):
            if not self.expandable:
                keep: list[tuple[int, int, Block]] = []
                for item in pool.free:
                    b = item[2]
                    if b.prev is None and b.next is None:
                        released += b.size
                        self.reserved_bytes -= b.size
                        self.num_device_free += 1
                        self._release_segment(b.seg)
                        if self.on_device_event is not None:
                            self.on_device_event("segment_free", b.addr, b.size)
                    else:
                        keep.append(item)
                pool.free = keep
            else:
                for b in [item[2] for item in pool.free]:
                    released += self._unmap_block(pool, b)
                    if not b.mapped and b.prev is None and b.next is None:
                        self._remove_cached(pool, b)
                        self._release_segment(b.seg)
        return released

    # ------------------------------------------------------------------ expandable segments

    def _find_expandable_block(self, pool: _Pool, rounded: int) -> Block:
        """``find_expandable_block``: lowest address where free + unmapped space fits."""
        for _, c in pool.unmapped:
            cand = c
            if cand.prev is not None and not cand.prev.allocated:
                cand = cand.prev
            total = 0
            b: Block | None = cand
            while b is not None and total < rounded and not b.allocated:
                total += b.size
                b = b.next
            if total >= rounded:
                return cand
        seg = self._new_segment(self._address_space, pool.small, pool.page)
        block = Block(seg.base, seg.size, seg, mapped=False)
        insort(pool.unmapped, (block.addr, block))
        return block

    def _map_block(self, pool: _Pool, block: Block, nbytes: int) -> bool:
        """``map_block``: back ``nbytes`` (rounded up to whole pages) of an unmapped range."""
        page = block.seg.page
        mapped = round_up(nbytes, page)
        if self.capacity is not None and self.reserved_bytes + mapped > self.capacity:
            return False
        self._remove_cached(pool, block)
        block.mapped = True
        map_addr = block.addr
        if mapped < block.size:
            rest = Block(block.addr + mapped, block.size - mapped, block.seg, mapped=False)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            insort(pool.unmapped, (rest.addr, rest))
            block.size = mapped
        self._try_merge(pool, block, block.prev)
        self._try_merge(pool, block, block.next)
        insort(pool.free, (block.size, block.addr, block))
        self.num_device_alloc += 1
        self._raise_reserved(mapped)
        if self.on_device_event is not None:
            self.on_device_event("segment_map", map_addr, mapped)
        return True

    def _try_allocate_expandable_block(self, pool: _Pool, rounded: int) -> Block | None:
        """``try_allocate_expandable_block``: grow the segment until a block of ``rounded`` fits."""
        cand = self._find_expandable_block(pool, rounded)
        if not cand.mapped and not self._map_block(pool, cand, min(cand.size, rounded)):
            return None
        while cand.size < rounded:
            nxt = cand.next
            assert nxt is not None and not nxt.mapped
            if not self._map_block(pool, nxt, min(rounded - cand.size, nxt.size)):
                return None
            cand = nxt
        self._remove_cached(pool, cand)
        return cand

    def _unmap_block(self, pool: _Pool, block: Block) -> int:
        """``unmap_block``: unmap the whole pages inside a free block; returns bytes unmapped."""
        seg = block.seg
        page, base = seg.page, seg.base
        begin = -(-(block.addr - base) // page)
        end = (block.addr + block.size - base) // page
        if begin >= end:
            return 0
        self._remove_cached(pool, block)
        start = base + begin * page
        size = (end - begin) * page
        before = start - block.addr
        if before > 0:
            bf = Block(block.addr, before, seg)
            bf.prev, bf.next = block.prev, block
            if block.prev is not None:
                block.prev.next = bf
            block.prev = bf
            insort(pool.free, (bf.size, bf.addr, bf))
        after = block.size - before - size
        if after > 0:
            af = Block(start + size, after, seg)
            af.prev, af.next = block, block.next
            if block.next is not None:
                block.next.prev = af
            block.next = af
            insort(pool.free, (af.size, af.addr, af))
        block.addr, block.size, block.mapped = start, size, False
        self._try_merge(pool, block, block.prev)
        self._try_merge(pool, block, block.next)
        insort(pool.unmapped, (block.addr, block))
        self.reserved_bytes -= size
        self.num_device_free += 1
        if self.on_device_event is not None:
            self.on_device_event("segment_unmap", start, size)
        return size
