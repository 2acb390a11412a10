"""The C replay (alloc/_replay.c, alloc/native.py) against the reference model (alloc/caching.py).

Two implementations of one model must agree statistic by statistic, out of memory included: the C
replay, the fast path of the default configuration and of ``expandable_segments:True``, and
``caching.CachingAllocator``, the method-by-method model of CUDACachingAllocator.cpp, which is also what
runs where the C replay was not built (or with ``VRAMPLAN_NATIVE=0``).  Every comparison runs in both
configurations (``EXPANDABLE``).  The C replay holds no allocator number of its own: it receives
``rules.py``'s values at import, which the tests here check too.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import vramplan.alloc
from test_alloc_properties import OPS, to_compact, to_events
from vramplan.alloc import Repeat, ReplayResult, expand, native, replay, replay_compact, replay_parts, rules
from vramplan.units import MiB

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

needs_native = pytest.mark.skipif(native._MODULE is None, reason="the C replay was not built")
# every comparison with the reference runs in the default configuration and with expandable_segments:True
EXPANDABLE = pytest.mark.parametrize("expandable", [False, True], ids=["default", "expandable"])


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


def _reference(parts: list[Any], capacity: int | None, expandable: bool = False) -> ReplayResult:
    """The reference model on the expanded stream (what ``replay_parts`` runs without the C replay)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VRAMPLAN_NATIVE", "0")
        assert not native.available()
        return replay_parts(parts, expandable, capacity_bytes=capacity)


# ---------------------------------------------------------------------------- the rules, from rules.py

def test_rules_come_from_rules_py() -> None:
    # every value the C replay is configured with is the rules.py object itself, under the C name
    assert native.RULES == {
        "min_block_size": rules.K_MIN_BLOCK_SIZE, "small_size": rules.K_SMALL_SIZE,
        "small_buffer": rules.K_SMALL_BUFFER, "large_buffer": rules.K_LARGE_BUFFER,
        "min_large_alloc": rules.K_MIN_LARGE_ALLOC, "round_large": rules.K_ROUND_LARGE,
        "segment_align": rules.SEGMENT_ALIGN, "address_base": rules.ADDRESS_BASE,
        "small_page": rules.EXPANDABLE_SMALL_PAGE, "large_page": rules.EXPANDABLE_LARGE_PAGE,
    }


@needs_native
def test_c_replay_was_configured_at_import() -> None:
    assert native._MODULE is not None
    assert native._MODULE.rules() == native.RULES


def test_c_source_holds_no_allocator_number() -> None:
    # rules.py is the only home of the numbers: outside comments and strings, _replay.c has no integer
    # literal of 512 or more (the smallest rule is kMinBlockSize = 512) and no shift that would build one
    src = (ROOT / "src" / "vramplan" / "alloc" / "_replay.c").read_text()
    code = re.sub(r"/\*.*?\*/", " ", src, flags=re.DOTALL)
    code = re.sub(r'"(\\.|[^"\\])*"', '""', code)
    code = "\n".join(line for line in code.splitlines() if not line.startswith("#include"))
    literals = [int(x) for x in re.findall(r"(?<![\w.])(\d+)(?:LL|L|ULL|U)?(?![\w.])", code)]
    assert literals and max(literals) < rules.K_MIN_BLOCK_SIZE
    assert "<<" not in code
    assert "#define" not in code.replace("#define PY_SSIZE_T_CLEAN", "")


@needs_native
def test_c_replay_follows_the_rules_it_is_given() -> None:
    # 1500 B rounds to 1536 B with rules.py's 512 B minimum block (3 x 512); reconfigured with a 1024 B
    # minimum block the C replay rounds it to 2048 B (2 x 1024), so it reads the rule it was given
    mod = native._MODULE
    assert mod is not None
    assert replay_compact([1500]).peak_allocated_bytes == 1536
    # expandable: 5 MiB maps one 20 MiB large page; with 10 MiB pages it maps one 10 MiB page
    assert replay_compact([5 * MiB], True).peak_reserved_bytes == 20 * MiB
    try:
        mod.configure(**{**native.RULES, "large_page": 10 * MiB})
        assert replay_compact([5 * MiB], True).peak_reserved_bytes == 10 * MiB
        mod.configure(**{**native.RULES, "min_block_size": 1024})
        assert replay_compact([1500]).peak_allocated_bytes == 2048
        with pytest.raises(ValueError, match="small_size must be > 0"):
            mod.configure(**{**native.RULES, "small_size": 0})
        with pytest.raises(TypeError):
            mod.configure(512)  # keyword-only, every rule named
    finally:
        mod.configure(**native.RULES)
    assert mod.rules() == native.RULES
    assert replay_compact([1500]).peak_allocated_bytes == 1536
    assert replay_compact([5 * MiB], True).peak_reserved_bytes == 20 * MiB


@needs_native
def test_c_replay_refuses_to_run_unconfigured() -> None:
    # the bare module, loaded without vramplan.alloc.native, has no rules and says so
    path = native._MODULE.__file__  # type: ignore[union-attr]
    code = ("import importlib.util as u\n"
            f"s = u.spec_from_file_location('vramplan.alloc._replay', {path!r})\n"
            "m = u.module_from_spec(s)\ns.loader.exec_module(m)\n"
            "assert m.rules() is None\n"
            "try:\n    m.replay([[1000]], -1)\nexcept RuntimeError as e:\n    print('refused:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("refused: _replay.configure() was not called")


# ---------------------------------------------------------------------------- hand-checked streams

def test_python_fallback_hand_checked_stream(python_replay: None) -> None:
    # 3 MiB: a 20 MiB segment (1 MiB < 3 MiB < 10 MiB), split (17 MiB left); 1000 B: a 2 MiB small
    # segment, 1024 B handed out; freeing both leaves 22 MiB reserved in two segments, nothing allocated
    assert not native.available()
    r = replay_compact([3 * MiB, 1000, -1, -2])
    assert (r.peak_allocated_bytes, r.peak_reserved_bytes, r.final_allocated_bytes) == (3 * MiB + 1024, 22 * MiB, 0)
    assert (r.num_allocs, r.num_frees, r.final_segments) == (2, 2, 2)


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
    assert r == _reference([[25 * MiB, 6 * MiB]], 30 * MiB)
    assert r2 == _reference([[25 * MiB, -1, 28 * MiB]], 30 * MiB)


@needs_native
def test_expandable_out_of_memory_record() -> None:
    # capacity 60 MiB, expandable segments of 20 MiB large pages; a segment reserves
    # round_up(60 + 60 / 8 = 67.5 MiB, 20 MiB) = 80 MiB of addresses.
    # 25 MiB: a new segment, 2 pages mapped (40 MiB), split: 25 MiB handed out, 15 MiB cached.
    # 30 MiB: no cached block fits; the unmapped [40, 80) MiB with the 15 MiB block before it holds 55 MiB;
    #   15 MiB more rounds up to one 20 MiB page (40 + 20 = 60 <= 60): a 35 MiB block, split 30 + 5 MiB.
    # 6 MiB: the 5 MiB block is too small; mapping one page more needs 80 MiB > 60 MiB; the retry unmaps
    #   nothing (the 5 MiB block at [55, 60) MiB holds no whole page) and fails: out of memory at event 2
    stream = [25 * MiB, 30 * MiB, 6 * MiB]
    r = replay_compact(stream, True, capacity_bytes=60 * MiB)
    assert r.expandable_segments and r.oom is not None
    assert (r.oom.event_index, r.oom.block_id, r.oom.device_request_bytes) == (2, 2, 20 * MiB)
    assert (r.oom.allocated_bytes, r.oom.reserved_bytes, r.oom.cached_released_bytes) == (55 * MiB, 60 * MiB, 0)
    assert (r.oom.largest_free_block_bytes, r.num_device_allocs, r.num_alloc_retries) == (5 * MiB, 2, 1)
    assert r.peak_segments == 1
    assert r == _reference([stream], 60 * MiB, True)
    # 25 MiB freed first: the retry unmaps its two pages (two device frees, the segment released), then maps
    # 40 MiB for the 30 MiB request in a new segment; the last request then fits in the 10 MiB left cached
    stream2 = [25 * MiB, -1, 30 * MiB, 6 * MiB]
    r2 = replay_compact(stream2, True, capacity_bytes=60 * MiB)
    assert r2 == _reference([stream2], 60 * MiB, True)
    assert r2.oom is None and r2.final_reserved_bytes == 40 * MiB and r2.final_allocated_bytes == 36 * MiB


@needs_native
def test_expandable_runs_in_c_not_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    # with the C replay available, expandable replays never build the reference CachingAllocator: it is
    # replaced by one that fails, and replay_compact, replay_parts and the engine's replay still answer
    # (and answer what the reference answered before)
    from vramplan.analytic.allocator import train_reserved_bytes
    from vramplan.analytic.train import train_step
    from vramplan.catalog.resolve import resolve

    stream = [25 * MiB, 30 * MiB, -1, 6 * MiB, 700 * 1024, -3]
    parts: list[Any] = [stream[:2], Repeat([3 * MiB, -3], [0, 1], 4)]
    want = (_reference([stream], None, True), _reference([stream], 60 * MiB, True), _reference(parts, None, True))
    r = resolve(EXAMPLES / "llama3-8b-fsdp-8xh100.yaml")
    layout = train_step(r).layout
    engine = train_reserved_bytes.__wrapped__          # not the lru_cache: replay again
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VRAMPLAN_NATIVE", "0")
        engine_want = engine(layout, True, r.gpu.total_memory_bytes)

    class NoReference:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise AssertionError("the expandable replay fell back to the Python reference")

    monkeypatch.setattr(vramplan.alloc, "CachingAllocator", NoReference)
    assert native.available()
    got = (replay_compact(stream, True), replay_compact(stream, True, capacity_bytes=60 * MiB),
           replay_parts(parts, True))
    assert got == want
    assert all(g.expandable_segments for g in got)
    assert engine(layout, True, r.gpu.total_memory_bytes) == engine_want
    monkeypatch.setenv("VRAMPLAN_NATIVE", "0")
    with pytest.raises(AssertionError, match="fell back"):
        replay_compact(stream, True)


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
    with pytest.raises(ValueError, match="address_space must be >= 0"):
        native._MODULE.replay([[1000]], -1, -5)  # type: ignore[union-attr]


def test_repeat_windows_and_expand() -> None:
    # window w frees w * stride ids further on: the free of id 1 (-2) becomes id 1 + 1 = 2 (-3), then 3 (-4)
    rep = Repeat([1000, -2], [0, 1], 3)
    assert rep.window(0) == [1000, -2]
    assert rep.window(2) == [1000, -4]
    assert expand([[3 * MiB], rep]) == [3 * MiB, 1000, -2, 1000, -3, 1000, -4]


@needs_native
@EXPANDABLE
def test_runs_expand_in_c(expandable: bool) -> None:
    # window w frees w ids further on: [1000, -1], [1000, -2], [1000, -3] after a 3 MiB block (id 0)
    # frees ids 0, 1, 2 in turn; every free is matched, 4 allocations and 3 frees
    parts: list[Any] = [[3 * MiB], Repeat([1000, -1], [0, 1], 3)]
    r = replay_parts(parts, expandable)
    assert (r.num_allocs, r.num_frees, r.unmatched_frees) == (4, 3, 0)
    assert r == replay_compact(expand(parts), expandable) == _reference(parts, None, expandable)


# ---------------------------------------------------------------------------- random programs

@needs_native
@EXPANDABLE
@settings(max_examples=300, deadline=None)
@given(OPS, st.one_of(st.none(), st.integers(0, 200 * MiB)), st.integers(0, 3))
def test_equals_the_reference(expandable: bool, ops: list[tuple[str, int]], capacity: int | None,
                              extra: int) -> None:
    events = to_events(ops)
    stream, ids = to_compact(events)
    stream = stream + [0] * extra + [-(len(ids) + 5)] * extra   # ignored zeros and unmatched frees
    model = replay(events, expandable, capacity_bytes=capacity)
    if model.oom is not None:  # the failing block under its compact id (the allocation's ordinal)
        model = replace(model, oom=replace(model.oom, block_id=len(ids) if model.oom.block_id not in ids
                                           else ids[model.oom.block_id]))
    assert native.available()
    ours = replay_compact(stream, expandable, capacity_bytes=capacity)
    assert ours == _reference([stream], capacity, expandable)   # run_compact, zeros and unmatched included
    if model.oom is None:
        assert replace(ours, unmatched_frees=0) == model  # to_events makes no unmatched frees
    else:
        assert ours.oom == model.oom


SIZE = st.sampled_from([512, 3000, 700 * 1024, 1 * MiB + 1, 5 * MiB, 12 * MiB + 1, 20 * MiB, 33 * MiB, 64 * MiB])


@st.composite
def periodic_programs(draw: st.DrawFn) -> list[list[int] | Repeat]:
    """A prefix of allocations (some freed), ``count`` windows of the same shape, and a suffix of frees.

    A window allocates some blocks, frees some of its own, and frees blocks made before it: by the
    previous windows (lag 1 to 3, stride = the window's allocation count) or by the prefix's chain of
    ``count + 3`` cells (stride +-cell size, newest or oldest first)."""
    count = draw(st.integers(2, 30))
    cell = draw(st.lists(SIZE, min_size=1, max_size=2))
    prefix: list[int] = []
    junk = draw(st.lists(SIZE, max_size=6))
    prefix += junk
    n_cells = count + 3
    cells0 = len(prefix)
    for _ in range(n_cells):
        prefix += cell
    allocs = draw(st.lists(SIZE, min_size=1, max_size=6))
    a = len(allocs)
    lags = draw(st.lists(st.tuples(st.integers(1, 3), st.integers(0, a - 1)), max_size=3, unique=True))
    max_lag = max((lag for lag, _ in lags), default=0)
    for _ in range(max_lag):                        # the windows before the run, for the lagged frees
        prefix += allocs
    frees_junk = draw(st.lists(st.integers(0, max(0, len(junk) - 1)), max_size=2, unique=True)) if junk else []
    for j in frees_junk:
        prefix.append(-j - 1)
    w0 = sum(1 for x in prefix if x > 0)            # id of window 0's first allocation
    events: list[int] = []
    strides: list[int] = []
    own_free = draw(st.lists(st.integers(0, a - 1), max_size=a, unique=True))
    remote = draw(st.sampled_from(["none", "newest", "oldest"]))
    which = draw(st.integers(0, len(cell) - 1))
    order = draw(st.permutations(range(a)))
    freed_own: set[int] = set()
    for pos in order:
        events.append(allocs[pos])
        strides.append(0)
        for o in own_free:
            if o <= pos and o not in freed_own and draw(st.booleans()):
                freed_own.add(o)
                events.append(-(w0 + order.index(o)) - 1)
                strides.append(a)
    for lag, k in lags:
        if k not in freed_own:
            events.append(-(w0 - lag * a + order.index(k)) - 1)
            strides.append(a)
    if remote != "none":
        c = n_cells - 1 if remote == "newest" else 0
        step = -len(cell) if remote == "newest" else len(cell)
        events.append(-(cells0 + c * len(cell) + which) - 1)
        strides.append(step)
    rep = Repeat(events, strides, count)
    suffix = [-(i + 1) for i in range(draw(st.integers(0, 20)))]
    return [prefix, rep, suffix]


@needs_native
@EXPANDABLE
@settings(max_examples=150, deadline=None)
@given(periodic_programs(), st.one_of(st.none(), st.floats(0.3, 1.05)))
def test_runs_equal_the_reference(expandable: bool, parts: list[list[int] | Repeat], cap_share: float | None) -> None:
    # the C replay expands each Repeat window by window itself; the reference replays the expanded stream
    unlimited = _reference(list(parts), None, expandable)
    cap = None if cap_share is None else int(unlimited.peak_reserved_bytes * cap_share)
    ours = replay_parts(parts, expandable, capacity_bytes=cap)
    assert ours == _reference(list(parts), cap, expandable)
    assert ours == replay_compact(expand(parts), expandable, capacity_bytes=cap)


def _cells_program(n: int, lag: int, cell: int, temp: int, keep: int) -> list[list[int] | Repeat]:
    """A layer-like run: ``n + 1`` cells of ``cell`` bytes made first (the forward's kept tensors), then ``n``
    windows that each borrow a temporary, free one cell, newest first (a remote stride), keep one block
    of ``keep`` bytes, and free the block kept ``lag`` windows earlier (a lag stride)."""
    prefix = [cell] * (n + 1)                       # ids 0..n: the cells
    k0 = n + 1
    for j in range(lag):                            # the windows before the run: ids k0 + 2j, k0 + 2j + 1
        prefix += [temp, keep, -(k0 + 2 * j) - 1]
    w0 = k0 + 2 * lag                               # id of window 0's first allocation
    # window 0: temp (w0), free it, free cell n, keep (w0 + 1), free the block kept by window -lag (k0 + 1)
    events = [temp, -w0 - 1, -(n + 1), keep, -(k0 + 1) - 1]
    strides = [0, 2, -1, 0, 2]
    return [prefix, Repeat(events, strides, n)]


@needs_native
@EXPANDABLE
@pytest.mark.parametrize("lag", [1, 2, 3])
def test_layer_like_runs_equal_the_reference(lag: int, expandable: bool) -> None:
    # 40 windows of 64 MiB cells, 30 MiB temporaries and 12 MiB kept blocks: every window's 2 allocations
    # and 3 frees are matched; unlimited and at capacities that release cached segments or run out
    parts = _cells_program(40, lag, 64 * MiB, 30 * MiB, 12 * MiB)
    plain = _reference(list(parts), None, expandable)
    assert (plain.num_allocs, plain.num_frees, plain.unmatched_frees) == (41 + 2 * lag + 80, lag + 120, 0)
    assert replay_parts(parts, expandable) == plain
    for cap in (plain.peak_reserved_bytes, plain.peak_reserved_bytes * 9 // 10, plain.peak_reserved_bytes // 2):
        assert replay_parts(parts, expandable, capacity_bytes=cap) == _reference(list(parts), cap, expandable)


# ---------------------------------------------------------------------------- the analytic engine's streams

def _train_layouts() -> list[tuple[str, Any, int]]:
    from vramplan.analytic.events import StepLayout
    from vramplan.analytic.train import train_step
    from vramplan.catalog.resolve import resolve

    docs: list[tuple[str, Any]] = [(p.name, p) for p in sorted(EXAMPLES.glob("*.yaml"))]
    docs += [
        ("mixtral zero3", {"model": "mistralai/Mixtral-8x7B-v0.1", "task": "train",
                           "hardware": {"gpu": "H100-80GB", "num_gpus": 8},
                           "train": {"micro_batch_size": 1, "seq_len": 2048, "gradient_checkpointing": "full"},
                           "parallel": {"zero_stage": 3}, "framework": "deepspeed"}),
        ("deepseek-v2-lite zero3", {"model": "deepseek-ai/DeepSeek-V2-Lite", "task": "train",
                                    "hardware": {"gpu": "H100-80GB", "num_gpus": 8},
                                    "train": {"micro_batch_size": 2, "seq_len": 1024,
                                              "gradient_checkpointing": "selective"},
                                    "parallel": {"zero_stage": 3}, "framework": "deepspeed"}),
    ]
    out: list[tuple[str, Any, int]] = []
    for name, doc in docs:
        r = resolve(doc)
        if r.scenario.task != "train":
            continue
        lay = train_step(r).layout
        assert isinstance(lay, StepLayout)
        out.append((name, lay, r.gpu.total_memory_bytes))
    return out


@needs_native
@EXPANDABLE
def test_engine_streams_equal_the_reference(expandable: bool) -> None:
    # every example's training stream and two MoE layouts, unlimited, at the device's memory and at
    # 100%, 80% and 50% of the unlimited peak (release-and-retry and out-of-memory paths)
    from vramplan.analytic.events import iter_run_parts, train_run_parts, train_run_stream

    layouts = _train_layouts()
    assert len(layouts) >= 10
    out_of_memory = 0
    for name, lay, device in layouts:
        parts = list(iter_run_parts(lay))
        assert expand(parts) == expand(train_run_parts(lay)) == train_run_stream(lay), name
        plain = _reference(parts, None, expandable)
        for cap in (None, device, plain.peak_reserved_bytes, plain.peak_reserved_bytes * 4 // 5,
                    plain.peak_reserved_bytes // 2):
            ours = replay_parts(parts, expandable, capacity_bytes=cap)
            assert ours == _reference(parts, cap, expandable), (name, cap)
            out_of_memory += ours.oom is not None
    assert out_of_memory > 0   # the out-of-memory path was compared too
