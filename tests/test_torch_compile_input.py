"""train.torch_compile is accepted and stated as not modelled: the eager step is counted, the band widens, and
measure (which runs the eager step) refuses it."""

from __future__ import annotations

from typing import Any

from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.measure.build import unsupported


def _doc(compile_: bool) -> dict[str, Any]:
    return {"model": "meta-llama/Llama-3.2-1B", "hardware": {"gpu": "A100-80GB"},
            "train": {"seq_len": 2048, "micro_batch_size": 4, "precision": "bf16-true", "peft": {"method": "lora"},
                      "torch_compile": compile_}}


def test_compiled_step_is_the_eager_estimate_with_a_wider_band() -> None:
    eager, compiled = estimate(_doc(False)), estimate(_doc(True))
    # the point estimate is the eager step's
    assert compiled.per_gpu.peak_allocated_bytes == eager.per_gpu.peak_allocated_bytes
    notes = [a for a in compiled.assumptions if a.startswith("not modelled: train.torch_compile")]
    assert len(notes) == 1 and "min-cut partitioner" in notes[0]
    assert not any("torch_compile" in a for a in eager.assumptions)
    # a report carrying a "not modelled:" assumption takes the widest calibrated class (train-full's, wider than
    # the LoRA class this scenario is in): never narrower, here strictly wider
    assert compiled.per_gpu.device_used_bytes_high >= eager.per_gpu.device_used_bytes_high
    assert compiled.per_gpu.device_used_bytes_low <= eager.per_gpu.device_used_bytes_low
    assert (compiled.per_gpu.device_used_bytes_high - compiled.per_gpu.device_used_bytes_low
            > eager.per_gpu.device_used_bytes_high - eager.per_gpu.device_used_bytes_low)


def test_measure_refuses_a_compiled_step() -> None:
    problems = unsupported(resolve(_doc(True)), "cuda")
    assert [p.where for p in problems] == ["train.torch_compile"]
    assert unsupported(resolve(_doc(False)), "cuda") == []
