"""The compact event stream (alloc/compact.py): ``Repeat`` runs of windows and their expansion.

The replays of a compact stream are compared in test_alloc_native.py (C replay against the reference
``CachingAllocator``, runs of windows included) and test_alloc_properties.py (against the
event-by-event replay).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vramplan.alloc import Repeat, expand
from vramplan.units import MiB

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_repeat_windows_and_expand() -> None:
    # window w frees w * stride ids further on: the free of id 1 (-2) becomes id 1 + 1 = 2 (-3), then 3 (-4)
    rep = Repeat([1000, -2], [0, 1], 3)
    assert rep.window(0) == [1000, -2]
    assert rep.window(2) == [1000, -4]
    assert expand([[3 * MiB], rep]) == [3 * MiB, 1000, -2, 1000, -3, 1000, -4]
    # an allocation keeps its size in every window (stride 0); zero windows expand to nothing
    assert expand([Repeat([5, -1], [0, 1], 2)]) == [5, -1, 5, -2]
    assert expand([Repeat([5, -1], [0, 1], 0), [7]]) == [7]


def _layouts() -> list[Any]:
    from vramplan.analytic.train import train_step
    from vramplan.catalog.resolve import resolve

    docs: list[Any] = [EXAMPLES / name for name in (
        "llama2-7b-full-naive-a100.yaml", "llama3-70b-zero3-offload-8xa100.yaml", "qlora-7b-rtx4090.yaml",
        "llama2-7b-zero3-ckpt-8xa100.yaml", "lora-llama3-8b-a10g.yaml", "gpt2-eager-fp32-t4.yaml")]
    docs += [
        {"model": "meta-llama/Meta-Llama-3-8B", "task": "train", "hardware": {"gpu": "H100-80GB", "num_gpus": 8},
         "train": {"micro_batch_size": 2, "seq_len": 4096}, "parallel": {"fsdp": "full_shard"},
         "framework": "accelerate"},
    ]
    out = []
    for doc in docs:
        lay = train_step(resolve(doc)).layout
        assert lay is not None
        out.append(lay)
    return out


def test_analytic_runs_expand_to_the_plain_stream() -> None:
    from vramplan.analytic.events import train_run_parts, train_run_stream

    repeated = 0
    for lay in _layouts():
        parts = train_run_parts(lay)
        assert expand(parts) == train_run_stream(lay)
        repeated += sum(p.count for p in parts if isinstance(p, Repeat))
    # the engine does write its layers as runs (Llama 3 70B alone has 80 layers forward and backward)
    assert repeated > 160
