"""A phase's tensors in the order the library makes and frees them, and what the allocator makes of them.

``PhaseStream`` writes a compact event stream (``vramplan.alloc.replay_compact``: ``n > 0`` allocates ``n``
bytes as the next block id, ``-id - 1`` frees block ``id``) and keeps, beside it, the bytes alive under each
declared key (analytic/moment.py ``K``) at the highest point, rounded as the caching allocator rounds a
request (512 B, ``round_size``).  The replay of the stream gives the phase's reserved bytes: the blocks a
phase frees stay cached in their segments (nvidia-smi still counts them), and a later, larger request that
finds no cached block big enough opens a new segment.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramplan.alloc import replay_compact
from vramplan.alloc.rules import round_size
from vramplan.analytic.moment import Key, Moment

__all__ = ["PhaseStream", "StreamPeak"]


@dataclass(frozen=True)
class StreamPeak:
    """The highest point of a stream: its content by key, its total, and the replay's reserved bytes."""

    content: tuple[tuple[Key, int], ...]
    allocated_bytes: int
    reserved_bytes: int

    def moment(self, phase: str) -> Moment:
        out = Moment(phase)
        for key, nbytes in self.content:
            out.add(key, nbytes)
        return out


class PhaseStream:
    """Allocations and frees of one phase (or of consecutive phases, ``mark`` between them).

    Keys are held by identity (declared keys are singletons) and the live total is kept running, so a
    70B model's load (some 900 events) costs a few milliseconds."""

    def __init__(self) -> None:
        self.events: list[int] = []
        self._keys: list[int] = []  # each block's key id (retagged while it lives)
        self._sizes: list[int] = []
        self._by_id: dict[int, Key] = {}
        self._live: dict[int, int] = {}
        self._total = 0
        self._peak: tuple[int, dict[int, int]] = (0, {})

    def _add(self, kid: int, nbytes: int) -> None:
        self._live[kid] = self._live.get(kid, 0) + nbytes
        self._total += nbytes

    def alloc(self, key: Key, nbytes: int) -> int:
        """Allocate ``nbytes`` under ``key``; returns the block id (-1 for 0 bytes: no allocation)."""
        if nbytes <= 0:
            return -1
        bid = len(self._sizes)
        size = round_size(nbytes)
        kid = id(key)
        self._by_id[kid] = key
        self.events.append(nbytes)
        self._keys.append(kid)
        self._sizes.append(size)
        self._add(kid, size)
        if self._total > self._peak[0]:
            self._peak = (self._total, dict(self._live))
        return bid

    def free(self, bid: int) -> None:
        if bid < 0:
            return
        self.events.append(-bid - 1)
        self._add(self._keys[bid], -self._sizes[bid])

    def retag(self, bid: int, key: Key) -> None:
        """Count a live block under another key from now on (a cast copy that becomes the parameter)."""
        if bid < 0:
            return
        size = self._sizes[bid]
        self._add(self._keys[bid], -size)
        kid = id(key)
        self._by_id[kid] = key
        self._add(kid, size)
        self._keys[bid] = kid

    def mark(self) -> None:
        """Start a new phase: its peak is looked for from here (what is alive carries over)."""
        self._peak = (self._total, dict(self._live))

    def peak(self) -> StreamPeak:
        """The current phase's highest point; its reserved bytes replay the whole stream so far (cached
        blocks of earlier phases included: reserved bytes only grow)."""
        total, live = self._peak
        reserved = replay_compact(self.events).peak_reserved_bytes if self.events else 0
        content = tuple((self._by_id[k], v) for k, v in live.items() if v)
        return StreamPeak(content, total, max(reserved, total))
