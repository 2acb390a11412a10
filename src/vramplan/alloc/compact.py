"""The compact event stream the analytic engine builds, and its runs of repeated windows.

A *compact stream* is a list of ints: ``n > 0`` allocates ``n`` bytes as the next block id (ids count
allocations from 0), ``n < 0`` frees block ``-n - 1``, ``0`` is ignored.  A transformer's layers make
the same events layer after layer, with block ids moved on by a constant per event, so the engine
writes each run of identical layers once, as a :class:`Repeat` (one layer's events, a *window*, with
the per-event id strides and the number of layers), and :func:`expand` gives the plain stream back.

Replaying is elsewhere: ``vramplan.alloc.replay_compact`` / ``replay_parts`` run a stream (or a
sequence of literal parts and ``Repeat`` runs) through the C replay (``native.py``; it expands each
``Repeat`` window by window in C) or, without it, through the reference ``caching.CachingAllocator``
on the expanded stream.  Every window is replayed: the allocator's state is not assumed periodic.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["Repeat", "expand", "split_pools"]


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


def split_pools(stream: Sequence[int], marked: Iterable[int]) -> tuple[list[int], list[int]]:
    """A compact stream cut in two: the events of the blocks not in ``marked`` and those of the blocks in it,
    each a compact stream of its own (ids renumbered from 0 in each, in allocation order).

    PyTorch's caching allocator keeps the blocks of each CUDA stream apart: ``BlockComparatorSize`` orders a
    pool by (stream, size, address) and ``get_free_block`` hands out only a cached block of the requesting
    stream (``c10/cuda/CUDACachingAllocator.cpp``), and with ``expandable_segments`` each stream maps its own
    segment.  Blocks allocated on a side stream (``marked``) are therefore replayed as an allocator of their own.

    >>> split_pools([10, 20, -1, 30, -2, -3], {1})
    ([10, -1, 30, -2], [20, -1])
    """
    side = set(marked)
    main: list[int] = []
    other: list[int] = []
    where: dict[int, tuple[bool, int]] = {}
    counts = [0, 0]
    bid = 0
    for x in stream:
        if x > 0:
            k = bid in side
            where[bid] = (k, counts[k])
            counts[k] += 1
            bid += 1
            (other if k else main).append(x)
        elif x < 0:
            k, i = where[-x - 1]
            (other if k else main).append(-i - 1)
    return main, other
