"""Storage-level memory tracker: every tensor storage's bytes, from first sight to release.

A ``TorchDispatchMode`` sees each op's outputs; the tracker records a storage the first time it
sees it (its ``nbytes``) and a ``weakref.finalize`` on the storage records its release.  Views
share a storage and so are counted once.  The same tracker runs over a real step (CPU or CUDA
tensors) and over a meta-device step, which is what lets the two be compared byte for byte.

Interface (stable; other modules rely on it):

    with Tracker() as tr:            # optionally Tracker(devices=("meta",))
        with tr.category("activations"):
            ...
    tr.peak_bytes, tr.live_bytes, tr.events   # events: list[TrackEvent]

Extensions used by the traced engine:

* ``devices``: only storages on these device types are counted (the meta device stands for
  the GPU; CPU-side tensors such as AdamW's ``step`` counters are then left out).
* ``relabel(tensors, category)``: give a storage its final role (a tensor made by a backward
  op that becomes ``param.grad`` is a gradient for its whole life).
* ``synthetic(nbytes, ...)``/``release(sid)``: memory the allocator hands out that no tensor
  shows (cuBLAS workspaces).
* ``mark(phase)``: phase boundaries (forward, backward, optimizer), as event sequence numbers.
* ``where``: a callable naming the module that is running, stored with each allocation.
* ``paused()``: allocations made inside are not counted (real-valued helper computations).
* ``op(name)``: allocations made inside are recorded under ``name`` instead of the aten op
  (FSDP2's all-gather and reduce-scatter buffers).
* A ``DTensor`` (FSDP2's sharded parameters, gradients and optimizer states) counts as its
  local shard: the wrapper's own storage reports the global size.

Gradient accumulation in the autograd engine.  When two gradients flow into the same input of
a node (a tensor used twice: a tied embedding's head and lookup, a residual stream, a norm's
input), ``InputBuffer::accumulate`` (torch/csrc/autograd/input_buffer.cpp) adds the second to
the first *in place* (``old_var.add_(var)``) when ``can_accumulate_inplace(old_var)``: a plain
tensor, non-overlapping and dense, whose last reference and storage the buffer holds alone;
otherwise out of place (``old_var + var``, a new buffer).  "Plain" is
``!at::isTensorSubclassLike(v)``, and that is true for *every* tensor while a
``TorchDispatchMode`` is active (``c10::impl::dispatch_mode_enabled()``,
ATen/TensorSubclassLikeUtils.h), so under this tracker every accumulation would be out of place,
one gradient-sized buffer more than the step has without it (a V x h fp32 buffer for a tied
embedding under autocast).  The tracker therefore makes the engine's decision itself: an
``aten.add.Tensor`` with grad mode off, inside the backward, whose first operand was made by
another autograd node than the one running, is the engine's sum; if that operand passes
``can_accumulate_inplace`` with the mode's own references discounted, it is added in place and
returned, as the engine without the mode would.  The references the dispatch itself adds (the
boxed argument, the Python wrapper) are measured once on a sum known to be in place
(``_exclusive_counts``), so they are not a constant guessed for one torch version.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Self

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["TrackEvent", "Tracker", "local_tensor"]


@dataclass(frozen=True)
class TrackEvent:
    """One allocation (``nbytes`` > 0) or release (``nbytes`` < 0) of a storage."""

    seq: int
    storage_id: int
    nbytes: int
    category: str
    op: str
    module: str = ""


class Tracker(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts live storage bytes under the mode; peak is the maximum of the running sum."""

    def __init__(self, devices: Iterable[str] | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.events: list[TrackEvent] = []
        self.live_bytes = 0
        self.peak_bytes = 0
        self.marks: list[tuple[int, str]] = []
        self.where: Callable[[], str] | None = None
        self._devices = frozenset(devices) if devices is not None else None
        self._seen: dict[int, int] = {}
        self._event_index: dict[int, list[int]] = {}
        self._next_id = 0
        self._category = "other"
        self._op: str | None = None
        self._paused = 0
        self._made_by: dict[int, tuple[int, str]] = {}  # storage id -> the autograd node that made it
        self._calibrating: list[tuple[int, int, int]] | None = None

    def __enter__(self) -> Self:
        if self._calibrating is None:
            _exclusive_counts()  # measured outside any mode, before this one is pushed
        super().__enter__()  # type: ignore[no-untyped-call]
        return self

    # ---- context -----------------------------------------------------------------
    @contextlib.contextmanager
    def category(self, name: str) -> Iterator[None]:
        old, self._category = self._category, name
        try:
            yield
        finally:
            self._category = old

    @property
    def current_category(self) -> str:
        return self._category

    @contextlib.contextmanager
    def op(self, name: str) -> Iterator[None]:
        old, self._op = self._op, name
        try:
            yield
        finally:
            self._op = old

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def mark(self, phase: str) -> None:
        """Start a phase at the next event."""
        self.marks.append((len(self.events), phase))

    # ---- recording ---------------------------------------------------------------
    def track(self, tensors: Any, category: str | None = None, op: str = "existing") -> None:
        """Record tensors created outside the mode (parameters, inputs) as allocated now."""
        flat, _ = tree_flatten(tensors)
        for t in flat:
            if isinstance(t, torch.Tensor):
                self._see(t, category or self._category, op, force=True)

    def storage_id(self, t: torch.Tensor) -> int | None:
        return self._seen.get(id(local_tensor(t).untyped_storage()))

    def relabel(self, tensors: Any, category: str, op: str | None = None) -> None:
        """Give the storages of ``tensors`` the category ``category`` for their whole life."""
        flat, _ = tree_flatten(tensors)
        for t in flat:
            if not isinstance(t, torch.Tensor):
                continue
            sid = self._seen.get(id(local_tensor(t).untyped_storage()))
            if sid is not None:
                self.relabel_id(sid, category, op)

    def relabel_id(self, sid: int, category: str, op: str | None = None) -> None:
        for i in self._event_index.get(sid, ()):
            ev = self.events[i]
            self.events[i] = replace(ev, category=category, op=op if op is not None and ev.nbytes > 0 else ev.op)

    def synthetic(self, nbytes: int, category: str, op: str, module: str = "") -> int:
        """An allocation no tensor shows (a library workspace); returns its id for ``release``."""
        sid = self._next_id
        self._next_id += 1
        self._emit(sid, nbytes, category, op, module)
        return sid

    def release(self, sid: int) -> None:
        idx = self._event_index.get(sid)
        if not idx:
            return
        first = self.events[idx[0]]
        self._emit(sid, -first.nbytes, first.category, "free", first.module)

    def resized(self, t: torch.Tensor, nbytes: int) -> None:
        """``t``'s storage was resized in place to ``nbytes`` (FSDP2 frees and re-allocates its
        unsharded parameters with ``storage.resize_``): a release at 0, a new allocation after."""
        t = local_tensor(t)
        if self._devices is not None and t.device.type not in self._devices:
            return
        key = id(t.untyped_storage())
        sid = self._seen.get(key)
        if nbytes == 0:
            if sid is not None:
                del self._seen[key]
                self._release(key, sid)
            return
        if sid is None:
            self._see(t, self._category, self._op or "resize", force=True)

    def category_of(self, sid: int) -> str | None:
        idx = self._event_index.get(sid)
        return self.events[idx[0]].category if idx else None

    def _see(self, t: torch.Tensor, category: str, op: str, force: bool = False) -> None:
        if self._paused and not force:
            return
        t = local_tensor(t)
        if self._devices is not None and t.device.type not in self._devices:
            return
        st = t.untyped_storage()
        key = id(st)
        if key in self._seen:
            return
        nbytes = st.nbytes()
        sid = self._next_id
        self._next_id += 1
        self._seen[key] = sid
        module = self.where() if self.where is not None else ""
        self._emit(sid, nbytes, category, op, module)
        node = torch._C._current_autograd_node()
        if node is not None:
            self._made_by[sid] = _node_key(node)
        weakref.finalize(st, self._release, key, sid)

    def _release(self, key: int, sid: int) -> None:
        if self._seen.get(key) == sid:
            del self._seen[key]
        self._made_by.pop(sid, None)
        idx = self._event_index.get(sid)
        if not idx or self.events[idx[-1]].nbytes < 0:
            return  # unknown, or released already (a storage resized to 0 and later collected)
        first = self.events[idx[0]]
        self._emit(sid, -first.nbytes, first.category, "free", first.module)

    def _emit(self, sid: int, nbytes: int, category: str, op: str, module: str = "") -> None:
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        self._event_index.setdefault(sid, []).append(len(self.events))
        self.events.append(TrackEvent(len(self.events), sid, nbytes, category, op, module))

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is _ADD and not kwargs and len(args) == 2 and self._engine_sum_in_place(args):
            return args[0].add_(args[1])  # the buffer is reused: nothing allocated
        out = func(*args, **(kwargs or {}))
        if self._paused:
            return out
        flat, _ = tree_flatten(out)
        for t in flat:
            if isinstance(t, torch.Tensor):
                self._see(t, self._category, self._op or str(func))
        return out


    def _engine_sum_in_place(self, args: tuple[Any, ...]) -> bool:
        """Whether this add is the autograd engine summing two gradients where, without the mode,
        ``InputBuffer::accumulate`` would add in place (see the module docstring)."""
        if torch.is_grad_enabled():
            return False
        node = torch._C._current_autograd_node()
        if node is None:
            return False
        old, new = args
        if type(old) is not torch.Tensor or type(new) is not torch.Tensor:
            return False  # a real subclass (DTensor): isTensorSubclassLike without the mode too
        if old.layout != torch.strided or new.layout != torch.strided or old.is_nested or old._is_zerotensor():
            return False
        if old.shape != new.shape or old.dtype != new.dtype or old.device != new.device:
            return False
        sid = self._seen.get(id(old.untyped_storage()))
        if sid is None or self._made_by.get(sid) == _node_key(node):
            return False  # made inside this node's own backward: an add of the formula, not the engine's sum
        if not _non_overlapping_and_dense(old):
            return False
        counts = _reference_counts(old)
        if self._calibrating is not None:
            self._calibrating.append(counts)
            return False
        return counts == _exclusive_counts()


_ADD = torch.ops.aten.add.Tensor


def _node_key(node: Any) -> tuple[int, str]:
    # sequence numbers are unique among the nodes the forward thread made (AccumulateGrad's is
    # UINT64_MAX, and it makes no tensor); the name guards a reused number
    return int(node._sequence_nr()), str(node.name())


def _reference_counts(t: torch.Tensor) -> tuple[int, int, int]:
    """(TensorImpl references, storage references, Python references) of ``t`` as seen from
    ``Tracker._engine_sum_in_place``: the C++ ``use_count``s ``can_accumulate_inplace`` tests, and
    the Python wrapper's (a tensor something in Python holds is not the buffer's alone)."""
    uses = int(t._use_count())  # type: ignore[attr-defined]
    return uses, torch._C._storage_Use_Count(t.untyped_storage()._cdata), sys.getrefcount(t)


def _non_overlapping_and_dense(t: torch.Tensor) -> bool:
    """``TensorImpl::is_non_overlapping_and_dense`` (c10/core/Contiguity.h): some order of the
    dimensions makes the strides those of a contiguous tensor (size-1 dimensions ignored)."""
    expected = 1
    for d in sorted(range(t.dim()), key=lambda d: (t.stride(d), t.shape[d])):
        if t.shape[d] == 1:
            continue
        if t.stride(d) != expected:
            return False
        expected *= t.shape[d]
    return True


@functools.cache
def _exclusive_counts() -> tuple[int, int, int]:
    """The references ``_reference_counts`` sees on a gradient the engine's buffer holds alone.

    ``w`` is used twice; each ``MulBackward0`` returns a fresh tensor, and the first to arrive is
    held by the buffer only, so ``can_accumulate_inplace`` is true for it without the mode.  The
    references above 1 are the dispatch's own (the boxed argument, the Python wrapper, this
    call's locals), the same for every sum the tracker sees.
    """
    from torch.utils._python_dispatch import _disable_current_modes

    probe = Tracker()
    probe._calibrating = []
    with _disable_current_modes(), torch.enable_grad():
        w = torch.zeros((4, 4), device="meta", requires_grad=True)
        with probe:
            loss = (w * 2.0).sum() + (w * 3.0).sum()
            backward: Any = loss.backward
            backward()
    if len(probe._calibrating) != 1:  # pragma: no cover - a torch whose engine no longer sums here
        return (-1, -1, -1)
    return probe._calibrating[0]


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (the tensor whose storage this rank holds); any other tensor itself."""
    local = getattr(t, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else t
