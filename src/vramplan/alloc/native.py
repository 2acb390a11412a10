"""The C replay of the caching allocator (``_replay.c``), when it was built.

``pip install`` compiles ``vramplan/alloc/_replay.c`` where a C compiler is available (setup.py marks
the extension optional).  It is the fast path of the default configuration and of
``expandable_segments:True``: the reference model ``caching.CachingAllocator``, event by event, at about
0.1-0.6 µs an event instead of 1.3-2.7 µs (``benchmarks/bench_replay.txt``); a 70B ZeRO-3 training
estimate replays about 21,000 events.  Where it is missing, or with ``VRAMPLAN_NATIVE=0`` in the
environment, ``vramplan.alloc`` replays through the reference itself, whose results are the same
(``tests/test_alloc_native.py`` compares the two statistic by statistic, in both configurations, on
random programs, runs of repeated windows and the analytic engine's streams).

The C module holds no allocator number of its own: :func:`_load` hands it ``rules.py``'s values
(``_replay.configure``) before anything can replay, so a rule changed in ``rules.py`` changes both
models; an expandable segment's address range is ``rules.expandable_address_space(capacity)``, computed
here for each replay.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from types import ModuleType

from vramplan.alloc import rules
from vramplan.alloc.compact import Repeat

__all__ = ["FIELDS", "OOM_FIELDS", "RULES", "available", "replay_parts", "replay_stream"]

# what _replay.configure receives: rules.py's values under the C replay's names
RULES: dict[str, int] = {
    "min_block_size": rules.K_MIN_BLOCK_SIZE,
    "small_size": rules.K_SMALL_SIZE,
    "small_buffer": rules.K_SMALL_BUFFER,
    "large_buffer": rules.K_LARGE_BUFFER,
    "min_large_alloc": rules.K_MIN_LARGE_ALLOC,
    "round_large": rules.K_ROUND_LARGE,
    "segment_align": rules.SEGMENT_ALIGN,
    "address_base": rules.ADDRESS_BASE,
    "small_page": rules.EXPANDABLE_SMALL_PAGE,
    "large_page": rules.EXPANDABLE_LARGE_PAGE,
}

# the fields of the tuple ``_replay.replay`` returns, in order (ReplayResult's names); the last is the
# out-of-memory record (OOM_FIELDS, OomInfo's names) or None
FIELDS = (
    "peak_allocated_bytes", "peak_reserved_bytes", "final_allocated_bytes", "final_reserved_bytes",
    "peak_requested_bytes", "allocated_at_peak_reserved_bytes", "largest_free_block_at_peak_reserved_bytes",
    "peak_segments", "final_segments", "final_largest_free_block_bytes", "num_allocs", "num_frees",
    "num_device_allocs", "num_device_frees", "num_alloc_retries", "unmatched_frees", "oom",
)
OOM_FIELDS = (
    "event_index", "block_id", "requested_bytes", "rounded_bytes", "device_request_bytes", "capacity_bytes",
    "allocated_bytes", "reserved_bytes", "reserved_before_retry_bytes", "cached_released_bytes",
    "largest_free_block_bytes",
)


def _load() -> ModuleType | None:
    """The built C module, configured with ``RULES``; None where it was not built."""
    try:
        from vramplan.alloc import _replay  # type: ignore[attr-defined]
    except ImportError:
        return None
    mod: ModuleType = _replay
    mod.configure(**RULES)
    return mod


_MODULE = _load()


def available() -> bool:
    """True when the C replay was built and ``VRAMPLAN_NATIVE`` is not ``0`` (read at each call, so a
    test can switch it)."""
    return _MODULE is not None and os.environ.get("VRAMPLAN_NATIVE", "1") != "0"


def replay_stream(stream: Sequence[int], capacity_bytes: int | None,
                  expandable_segments: bool = False) -> tuple[object, ...]:
    """The C replay of a compact stream (``n > 0`` allocates ``n`` bytes as the next block id, ``n < 0``
    frees block ``-n - 1``): a tuple of ``FIELDS``.  Raises ``RuntimeError`` when it was not built."""
    return replay_parts([stream], capacity_bytes, expandable_segments)


def replay_parts(parts: Iterable[Sequence[int] | Repeat], capacity_bytes: int | None,
                 expandable_segments: bool = False) -> tuple[object, ...]:
    """The C replay of ``compact.expand(parts)``; a ``Repeat`` run is expanded in C, window by window.
    With ``expandable_segments`` each segment reserves ``rules.expandable_address_space(capacity_bytes)``
    bytes of addresses, as in ``caching.CachingAllocator``."""
    if _MODULE is None:
        raise RuntimeError("vramplan.alloc._replay was not built (no C compiler at install time)")
    if capacity_bytes is not None and capacity_bytes < 0:
        raise ValueError("capacity_bytes must be >= 0")
    flat = [(p.events, p.strides, p.count) if isinstance(p, Repeat) else p for p in parts]
    space = rules.expandable_address_space(capacity_bytes) if expandable_segments else 0
    out: tuple[object, ...] = _MODULE.replay(flat, -1 if capacity_bytes is None else capacity_bytes, space)
    return out
