"""The C replay of the default caching allocator (alloc/_replay.c, alloc/native.py) against the Python models.

Three implementations of one model must agree statistic by statistic, out of memory included: the
C replay, ``compact.CompactReplay`` (the Python replay, with its skipping of mirrored windows) and
``caching.CachingAllocator`` (the method-by-method model of CUDACachingAllocator.cpp).
"""

from __future__ import annotations

import os
import shutil
import sysconfig
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from test_alloc_properties import OPS, to_compact, to_events
from vramplan.alloc import Repeat, compact_result, expand, native, replay, replay_compact, replay_parts
from vramplan.alloc.compact import CompactReplay
from vramplan.units import MiB

ROOT = Path(__file__).resolve().parents[1]

needs_native = pytest.mark.skipif(native._MODULE is None, reason="the C replay was not built")


def _compiler() -> bool:
    cc = (sysconfig.get_config_var("CC") or "").split()
    return bool(cc) and shutil.which(cc[0]) is not None


def test_built_where_a_compiler_exists() -> None:
    # `pip install -e .` builds the extension in place (setup.py, optional=True); a machine with the
    # compiler Python was built with must have it, or estimates silently run the slower Python replay
    if not _compiler():
        pytest.skip("no C compiler: the Python replay is used")
    assert native._MODULE is not None, "src/vramplan/alloc/_replay.c was not built: run `pip install -e .`"


@pytest.fixture
def python_replay() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VRAMPLAN_NATIVE", "0")
        yield


@needs_native
def test_switch_and_a_hand_checked_stream(python_replay: None) -> None:
    # 3 MiB: a 20 MiB segment (1 MiB < 3 MiB < 10 MiB), split, 17 MiB cached; 1000 B rounds to 1024 B in a
    # 2 MiB small segment; freeing both leaves 22 MiB reserved in two segments, the largest free block 20 MiB
    assert not native.available()
    os.environ["VRAMPLAN_NATIVE"] = "1"
    assert native.available()
    r = replay_compact([3 * MiB, 1000, -1, -2])
    assert (r.peak_allocated_bytes, r.peak_reserved_bytes, r.final_allocated_bytes) == (3 * MiB + 1024, 22 * MiB, 0)
    assert (r.allocated_at_peak_reserved_bytes, r.largest_free_block_at_peak_reserved_bytes) == (3 * MiB + 1024,
                                                                                               17 * MiB)
    assert (r.final_segments, r.final_largest_free_block_bytes, r.num_allocs, r.num_frees) == (2, 20 * MiB, 2, 2)


@needs_native
def test_out_of_memory_record() -> None:
    # capacity 30 MiB: 25 MiB takes a 26 MiB segment (rounded up to 2 MiB); 6 MiB needs a 20 MiB segment,
    # 46 MiB > 30 MiB, and nothing cached is a whole segment, so the retry fails at event 1, block 1
    r = replay_compact([25 * MiB, 6 * MiB], capacity_bytes=30 * MiB)
    assert r.oom is not None
    assert (r.oom.event_index, r.oom.block_id, r.oom.device_request_bytes) == (1, 1, 20 * MiB)
    assert (r.oom.reserved_bytes, r.oom.cached_released_bytes, r.num_alloc_retries) == (26 * MiB, 0, 1)
    # freed first, the 26 MiB segment is too small for 28 MiB and 26 + 28 > 30 MiB: the retry releases it
    # (one cudaFree) and the 28 MiB segment then fits
    r2 = replay_compact([25 * MiB, -1, 28 * MiB], capacity_bytes=30 * MiB)
    assert r2.oom is None and r2.num_device_frees == 1 and r2.final_reserved_bytes == 28 * MiB


@needs_native
def test_bad_input() -> None:
    with pytest.raises(TypeError):
        native.replay_stream(["1"], None)  # type: ignore[list-item]
    with pytest.raises(OverflowError):
        native.replay_stream([1 << 70], None)
    with pytest.raises(ValueError, match="capacity_bytes"):
        native.replay_stream([1], -5)
    with pytest.raises(ValueError, match="as many strides as events"):
        native.replay_parts([Repeat([1000, -1], [0], 3)], None)


@needs_native
def test_runs_expand_in_c() -> None:
    # window w frees w ids further on: [1000, -1], [1000, -2], [1000, -3] after a 3 MiB block (id 0)
    # frees ids 0, 1, 2 in turn; every free is matched, 4 allocations and 3 frees
    parts = [[3 * MiB], Repeat([1000, -1], [0, 1], 3)]
    r = replay_parts(parts)
    assert (r.num_allocs, r.num_frees, r.unmatched_frees) == (4, 3, 0)
    assert r == replay_compact(expand(parts))


@needs_native
@settings(max_examples=300, deadline=None)
@given(OPS, st.one_of(st.none(), st.integers(0, 200 * MiB)), st.integers(0, 3))
def test_equals_both_python_models(ops: list[tuple[str, int]], capacity: int | None, extra: int) -> None:
    events = to_events(ops)
    stream, ids = to_compact(events)
    stream = stream + [0] * extra + [-(len(ids) + 5)] * extra   # ignored zeros and unmatched frees
    model = replay(events, capacity_bytes=capacity)
    if model.oom is not None:  # the failing block under its compact id (the allocation's ordinal)
        model = replace(model, oom=replace(model.oom, block_id=len(ids) if model.oom.block_id not in ids
                                           else ids[model.oom.block_id]))
    c = CompactReplay(capacity)
    c.run(stream)
    python = compact_result(c)
    assert native.available()
    ours = replay_compact(stream, capacity_bytes=capacity)
    assert ours == python
    if model.oom is None:
        assert replace(ours, unmatched_frees=0) == model  # to_events makes no unmatched frees
    else:
        assert ours.oom == model.oom


def _train_layouts() -> list[tuple[str, object]]:
    from vramplan.analytic.events import StepLayout
    from vramplan.analytic.train import train_step
    from vramplan.spec.load import resolve

    out: list[tuple[str, object]] = []
    for p in sorted((ROOT / "examples").glob("*.yaml")):
        r = resolve(p)
        if r.scenario.task != "train":
            continue
        lay = train_step(r).layout
        assert isinstance(lay, StepLayout)
        out.append((p.name, lay))
    return out


@needs_native
def test_engine_streams_equal_the_python_replay() -> None:
    # every example's training stream, unlimited and at 100%, 90% and 50% of its unlimited peak
    # (release-and-retry and out-of-memory paths): the C replay equals the Python replay with skipping
    from vramplan.analytic.events import iter_run_parts

    layouts = _train_layouts()
    assert len(layouts) >= 8
    for name, lay in layouts:
        parts = list(iter_run_parts(lay))  # type: ignore[arg-type]
        plain = replay_compact(expand(parts))
        for cap in (None, plain.peak_reserved_bytes, plain.peak_reserved_bytes * 9 // 10,
                    plain.peak_reserved_bytes // 2):
            c = CompactReplay(cap)
            c.run_parts(parts)
            assert replay_parts(parts, capacity_bytes=cap) == compact_result(c), (name, cap)
