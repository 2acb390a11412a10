"""The analytic event stream (analytic/events.py) replayed through the allocator model."""

from __future__ import annotations

from pathlib import Path

from vramplan.alloc import replay
from vramplan.analytic.events import reconcile, split_exact, train_run_events
from vramplan.analytic.train import train_step
from vramplan.catalog.resolve import resolve

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_split_and_reconcile_sum_exactly() -> None:
    # 10 over three equal weights: 3 + 3 + 4 (the last takes the rounding)
    assert split_exact(10, [1, 1, 1]) == [3, 3, 4]
    # below the closed-form total: the difference (5) is a tensor just before the layer's output (4)
    assert reconcile([1, 2, 4], 12) == [1, 2, 5, 4]
    # above it: proportional shrink, 7 -> 3.5 becomes [0, 1, 2] + rounding = sum 3
    assert sum(reconcile([1, 2, 4], 3)) == 3


def test_stream_peak_allocated_matches_closed_form() -> None:
    # Llama-2-7B, bf16-mixed AdamW, no checkpointing: the stream holds the closed-form terms split into
    # tensors, so its allocated peak (512-byte rounding, unsplit blocks) is within 0.5% of the closed form
    # (146.46 vs 146.41 GiB when written).
    tr = train_step(resolve(EXAMPLES / "llama2-7b-full-naive-a100.yaml"))
    assert tr.layout is not None
    res = replay(train_run_events(tr.layout))
    assert abs(res.peak_allocated_bytes / tr.peak.total - 1) < 0.005
    # reserved >= allocated, and fragmentation is counted: more than the 2 MiB segment rounding
    assert res.peak_reserved_bytes > res.peak_allocated_bytes + 64 * 2**20
