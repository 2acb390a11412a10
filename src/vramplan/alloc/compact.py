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

__all__ = ["Repeat", "expand"]


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
