"""Invariants, checked with hypothesis."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from vramplan import estimate

BASE: dict[str, Any] = {"model": "TinyLlama/TinyLlama-1.1B-Chat-v1.0", "task": "train", "hardware": {"gpu": "A100-80GB"}}
precisions = st.sampled_from(["fp32", "bf16-mixed", "bf16-true", "fp16-mixed"])
optimizers = st.sampled_from(["adamw", "adamw-fused", "adamw-8bit", "sgd", "lion", "adafactor", "paged-adamw"])
attn = st.sampled_from(["eager", "sdpa", "flash"])
ckpt = st.sampled_from(["none", "full", "selective"])


def _peak(**train: Any) -> int:
    return estimate({**BASE, "train": train}).per_gpu.peak_allocated_bytes


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 8), s=st.sampled_from([64, 256, 1024, 2048]), p=precisions, o=optimizers, a=attn, c=ckpt)
def test_monotone_in_batch_and_sequence(b: int, s: int, p: str, o: str, a: str, c: str) -> None:
    kw = {"precision": p, "optimizer": o, "attention": a, "gradient_checkpointing": c}
    assert _peak(micro_batch_size=b + 1, seq_len=s, **kw) >= _peak(micro_batch_size=b, seq_len=s, **kw)
    assert _peak(micro_batch_size=b, seq_len=2 * s, **kw) >= _peak(micro_batch_size=b, seq_len=s, **kw)


@settings(max_examples=30, deadline=None)
@given(b=st.integers(1, 8), s=st.sampled_from([128, 512, 2048]), p=precisions, a=attn)
def test_checkpointing_never_increases_the_peak(b: int, s: int, p: str, a: str) -> None:
    kw = {"micro_batch_size": b, "seq_len": s, "precision": p, "attention": a}
    none = _peak(gradient_checkpointing="none", **kw)
    assert _peak(gradient_checkpointing="selective", **kw) <= none
    assert _peak(gradient_checkpointing="full", **kw) <= none


@settings(max_examples=20, deadline=None)
@given(n=st.sampled_from([2, 4, 8, 16]), b=st.integers(1, 4), accum=st.integers(1, 4))
def test_zero_stages_are_ordered(n: int, b: int, accum: int) -> None:
    # with a ZeRO-3 that releases every module after use: under DeepSpeed's default stage3_max_reuse_distance
    # (1e9) a 1.1B model keeps its last layers gathered from their forward to their backward
    # (partitioned_param_coordinator.py __params_to_release), which can cost more than the shard saves
    # (test_small_model_zero3_keeps_layers_gathered)
    def peak(stage: int) -> int:
        par: dict[str, Any] = {"zero_stage": stage}
        if stage == 3:
            par["deepspeed"] = {"stage3_max_reuse_distance": 0}
        sc = {**BASE, "hardware": {"gpu": "A100-80GB", "num_gpus": n}, "framework": "deepspeed",
              "train": {"micro_batch_size": b, "seq_len": 512, "grad_accum_steps": accum},
              "parallel": par}
        return estimate(sc).per_gpu.peak_allocated_bytes

    p0, p1, p2, p3 = (peak(z) for z in (0, 1, 2, 3))
    assert p2 <= p1 <= p0
    # ZeRO-3's gradient partition is one flat buffer made at the optimizer's __init__ and resident from the forward
    # (stage3.py grad_partitions_flat_buffer), where ZeRO-2 makes its partition in the backward and frees it after
    # the step (stage_1_and_2.py copy_grads_in_partition, _release_ipg_buffers): on 2 GPUs the weights' half that
    # ZeRO-3 saves is what that partition costs, so ZeRO-3 is below ZeRO-2 only up to the partition
    # (1,100,048,384 parameters x 2 B / n)
    assert p3 <= p2 + 1_100_048_384 * 2 // n


@settings(max_examples=15, deadline=None)
@given(b=st.integers(1, 4))
def test_more_gpus_under_zero3_never_increase(b: int) -> None:
    prev = None
    for n in (1, 2, 4, 8, 16, 64):
        sc = {**BASE, "hardware": {"gpu": "A100-80GB", "num_gpus": n}, "framework": "deepspeed",
              "train": {"micro_batch_size": b, "seq_len": 1024}, "parallel": {"zero_stage": 3}}
        peak = estimate(sc).per_gpu.peak_allocated_bytes
        assert prev is None or peak <= prev
        prev = peak


@settings(max_examples=40, deadline=None)
@given(task=st.sampled_from(["train", "inference", "serve"]), b=st.integers(1, 16), p=precisions, o=optimizers,
       lora=st.booleans(), tp=st.sampled_from([1, 2, 4]))
def test_breakdown_sums_to_peak(task: str, b: int, p: str, o: str, lora: bool, tp: int) -> None:
    train: dict[str, Any] = {"micro_batch_size": b, "seq_len": 256, "precision": p, "optimizer": o}
    if lora:
        train["peft"] = {"method": "lora", "rank": 8}
    sc = {**BASE, "task": task, "hardware": {"gpu": "H100-SXM", "num_gpus": tp}, "train": train,
          "parallel": {"tp": tp}, "inference": {"batch_size": b}}
    r = estimate(sc)
    pg = r.per_gpu
    assert sum(pg.breakdown.values()) == pg.peak_allocated_bytes
    for key, parts in pg.breakdown_detail.items():
        assert sum(parts.values()) == pg.breakdown[key]
    assert pg.peak_reserved_bytes >= pg.peak_allocated_bytes
    assert pg.device_used_bytes == pg.peak_reserved_bytes + sum(pg.outside_allocator.values())
    assert pg.headroom_bytes == pg.capacity_bytes - pg.device_used_bytes
