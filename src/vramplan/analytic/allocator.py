"""PyTorch's CUDA caching allocator: from allocated bytes to reserved bytes.

The rules live in one place, ``vramplan.alloc`` (a replay of c10/cuda/CUDACachingAllocator.cpp:
512-byte rounding, 2 MiB small-pool segments for requests <= 1 MiB, 20 MiB segments for requests
below 10 MiB, 2 MiB-rounded segments above, best fit with splitting).  This module applies them to
what the analytic engine knows: the tensors alive at the peak, not their order.  It replays those
tensors as allocations into an empty allocator, largest first, so it counts segment rounding and
the whole-block hand-outs of unsplit blocks, but not fragmentation left behind by earlier phases
(the traced engine replays the real event order for that).  ``train_reserved_bytes`` replays the
analytic step's own event stream (analytic/events.py: the closed-form terms as individual tensors in
the order one training step makes and frees them, two steps), which does count that fragmentation;
``estimate`` uses it for training scenarios by default (``reserved="replay"``; docs/allocator.md).

Worked example: five 8 MiB tensors.  Each opens or reuses a 20 MiB segment (8 MiB < 10 MiB); a
segment holds two (8 + 8, 4 MiB left, too small for the third), so three segments: 60 MiB
reserved for 40 MiB allocated.  With ``expandable_segments`` the same tensors map 40 MiB.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from vramplan.alloc import replay_compact, replay_parts
from vramplan.alloc.compact import Repeat, expand, split_pools
from vramplan.alloc.rules import (
    K_LARGE_BUFFER as LARGE_SEGMENT,
)
from vramplan.alloc.rules import (
    K_MIN_BLOCK_SIZE as ROUND_BYTES,
)
from vramplan.alloc.rules import (
    K_MIN_LARGE_ALLOC as MIN_LARGE_ALLOC,
)
from vramplan.alloc.rules import (
    K_ROUND_LARGE as ROUND_LARGE,
)
from vramplan.alloc.rules import (
    K_SMALL_BUFFER as SMALL_SEGMENT,
)
from vramplan.alloc.rules import (
    K_SMALL_SIZE as SMALL_SIZE,
)
from vramplan.alloc.rules import allocation_size, is_small, round_size, should_split
from vramplan.analytic.events import StepLayout, iter_run_parts, train_run_parts_marked

__all__ = [
    "LARGE_SEGMENT", "MIN_LARGE_ALLOC", "ROUND_BYTES", "ROUND_LARGE", "SMALL_SEGMENT", "SMALL_SIZE",
    "allocated_bytes_for", "reserved_after_parts", "reserved_after_step", "reserved_for", "rounded_request", "segment_bytes",
    "train_reserved_bytes",
]


def rounded_request(nbytes: int) -> int:
    """The block size a request is rounded to: a multiple of 512 B (``round_size``)."""
    return round_size(max(nbytes, 1))


def segment_bytes(nbytes: int) -> int:
    """The segment cudaMalloc'd for a request that finds no cached block (``get_allocation_size``)."""
    return allocation_size(rounded_request(nbytes))


def allocated_bytes_for(nbytes: int) -> int:
    """What ``max_memory_allocated`` counts for a tensor opening a fresh segment.

    The rounded size, or the whole block when the remainder is too small to split
    (large pool: 1 MiB or less left), e.g. 19.5 MiB in a 20 MiB segment counts 20 MiB.
    """
    r = rounded_request(nbytes)
    seg = allocation_size(r)
    return r if should_split(seg, r, is_small(r), False) else seg


def reserved_for(tensor_sizes: list[tuple[int, int]], expandable_segments: bool = False) -> int:
    """Reserved bytes for ``(size, count)`` tensors alive together, allocated largest first."""
    return _reserved_for(tuple(sorted(tensor_sizes, key=lambda sc: -sc[0])), expandable_segments)


# the planner estimates many setups whose peaks hold the same tensors (setups that differ only in step
# time): the packing is a pure function of the sorted sizes
@lru_cache(maxsize=4096)
def _reserved_for(ordered: tuple[tuple[int, int], ...], expandable_segments: bool) -> int:
    stream = [max(size, 1) for size, count in ordered for _ in range(count)]
    return replay_compact(stream, expandable_segments).final_reserved_bytes


def _pooled_reserved(main: list[int], side: list[int], expandable_segments: bool, capacity_bytes: int | None) -> int:
    """Reserved bytes of a step whose gradients are made on a side stream (torch FSDP's reduce-scatter stream,
    ``terms/sharding.py grads_on_reduce_stream``) or whose parameters are gathered on one (DeepSpeed ZeRO-3's
    all-gather stream, ``terms/deepspeed.py gathers_on_side_stream``): the compute stream's blocks (``main``) and the
    side stream's (``side``, ``vramplan.alloc.compact.split_pools``) replayed as two allocators, the reserved bytes
    being their sum.

    The caching allocator never hands a block to another stream, and without a failed ``cudaMalloc`` (or
    ``empty_cache``) it never gives a segment back, so each pool's reserved bytes only grow and the process's peak
    is the sum of the pools' peaks.  Where that sum passes ``capacity_bytes``, the real allocator's failed
    ``cudaMalloc`` releases the free segments of every stream and retries (``release_cached_blocks``); the step's
    single-stream replay with the capacity (``train_reserved_bytes``, which calls this only when it did not run out
    of memory) shows the retry succeeds, so the reserved bytes are then the capacity: the allocator fills the device
    before it gives cached segments back.  Allocated bytes are the whole stream's.

    Worked example (``tests/test_fsdp_grad_pool.py``): a 20 MiB activation freed, then a 20 MiB gradient: one
    stream reuses the activation's segment (20 MiB reserved); on two streams the gradient opens its own (40 MiB)."""
    pooled = (replay_compact(side, expandable_segments).peak_reserved_bytes
              + replay_compact(main, expandable_segments).peak_reserved_bytes)
    return pooled if capacity_bytes is None else min(pooled, capacity_bytes)


# ------------------------------------------------------------------------------------------------
# a training run's event stream (analytic/events.py) through the allocator model
# ------------------------------------------------------------------------------------------------

@lru_cache(maxsize=4096)
def train_reserved_bytes(layout: StepLayout, expandable_segments: bool = False,
                         capacity_bytes: int | None = None) -> tuple[int, int]:
    """(peak allocated, peak reserved) of the first two training steps, replayed event by event.

    With ``capacity_bytes`` (the device memory PyTorch may reserve: total memory less what lives
    outside the allocator) the replay behaves as PyTorch does when ``cudaMalloc`` fails: it
    releases every cached segment that is entirely free and retries (``release_cached_blocks``),
    so cached blocks left by earlier phases do not count beyond the device; without it, nothing
    is ever released and reserved bytes can exceed any real device.  When even the retry fails,
    the returned reserved bytes are what the failing request needed, above the capacity.

    The result is that of replaying every event: extrapolating from the first few layers is not
    exact (on QLoRA 7B the reserved increment per layer alternates 272 / 140 MiB after settling at
    272 MiB for three layers, so a linear extrapolation over-counts 1.8 GiB).  The stream comes as
    runs of identical layers (``iter_run_parts``); ``replay_parts`` replays every event, in C with the runs
    expanded there, otherwise through the reference model on the expanded stream (``vramplan.alloc``).
    Results are cached per layout (a frozen dataclass), so repeated estimates of one scenario replay
    once.
    """
    if layout.grads_on_side_stream or layout.gathered_on_side_stream:
        # the stream is written once: its parts replay whole (allocated bytes, a failed request), then by pool
        parts, marked = train_run_parts_marked(layout)
        res = replay_parts(parts, expandable_segments=expandable_segments, capacity_bytes=capacity_bytes)
        if res.oom is None:
            main, side = split_pools(expand(parts), marked)
            return res.peak_allocated_bytes, _pooled_reserved(main, side, expandable_segments, capacity_bytes)
    else:
        res = replay_parts(iter_run_parts(layout), expandable_segments=expandable_segments,
                           capacity_bytes=capacity_bytes)
    if res.oom is not None:
        # the request that failed after the allocator emptied its cache and retried: the step needs
        # at least what stayed reserved plus that request's segment, which exceeds the capacity
        return (max(res.peak_allocated_bytes, res.oom.allocated_bytes + res.oom.rounded_bytes),
                max(res.peak_reserved_bytes, res.oom.reserved_bytes + res.oom.device_request_bytes))
    return res.peak_allocated_bytes, res.peak_reserved_bytes


@lru_cache(maxsize=256)
def reserved_after_step(layout: StepLayout, tail: tuple[int, ...], expandable_segments: bool = False,
                        capacity_bytes: int | None = None) -> int:
    """Peak reserved bytes of the two training steps (``train_reserved_bytes``'s stream) followed by ``tail``, a
    compact stream of its own (ids from 0) that runs after them on the same allocator: an evaluation between steps
    (``analytic/lifecycle/evaluation.py`` ``eval_forward_stream``), with nothing but the resident tensors alive and
    every block the steps freed still cached, as the caching allocator keeps them while no ``empty_cache`` runs.
    A tail tensor reuses a cached block at least as large (best fit, split) and opens a segment otherwise, so an
    evaluation at a larger batch than the step's micro-batch adds segments beside the step's cached ones.

    Worked example (``tests/test_lifecycle.py``): a step that frees a 20 MiB activation leaves its 20 MiB segment
    cached; a 10 MiB evaluation tensor takes it (20 MiB reserved), a 40 MiB one opens a second segment (60 MiB).

    A side-stream step (FSDP's gradients, ZeRO-3's gathers) is replayed on one stream here: its pools' cached
    blocks are all offered to the tail, a lower figure than two pools would give, and never below the step's own
    peak, which the caller keeps."""
    return reserved_after_parts(list(iter_run_parts(layout)), tail, expandable_segments, capacity_bytes)


def reserved_after_parts(parts: list[list[int] | Repeat], tail: Sequence[int], expandable_segments: bool = False,
                         capacity_bytes: int | None = None) -> int:
    """``reserved_after_step`` on a stream given as parts (``vramplan.alloc.replay_parts``): the peak reserved bytes
    of ``parts`` then ``tail``, whose ids count from 0 in the tail."""
    made = sum(sum(1 for x in p.events if x > 0) * p.count if isinstance(p, Repeat) else sum(1 for x in p if x > 0)
               for p in parts)
    shifted = [x if x > 0 else x - made for x in tail]
    res = replay_parts([*parts, shifted], expandable_segments=expandable_segments, capacity_bytes=capacity_bytes)
    if res.oom is not None:
        return max(res.peak_reserved_bytes, res.oom.reserved_bytes + res.oom.device_request_bytes)
    return res.peak_reserved_bytes
