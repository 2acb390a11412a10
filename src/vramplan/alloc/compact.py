"""A fast replay of compact event streams through the default caching allocator.

``CachingAllocator`` (caching.py) is the model, method by method; this module is the same model
for PyTorch's default configuration (no ``expandable_segments``, no ``max_split_size_mb``, no
``roundup_power2_divisions``) written for speed, because the analytic engine replays 10,000 to
20,000 events per training estimate.  Two things make it fast.

**Representation** (same rules, cheaper objects).  A block is a list ``[address, size, requested,
prev, next, segment, id]`` (``requested`` is 0 for a cached block, > 0 for an allocated one); each
pool's cached blocks are a sorted list of int keys ``size << 64 | address`` with a dict from key to
block, i.e. the order of ``(size, address)`` pairs, which is the C++ ``BlockComparatorSize``; the
statistics live in local variables of the replay loop.  The rules are those of caching.py: best fit
(``bisect`` gives the smallest cached block at least as large as the request, the lowest address
among equal sizes), ``should_split`` (small pool: 512 B or more left; large pool: more than 1 MiB
left), a new segment of ``allocation_size`` bytes at the next address when nothing fits, merging of
free neighbours on a free and, under a capacity, ``release_cached_blocks`` (every cached block that is
a whole segment is given back, large pool first) and one retry before out of memory.  A property test
checks ``replay_compact`` (this class) against ``CachingAllocator`` event by event on random programs.

**Repeated windows** (:class:`Repeat`).  A transformer's layers make the same events layer after
layer, with block ids moved on by a constant per event (``Repeat.strides``).  When the allocator's
state is periodic too, the windows in the middle of such a run need not be replayed event by event:
:meth:`CompactReplay.run_parts` replays windows recording what they touch, takes two consecutive
groups of ``P`` windows (``A`` then ``B``, ``P`` = 1 to 4), proves that the next ``K + 1`` groups all
mirror ``B``, builds the state the first ``K`` of them leave, and replays the last one.  When a check
fails nothing is skipped there, so the result is always that of the plain replay:
``tests/test_alloc_compact.py`` compares every statistic on analytic streams and random periodic
programs, ``benchmarks/check_replay_identity.py`` the engine's reports.  The argument:

*Mirror lemma.*  Let group ``B`` run from state ``S_B`` and group ``C`` (the same events, ids moved)
from ``S_C``.  A segment is *touched* by ``B`` when ``B`` takes a cached block from it, frees a block in
it, or creates it.  Suppose a one-to-one map ``psi`` from the segments that existed at ``S_B`` and that
``B`` touched, to segments of ``S_C``, satisfies

  (S1) ``psi(s)`` at ``S_C`` has the pool, size and block layout (each block's size and requested bytes,
       0 for a cached block) that ``s`` had when ``B`` first touched it;
  (S2) each free in ``C`` of a block made before ``C`` frees the block at the offset of ``psi(s)`` where
       the corresponding free in ``B`` found its block in ``s``;
  (S3) ``psi`` keeps the address order of those segments;
  (S4) no cached block outside ``psi``'s image qualifies where ``B``'s did not: for each request of
       ``r`` bytes ``B`` served with a block of size ``s`` at address ``a``, none has ``r <= size < s``, nor
       ``size == s`` at an address below the mirrored ``a``; for a request that made a segment, none has
       ``size >= r``;
  (S5) no segment ``C`` makes exceeds the capacity (so nothing is released).
Then ``C`` makes ``B``'s decisions.  By induction over the events: every touched segment of ``C`` has
the layout of its counterpart in ``B``; segments made get the same sizes, at the next address, which
lies above every segment in both; a request's mirrored candidates are ordered as ``B``'s by (S1), (S3)
and the new segments lying above, and no other cached block competes by (S4), so it takes the mirrored
block and splits it alike (``should_split`` reads sizes only); a free merges with the mirrored
neighbours (same layouts).  The statistics change by the same amounts.

*Roles.*  Groups are numbered from ``B`` (0); ``C`` is 1.  :meth:`CompactReplay._plan_skip` pairs
``B``'s touched segments with ``A``'s in the order each group first touched them and proposes a role
for each (the pairing only proposes; the checks below decide):
  * *fixed*: the same segment in every group (a pool the group borrows blocks from and returns them
    to); ``psi(s) = s``;
  * a member ``G_-l`` of a *track*: segments ``G_j = G_0 + j * delta`` one per group, made by group ``j``
    (``delta`` = the address advance per group) or pre-existing *cells* group ``j`` consumes first
    (``delta`` = the distance between cells; e.g. the tensor each layer's backward frees, kept by that
    layer's forward); group ``j + l`` touches ``G_j`` again for each ``l`` in the track's *lags* (the
    largest is ``top``), e.g. to free the previous layer's gradient; ``psi(G_-l) = G_1-l``.
*Checks*, once, at ``S_C``, for the range of groups ``1 .. K + 1``:
  (C1) fixed segments have the layout ``B`` found them in; for each track and age ``a`` in ``1 .. top``,
       ``G_1-a`` has the layout ``G_-a`` had when ``B`` came to it (``B``'s snapshot, or its present layout
       if ``B`` did not touch it); cells ``G_1 .. G_K+1`` exist, were made before ``B``, and have the
       layout ``B`` found ``G_0`` in;
  (C2) for each free in ``B`` of an older block (offset ``o`` of ``s``, template stride ``t``) and each
       group ``g`` of the range: the block ``id + g * t`` that exists now is at offset ``o`` of ``g``'s
       counterpart of ``s`` (a fixed segment's only for ``g = 1``, i.e. made by the group before), and
       the lags ``B`` touched that segment at before the free kept it; one that group ``h`` will make needs
       ``t`` = the allocations per group and ``B``'s allocation of the same ordinal placed at offset ``o``
       of the member of the same lag, kept by ``B`` at the later lags;
  (C3) cells' segments over ``G_-top .. G_K+1`` are distinct, none is fixed, and each lies on the same
       side of every fixed segment at both ends of that range; the oldest member a group touches of a
       track of made segments lies above every fixed segment and cell (as all later ones will);
  (C4) the cached blocks that groups of the range do not touch: those cached now outside the fixed
       segments, ``G_1-top .. G_0`` and ``G_1 .. G_K+1``; in group ``g``, a track's member of age ``a`` not a
       lag (with ``G_1-a``'s present layout, at ``G_g+1-a``), its older members (``G_-top``'s present
       layout, at ``G_-top+j``, ``1 <= j <= g``) and the cells not consumed yet (``B``'s fresh layout, at
       ``G_j``, ``g + 2 <= j <= K + 1``): sizes against the ranges of (S4), and for ties addresses, which
       are linear in ``g`` and ``j`` as are the mirrored addresses, at the ends of their ranges;
  (C5) reserved bytes now plus ``K + 1`` times ``B``'s growth fit the capacity.
*Induction.*  If groups ``1 .. X - 1`` mirror ``B``, so does ``X`` (``X <= K + 1``), with ``psi``: fixed to
itself, ``G_-l`` to ``G_X-l``.  (S1): a mirrored group turns a fixed segment's layout into the one ``B``
left, which is the one it found (C1); a member ``G_X-l`` made or consumed in the range went through
``B``'s transforms of lags below ``l`` from ``B``'s starting layout (a new segment, or a fresh cell by
(C1)), so it has ``G_-l``'s layout as ``B`` found it; an older one had at ``S_C`` the layout of the same
age as ``B`` found it (C1) and went through the same transforms.  (S2) by (C2); (S3): new segments lie
above all older ones and so do the older members touched (C3), cells keep their side of fixed segments
(C3) and move together; (S4): the cached
blocks outside the segments ``X`` touches are among those of (C4), untouched segments keeping their
blocks; (S5) by (C5).

*Building the state* (:meth:`CompactReplay._build`).  After ``K`` groups: fixed segments have their
layout, the blocks freed and made again every group carrying the ids of ``K`` groups later; a track's
members ``G_1-top .. G_K`` are rebuilt by applying, group by group, what ``B`` did to the member of the
same age (blocks that were there stay, with their ids; blocks ``B`` allocated get the id of the same
allocation in the applying group).  Statistics move by ``K`` times ``B``'s change; each peak is the
larger of the first and last group's (they move linearly).  Group ``K + 1`` is replayed event by event,
so the moment reserved bytes last peaked, and what was allocated and cached then, come from a replay.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from vramplan.alloc.caching import OomInfo
from vramplan.alloc.rules import (
    K_LARGE_BUFFER,
    K_MIN_LARGE_ALLOC,
    K_ROUND_LARGE,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
)

__all__ = ["CompactReplay", "Repeat", "expand"]

_ADDRESS_BASE = 1 << 40  # as caching.py
_SEGMENT_ALIGN = 2 << 20
_SHIFT = 64              # key = size << 64 | address; addresses stay far below 2**64
_MAX_PERIOD = 4          # windows per group tried for periodicity
_PATIENCE = 20           # windows recorded without a skip before the rest of a run is replayed plainly

# block fields
ADDR, SIZE, REQ, PREV, NEXT, SEG, ID = range(7)
# segment fields: [base, size, small, head block, window it was created in, window that last snapshotted it]
S_BASE, S_SIZE, S_SMALL, S_HEAD, S_CREATED, S_STAMP = range(6)

Block = list[Any]
Seg = list[Any]


@dataclass(frozen=True)
class Repeat:
    """``count`` windows of events; window ``w`` is ``events`` with each free ``w * strides[k]`` ids on
    (``strides[k]`` is 0 for an allocation): ``[x - w * s for x, s in zip(events, strides)]``."""

    events: Sequence[int]
    strides: Sequence[int]
    count: int

    def window(self, w: int) -> list[int]:
        if w == 0:
            return list(self.events)
        return [x - w * s for x, s in zip(self.events, self.strides, strict=True)]


def expand(parts: Iterable[Sequence[int] | Repeat]) -> list[int]:
    """The plain compact stream of a sequence of literal event lists and :class:`Repeat` runs."""
    out: list[int] = []
    for part in parts:
        if isinstance(part, Repeat):
            for w in range(part.count):
                out += part.window(w)
        else:
            out += part
    return out


def _segment_size(rounded: int, small: bool) -> int:
    """``get_allocation_size``."""
    if small:
        return K_SMALL_BUFFER
    if rounded < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-rounded // K_ROUND_LARGE) * K_ROUND_LARGE


def _blocks(seg: Seg) -> list[Block]:
    out = []
    b = seg[S_HEAD]
    while b is not None:
        out.append(b)
        b = b[NEXT]
    return out


class _Rec:
    """What a replayed window (or group of windows) did, for the periodicity checks."""

    __slots__ = ("d_alloc", "d_dev", "d_next", "d_req", "d_res", "d_seg", "first", "fits", "id0", "id1",
                 "irregular", "max_alloc", "max_req", "n_events", "n_frees", "new_segs", "news", "nwin",
                 "placed", "pre_frees", "sig", "snaps", "touched")

    def __init__(self) -> None:
        self.first = 0                 # number of the first window
        self.nwin = 1
        self.id0 = self.id1 = 0        # block ids allocated: [id0, id1)
        self.n_events = 0
        self.touched: list[Seg] = []   # segments that existed at the start, in the order first touched
        self.snaps: dict[int, list[tuple[int, int, int]]] = {}  # id(seg) -> [(size, requested, id)] then
        self.new_segs: list[Seg] = []
        self.fits: list[tuple[bool, int, int, int, Seg]] = []   # (small, rounded, size, address, segment)
        self.news: list[tuple[bool, int]] = []                   # requests that opened a segment
        self.pre_frees: list[tuple[int, int, Seg]] = []          # (event offset, id, segment) of older blocks
        self.placed: list[tuple[Seg, int]] = []                  # (segment, address) of each allocation
        self.n_frees = 0
        self.d_alloc = self.d_req = self.d_res = self.d_seg = self.d_dev = self.d_next = 0
        self.max_alloc = self.max_req = 0                        # highest allocated / requested offsets
        self.irregular = False         # a release, a retry, an unmatched free or an out of memory
        self.sig: tuple[Any, ...] = ()    # the statistics' moves, compared before anything else


def _merge(recs: Sequence[_Rec]) -> _Rec:
    """The record of consecutive windows taken as one."""
    if len(recs) == 1:
        return recs[0]
    m = _Rec()
    m.first, m.nwin, m.id0, m.id1 = recs[0].first, len(recs), recs[0].id0, recs[-1].id1
    seen: set[int] = set()
    off = 0
    for r in recs:
        for s in r.touched:
            if s[S_CREATED] < m.first and id(s) not in seen:
                seen.add(id(s))
                m.touched.append(s)
                m.snaps[id(s)] = r.snaps[id(s)]
        m.new_segs += r.new_segs
        m.placed += r.placed
        m.fits += r.fits
        m.news += r.news
        m.pre_frees += [(off + o, i, s) for o, i, s in r.pre_frees if i < m.id0]
        m.max_alloc = max(m.max_alloc, m.d_alloc + r.max_alloc)
        m.max_req = max(m.max_req, m.d_req + r.max_req)
        m.d_alloc += r.d_alloc
        m.d_req += r.d_req
        m.d_res += r.d_res
        m.d_seg += r.d_seg
        m.d_dev += r.d_dev
        m.d_next += r.d_next
        m.n_frees += r.n_frees
        m.irregular = m.irregular or r.irregular
        off += r.n_events
    m.n_events = off
    return m


class _Track:
    """Segments ``G_j`` translated by ``delta`` per group: made by group ``j`` (``new``) or pre-existing cells
    group ``j`` consumes first; ``g0`` is ``b``'s; group ``j + l`` touches ``G_j`` again for each ``l`` in
    ``lags`` (``top``: the largest, 0 if none)."""

    __slots__ = ("delta", "g0", "lags", "new", "top")

    def __init__(self, g0: Seg, delta: int, new: bool) -> None:
        self.g0, self.delta, self.new = g0, delta, new
        self.lags: set[int] = set()
        self.top = 0


class CompactReplay:
    """The default caching allocator fed a compact stream (``n > 0`` allocates ``n`` bytes as the next
    block id, ``n < 0`` frees block ``-n - 1``); statistics named as in ``CachingAllocator``."""

    def __init__(self, capacity_bytes: int | None = None) -> None:
        if capacity_bytes is not None and capacity_bytes < 0:
            raise ValueError("capacity_bytes must be >= 0")
        self.capacity = capacity_bytes
        self.small_keys: list[int] = []
        self.large_keys: list[int] = []
        self.cached: dict[int, Block] = {}     # key -> cached block, both pools
        self.live: list[Block | None] = []      # block id -> allocated block (None once freed)
        self.segs_by_base: dict[int, Seg] = {}
        self.next_addr = _ADDRESS_BASE
        self.window = 0                         # windows started (numbers segments' creation)
        self.index = 0                          # events replayed (skipped windows included)
        self.unmatched = 0
        self.oom: OomInfo | None = None
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
        self.skipped_windows = 0                # windows built without replaying their events
        self._periods: dict[tuple[int, ...], list[int]] = {}   # per run's events: the period that worked
        self._moved = False
        self._released = False

    # ------------------------------------------------------------------ queries

    def largest_free_block(self) -> int:
        best = 0
        for keys in (self.small_keys, self.large_keys):
            if keys:
                best = max(best, keys[-1] >> _SHIFT)
        return best

    # ------------------------------------------------------------------ the replay loop

    def run(self, stream: Iterable[int]) -> bool:
        """Replay ``stream`` after what was replayed before; False once an allocation ran out of memory
        (``self.oom`` says which; the rest of the stream is not replayed)."""
        if self.oom is not None:
            return False
        live = self.live
        append = live.append
        skeys, lkeys, cached = self.small_keys, self.large_keys, self.cached
        alloc_b, req_b = self.allocated_bytes, self.requested_bytes
        peak_a, peak_q = self.peak_allocated_bytes, self.peak_requested_bytes
        ids0, index0, unmatched, zeros = len(live), self.index, self.unmatched, 0
        index = index0 - 1
        cap = self.capacity
        moved: list[int] = []          # non-empty while the current malloc moved the reserved peak
        for index, n in enumerate(stream, index0):
            if n > 0:
                r = ((n + 511) >> 9) << 9          # round_size: a multiple of kMinBlockSize
                if r <= K_SMALL_SIZE:
                    keys, small = skeys, True
                else:
                    keys, small = lkeys, False
                i = bisect_left(keys, r << _SHIFT)
                if i == len(keys):
                    # no cached block fits: a new segment (alloc_block)
                    size = K_SMALL_BUFFER if small else (
                        K_LARGE_BUFFER if r < K_MIN_LARGE_ALLOC else -(-r // K_ROUND_LARGE) * K_ROUND_LARGE)
                    if cap is not None and self.reserved_bytes + size > cap:
                        # releases, a retry and perhaps out of memory: the general path
                        self.allocated_bytes, self.requested_bytes = alloc_b, req_b
                        self.num_frees += index - index0 - (len(live) - ids0) - (unmatched - self.unmatched) - zeros
                        self.num_allocs += len(live) - ids0
                        self.peak_allocated_bytes, self.peak_requested_bytes = peak_a, peak_q
                        self.unmatched, self.index = unmatched, index
                        ok = self._alloc_new(r, small, n)
                        alloc_b, req_b = self.allocated_bytes, self.requested_bytes
                        peak_a, peak_q = self.peak_allocated_bytes, self.peak_requested_bytes
                        ids0, index0, zeros = len(live), index + 1, 0
                        if not ok:
                            return False
                        continue
                    base = self.next_addr
                    self.next_addr = base + -(-size // _SEGMENT_ALIGN) * _SEGMENT_ALIGN
                    self.segments += 1
                    if self.segments > self.peak_segments:  # noqa: PLR1730
                        self.peak_segments = self.segments
                    self.num_device_alloc += 1
                    self.reserved_bytes += size
                    nseg: Seg = [base, size, small, None, self.window, -1]
                    b: Block = [base, size, 0, None, None, nseg, -1]
                    nseg[S_HEAD] = b
                    self.segs_by_base[base] = nseg
                    if self.reserved_bytes > self.peak_reserved_bytes:
                        # the peak of reserved bytes moves in this malloc: what is allocated and cached
                        # once the block is handed out
                        self.peak_reserved_bytes = self.reserved_bytes
                        moved.append(index)
                else:
                    k = keys[i]
                    del keys[i]
                    b = cached.pop(k)
                rem = b[SIZE] - r
                # should_split: small pool at >= 512 B left, large pool at > 1 MiB left
                if rem >= 512 if small else rem > K_SMALL_SIZE:
                    p = b[PREV]
                    nb = [b[ADDR], r, n, p, b, b[SEG], len(live)]
                    if p is not None:
                        p[NEXT] = nb
                    else:
                        b[SEG][S_HEAD] = nb
                    b[PREV] = nb
                    a2 = b[ADDR] + r
                    b[ADDR] = a2
                    b[SIZE] = rem
                    k = rem << _SHIFT | a2
                    insort(keys, k)
                    cached[k] = b
                    b = nb
                    alloc_b += r
                else:
                    b[REQ] = n
                    b[ID] = len(live)
                    alloc_b += b[SIZE]
                req_b += n
                if alloc_b > peak_a:  # noqa: PLR1730 (a comparison is cheaper than max() here)
                    peak_a = alloc_b
                if req_b > peak_q:  # noqa: PLR1730
                    peak_q = req_b
                append(b)
                if moved:
                    moved.clear()
                    self.allocated_at_peak_reserved_bytes = alloc_b
                    self.largest_free_at_peak_reserved_bytes = max(
                        skeys[-1] if skeys else 0, lkeys[-1] if lkeys else 0) >> _SHIFT
            elif n < 0:
                j = -n - 1
                fb = live[j] if j < len(live) else None
                if fb is None:
                    unmatched += 1
                    continue
                b = fb
                live[j] = None
                alloc_b -= b[SIZE]
                req_b -= b[REQ]
                b[REQ] = 0
                seg = b[SEG]
                keys = skeys if seg[S_SMALL] else lkeys
                p = b[PREV]
                if p is not None and not p[REQ]:
                    k = p[SIZE] << _SHIFT | p[ADDR]
                    del keys[bisect_left(keys, k)]
                    del cached[k]
                    b[ADDR] = p[ADDR]
                    b[SIZE] += p[SIZE]
                    pp = b[PREV] = p[PREV]
                    if pp is not None:
                        pp[NEXT] = b
                    else:
                        seg[S_HEAD] = b
                nx = b[NEXT]
                if nx is not None and not nx[REQ]:
                    k = nx[SIZE] << _SHIFT | nx[ADDR]
                    del keys[bisect_left(keys, k)]
                    del cached[k]
                    b[SIZE] += nx[SIZE]
                    nn = b[NEXT] = nx[NEXT]
                    if nn is not None:
                        nn[PREV] = b
                k = b[SIZE] << _SHIFT | b[ADDR]
                insort(keys, k)
                cached[k] = b
            else:
                zeros += 1
        index += 1
        self.allocated_bytes, self.requested_bytes = alloc_b, req_b
        self.peak_allocated_bytes, self.peak_requested_bytes = peak_a, peak_q
        self.num_allocs += len(live) - ids0
        self.num_frees += index - index0 - (len(live) - ids0) - (unmatched - self.unmatched) - zeros
        self.unmatched, self.index = unmatched, index
        return True

    def _alloc_new(self, r: int, small: bool, n: int) -> bool:
        """``malloc`` when no cached block fits: a new segment (with releases and a retry under a
        capacity), then ``alloc_found_block`` on it; False (``self.oom`` set) when even the retry fails."""
        b = self._new_segment_block(r, small, n, self.index)
        if b is None:
            return False
        live = self.live
        rem = b[SIZE] - r
        if rem >= 512 if small else rem > K_SMALL_SIZE:
            nb = [b[ADDR], r, n, None, b, b[SEG], len(live)]
            b[SEG][S_HEAD] = nb
            b[PREV] = nb
            b[ADDR] += r
            b[SIZE] = rem
            self._cache(b)
            b = nb
            self.allocated_bytes += r
        else:
            b[REQ] = n
            b[ID] = len(live)
            self.allocated_bytes += b[SIZE]
        self.requested_bytes += n
        self.num_allocs += 1
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, self.allocated_bytes)
        self.peak_requested_bytes = max(self.peak_requested_bytes, self.requested_bytes)
        live.append(b)
        self.index += 1
        if self._moved:
            # the peak of reserved bytes moved inside this malloc: what was allocated and cached then
            self.allocated_at_peak_reserved_bytes = self.allocated_bytes
            self.largest_free_at_peak_reserved_bytes = self.largest_free_block()
        return True

    # ------------------------------------------------------------------ slow paths

    def _new_segment_block(self, rounded: int, small: bool, nbytes: int, index: int) -> Block | None:
        """``alloc_block`` for a request no cached block fits, with ``release_cached_blocks`` and one
        retry under a capacity; None (and ``self.oom`` set) when even the retry fails."""
        size = _segment_size(rounded, small)
        cap = self.capacity
        if cap is not None and self.reserved_bytes + size > cap:
            before = self.reserved_bytes
            released = self._release_cached_blocks()
            self.num_alloc_retries += 1
            self._released = True
            if self.reserved_bytes + size > cap:
                self.oom = OomInfo(
                    event_index=index, block_id=len(self.live), requested_bytes=nbytes, rounded_bytes=rounded,
                    device_request_bytes=size, capacity_bytes=cap, allocated_bytes=self.allocated_bytes,
                    reserved_bytes=self.reserved_bytes, reserved_before_retry_bytes=before,
                    cached_released_bytes=released, largest_free_block_bytes=self.largest_free_block())
                return None
        base = self.next_addr
        self.next_addr = base + -(-size // _SEGMENT_ALIGN) * _SEGMENT_ALIGN
        self.segments += 1
        self.peak_segments = max(self.peak_segments, self.segments)
        self.num_device_alloc += 1
        self.reserved_bytes += size
        if self.reserved_bytes > self.peak_reserved_bytes:
            self.peak_reserved_bytes = self.reserved_bytes
            self._moved = True
        else:
            self._moved = False
        seg: Seg = [base, size, small, None, self.window, -1]
        b = [base, size, 0, None, None, seg, -1]
        seg[S_HEAD] = b
        self.segs_by_base[base] = seg
        return b

    def _release_cached_blocks(self) -> int:
        """``release_cached_blocks``: give back every cached block that is a whole segment (large pool first)."""
        released = 0
        cached = self.cached
        for keys in (self.large_keys, self.small_keys):
            keep: list[int] = []
            for k in keys:
                b = cached[k]
                if b[PREV] is None and b[NEXT] is None:
                    released += b[SIZE]
                    self.num_device_free += 1
                    self.segments -= 1
                    del cached[k]
                    del self.segs_by_base[b[SEG][S_BASE]]
                else:
                    keep.append(k)
            keys[:] = keep
        self.reserved_bytes -= released
        return released

    # ------------------------------------------------------------------ structured streams

    def run_parts(self, parts: Iterable[Sequence[int] | Repeat]) -> bool:
        """Replay literal event lists and :class:`Repeat` runs in order (the same result as replaying
        ``expand(parts)``), building the state of mirrored windows instead of replaying them."""
        for part in parts:
            if isinstance(part, Repeat):
                if not self._run_repeat(part):
                    return False
            elif not self.run(part):
                return False
        return True

    def _run_repeat(self, rep: Repeat) -> bool:
        """Replay a run of windows, recording them and, after each, looking for two consecutive groups of
        1 to ``_MAX_PERIOD`` windows that prove the following groups mirror them.  Recording costs time, so
        the rest of a run is replayed plainly once ``_PATIENCE`` windows went by without a skip, or ten
        without two groups that moved the statistics alike, or after a skip that stopped before the
        end of the run (cells or capacity ran out); a run with the events of an earlier one (the second
        training step's) tries the period that worked then first, and records nothing if none did.
        These choices only decide what is tried: every skip is proven by :meth:`_plan_skip`."""
        shape = tuple(max(0, x) for x in rep.events)
        known = self._periods.get(shape)
        periods = list(range(1, _MAX_PERIOD + 1))
        if known:
            periods.remove(known[0])
            periods.insert(0, known[0])
        elif known is not None:
            periods = []
        recs: list[_Rec] = []
        w = 0
        since = 0 if periods else _PATIENCE     # windows recorded since the last skip (or the start)
        unlike = 0                              # windows recorded since two groups last looked alike
        n_alloc = sum(1 for x in rep.events if x > 0)
        found: list[int] = []
        while w < rep.count:
            if since >= _PATIENCE or unlike > 2 * _MAX_PERIOD + 1 or rep.count - w < 3:
                if not self.run(rep.window(w)):
                    return False
                w += 1
                continue
            rec = self._run_window(rep.window(w))
            if rec is None:
                return False
            w += 1
            since += 1
            unlike += 1
            recs.append(rec)
            del recs[:-2 * _MAX_PERIOD]
            for period in periods:
                left = (rep.count - w) // period   # whole groups still to come
                if left < 3 or len(recs) < 2 * period:
                    continue
                if any(recs[i - period].sig != recs[i].sig for i in range(-period, 0)):
                    continue   # the two groups moved the statistics differently: no mirror
                unlike = 0
                a = _merge(recs[-2 * period:-period])
                b = _merge(recs[-period:])
                k = self._skip(a, b, rep, period, n_alloc * period, left - 1)
                if k:
                    w += k * period
                    recs.clear()
                    found.append(period)
                    # stopped before the end (cells or the capacity ran out): what follows is not the same
                    since = 0 if k == left - 1 else _PATIENCE
                    unlike = 0
                    break
        self._periods[shape] = found[:1]
        return True

    def _run_window(self, events: list[int]) -> _Rec | None:
        """Replay one window's events as :meth:`run` does, recording what they touched: the segments that
        existed before (with their layout when first touched), the segments made, which cached block each
        request took, the frees of older blocks, and how the statistics moved."""
        self.window += 1
        w = self.window
        rec = _Rec()
        live = self.live
        id0 = len(live)
        rec.first, rec.id0, rec.n_events = w, id0, len(events)
        res0, seg0, dev0, next0 = self.reserved_bytes, self.segments, self.num_device_alloc, self.next_addr
        frees0, unmatched0 = self.num_frees, self.unmatched
        self._released = False
        touched, snaps, fits, pre_frees, placed = rec.touched, rec.snaps, rec.fits, rec.pre_frees, rec.placed
        skeys, lkeys, cached = self.small_keys, self.large_keys, self.cached
        alloc_b, req_b = self.allocated_bytes, self.requested_bytes
        alloc0, req0 = alloc_b, req_b
        top_a, top_q = alloc_b, req_b
        peak_a, peak_q = self.peak_allocated_bytes, self.peak_requested_bytes
        n_alloc, n_free = self.num_allocs, self.num_frees
        index = self.index
        for off, n in enumerate(events):
            if n > 0:
                r = ((n + 511) >> 9) << 9
                if r <= K_SMALL_SIZE:
                    keys, small = skeys, True
                else:
                    keys, small = lkeys, False
                i = bisect_left(keys, r << _SHIFT)
                if i == len(keys):
                    self.allocated_bytes, self.requested_bytes = alloc_b, req_b
                    self.num_allocs, self.num_frees, self.index = n_alloc, n_free, index
                    b = self._new_segment_block(r, small, n, index)
                    if b is None:
                        self.peak_allocated_bytes, self.peak_requested_bytes = peak_a, peak_q
                        return None
                    seg = b[SEG]
                    seg[S_STAMP] = w
                    rec.new_segs.append(seg)
                    rec.news.append((small, r))
                    moved = self._moved
                else:
                    k = keys[i]
                    b = cached[k]
                    seg = b[SEG]
                    if seg[S_STAMP] != w:
                        seg[S_STAMP] = w
                        touched.append(seg)
                        snap = []
                        x = seg[S_HEAD]
                        while x is not None:
                            snap.append((x[SIZE], x[REQ], x[ID]))
                            x = x[NEXT]
                        snaps[id(seg)] = snap
                    fits.append((small, r, b[SIZE], b[ADDR], seg))
                    del keys[i]
                    del cached[k]
                    moved = False
                rem = b[SIZE] - r
                if rem >= 512 if small else rem > K_SMALL_SIZE:
                    p = b[PREV]
                    nb = [b[ADDR], r, n, p, b, b[SEG], len(live)]
                    if p is not None:
                        p[NEXT] = nb
                    else:
                        b[SEG][S_HEAD] = nb
                    b[PREV] = nb
                    a2 = b[ADDR] + r
                    b[ADDR] = a2
                    b[SIZE] = rem
                    k = rem << _SHIFT | a2
                    insort(keys, k)
                    cached[k] = b
                    b = nb
                    alloc_b += r
                else:
                    b[REQ] = n
                    b[ID] = len(live)
                    alloc_b += b[SIZE]
                req_b += n
                n_alloc += 1
                if alloc_b > top_a:
                    top_a = alloc_b
                    if alloc_b > peak_a:  # noqa: PLR1730
                        peak_a = alloc_b
                if req_b > top_q:
                    top_q = req_b
                    if req_b > peak_q:  # noqa: PLR1730
                        peak_q = req_b
                live.append(b)
                placed.append((b[SEG], b[ADDR]))
                if moved:
                    self.allocated_at_peak_reserved_bytes = alloc_b
                    self.largest_free_at_peak_reserved_bytes = self.largest_free_block()
            elif n < 0:
                j = -n - 1
                b = live[j] if j < len(live) else None
                if b is None:
                    self.unmatched += 1
                    index += 1
                    continue
                seg = b[SEG]
                if seg[S_STAMP] != w:
                    seg[S_STAMP] = w
                    touched.append(seg)
                    snap = []
                    x = seg[S_HEAD]
                    while x is not None:
                        snap.append((x[SIZE], x[REQ], x[ID]))
                        x = x[NEXT]
                    snaps[id(seg)] = snap
                if j < id0:
                    pre_frees.append((off, j, seg))
                live[j] = None
                alloc_b -= b[SIZE]
                req_b -= b[REQ]
                b[REQ] = 0
                n_free += 1
                keys = skeys if seg[S_SMALL] else lkeys
                p = b[PREV]
                if p is not None and not p[REQ]:
                    k = p[SIZE] << _SHIFT | p[ADDR]
                    del keys[bisect_left(keys, k)]
                    del cached[k]
                    b[ADDR] = p[ADDR]
                    b[SIZE] += p[SIZE]
                    pp = b[PREV] = p[PREV]
                    if pp is not None:
                        pp[NEXT] = b
                    else:
                        seg[S_HEAD] = b
                nx = b[NEXT]
                if nx is not None and not nx[REQ]:
                    k = nx[SIZE] << _SHIFT | nx[ADDR]
                    del keys[bisect_left(keys, k)]
                    del cached[k]
                    b[SIZE] += nx[SIZE]
                    nn = b[NEXT] = nx[NEXT]
                    if nn is not None:
                        nn[PREV] = b
                k = b[SIZE] << _SHIFT | b[ADDR]
                insort(keys, k)
                cached[k] = b
            index += 1
        self.allocated_bytes, self.requested_bytes = alloc_b, req_b
        self.peak_allocated_bytes, self.peak_requested_bytes = peak_a, peak_q
        self.num_allocs, self.num_frees, self.index = n_alloc, n_free, index
        rec.id1 = len(live)
        rec.max_alloc, rec.max_req = top_a - alloc0, top_q - req0
        rec.d_alloc, rec.d_req = alloc_b - alloc0, req_b - req0
        rec.d_res, rec.d_seg = self.reserved_bytes - res0, self.segments - seg0
        rec.d_dev, rec.d_next = self.num_device_alloc - dev0, self.next_addr - next0
        rec.n_frees = n_free - frees0
        rec.irregular = self._released or self.unmatched != unmatched0
        rec.sig = (rec.d_alloc, rec.d_req, rec.d_res, rec.d_seg, rec.d_next, rec.n_frees, rec.max_alloc, rec.max_req,
                   len(pre_frees), rec.irregular, tuple(rec.news), tuple(f[2] for f in fits),
                   tuple(s[S_SIZE] for s in touched))
        return rec

    def _cache(self, b: Block) -> None:
        k = b[SIZE] << _SHIFT | b[ADDR]
        insort(self.small_keys if b[SEG][S_SMALL] else self.large_keys, k)
        self.cached[k] = b

    def _uncache(self, b: Block) -> None:
        k = b[SIZE] << _SHIFT | b[ADDR]
        keys = self.small_keys if b[SEG][S_SMALL] else self.large_keys
        del keys[bisect_left(keys, k)]
        del self.cached[k]

    # ------------------------------------------------------------------ skipping mirrored windows

    def _skip(self, a: _Rec, b: _Rec, rep: Repeat, period: int, n_alloc: int, most: int) -> int:
        """Build the state after ``K`` (<= ``most``) groups that mirror ``b``, when the checks in the module
        docstring prove they do; the group after them is left to be replayed.  Returns ``K`` (0: none)."""
        plan = self._plan_skip(a, b, rep, period, n_alloc, most)
        if plan is None:
            return 0
        k, fixed, tracks, recurring = plan
        self._build(b, k, fixed, tracks, recurring, n_alloc)
        return k

    def _member(self, t: _Track, j: int) -> Seg | None:
        """Segment ``G_j`` of track ``t`` (``G_0``: the one ``b`` made or consumed)."""
        return self.segs_by_base.get(t.g0[S_BASE] + j * t.delta)

    def _plan_skip(self, a: _Rec, b: _Rec, rep: Repeat, period: int, n_alloc: int,
                   most: int) -> tuple[int, list[Seg], list[_Track], list[int]] | None:
        # ---- the two groups did the same things (cheap tests first)
        if a.irregular or b.irregular or b.id1 - b.id0 != n_alloc or a.id1 - a.id0 != n_alloc:
            return None
        if (len(a.touched) != len(b.touched) or len(a.fits) != len(b.fits) or a.news != b.news
                or len(a.new_segs) != len(b.new_segs) or len(a.pre_frees) != len(b.pre_frees)):
            return None
        for fa, fb in zip(a.fits, b.fits, strict=True):
            if fa[0] != fb[0] or fa[1] != fb[1] or fa[2] != fb[2]:
                return None
        d_new = b.d_next
        for sa, sb in zip(a.new_segs, b.new_segs, strict=True):
            if sa[S_SIZE] != sb[S_SIZE] or sa[S_SMALL] != sb[S_SMALL] or sb[S_BASE] - sa[S_BASE] != d_new:
                return None
        # ---- roles of the segments b touched (paired with a's in first-touch order): fixed, or a member
        # G_-l of a track of new segments (l groups old) or of cells (G_0: the cell b consumed fresh)
        a_ids = {id(s) for s in a.touched}
        tracks = [_Track(s, d_new, True) for s in b.new_segs]
        new_at = {s[S_BASE]: t for s, t in zip(b.new_segs, tracks, strict=True)}
        fixed: list[Seg] = []
        role: dict[int, tuple[_Track | None, int]] = {}   # id(seg) -> (track, lag); (None, 0): fixed
        lagged_cells: list[Seg] = []
        d_cell = 0
        for sa, sb in zip(a.touched, b.touched, strict=True):
            if sa[S_SIZE] != sb[S_SIZE] or sa[S_SMALL] != sb[S_SMALL]:
                return None
            if sb is sa:
                fixed.append(sb)
                role[id(sb)] = (None, 0)
                continue
            d = sb[S_BASE] - sa[S_BASE]
            if d == d_new and d_new > 0:
                for g0_base, t in new_at.items():
                    lag, rest = divmod(g0_base - sb[S_BASE], d_new)
                    if rest == 0 and lag >= 1 and b.first - lag * period <= sb[S_CREATED] < b.first - (lag - 1) * period:
                        t.lags.add(lag)
                        role[id(sb)] = (t, lag)
                        break
                else:
                    return None
                continue
            if d == 0 or (d_cell and d != d_cell):
                return None
            d_cell = d
            if id(sb) in a_ids:
                lagged_cells.append(sb)
            else:
                t = _Track(sb, d_cell, False)
                tracks.append(t)
                role[id(sb)] = (t, 0)
        cell_at = {t.g0[S_BASE]: t for t in tracks if not t.new}
        for sb in lagged_cells:
            for g0_base, t in cell_at.items():
                lag, rest = divmod(g0_base - sb[S_BASE], d_cell)
                if rest == 0 and lag >= 1:
                    t.lags.add(lag)
                    role[id(sb)] = (t, lag)
                    break
            else:
                return None
        # ---- (S1) the layouts the next group finds: fixed segments as b found them; each track's members
        # one group younger than b's (G_1-a at the start of the next group has age a, as G_-a had for b)
        def layout(seg: Seg) -> list[tuple[int, int]]:
            return [(x[SIZE], x[REQ]) for x in _blocks(seg)]

        def snap_layout(seg: Seg) -> list[tuple[int, int]]:
            return [(sz, q) for sz, q, _ in b.snaps[id(seg)]]

        for s in fixed:
            if layout(s) != snap_layout(s):
                return None
        for t in tracks:
            t.top = max(t.lags, default=0)
            for age in range(1, t.top + 1):
                older, younger = self._member(t, -age), self._member(t, 1 - age)
                if (older is None or younger is None or older[S_SIZE] != younger[S_SIZE]
                        or older[S_SMALL] != younger[S_SMALL]):
                    return None
                if id(older) in role and role[id(older)][0] is not t:
                    return None
                want = snap_layout(older) if age in t.lags else layout(older)
                if layout(younger) != want:
                    return None
        # ---- how many groups: capacity (S5), cells that exist untouched as translates of b's (S1)
        k = most
        if self.capacity is not None and b.d_res > 0:
            k = min(k, (self.capacity - self.reserved_bytes) // b.d_res - 1)
        cells = [t for t in tracks if not t.new]
        for j in range(1, k + 2):
            if not cells:
                break
            if not all(self._fresh_cell_ok(t, j, b) for t in cells):
                k = j - 2
                break
        if k < 1:
            return None
        # ---- (S2) each free of an older block frees, in every group of the range, the block at the same
        # offset of the counterpart: blocks that exist now are checked where they are; blocks to be made in
        # the range must be made there, which holds when b made its own at that offset
        win_len = len(rep.events)
        recurring: list[int] = []        # blocks of fixed segments freed and made again in every group
        for off_ev, x, seg in b.pre_frees:
            stride = period * rep.strides[off_ev % win_len]
            if id(seg) not in role:
                return None
            owner, lag = role[id(seg)]
            offset, size, req = self._snap_block(b, seg, x)
            for g in range(1, 1 << 30):
                y = x + g * stride
                if owner is not None and g > k + 1:
                    break
                if y < 0:
                    if owner is None or g < 2:
                        return None
                    k = g - 2                       # no such block: the range ends before this group
                    break
                if y >= b.id1:
                    # made in the range, by group h at ordinal o, into G_(h - (g - lag)) at lag m: b made that
                    # ordinal there, and what b did at the lags between m and this free kept it
                    if stride != n_alloc:
                        return None
                    o = (y - b.id0) % n_alloc
                    m = (y - b.id0) // n_alloc - g + lag
                    seg_p, addr_p = b.placed[o]
                    want_seg = seg if owner is None else self._member(owner, -m)
                    if want_seg is None or seg_p is not want_seg or addr_p - seg_p[S_BASE] != offset:
                        return None
                    if owner is not None and not self._kept(b, owner, offset, m + 1, lag):
                        return None
                    break
                if owner is None and g >= 2:
                    return None                 # a fixed segment's block made two groups before its free
                blk = self.live[y]
                want_seg = seg if owner is None else self._member(owner, g - lag)
                if (blk is None or blk[SEG] is not want_seg or blk[ADDR] - blk[SEG][S_BASE] != offset
                        or blk[SIZE] != size or blk[REQ] != req
                        or (owner is not None and not self._kept(b, owner, offset, lag - g + 1, lag))):
                    if owner is None or g < 2:
                        return None
                    k = g - 2                   # the range ends before this group
                    break
                if owner is None:
                    if stride != n_alloc:
                        return None
                    recurring.append(y)
        if k < 1:
            return None
        # ---- (S3) cells keep their side of every fixed segment (addresses move linearly: ends suffice)
        if cells:
            every = [t.g0[S_BASE] + j * d_cell for t in cells for j in range(-t.top, k + 2)]
            fixed_bases = {s[S_BASE] for s in fixed}
            if len(set(every)) != len(every) or fixed_bases.intersection(every):
                return None
            for f in fixed:
                for t in cells:
                    lo = t.g0[S_BASE] - t.top * d_cell - f[S_BASE]
                    hi = t.g0[S_BASE] + (k + 1) * d_cell - f[S_BASE]
                    if (lo > 0) != (hi > 0):
                        return None
        # made segments lie above all others; those made before b (lag >= 1) must already lie above
        # every fixed segment and cell of the range, as the ones made later will
        older = [s[S_BASE] for s in fixed] + [t.g0[S_BASE] + j * d_cell for t in cells for j in (-t.top, k + 1)]
        if older:
            top_older = max(older)
            for t in tracks:
                if t.new and t.top and t.g0[S_BASE] - t.top * t.delta < top_older:
                    return None
        # ---- (S4) no other cached block wins best fit, in any of the k + 1 groups
        if not self._cached_ok(b, k, fixed, tracks, role):
            return None
        return k, fixed, tracks, recurring

    def _kept(self, b: _Rec, t: _Track, offset: int, lo: int, hi: int) -> bool:
        """What ``b`` did at each lag ``m`` of ``t`` in ``[lo, hi)`` left the allocated block at ``offset`` of
        ``G_-m`` in place (the same block before and after)."""
        for m in t.lags:
            if not lo <= m < hi:
                continue
            seg = self._member(t, -m)
            assert seg is not None
            before = -1
            off = 0
            for size, q, bid in b.snaps[id(seg)]:
                if off == offset:
                    before = bid if q else -1
                    break
                off += size
            after = next((x[ID] for x in _blocks(seg) if x[ADDR] - seg[S_BASE] == offset and x[REQ]), -2)
            if before < 0 or before != after:
                return False
        return True

    @staticmethod
    def _snap_block(rec: _Rec, seg: Seg, block_id: int) -> tuple[int, int, int]:
        """(offset, size, requested) of allocated block ``block_id`` in ``rec``'s snapshot of ``seg``."""
        off = 0
        for size, q, bid in rec.snaps[id(seg)]:
            if q and bid == block_id:
                return off, size, q
            off += size
        raise AssertionError("a freed block is in its segment's snapshot")

    def _fresh_cell_ok(self, t: _Track, j: int, b: _Rec) -> bool:
        """Cell ``G_j`` exists, made before ``b``, with the layout ``b`` found ``G_0`` in."""
        seg = self._member(t, j)
        if (seg is None or seg[S_SMALL] != t.g0[S_SMALL] or seg[S_SIZE] != t.g0[S_SIZE]
                or seg[S_CREATED] >= b.first):
            return False
        snap = b.snaps[id(t.g0)]
        x = seg[S_HEAD]
        for size, q, _ in snap:
            if x is None or x[SIZE] != size or x[REQ] != q:
                return False
            x = x[NEXT]
        return x is None

    def _cached_ok(self, b: _Rec, k: int, fixed: list[Seg], tracks: list[_Track],
                   role: dict[int, tuple[_Track | None, int]]) -> bool:
        """(S4) for the groups ``g = 0..k`` after ``b`` (0: the next one): no cached block outside the segments
        the group touches wins best fit over the mirrored block, nor fits a request that opens a segment."""
        # forbidden sizes per pool: [r, s) for a request served by a block of size s, [r, inf) for one that
        # opened a segment; a tie at s loses only above the mirrored address c0 + dc * g
        spans: dict[bool, list[tuple[int, int]]] = {True: [], False: []}
        tie_at: dict[tuple[bool, int], dict[int | None, int]] = {}   # (pool, s) -> {slope: highest c0}
        b_new = {id(s) for s in b.new_segs}
        for small, r, size, addr, seg in b.fits:
            spans[small].append((r, size))
            if id(seg) in b_new:
                dc: int | None = None            # made in this group: above every older segment
                c0 = 0
            else:
                t, _ = role[id(seg)]
                dc = 0 if t is None else t.delta
                c0 = addr + dc
            slot = tie_at.setdefault((small, size), {})
            slot[dc] = max(slot.get(dc, c0), c0)
        for small, r in b.news:
            spans[small].append((r, 1 << 62))
        merged: dict[bool, list[tuple[int, int]]] = {True: [], False: []}
        for small in (True, False):
            out = merged[small]
            for lo, hi in sorted(spans[small]):
                if out and lo <= out[-1][1]:
                    out[-1] = (out[-1][0], max(hi, out[-1][1]))
                elif lo < hi:
                    out.append((lo, hi))
        starts = {small: [lo for lo, _ in merged[small]] for small in (True, False)}

        def size_bad(small: bool, size: int) -> bool:
            i = bisect_left(starts[small], size + 1) - 1
            return i >= 0 and size < merged[small][i][1]

        def tie_bad(small: bool, size: int, a0: int, da: int, lo: tuple[int, int], hi: tuple[int, int]) -> bool:
            """A cached block of ``size`` at ``a0 + da * j`` for ``j`` in ``[lo0 + lo1 * g, hi0 + hi1 * g]`` in
            group ``g = 0..k`` loses every tie it is in.  Everything is linear in ``g`` (and ``j``), so the ends
            of the range of ``g`` where such a ``j`` exists are enough."""
            found = tie_at.get((small, size))
            if not found:
                return False
            d, rhs = lo[1] - hi[1], hi[0] - lo[0]      # j exists iff d * g <= rhs
            g_min, g_max = 0, k
            if d > 0:
                g_max = min(g_max, rhs // d)
            elif d < 0:
                g_min = max(g_min, -(rhs // -d))
            elif rhs < 0:
                return False
            if g_min > g_max:
                return False
            for dc, c0 in found.items():
                if dc is None:
                    return True
                for g in (g_min, g_max):
                    c = c0 + dc * g
                    if a0 + da * (lo[0] + lo[1] * g) < c or a0 + da * (hi[0] + hi[1] * g) < c:
                        return True
            return False

        # blocks cached now, outside the segments the groups touch
        excluded = {id(s) for s in fixed}
        for t in tracks:
            # members touched again in the range (G_1-top .. G_0) and the cells it consumes (G_1 .. G_k+1)
            for j in range(1 - t.top, k + 2 if not t.new else 1):
                member = self._member(t, j)
                if member is not None:
                    excluded.add(id(member))
        for small in (True, False):
            keys = self.small_keys if small else self.large_keys
            for lo, hi in merged[small]:
                i = bisect_left(keys, lo << _SHIFT)
                end = bisect_left(keys, hi << _SHIFT) if hi < (1 << 62) else len(keys)
                for key in keys[i:end]:
                    if id(self.cached[key][SEG]) not in excluded:
                        return False
            for sm, s in tie_at:
                if sm != small:
                    continue
                i = bisect_left(keys, s << _SHIFT)
                end = bisect_left(keys, (s + 1) << _SHIFT)
                for key in keys[i:end]:
                    blk = self.cached[key]
                    if id(blk[SEG]) not in excluded and tie_bad(small, s, blk[ADDR], 0, (0, 0), (0, 0)):
                        return False
        # the track segments' cached blocks in the groups that do not touch them: age a (1 <= a <= top,
        # not a lag) has the layout of G_1-a now and is G_g+1-a in group g; older ones (done) have G_-top's
        # and are G_-top+j, j in [1, g]; cells not consumed yet (fresh) are G_j, j in [g + 2, k + 1]
        for t in tracks:
            small = t.g0[S_SMALL]
            kinds: list[tuple[Seg, tuple[int, int], tuple[int, int]]] = []
            for age in range(1, t.top + 1):
                if age not in t.lags:
                    src = self._member(t, 1 - age)
                    assert src is not None
                    kinds.append((src, (0, 1), (0, 1)))
            done = self._member(t, -t.top)
            assert done is not None
            kinds.append((done, (1, 0), (0, 1)))
            for src, j_lo, j_hi in kinds:
                for x in _blocks(src):
                    if x[REQ]:
                        continue
                    if k >= 1 and size_bad(small, x[SIZE]):
                        return False
                    if tie_bad(small, x[SIZE], x[ADDR], t.delta, j_lo, j_hi):
                        return False
            if not t.new:
                addr = t.g0[S_BASE]
                for size, req, _ in b.snaps[id(t.g0)]:
                    if not req:
                        if k >= 1 and size_bad(small, size):
                            return False
                        if tie_bad(small, size, addr, t.delta, (2, 1), (k + 1, 0)):
                            return False
                    addr += size
        return True

    def _build(self, b: _Rec, k: int, fixed: list[Seg], tracks: list[_Track], recurring: list[int],
               n_alloc: int) -> None:
        """The state after ``k`` groups that mirror ``b`` (see the module docstring).

        Groups are numbered from ``b`` (0).  Fixed segments keep their layout; their blocks that are freed
        and made again every group now carry the ids of ``k`` groups later.  A track's segments
        ``G_1-top .. G_k`` are rebuilt by applying, group by group, what ``b`` did to the segment of the
        same age (``T_m``: from ``b``'s snapshot of ``G_-m`` to ``G_-m`` now; ``T_0``: making ``G_0``,
        or consuming the fresh cell): blocks that were there before stay (same offset, same id), blocks
        ``b`` allocated get the id of the same allocation in the applying group, cached blocks are new.
        """
        live = self.live
        live.extend([None] * (k * n_alloc))
        shift = k * n_alloc
        for y in recurring:
            x = live[y]
            assert x is not None
            live[y] = None
            x[ID] = y + shift
            live[y + shift] = x
        for t in tracks:
            # b's transforms, as (input ids by offset, output [(offset, size, requested, id)])
            trans: dict[int, tuple[dict[int, int], list[tuple[int, int, int, int]]]] = {}
            for m in [0, *sorted(t.lags)]:
                seg = self._member(t, -m)
                assert seg is not None
                if m == 0 and t.new:
                    before: dict[int, int] = {}
                else:
                    before = {}
                    off = 0
                    for size, q, bid in b.snaps[id(seg)]:
                        if q:
                            before[off] = bid
                        off += size
                base = seg[S_BASE]
                trans[m] = (before, [(x[ADDR] - base, x[SIZE], x[REQ], x[ID] if x[REQ] else -1) for x in _blocks(seg)])
            # current layouts (before any rebuild) of the members that exist
            start: dict[int, list[tuple[int, int, int, int, Block | None]]] = {}
            for j in range(1 - t.top, k + 1):
                if j >= 1 and t.new:
                    continue
                seg = self._member(t, j)
                assert seg is not None
                base = seg[S_BASE]
                start[j] = [(x[ADDR] - base, x[SIZE], x[REQ], x[ID] if x[REQ] else -1, x) for x in _blocks(seg)]
            done: list[tuple[int, int, int, int, Block | None]] | None = None
            for j in range(1 - t.top, k + 1):
                own = start.get(j, [])
                if j >= 1 and j + t.top <= k and done is not None:
                    # every lag applied, as to G_1: G_1's layout, its allocations j - 1 groups later and the
                    # member's own blocks from before (a cell's) where G_1 kept its own
                    have = {e[0]: e for e in own if e[2]}
                    shift = (j - 1) * n_alloc
                    cur = [have[e[0]] if e[4] is not None else (e if not e[2] else (e[0], e[1], e[2], e[3] + shift, None))
                           for e in done]
                else:
                    cur = self._apply(trans, own, j, k, n_alloc)
                    if j == 1:
                        done = cur
                self._lay_out(t, j, cur, b.nwin)
        self._stats(b, k)

    @staticmethod
    def _apply(trans: dict[int, tuple[dict[int, int], list[tuple[int, int, int, int]]]],
               cur: list[tuple[int, int, int, int, Block | None]], j: int, k: int,
               n_alloc: int) -> list[tuple[int, int, int, int, Block | None]]:
        """Member ``G_j``'s layout after groups ``max(1, j) .. k`` each did what ``b`` did at their lag."""
        for g in range(max(1, j), k + 1):
            m = g - j
            if m not in trans:
                continue
            before, after = trans[m]
            have = {e[0]: e for e in cur if e[2]}
            nxt: list[tuple[int, int, int, int, Block | None]] = []
            for off, size, q, bid in after:
                if q and before.get(off) == bid:
                    kept = have[off]
                    assert kept[1] == size and kept[2] == q
                    nxt.append(kept)
                elif q:
                    nxt.append((off, size, q, bid + g * n_alloc, None))
                else:
                    nxt.append((off, size, 0, -1, None))
            cur = nxt
        return cur

    def _lay_out(self, t: _Track, j: int, lay: list[tuple[int, int, int, int, Block | None]], nwin: int) -> None:
        """Give track ``t``'s segment ``G_j`` the layout ``lay`` (offset, size, requested, id, block to keep)."""
        live = self.live
        base = t.g0[S_BASE] + j * t.delta
        seg = self.segs_by_base.get(base)
        if seg is None:
            assert t.new
            seg = [base, t.g0[S_SIZE], t.g0[S_SMALL], None, t.g0[S_CREATED] + j * nwin, -1]
            self.segs_by_base[base] = seg
        else:
            for x in _blocks(seg):
                if x[REQ]:
                    if live[x[ID]] is x:
                        live[x[ID]] = None
                else:
                    self._uncache(x)
        blocks: list[Block] = []
        for off, size, q, bid, keep in lay:
            if keep is not None:
                x = keep
                x[ADDR] = base + off
            else:
                x = [base + off, size, q, None, None, seg, bid]
            blocks.append(x)
        prev: Block | None = None
        for x in blocks:
            x[PREV] = prev
            x[NEXT] = None
            if prev is not None:
                prev[NEXT] = x
            prev = x
        seg[S_HEAD] = blocks[0]
        for x in blocks:
            if x[REQ]:
                live[x[ID]] = x
            else:
                self._cache(x)

    def _stats(self, b: _Rec, k: int) -> None:
        a0, q0 = self.allocated_bytes, self.requested_bytes
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, a0 + b.max_alloc,
                                        a0 + (k - 1) * b.d_alloc + b.max_alloc)
        self.peak_requested_bytes = max(self.peak_requested_bytes, q0 + b.max_req,
                                        q0 + (k - 1) * b.d_req + b.max_req)
        self.allocated_bytes += k * b.d_alloc
        self.requested_bytes += k * b.d_req
        self.reserved_bytes += k * b.d_res
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)
        self.segments += k * b.d_seg
        self.peak_segments = max(self.peak_segments, self.segments)
        self.num_device_alloc += k * b.d_dev
        self.next_addr += k * b.d_next
        self.num_allocs += k * (b.id1 - b.id0)
        self.num_frees += k * b.n_frees
        self.index += k * b.n_events
        self.window += k * b.nwin
        self.skipped_windows += k * b.nwin
