"""A compact allocation-event stream, the form ``vramplan.alloc.replay_compact`` replays.

Written by the analytic engine's training step (``analytic/events.py``) and by its ``generate`` replay
(``analytic/generate_replay.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from vramplan.alloc.compact import Repeat

__all__ = ["AllocStream"]


class AllocStream:
    """Builds a compact event stream (``vramplan.alloc.replay_compact``): ``n > 0`` allocates ``n``
    bytes as the next block id, ``-id - 1`` frees block ``id``.  A 0-byte tensor gets no block
    (PyTorch does not call the allocator for it): its id is -1 and freeing it does nothing.

    With ``runs``, :func:`_layers` writes a run of identical layers as one ``Repeat`` (its first window
    literally, then the template and the id strides) into ``parts`` instead of every layer's events.

    ``marked`` collects the ids of blocks that a side CUDA stream allocates (``vramplan.alloc.compact.split_pools``
    replays them as a pool of their own)."""

    __slots__ = ("events", "marked", "next_id", "parts", "runs")

    def __init__(self, runs: bool = False) -> None:
        self.events: list[int] = []
        self.next_id = 0
        self.runs = runs
        self.parts: list[list[int] | Repeat] = []
        self.marked: set[int] = set()

    def close(self) -> list[list[int] | Repeat]:
        if self.events:
            self.parts.append(self.events)
            self.events = []
        return self.parts

    def alloc(self, nbytes: int) -> int:
        if nbytes <= 0:
            return -1
        bid = self.next_id
        self.next_id += 1
        self.events.append(nbytes)
        return bid

    def alloc_all(self, sizes: Iterable[int]) -> list[int]:
        """``alloc`` of each size in turn."""
        ev, bid, out = self.events, self.next_id, []
        for nbytes in sizes:
            if nbytes > 0:
                ev.append(nbytes)
                out.append(bid)
                bid += 1
            else:
                out.append(-1)
        self.next_id = bid
        return out

    def free(self, bid: int) -> None:
        if bid >= 0:
            self.events.append(-bid - 1)

    def free_all(self, bids: Sequence[int]) -> None:
        ev = self.events
        ev.extend(-b - 1 for b in bids if b >= 0)
