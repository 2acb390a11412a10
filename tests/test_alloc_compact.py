"""The fast default-configuration replay (alloc/compact.py) and its skipping of mirrored windows.

Every test compares with the event-by-event replay: ``replay_parts`` must give the ``ReplayResult`` of
``replay_compact`` on the expanded stream (which a property test in test_alloc_properties.py checks
against ``CachingAllocator`` itself), field by field, out of memory included.  The C replay
(``alloc/native.py``) is switched off here, so that both sides are the Python replay;
test_alloc_native.py compares the C replay with it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vramplan.alloc import Repeat, compact_result, expand, replay_compact, replay_parts
from vramplan.alloc.compact import CompactReplay
from vramplan.units import MiB

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(autouse=True, scope="module")
def _python_replay() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VRAMPLAN_NATIVE", "0")
        yield


def test_repeat_windows_and_expand() -> None:
    # window w frees w * stride ids further on: the free of id 1 (-2) becomes id 1 + 1 = 2 (-3), then 3 (-4)
    rep = Repeat([1000, -2], [0, 1], 3)
    assert rep.window(0) == [1000, -2]
    assert rep.window(2) == [1000, -4]
    assert expand([[3 * MiB], rep]) == [3 * MiB, 1000, -2, 1000, -3, 1000, -4]


def test_plain_stream_statistics() -> None:
    # 3 MiB: a 20 MiB segment (1 MiB < 3 MiB < 10 MiB), split (17 MiB left); 1000 B: a 2 MiB small
    # segment, 1024 B handed out; freeing both leaves 22 MiB reserved, nothing allocated
    c = CompactReplay()
    assert c.run([3 * MiB, 1000, -1, -2])
    assert (c.peak_allocated_bytes, c.peak_reserved_bytes, c.allocated_bytes) == (3 * MiB + 1024, 22 * MiB, 0)
    assert (c.num_allocs, c.num_frees, c.segments) == (2, 2, 2)


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


@pytest.mark.parametrize("lag", [1, 2, 3])
def test_mirrored_windows_are_skipped_and_exact(lag: int) -> None:
    parts = _cells_program(40, lag, 64 * MiB, 30 * MiB, 12 * MiB)
    plain = replay_compact(expand(parts))
    c = CompactReplay()
    assert c.run_parts(parts)
    assert c.skipped_windows > 0
    assert compact_result(c) == plain
    for cap in (plain.peak_reserved_bytes, plain.peak_reserved_bytes * 9 // 10, plain.peak_reserved_bytes // 2):
        assert replay_parts(parts, capacity_bytes=cap) == replay_compact(expand(parts), capacity_bytes=cap)


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


@settings(max_examples=150, deadline=None)
@given(periodic_programs(), st.one_of(st.none(), st.floats(0.3, 1.05)))
def test_skipping_equals_plain_replay(parts: list[list[int] | Repeat], cap_share: float | None) -> None:
    plain_free = replay_compact(expand(parts))
    cap = None if cap_share is None else int(plain_free.peak_reserved_bytes * cap_share)
    assert replay_parts(parts, capacity_bytes=cap) == replay_compact(expand(parts), capacity_bytes=cap)


def _layouts() -> list[tuple[Any, int]]:
    from vramplan.analytic.train import train_step
    from vramplan.spec.load import resolve

    docs: list[Any] = [EXAMPLES / name for name in (
        "llama2-7b-full-naive-a100.yaml", "llama3-70b-zero3-offload-8xa100.yaml", "qlora-7b-rtx4090.yaml",
        "llama2-7b-zero3-ckpt-8xa100.yaml", "lora-llama3-8b-a10g.yaml", "gpt2-eager-fp32-t4.yaml")]
    docs += [
        {"model": "mistralai/Mixtral-8x7B-v0.1", "task": "train", "hardware": {"gpu": "H100-80GB", "num_gpus": 8},
         "train": {"micro_batch_size": 1, "seq_len": 2048, "gradient_checkpointing": "full"},
         "parallel": {"zero_stage": 3}, "framework": "deepspeed"},
        {"model": "deepseek-ai/DeepSeek-V2-Lite", "task": "train", "hardware": {"gpu": "H100-80GB", "num_gpus": 8},
         "train": {"micro_batch_size": 2, "seq_len": 1024, "gradient_checkpointing": "selective"},
         "parallel": {"zero_stage": 3}, "framework": "deepspeed"},
        {"model": "meta-llama/Meta-Llama-3-8B", "task": "train", "hardware": {"gpu": "H100-80GB", "num_gpus": 8},
         "train": {"micro_batch_size": 2, "seq_len": 4096}, "parallel": {"fsdp": "full_shard"},
         "framework": "accelerate"},
    ]
    out = []
    for doc in docs:
        r = resolve(doc)
        lay = train_step(r).layout
        assert lay is not None
        out.append((lay, r.gpu.total_memory_bytes))
    return out


def test_analytic_streams_skip_exactly() -> None:
    from vramplan.analytic.events import train_run_parts, train_run_stream

    skipped = 0
    for lay, device in _layouts():
        parts = train_run_parts(lay)
        stream = train_run_stream(lay)
        assert expand(parts) == stream
        peak = replay_compact(stream).peak_reserved_bytes
        for cap in (None, device, peak, peak * 4 // 5, peak // 2):
            c = CompactReplay(cap)
            c.run_parts(parts)
            assert compact_result(c) == replay_compact(stream, capacity_bytes=cap)
            skipped += c.skipped_windows
    # the skipping is used (Llama 3 70B's forward and backward passes mirror over most layers)
    assert skipped > 500
