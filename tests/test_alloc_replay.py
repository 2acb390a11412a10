"""Allocator replay: small cases computed by hand from the rules in CUDACachingAllocator.cpp."""

from __future__ import annotations

import random

import pytest

from vramplan.alloc import AllocEvent, ReplayResult, replay
from vramplan.alloc.caching import AllocatorOutOfMemory, CachingAllocator
from vramplan.alloc.rules import round_size

KiB, MiB = 2**10, 2**20


def layout(a: CachingAllocator) -> list[tuple[int, list[tuple[int, str]]]]:
    """[(segment bytes, [(block bytes, state), ...]), ...] in address order."""
    return [(s.total_size, [(b.size, b.state) for b in s.blocks]) for s in a.segment_views()]


def ev(*pairs: tuple[int, int]) -> list[AllocEvent]:
    return [AllocEvent(i, n) for i, n in pairs]


def test_interface_is_stable() -> None:
    r = replay([AllocEvent(1, 100), AllocEvent(1, -100)])
    assert isinstance(r, ReplayResult)
    assert (r.peak_allocated_bytes, r.peak_reserved_bytes, r.final_allocated_bytes, r.final_reserved_bytes) == (
        512, 2 * MiB, 0, 2 * MiB)
    assert replay([], expandable_segments=True).peak_reserved_bytes == 0


def test_three_600kib_share_one_small_segment() -> None:
    # 600 KiB = 614,400 B, a multiple of 512, <= 1 MiB -> small pool, 2 MiB segment (2,097,152).
    # 1st: new segment, split (2,097,152 - 614,400 = 1,482,752 >= 512 left)
    # 2nd: best fit = that 1,482,752 block, split -> 868,352 left; 3rd: -> 253,952 left.
    a = CachingAllocator()
    for _ in range(3):
        a.malloc(600 * KiB)
    assert layout(a) == [(2 * MiB, [(614_400, "allocated")] * 3 + [(253_952, "free")])]
    assert a.allocated_bytes == 3 * 614_400 == 1_843_200
    assert a.reserved_bytes == 2 * MiB and a.num_device_alloc == 1
    # a 4th does not fit in 253,952 B: a second 2 MiB segment
    a.malloc(600 * KiB)
    assert a.reserved_bytes == 4 * MiB


def test_5mib_gets_20mib_segment_and_next_5mib_splits_it() -> None:
    # 5 MiB: large pool (> 1 MiB), below 10 MiB -> 20 MiB segment; 15 MiB left > 1 MiB -> split.
    # 2nd 5 MiB: best fit is the cached 15 MiB block -> split, 10 MiB left; no new segment.
    r = replay(ev((1, 5 * MiB), (2, 5 * MiB)))
    assert r.peak_allocated_bytes == 10 * MiB
    assert r.peak_reserved_bytes == 20 * MiB
    assert r.num_device_allocs == 1
    assert r.final_largest_free_block_bytes == 10 * MiB


def test_large_requests_get_their_own_rounded_segment() -> None:
    # 12 MiB: >= 10 MiB -> segment of 12 MiB (already a multiple of 2 MiB), nothing left.
    a = CachingAllocator()
    a.malloc(12 * MiB)
    assert layout(a) == [(12 * MiB, [(12 * MiB, "allocated")])]
    # 12 MiB + 1 B -> rounded 12 MiB + 512 -> segment 14 MiB; 2 MiB - 512 left (> 1 MiB) -> split
    a.malloc(12 * MiB + 1)
    assert layout(a)[1] == (14 * MiB, [(12 * MiB + 512, "allocated"), (2 * MiB - 512, "free")])
    # 11 MiB + 1 B -> 11 MiB + 512 -> segment 12 MiB; 1 MiB - 512 left (not > 1 MiB): NOT split,
    # the whole 12 MiB block is handed out and counted as allocated
    b = a.malloc(11 * MiB + 1)
    assert b.size == 12 * MiB
    assert a.allocated_bytes == 12 * MiB + (12 * MiB + 512) + 12 * MiB


def test_freed_block_is_cached_and_reused() -> None:
    # alloc 12 MiB, free it (reserved stays 12 MiB), alloc 12 MiB again: same block, no cudaMalloc
    r = replay(ev((1, 12 * MiB), (1, -12 * MiB), (2, 12 * MiB)))
    assert (r.final_allocated_bytes, r.final_reserved_bytes, r.num_device_allocs) == (12 * MiB, 12 * MiB, 1)
    # a smaller request splits the cached block when more than 1 MiB remains: 12 - 8 = 4 MiB
    r = replay(ev((1, 12 * MiB), (1, -12 * MiB), (2, 8 * MiB)))
    assert (r.final_allocated_bytes, r.final_reserved_bytes, r.num_device_allocs) == (8 * MiB, 12 * MiB, 1)
    # ... and takes it whole when 1 MiB or less would remain: 12 - 11.5 = 0.5 MiB
    r = replay(ev((1, 12 * MiB), (1, -12 * MiB), (2, 11 * MiB + 512 * KiB)))
    assert r.final_allocated_bytes == 12 * MiB


def test_coalescing_of_free_neighbours() -> None:
    # 20 MiB segment: [a 5][b 5][free 10]. Free a: b is allocated, no merge -> free blocks 5, 10.
    a = CachingAllocator()
    x, y = a.malloc(5 * MiB), a.malloc(5 * MiB)
    a.free(x)
    assert layout(a) == [(20 * MiB, [(5 * MiB, "free"), (5 * MiB, "allocated"), (10 * MiB, "free")])]
    # Free b: merges with both neighbours -> one free 20 MiB block
    a.free(y)
    assert layout(a) == [(20 * MiB, [(20 * MiB, "free")])]
    # an 18 MiB request now fits in it (20 - 18 = 2 MiB > 1 MiB left -> split): no new segment
    a.malloc(18 * MiB)
    assert a.reserved_bytes == 20 * MiB and a.num_device_alloc == 1


def test_best_fit_picks_the_smallest_cached_block() -> None:
    # segments of 12, 16 and 14 MiB, all freed; a 13 MiB request takes the 14 MiB block whole
    # (14 - 13 = 1 MiB left, not > 1 MiB -> no split)
    a = CachingAllocator()
    blocks = [a.malloc(n * MiB) for n in (12, 16, 14)]
    for b in blocks:
        a.free(b)
    got = a.malloc(13 * MiB)
    assert got.size == 14 * MiB and a.reserved_bytes == 42 * MiB


def test_small_and_large_pools_are_separate() -> None:
    # a free 2 MiB small segment cannot serve a 1.5 MiB (large-pool) request: new 20 MiB segment
    r = replay(ev((1, 1 * MiB), (1, -1 * MiB), (2, 1 * MiB + 512 * KiB)))
    assert r.final_reserved_bytes == 2 * MiB + 20 * MiB
    assert r.final_segments == 2


def test_empty_cache_and_retry_saves_the_allocation() -> None:
    # capacity 32 MiB. A = 12 MiB (segment 12), B = 12 MiB (segment 12): 24 reserved. Free A.
    # C = 16 MiB: no cached block >= 16; cudaMalloc(16) would make 40 > 32 -> release the free,
    # unsplit 12 MiB segment (reserved 12), retry: 12 + 16 = 28 <= 32 -> success.
    r = replay(ev((1, 12 * MiB), (2, 12 * MiB), (1, -12 * MiB), (3, 16 * MiB)), capacity_bytes=32 * MiB)
    assert r.oom is None
    assert r.num_alloc_retries == 1
    assert (r.final_reserved_bytes, r.final_allocated_bytes, r.peak_reserved_bytes) == (28 * MiB, 28 * MiB, 28 * MiB)
    assert r.num_device_frees == 1


def test_oom_from_fragmentation_and_expandable_segments_avoid_it() -> None:
    # capacity 50 MiB. A = 30 MiB: segment 30 (>= 10 MiB, already a multiple of 2). Free A.
    # P = 8 MiB: best fit = the cached 30 MiB block, 22 MiB left > 1 MiB -> split [P 8][free 22].
    # B = 32 MiB: 22 < 32 -> cudaMalloc(32): 30 + 32 = 62 > 50; the only cached block is part of a
    # split segment, so nothing can be released -> OOM with 8 MiB allocated, 30 MiB reserved,
    # largest free block 22 MiB.  8 + 32 = 40 <= 50: it is a fragmentation OOM.
    events = ev((1, 30 * MiB), (1, -30 * MiB), (2, 8 * MiB), (3, 32 * MiB))
    r = replay(events, capacity_bytes=50 * MiB)
    assert r.oom is not None
    o = r.oom
    assert (o.event_index, o.block_id, o.rounded_bytes, o.device_request_bytes) == (3, 3, 32 * MiB, 32 * MiB)
    assert (o.allocated_bytes, o.reserved_bytes, o.largest_free_block_bytes) == (8 * MiB, 30 * MiB, 22 * MiB)
    assert o.cached_released_bytes == 0 and o.reserved_unallocated_bytes == 22 * MiB
    assert o.fits_without_fragmentation
    assert r.final_allocated_bytes == 8 * MiB  # the replay stops at the failing allocation
    # expandable: A = 30 MiB maps 2 pages of 20 MiB (40 reserved) [A 30][free 10]; free A -> one free
    # 40 MiB block; P splits it [P 8][free 32]; B = 32 MiB fits that block exactly: no OOM, 40 reserved.
    e = replay(events, expandable_segments=True, capacity_bytes=50 * MiB)
    assert e.oom is None
    assert (e.final_allocated_bytes, e.final_reserved_bytes) == (40 * MiB, 40 * MiB)


def test_genuine_oom_is_not_fragmentation() -> None:
    # capacity 30 MiB, two live 12 MiB tensors (24 reserved), then 12 MiB more: 36 > 30 with nothing
    # cached -> OOM; 24 + 12 = 36 > 30: would not fit even perfectly packed.
    r = replay(ev((1, 12 * MiB), (2, 12 * MiB), (3, 12 * MiB)), capacity_bytes=30 * MiB)
    assert r.oom is not None and not r.oom.fits_without_fragmentation
    assert r.peak_allocated_bytes == 24 * MiB


def test_expandable_segment_grows_in_20mib_pages() -> None:
    # large pool pages are 20 MiB: 5 + 5 MiB fit one page; 12 MiB more needs 22 > 20 -> a 2nd page.
    # The small pool maps 2 MiB pages: 100 B -> 512 B block in a 2 MiB page.
    a = CachingAllocator(expandable_segments=True)
    a.malloc(5 * MiB)
    a.malloc(5 * MiB)
    assert a.reserved_bytes == 20 * MiB
    a.malloc(12 * MiB)
    a.malloc(100)
    assert a.reserved_bytes == 40 * MiB + 2 * MiB
    assert layout(a) == [
        (40 * MiB, [(5 * MiB, "allocated"), (5 * MiB, "allocated"), (12 * MiB, "allocated"), (18 * MiB, "free")]),
        (2 * MiB, [(512, "allocated"), (2 * MiB - 512, "free")]),
    ]
    # empty_cache unmaps whole free pages only. The free 18 MiB tail spans [22, 40) MiB: the page
    # [20, 40) also holds allocated bytes [20, 22), so no whole page is free; the small page holds a
    # live block. Nothing is unmapped.
    assert a.empty_cache() == 0
    assert a.reserved_bytes == 42 * MiB


def test_expandable_unmaps_free_pages_on_empty_cache() -> None:
    # 30 MiB maps 2 pages (40 MiB); freed: the whole segment is free -> empty_cache unmaps 40 MiB
    a = CachingAllocator(expandable_segments=True)
    b = a.malloc(30 * MiB)
    a.free(b)
    assert a.empty_cache() == 40 * MiB
    assert a.reserved_bytes == 0 and a.segments == 0


def test_max_split_size() -> None:
    # max_split_size_mb:32. A 64 MiB block, freed, is "oversize": a 16 MiB request must not take it.
    a = CachingAllocator(max_split_size_bytes=32 * MiB)
    a.free(a.malloc(64 * MiB))
    a.malloc(16 * MiB)
    assert a.reserved_bytes == 64 * MiB + 16 * MiB
    # a 50 MiB request may use it (>= max_split and 64 < 50 + 20), unsplit: 64 MiB allocated
    b = a.malloc(50 * MiB)
    assert b.size == 64 * MiB
    with pytest.raises(ValueError):
        CachingAllocator(max_split_size_bytes=20 * MiB)  # must be > 20 MiB, as PyTorch requires


def test_release_available_cached_blocks_with_max_split() -> None:
    # capacity 100 MiB, max_split_size 32 MiB. 64 MiB (own segment, never split), freed: cached.
    # 40 MiB: the cached 64 MiB block is refused (64 >= 40 + 20, "oversized block ... within a
    # limit"); cudaMalloc(40) would make 104 > 100 -> release_available_cached_blocks frees the
    # oversize 64 MiB block only (not a full empty-cache retry) -> 40 MiB segment, 40 reserved.
    r = replay(ev((1, 64 * MiB), (1, -64 * MiB), (2, 40 * MiB)),
               capacity_bytes=100 * MiB, max_split_size_bytes=32 * MiB)
    assert r.oom is None
    assert (r.final_reserved_bytes, r.num_device_frees, r.num_alloc_retries) == (40 * MiB, 1, 0)
    # without max_split_size the 64 MiB block would simply be split: 40 allocated in it, 24 left
    r = replay(ev((1, 64 * MiB), (1, -64 * MiB), (2, 40 * MiB)), capacity_bytes=100 * MiB)
    assert (r.final_reserved_bytes, r.final_allocated_bytes, r.num_device_frees) == (64 * MiB, 40 * MiB, 0)


def test_events_semantics() -> None:
    # zero-byte events are ignored; unknown frees are counted; a double allocation is an error
    r = replay([AllocEvent(1, 0), AllocEvent(2, -4), AllocEvent(3, 100)])
    assert r.unmatched_frees == 1 and r.num_allocs == 1
    with pytest.raises(ValueError, match="allocated twice"):
        replay([AllocEvent(1, 100), AllocEvent(1, 100)])
    with pytest.raises(ValueError):
        CachingAllocator().malloc(0)


def test_fragmentation_at_peak_reserved() -> None:
    # A = 12 MiB (segment 12), free A; B = 8 MiB splits A's cached block [B 8][free 4];
    # C = 6 MiB: 4 < 6 -> a new 20 MiB segment [C 6][free 14]: reserved 32 MiB, the peak.
    # Allocated then: 8 + 6 = 14 MiB -> fragmentation 1 - 14/32 = 0.5625; largest free block 14 MiB.
    r = replay(ev((1, 12 * MiB), (1, -12 * MiB), (2, 8 * MiB), (3, 6 * MiB)))
    assert r.peak_reserved_bytes == 32 * MiB
    assert r.allocated_at_peak_reserved_bytes == 14 * MiB
    assert r.fragmentation_at_peak_reserved == pytest.approx(1 - 14 / 32)
    assert r.largest_free_block_at_peak_reserved_bytes == 14 * MiB


def test_zero_capacity() -> None:
    # found by hypothesis: with no memory at all, even a 512 B block fails, in both modes
    for expandable in (False, True):
        r = replay([AllocEvent(1, 1)], expandable_segments=expandable, capacity_bytes=0)
        assert r.oom is not None and r.peak_reserved_bytes == 0


def test_allocator_out_of_memory_exception() -> None:
    a = CachingAllocator(capacity_bytes=10 * MiB)
    with pytest.raises(AllocatorOutOfMemory) as exc:
        a.malloc(12 * MiB)
    assert exc.value.info.device_request_bytes == 12 * MiB


def random_events(n: int, seed: int, live_target: int = 2000) -> list[AllocEvent]:
    rng = random.Random(seed)
    out: list[AllocEvent] = []
    live: list[tuple[int, int]] = []
    nid = 0
    while len(out) < n:
        if live and (len(live) > live_target or rng.random() < 0.5):
            i = rng.randrange(len(live))
            live[i], live[-1] = live[-1], live[i]
            bid, size = live.pop()
            out.append(AllocEvent(bid, -size))
        else:
            size = int(2 ** rng.uniform(9, 28))
            out.append(AllocEvent(nid, size))
            live.append((nid, size))
            nid += 1
    return out


def test_replay_of_a_long_stream_keeps_its_invariants() -> None:
    # 200,000 mixed events (512 B .. 256 MiB, ~2,000 live) through both configurations; their speed is timed by
    # benchmarks/bench_replay.py (docs/allocator.md), not here.  At the end the allocated bytes are the live blocks'
    # rounded sizes (round_size, 512 B multiples; no block is split off the large pool's remainder below 1 MiB, so
    # a block may hold more than its rounded size: at least, never less), and reserved bytes never fall below them.
    events = random_events(200_000, seed=1)
    live: dict[int, int] = {}
    for ev in events:
        if ev.nbytes > 0:
            live[ev.block_id] = ev.nbytes
        else:
            live.pop(ev.block_id, None)
    rounded = sum(round_size(n) for n in live.values())
    for expandable in (False, True):
        r = replay(events, expandable_segments=expandable)
        assert r.final_allocated_bytes >= rounded > 0
        assert r.final_allocated_bytes - rounded < len(live) * 2 * 2**20  # at most a split remainder per block
        assert r.peak_reserved_bytes >= r.peak_allocated_bytes >= r.final_allocated_bytes
