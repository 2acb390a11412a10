"""Storage-level memory tracker: every tensor storage's bytes, from first sight to release.

A ``TorchDispatchMode`` sees each op's outputs; the tracker records a storage the first time it
sees it (its ``nbytes``) and a ``weakref.finalize`` on the storage records its release.  Views
share a storage and so are counted once.  The same tracker runs over a real step (CPU or CUDA
tensors) and over a meta-device step, which is what lets the two be compared byte for byte.

Interface (stable; other modules rely on it):

    with Tracker() as tr:            # optionally Tracker(track_existing=[module params...])
        with tr.category("activations"):
            ...
    tr.peak_bytes, tr.live_bytes, tr.events   # events: list[TrackEvent]
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["TrackEvent", "Tracker"]


@dataclass(frozen=True)
class TrackEvent:
    """One allocation (``nbytes`` > 0) or release (``nbytes`` < 0) of a storage."""

    seq: int
    storage_id: int
    nbytes: int
    category: str
    op: str


class Tracker(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts live storage bytes under the mode; peak is the maximum of the running sum."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.events: list[TrackEvent] = []
        self.live_bytes = 0
        self.peak_bytes = 0
        self._seen: dict[int, int] = {}
        self._next_id = 0
        self._category = "other"

    @contextlib.contextmanager
    def category(self, name: str) -> Iterator[None]:
        old, self._category = self._category, name
        try:
            yield
        finally:
            self._category = old

    def track(self, tensors: Any, category: str | None = None, op: str = "existing") -> None:
        """Record tensors created outside the mode (parameters, inputs) as allocated now."""
        flat, _ = tree_flatten(tensors)
        for t in flat:
            if isinstance(t, torch.Tensor):
                self._see(t, category or self._category, op)

    def _see(self, t: torch.Tensor, category: str, op: str) -> None:
        st = t.untyped_storage()
        key = id(st)
        if key in self._seen:
            return
        nbytes = st.nbytes()
        sid = self._next_id
        self._next_id += 1
        self._seen[key] = sid
        self._emit(sid, nbytes, category, op)
        weakref.finalize(st, self._release, key, sid, nbytes, category)

    def _release(self, key: int, sid: int, nbytes: int, category: str) -> None:
        self._seen.pop(key, None)
        self._emit(sid, -nbytes, category, "free")

    def _emit(self, sid: int, nbytes: int, category: str, op: str) -> None:
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        self.events.append(TrackEvent(len(self.events), sid, nbytes, category, op))

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        flat, _ = tree_flatten(out)
        for t in flat:
            if isinstance(t, torch.Tensor):
                self._see(t, self._category, str(func))
        return out
