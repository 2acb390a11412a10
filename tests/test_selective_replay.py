"""The allocator's event stream and the timeline agree under selective checkpointing, and the allocator runs with
expandable segments where the launcher sets them.

The event stream (analytic/events.py) used to record every saved tensor of a layer under torchtitan's op-level
selective checkpointing (and Megatron's attention-core), as if nothing were recomputed, while the timeline kept only
the policy's share: the replay's allocated peak was the no-checkpointing one (75.08 GiB against the timeline's
41.58 GiB for the scenario below), and the reserved bytes that the report takes from the replay came out near it.
"""

from __future__ import annotations

from typing import Any

import pytest

from vramplan import estimate
from vramplan.analytic.allocator import train_reserved_bytes
from vramplan.analytic.train import train_step
from vramplan.catalog.resolve import resolve


def _titan(gc: str, **software: Any) -> dict[str, Any]:
    return {"model": "meta-llama/Meta-Llama-3-8B", "task": "train", "framework": "torchtitan",
            "hardware": {"gpu": "H100-SXM", "num_gpus": 8},
            "train": {"micro_batch_size": 1, "seq_len": 8192, "precision": "bf16-mixed", "optimizer": "adamw",
                      "gradient_checkpointing": gc, "attention": "flash"},
            "parallel": {"fsdp": "full_shard"}, "software": software}


@pytest.mark.parametrize("gc", ["none", "full", "op-sac", "selective"])
def test_the_replays_allocated_peak_is_the_timelines(gc: str) -> None:
    # the two views of one step: the replay's peak allocated bytes equal the moments' peak to within one
    # allocator rounding per tensor (512 B blocks; 0.1 % is far above it and far below the 80 % gap it had)
    tr = train_step(resolve(_titan(gc)))
    assert tr.layout is not None
    allocated, reserved = train_reserved_bytes(tr.layout)
    assert abs(allocated - tr.peak.total) <= 0.001 * tr.peak.total, (allocated, tr.peak.total)
    assert reserved >= allocated


def test_op_sac_records_the_policys_share_only() -> None:
    # op-sac keeps less than no checkpointing and more than full checkpointing, in both views
    peaks = {gc: train_reserved_bytes(train_step(resolve(_titan(gc))).layout)[0]  # type: ignore[arg-type]
             for gc in ("none", "op-sac", "full")}
    assert peaks["full"] < peaks["op-sac"] < peaks["none"]


def test_torchtitan_runs_with_expandable_segments_by_default() -> None:
    rep = estimate(_titan("full"))
    assert any("expandable_segments:True (torchtitan's run_train.sh" in a for a in rep.assumptions)
    off = estimate(_titan("full", expandable_segments=False))
    assert not any("expandable_segments:True" in a for a in off.assumptions)
    given = estimate(_titan("full", expandable_segments=True))
    assert any("expandable_segments:True (as given)" in a for a in given.assumptions)
    # the same tensors either way; only the reserved bytes may move
    assert rep.per_gpu.peak_allocated_bytes == off.per_gpu.peak_allocated_bytes
    # another framework keeps PyTorch's default unless told
    hf = {**_titan("full"), "framework": "hf-trainer"}
    assert not any("expandable_segments" in a for a in estimate(hf).assumptions)


def test_expandable_segments_outside_training_is_set_but_not_used() -> None:
    doc = {"model": "meta-llama/Meta-Llama-3-8B", "task": "inference", "hardware": {"gpu": "H100-SXM"},
           "software": {"expandable_segments": True}}
    assert any(a.startswith("software.expandable_segments set but not used") for a in estimate(doc).assumptions)
