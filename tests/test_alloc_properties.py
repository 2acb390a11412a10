"""Invariants of the allocator model over random programs (hypothesis)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from vramplan.alloc import AllocEvent, replay, replay_compact, round_size
from vramplan.alloc.caching import AllocatorOutOfMemory, Block, CachingAllocator
from vramplan.units import MiB, round_up

SIZES = st.one_of(
    st.integers(1, 2 * MiB),                       # small pool and just above
    st.integers(1, 48 * MiB),                      # 20 MiB-segment range and large
    st.sampled_from([512, 1 * MiB, 10 * MiB, 12 * MiB + 1, 20 * MiB, 19 * MiB]),
)
# an operation: ("a", size) allocates; ("f", k) frees the k-th live block (modulo count)
OPS = st.lists(st.one_of(st.tuples(st.just("a"), SIZES), st.tuples(st.just("f"), st.integers(0, 10**6))),
               max_size=60)


def to_events(ops: list[tuple[str, int]]) -> list[AllocEvent]:
    events: list[AllocEvent] = []
    live: list[tuple[int, int]] = []
    for i, (kind, v) in enumerate(ops):
        if kind == "a":
            events.append(AllocEvent(i, v))
            live.append((i, v))
        elif live:
            bid, n = live.pop(v % len(live))
            events.append(AllocEvent(bid, -n))
    return events


def check_state(a: CachingAllocator, live: dict[int, Block]) -> None:
    assert a.reserved_bytes >= a.allocated_bytes >= a.requested_bytes >= 0
    views = a.segment_views()
    assert sum(s.total_size for s in views) == a.reserved_bytes
    assert sum(s.allocated_size for s in views) == a.allocated_bytes
    for s in views:
        addr = s.address
        prev_free = False
        for b in s.blocks:
            assert b.address == addr          # blocks tile the segment
            addr += b.size
            assert not (prev_free and b.state == "free")  # free neighbours are always merged
            prev_free = b.state == "free"
        assert addr == s.address + s.total_size
    for b in live.values():
        r = round_size(b.requested)
        if a.expandable or r <= MiB:
            assert b.size == r                # split whenever >= 512 B would remain
        else:
            assert r <= b.size <= r + MiB     # whole block only when <= 1 MiB would remain


@settings(max_examples=120, deadline=None)
@given(OPS, st.booleans())
def test_invariants_hold_after_every_operation(ops: list[tuple[str, int]], expandable: bool) -> None:
    a = CachingAllocator(expandable_segments=expandable)
    live: dict[int, Block] = {}
    for ev in to_events(ops):
        if ev.nbytes > 0:
            live[ev.block_id] = a.malloc(ev.nbytes)
        else:
            a.free(live.pop(ev.block_id))
        check_state(a, live)
    for b in list(live.values()):
        a.free(b)
    assert a.allocated_bytes == 0
    a.empty_cache()                           # everything coalesced -> every segment released
    assert a.reserved_bytes == 0 and a.segments == 0


@settings(max_examples=80, deadline=None)
@given(OPS, st.booleans())
def test_replay_is_deterministic_and_peaks_are_ordered(ops: list[tuple[str, int]], expandable: bool) -> None:
    events = to_events(ops)
    r1 = replay(events, expandable_segments=expandable)
    r2 = replay(events, expandable_segments=expandable)
    assert r1 == r2
    assert r1.peak_reserved_bytes >= r1.peak_allocated_bytes >= r1.peak_requested_bytes
    assert r1.peak_reserved_bytes >= r1.allocated_at_peak_reserved_bytes
    assert 0.0 <= r1.fragmentation_at_peak_reserved <= 1.0


@settings(max_examples=80, deadline=None)
@given(st.lists(SIZES, max_size=40))
def test_expandable_allocations_tile_pages_exactly(sizes: list[int]) -> None:
    # allocations only: each pool is one segment filled end to end, so reserved is the rounded
    # totals rounded up to whole pages (20 MiB large, 2 MiB small)
    r = replay([AllocEvent(i, n) for i, n in enumerate(sizes)], expandable_segments=True)
    large = sum(round_size(n) for n in sizes if round_size(n) > MiB)
    small = sum(round_size(n) for n in sizes if round_size(n) <= MiB)
    assert r.final_reserved_bytes == round_up(large, 20 * MiB) + round_up(small, 2 * MiB)
    assert r.final_allocated_bytes == large + small


@settings(max_examples=80, deadline=None)
@given(OPS, st.booleans())
def test_capacity(ops: list[tuple[str, int]], expandable: bool) -> None:
    events = to_events(ops)
    free_run = replay(events, expandable_segments=expandable)
    # a capacity equal to the unlimited peak reserved never fails and changes nothing
    same = replay(events, expandable_segments=expandable, capacity_bytes=free_run.peak_reserved_bytes)
    assert same.oom is None and same.peak_reserved_bytes == free_run.peak_reserved_bytes
    # below the peak of live requested bytes, an OOM is certain (requested <= allocated <= reserved)
    if free_run.peak_requested_bytes > 0:
        r = replay(events, expandable_segments=expandable, capacity_bytes=free_run.peak_requested_bytes - 1)
        assert r.oom is not None
        assert r.oom.reserved_bytes <= free_run.peak_requested_bytes - 1


@settings(max_examples=80, deadline=None)
@given(OPS, st.booleans(), st.sampled_from([0, 20 * MiB, 40 * MiB, 64 * MiB, 100 * MiB]))
def test_invariants_hold_through_out_of_memory(ops: list[tuple[str, int]], expandable: bool,
                                               capacity: int) -> None:
    # a program that catches the OOM and goes on: the empty-cache-and-retry path, the unmapping of
    # expandable pages and the failed allocations must leave a consistent allocator
    a = CachingAllocator(expandable_segments=expandable, capacity_bytes=capacity)
    live: dict[int, Block] = {}
    for ev in to_events(ops):
        if ev.nbytes > 0:
            try:
                live[ev.block_id] = a.malloc(ev.nbytes)
            except AllocatorOutOfMemory as exc:
                assert exc.info.reserved_bytes <= capacity
                assert exc.info.allocated_bytes + exc.info.largest_free_block_bytes <= capacity
        elif ev.block_id in live:
            a.free(live.pop(ev.block_id))
        assert a.reserved_bytes <= capacity
        check_state(a, live)
    for b in list(live.values()):
        a.free(b)
    a.empty_cache()
    assert a.reserved_bytes == 0


def to_compact(events: list[AllocEvent]) -> tuple[list[int], dict[int, int]]:
    """The same program as a compact stream (block ids renumbered in allocation order), and the renumbering."""
    ids: dict[int, int] = {}
    out: list[int] = []
    for ev in events:
        if ev.nbytes > 0:
            ids[ev.block_id] = len(ids)
            out.append(ev.nbytes)
        else:
            out.append(-ids[ev.block_id] - 1)
    return out, ids


@settings(max_examples=200, deadline=None)
@given(OPS, st.booleans(), st.one_of(st.none(), st.integers(0, 200 * MiB)))
def test_compact_replay_equals_event_replay(ops: list[tuple[str, int]], expandable: bool,
                                            capacity: int | None) -> None:
    # replay_compact runs the default configuration's common paths inline; every statistic and the
    # OOM point must be those of the event-by-event replay, with and without a capacity
    events = to_events(ops)
    stream, ids = to_compact(events)
    a = replay(events, expandable_segments=expandable, capacity_bytes=capacity)
    if a.oom is not None:  # the failing block under its compact id (the allocation's ordinal)
        a = replace(a, oom=replace(a.oom, block_id=len(ids) if a.oom.block_id not in ids else ids[a.oom.block_id]))
    b = replay_compact(stream, expandable_segments=expandable, capacity_bytes=capacity)
    assert a == b
