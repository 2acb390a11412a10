"""DeepSpeed ZeRO's buffers and ZeRO-3 parameter fetching (analytic/terms/deepspeed.py), by hand on Llama-2-7B.

Llama-2-7B: h = 4096, I = 11008, 32 layers, vocabulary 32,000, untied head.  One layer's tensors in the model's
order: q, k, v, o (4096^2 = 16,777,216 each), the two norms (4,096 each), gate, up, down (4096 x 11008 =
45,088,768 each): P = 4 x 16,777,216 + 2 x 4,096 + 3 x 45,088,768 = 202,383,360.  Head H = 32,000 x 4096 =
131,072,000.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vramplan.analytic.deepspeed import zero_settings
from vramplan.analytic.terms import deepspeed as ds
from vramplan.analytic.terms.base import Term
from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.terms.gradients import gradients
from vramplan.analytic.terms.optimizer_state import step_temporary
from vramplan.analytic.timeline import FORWARD
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.spec.scenario import Scenario

P = 202_383_360
H = 131_072_000


def _scenario(zero: int = 3, gpus: int = 2, **extra: Any) -> Scenario:
    doc: dict[str, Any] = {"model": "meta-llama/Llama-2-7b-hf", "task": "train",
                           "hardware": {"gpu": "H100-SXM", "num_gpus": gpus}, "parallel": {"zero_stage": zero}}
    for k, v in extra.items():
        if k in ("deepspeed", "offload"):
            doc["parallel"][k] = v
        elif k in ("framework", "software"):
            doc[k] = v
        else:
            doc.setdefault("train", {})[k] = v
    return Scenario.model_validate(doc)


def _ctx(s: Scenario) -> StepContext:
    return StepContext(resolve(s), 0, "flash", False)


def _bytes(terms: list[Term], name: str) -> int:
    return sum(t.nbytes for t in terms if t.name == name)


def test_defaults_by_framework() -> None:
    # DeepSpeed 0.19.8 runtime/zero/config.py; transformers' "auto": h^2, int(0.9 h^2), 10 h with h = 4096;
    # Lightning's DeepSpeedStrategy: 2e8 buckets, overlap_comm on
    own = zero_settings(_scenario(), 4096)
    assert (own.reduce_bucket_size, own.prefetch_bucket_size, own.param_persistence_threshold,
            own.max_live_parameters, own.max_reuse_distance, own.overlap_comm, own.contiguous_gradients) == \
        (500_000_000, 50_000_000, 100_000, 1_000_000_000, 1_000_000_000, True, True)
    assert not zero_settings(_scenario(zero=2), 4096).overlap_comm  # overlap_comm_valid: stage 3 only
    hf = zero_settings(_scenario(framework="hf-trainer"), 4096)
    assert (hf.reduce_bucket_size, hf.prefetch_bucket_size, hf.param_persistence_threshold) == \
        (16_777_216, 15_099_494, 40_960)  # 4096^2; int(0.9 x 16,777,216) = 15,099,494; 10 x 4096
    lt = zero_settings(_scenario(framework="lightning", zero=2), 4096)
    assert (lt.reduce_bucket_size, lt.allgather_bucket_size, lt.overlap_comm) == (200_000_000, 200_000_000, True)
    given_ = zero_settings(_scenario(deepspeed={"reduce_bucket_size": 1000}), 4096)
    assert given_.reduce_bucket_size == 1000 and given_.prefetch_bucket_size == 50_000_000


def test_zero3_reduce_bucket() -> None:
    # one bucket of reduce_bucket_size elements in bf16: 5e8 x 2 = 1,000,000,000 B
    assert _bytes(ds.reduce_buckets(_ctx(_scenario())), "deepspeed.reduce_bucket") == 1_000_000_000
    # contiguous_gradients off: no preallocated bucket
    assert _bytes(ds.reduce_buckets(_ctx(_scenario(deepspeed={"contiguous_gradients": False}))),
                  "deepspeed.reduce_bucket") == 0


def test_zero12_reduce_buckets_and_offload_staging() -> None:
    # ZeRO-2, overlap_comm: two buffers (setup_buckets "double buffers"): 2 x 1e6 x 2 B = 4,000,000
    c = _ctx(_scenario(zero=2, deepspeed={"reduce_bucket_size": 1_000_000, "overlap_comm": True}))
    assert _bytes(ds.reduce_buckets(c), "deepspeed.reduce_bucket") == 4_000_000
    # ZeRO-2 default (overlap_comm false): one, 5e8 x 2 = 1e9 B
    assert _bytes(ds.reduce_buckets(_ctx(_scenario(zero=2))), "deepspeed.reduce_bucket") == 1_000_000_000
    # offload_optimizer: temp_grad_buffer_for_gpu_offload of the largest parameter (the embedding or head,
    # 131,072,000 elements) in bf16: 262,144,000 B
    s = Scenario.model_validate({**_scenario(zero=2).model_dump(), "parallel": {"zero_stage": 2, "offload": "optimizer"}})
    assert _bytes(ds.reduce_buckets(_ctx(s)), "deepspeed.offload_staging") == 262_144_000


def test_zero3_persistent_parameters() -> None:
    # tensors of at most 1e5 elements: the 2 x 32 layer norms and the final norm, 65 x 4096 = 266,240 elements;
    # gathered in bf16 (532,480 B) less the shard counted as parameters (266,240 / 2 x 2 = 266,240 B)
    assert _bytes(ds.persistent(_ctx(_scenario())), "deepspeed.persistent") == 266_240


def test_zero3_persistent_lora_matrices() -> None:
    # LoRA r = 8 on all linears: A (8 x in) and B (out x 8) per linear, per layer q/k/v/o 4 x (32,768 + 32,768)
    # = 262,144; gate/up 32,768 + 88,064 each, down 88,064 + 32,768: 362,496; 624,640 per layer, 19,988,480 in all.
    # DeepSpeed's threshold 1e5 keeps every matrix: 19,988,480 x 2 B less the shard (19,988,480 B) = 19,988,480,
    # plus the norms' 266,240
    c = _ctx(_scenario(peft={"method": "lora", "target_modules": "all-linear"}))
    assert _bytes(ds.persistent(c), "deepspeed.persistent") == 19_988_480 + 266_240
    # the "auto" threshold 10 h = 40,960 drops gate/up's B and down's A (88,064 each): 262,144 + 3 x 32,768 =
    # 360,448 per layer, 11,534,336 in all; under hf-trainer the DeepSpeed engine casts the whole module, peft's fp32
    # adapters too, to the half dtype (Scenario.deepspeed_engine; terms/context.py step_policy): 11,534,336 x 2 B less
    # the shard (5,767,168 x 2 B) = 11,534,336 B; the norms (4,096 elements) still persist
    c = _ctx(_scenario(framework="hf-trainer", peft={"method": "lora", "target_modules": "all-linear"}))
    assert _bytes(ds.persistent(c), "deepspeed.persistent") == 11_534_336 + 266_240


def test_zero3_retained_layers_without_checkpointing() -> None:
    # D = 2 x (rest of the layer) + 2 x (later layers) + 2 H (no checkpointing); kept while D < 1e9.
    # Layer 31: D <= 2 x (P - 16,777,216) + 262,144,000 = 633,356,288: every tensor but the (persistent) norms,
    #   P - 8,192 = 202,375,168 elements.
    # Layer 30: D = 2 x after + 2P + 2H = 2 x after + 666,910,720: q (after 185,606,144: 1,038,123,008) and
    #   k (after 168,828,928: 1,004,568,576) released; v (971,014,144), o, gate, up, down kept:
    #   2 x 16,777,216 + 3 x 45,088,768 = 168,820,736 elements.
    # Layer 29: D >= 4P + 2H = 1,071,677,440: none.
    c = _ctx(_scenario())
    assert ds.retained_layers(c)[29:] == [0, 168_820_736, 202_375_168]
    assert sum(ds.retained_layers(c)) == 371_195_904
    terms = ds.zero3_gathered(c)
    # 371,195,904 x 2 B = 742,391,808 B, from the forward
    assert sum(t.nbytes for t in terms if t.name == "gathered.retained") == 742_391_808
    assert all(t.born == FORWARD for t in terms if t.name == "gathered.retained")
    # the running module: the head at the loss (131,072,000 x 2 = 262,144,000 B), then a layer's largest tensor
    # (45,088,768 x 2 = 90,177,536 B); prefetch min(5e7, 1e9 - 371,195,904) = 5e7 elements = 1e8 B
    assert _bytes(terms, "gathered.head") == 262_144_000
    assert _bytes(terms, "gathered") == 90_177_536
    assert _bytes(terms, "gathered.prefetch") == 100_000_000


def test_zero3_retained_with_checkpointing() -> None:
    # checkpointed layers run their forward again: D = (rest) + 3 x (later layers) + 2 H + (before).
    # Layer 31: D = P - t + 2H <= 202,383,360 - 4,096 + 262,144,000 < 1e9: all but the norms, 202,375,168.
    # Layer 30: D = 4P - t + 2H >= 1,071,677,440 - 45,088,768 = 1,026,588,672: none.
    c = _ctx(_scenario(gradient_checkpointing="full"))
    assert ds.retained_layers(c)[30:] == [0, 202_375_168]
    assert sum(ds.retained_layers(c)) == 202_375_168


def test_small_reuse_distance_releases_everything_and_live_cap_stops_prefetch() -> None:
    c = _ctx(_scenario(deepspeed={"stage3_max_reuse_distance": 0, "stage3_max_live_parameters": 0}))
    assert sum(ds.retained_layers(c)) == 0
    assert _bytes(ds.zero3_gathered(c), "gathered.prefetch") == 0


def test_zero3_gradients_resident_and_in_flight() -> None:
    # the flat gradient partition (stage3.py grad_partitions_flat_buffer) exists from the forward on
    c = _ctx(_scenario())
    assert all(t.born == FORWARD for t in gradients(c))
    # one parameter's full gradient on its way into the bucket: the layer's largest, 45,088,768 x 2 B
    inflight = ds.grad_in_flight(c)
    assert {t.nbytes for t in inflight} == {90_177_536} and len(inflight) == 32
    # without contiguous_gradients: up to the bucket plus one tensor, at most the layer (P x 2 B)
    c2 = _ctx(_scenario(deepspeed={"contiguous_gradients": False, "reduce_bucket_size": 10_000_000}))
    assert {t.nbytes for t in ds.grad_in_flight(c2)} == {(10_000_000 + 45_088_768) * 2}


def test_fsdp_and_zero0_untouched() -> None:
    for s in (_scenario(zero=0), Scenario.model_validate({**_scenario(zero=0).model_dump(),
                                                          "parallel": {"fsdp": "full_shard"}})):
        c = _ctx(s)
        assert ds.zero3_gathered(c) == [] and ds.reduce_buckets(c) == [] and ds.persistent(c) == []


def test_estimate_names_the_settings() -> None:
    rep = estimate(_scenario(framework="hf-trainer"))
    assert any("reduce_bucket_size 16,777,216" in a for a in rep.assumptions)
    unused = estimate(_scenario(zero=2, deepspeed={"stage3_max_live_parameters": 5}))
    assert any("parallel.deepspeed.stage3_max_live_parameters set but not used" in a for a in unused.assumptions)


@settings(max_examples=12, deadline=None)
@given(small=st.integers(1, 2_000_000_000), extra=st.integers(0, 2_000_000_000))
def test_terms_nonnegative_and_monotone_in_bucket_sizes(small: int, extra: int) -> None:
    """Every new term is >= 0, and a larger bucket (reduce, prefetch, live cap, reuse distance, persistence)
    never makes fewer bytes."""
    big = small + extra
    keys = ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_max_live_parameters",
            "stage3_max_reuse_distance", "stage3_param_persistence_threshold")

    def total(v: int) -> int:
        c = _ctx(_scenario(deepspeed=dict.fromkeys(keys, v)))
        terms = ds.reduce_buckets(c) + ds.persistent(c) + ds.zero3_gathered(c) + ds.grad_in_flight(c)
        assert all(t.nbytes >= 0 for t in terms)
        return sum(t.nbytes for t in terms)

    assert total(small) <= total(big)


@pytest.mark.parametrize("key", ["reduce_bucket_size", "stage3_prefetch_bucket_size"])
def test_bucket_terms_monotone_one_at_a_time(key: str) -> None:
    # reduce bucket: 1e6 -> 2e6 elements adds 1e6 x 2 B; prefetch: 1e6 -> 2e6 elements adds 1e6 x 2 B
    def total(v: int) -> int:
        c = _ctx(_scenario(deepspeed={key: v}))
        return sum(t.nbytes for t in ds.reduce_buckets(c) + ds.zero3_gathered(c))
    assert total(2_000_000) - total(1_000_000) == 2_000_000


def test_small_model_zero3_keeps_layers_gathered() -> None:
    """TinyLlama 1.1B (22 layers of 44,044,288 parameters, h = 2048, head 32,000 x 2048 = 65,536,000) on 2 GPUs:
    with DeepSpeed's reuse distance 1e9 and no checkpointing, a layer's parameters stay gathered while
    2 x (later layers + head) + 2 x (its own later tensors) < 1e9, about the last 9 layers, so ZeRO-3's backward
    exceeds ZeRO-2's; releasing every module (distance 0) brings it down.  (The backward, not the job's peak: ZeRO-2's
    step holds the flat partition beside its fp32 copy, ``test_zero2_step_norm_and_flatten``, and is its peak.)"""
    def backward(stage: int, distance: int | None = None) -> int:
        par: dict[str, Any] = {"zero_stage": stage}
        if distance is not None:
            par["deepspeed"] = {"stage3_max_reuse_distance": distance}
        sc = {"model": "TinyLlama/TinyLlama-1.1B-Chat-v1.0", "task": "train", "framework": "deepspeed",
              "hardware": {"gpu": "A100-80GB", "num_gpus": 2},
              "train": {"micro_batch_size": 2, "seq_len": 512}, "parallel": par}
        return estimate(sc).per_gpu.phases["backward"]
    assert backward(3) > backward(2)
    assert backward(3) > backward(3, 0)


def test_zero3_on_one_rank_counts_its_buffers_and_no_gathered_copy() -> None:
    from vramplan import estimate

    # stage3.py makes its reduce bucket and flat gradient partition whatever the world size: DeepSpeed's default
    # reduce_bucket_size 500,000,000 x 2 B (bf16) = 1,000,000,000 B, and the gradient partition of the whole model,
    # 6,738,415,616 x 2 B = 13,476,831,232; a partition world size of 1 gathers through NoGatherHandle (the partition
    # itself): nothing gathered, and the report says so instead of listing the fetching
    rep = estimate(_scenario(zero=3, gpus=1, framework="deepspeed"))
    assert any(a.startswith("DeepSpeed ZeRO-3 on one data-parallel rank") and "fetching copies nothing" in a
               for a in rep.assumptions)
    assert not any(a.startswith("DeepSpeed ZeRO-3 fetching") for a in rep.assumptions)
    grads = rep.per_gpu.breakdown_detail.get("gradients", {})
    assert grads.get("DeepSpeed reduce buckets") == 1_000_000_000
    assert grads.get("parameter gradients") == 13_476_831_232
    c = _ctx(_scenario(zero=3, gpus=1, framework="deepspeed"))
    assert ds.zero3(c) and not ds.fetches_copies(c) and ds.zero3_gathered(c) == [] and ds.persistent(c) == []
    # offloaded parameters are copied to the GPU when fetched (NoGatherHandle's ``.to(device)`` of a host partition)
    off = _ctx(_scenario(zero=3, gpus=1, framework="deepspeed", offload="optimizer+params"))
    assert ds.fetches_copies(off) and ds.zero3_gathered(off)
    rep = estimate(_scenario(zero=3, gpus=1, framework="deepspeed", offload="optimizer+params"))
    assert any(a.startswith("DeepSpeed ZeRO-3 fetching") for a in rep.assumptions)


def test_the_exported_config_carries_the_settings_estimated() -> None:
    from vramplan.export.deepspeed import deepspeed_config
    from vramplan.plan import TrainSetup
    from vramplan.spec.scenario import DeepSpeedZero, Parallel

    par = Parallel(zero_stage=2, deepspeed=DeepSpeedZero(reduce_bucket_size=2_000_000_000, overlap_comm=True))
    cfg = deepspeed_config(TrainSetup("deepspeed", 2, parallel=par, optimizer="adamw"))
    zero = cfg["zero_optimization"]
    assert (zero["stage"], zero["reduce_bucket_size"], zero["overlap_comm"]) == (2, 2_000_000_000, True)
    assert "stage3_max_live_parameters" not in zero  # a null setting is DeepSpeed's default: not written


def _step_terms(zero: int, gpus: int, **extra: Any) -> dict[str, int]:
    return {t.name: t.nbytes for t in ds.step_norm_and_flatten(_ctx(_scenario(zero, gpus, **extra)))}


def _step_extra(zero: int, gpus: int, **extra: Any) -> int:
    return _step_terms(zero, gpus, **extra).get("deepspeed.step_norm_and_flatten", 0)


def test_zero2_step_norm_and_flatten() -> None:
    """Llama-2-7B, 6,738,415,616 parameters; its largest tensors the embedding and the untied head, 32,000 x 4,096 =
    131,072,000 each.  AdamW's step makes no temporaries here (0), so the optimizer's own moment holds the fp32
    gradient copy, 4 B x the partition; the second term is what the step's earlier copies add to it."""
    # 2 ranks, bf16: partition 3,369,207,808; flat 2 B + fp32 4 B per element beside the gradients; the norm's fp64
    # copy 8 x 131,072,000 is smaller; no overflow check for bf16 (from 0.11.2): adds the flat copy, 2 x 3,369,207,808
    assert _step_terms(2, 2) == {"optimizer.step.fp32_gradients": 4 * 3_369_207_808,
                                 "deepspeed.step_norm_and_flatten": 6_738_415_616}
    # the fp32 copy is DeepSpeed's term now, not the generic step's
    assert _bytes(step_temporary(_ctx(_scenario(2, 2))), "optimizer.step.fp32_gradients") == 0
    # 64 ranks: partition 105,287,744 < 131,072,000, so the head's piece is the partition: the norm's copy
    # 8 x 105,287,744 = 842,301,952 beats flat + fp32 6 x 105,287,744 = 631,726,464; less fp32 4 x 105,287,744
    assert _step_extra(2, 64) == 842_301_952 - 421_150_976
    # fp16 is checked for overflow: 11 B (fp32 copy, three masks, float of the last) x 105,287,744 = 1,158,165,184
    assert _step_extra(2, 64, precision="fp16-mixed") == 1_158_165_184 - 421_150_976
    # ZeRO-1 checks the whole gradients (has_overflow_serial): 11 x 131,072,000 = 1,441,792,000
    assert _step_extra(1, 64, precision="fp16-mixed") == 1_441_792_000 - 421_150_976
    # from DeepSpeed 0.19.6 the check allocates nothing: back to the norm's copy
    assert _step_extra(2, 64, precision="fp16-mixed", software={"deepspeed": "0.19.8"}) == _step_extra(2, 64)
    # before 0.11.2 bf16 was checked too
    assert _step_extra(2, 64, software={"deepspeed": "0.10.3"}) == _step_extra(2, 64, precision="fp16-mixed")
    # fp32: the flat copy is the optimizer's gradient for the step, nothing beside it
    assert _step_terms(2, 2, precision="fp32") == {"optimizer.step.fp32_gradients": 4 * 3_369_207_808}


def test_zero3_steps_one_sub_group_at_a_time() -> None:
    """ZeRO-3 flattens and converts one sub-group at a time (sub_group_size 1e9; a sub-group closes at the parameter
    that reaches it, so it holds less than 1e9 + one parameter's partition).  Llama-2-7B on 2 ranks: partition
    3,369,207,808 > 1e9, the largest parameter's partition 131,072,000 / 2 = 65,536,000: a sub-group of at most
    1,065,536,000 elements, fp32 4 x = 4,262,144,000 and the flat bf16 copy 2 x = 2,131,072,000.  On 8 ranks the
    partition, 842,301,952, is one sub-group: 3,369,207,808 and 1,684,603,904.  On one rank the partition is the
    whole model, 6,738,415,616, stepped the same way (stage3.py does not look at the world size): at most 1e9 + the
    largest parameter, 131,072,000, = 1,131,072,000 elements: 4,524,288,000 and 2,262,144,000."""
    assert _step_terms(3, 2) == {"optimizer.step.fp32_gradients": 4_262_144_000,
                                 "deepspeed.step_norm_and_flatten": 2_131_072_000}
    assert _step_terms(3, 8) == {"optimizer.step.fp32_gradients": 3_369_207_808,
                                 "deepspeed.step_norm_and_flatten": 1_684_603_904}
    assert _step_terms(3, 1) == {"optimizer.step.fp32_gradients": 4_524_288_000,
                                 "deepspeed.step_norm_and_flatten": 2_262_144_000}


def test_zero3_offload_copies_each_gradient_partition_back_and_to_fp32() -> None:
    """ZeRO-3 with the optimizer offloaded (stage3.py ``partition_grads`` / ``_offload_grad_partition_at_boundary``):
    a partition's GPU copy in bf16 (2 B) and its fp32 conversion (4 B), one parameter at a time.  Llama-2-7B on one
    rank: a layer's largest tensor, an MLP weight of 11,008 x 4,096 = 45,088,768 -> 6 x = 270,532,608 B; the untied
    head with the last layer, 32,000 x 4,096 = 131,072,000 -> 786,432,000 B; the input embedding's in the epilogue,
    the same.  On 8 ranks the partitions are an eighth: 6 x 5,636,096 = 33,816,576 and 6 x 16,384,000 = 98,304,000."""
    terms = ds.zero3_offload_grad_copies(_ctx(_scenario(3, 1, offload="optimizer", framework="deepspeed")))
    by_layer = {t.layer: t.nbytes for t in terms if t.name == "deepspeed.offload_grad_copy"}
    assert len(by_layer) == 32 and by_layer[31] == 786_432_000 and by_layer[0] == 270_532_608
    assert _bytes(terms, "deepspeed.offload_grad_copy.embedding") == 786_432_000
    terms = ds.zero3_offload_grad_copies(_ctx(_scenario(3, 8, offload="optimizer", framework="deepspeed")))
    by_layer = {t.layer: t.nbytes for t in terms if t.name == "deepspeed.offload_grad_copy"}
    assert by_layer[0] == 33_816_576 and by_layer[31] == 98_304_000
    # fp32: the partition's copy only (its ``.to(fp32)`` is itself): 4 x 45,088,768
    terms = ds.zero3_offload_grad_copies(_ctx(_scenario(3, 1, offload="optimizer", framework="deepspeed",
                                                        precision="fp32")))
    assert {t.layer: t.nbytes for t in terms if t.name == "deepspeed.offload_grad_copy"}[0] == 180_355_072
    # not without the offload, nor under ZeRO-2 (its own norm copies)
    assert ds.zero3_offload_grad_copies(_ctx(_scenario(3, 1, framework="deepspeed"))) == []
    assert ds.zero3_offload_grad_copies(_ctx(_scenario(2, 2, offload="optimizer"))) == []


def test_zero2_offload_norm_and_overflow_copies() -> None:
    """ZeRO-2 with the optimizer offloaded, Llama-2-7B on 2 ranks (partition 3,369,207,808): each gradient's norm
    copy (8 B x its piece) and, before DeepSpeed 0.19.6, its overflow check's (11 B x the whole bf16 gradient), in
    the backward: a layer's largest tensor is an MLP weight, 11,008 x 4,096 = 45,088,768 -> 11 x = 495,976,448; the
    last layer's backward also reduces the untied head, 11 x 131,072,000 = 1,441,792,000; the input embedding's in
    the epilogue, the same."""
    c = _ctx(_scenario(2, 2, offload="optimizer"))
    terms = ds.offload_norm_copies(c)
    by_layer = {t.layer: t.nbytes for t in terms if t.name == "deepspeed.offload_norm"}
    assert len(by_layer) == 32 and by_layer[31] == 1_441_792_000
    assert {by_layer[j] for j in range(31)} == {495_976_448}
    assert _bytes(terms, "deepspeed.offload_norm.embedding") == 1_441_792_000
    # 0.19.6 on: the norm's copy only, 8 x 45,088,768 = 360,710,144 and 8 x 131,072,000 = 1,048,576,000
    terms = ds.offload_norm_copies(_ctx(_scenario(2, 2, offload="optimizer", software={"deepspeed": "0.19.6"})))
    by_layer = {t.layer: t.nbytes for t in terms if t.name == "deepspeed.offload_norm"}
    assert by_layer[0] == 360_710_144 and by_layer[31] == 1_048_576_000
    # not without the offload, and nothing of the step's kind with it
    assert ds.offload_norm_copies(_ctx(_scenario(2, 2))) == []
    assert ds.step_norm_and_flatten(c) == []


def test_zero3_overflow_check_never_sets_the_step() -> None:
    """stage3.py's overflow check up to 0.19.5 is ``float(x.float().sum())``: a 4 B copy of a piece, below the norm's
    8 B fp64 copy of the same piece, so fp16 and bf16 give the same step (Llama-2-7B on 8 ranks: the flat copy
    2 x 842,301,952 = 1,684,603,904 either way)."""
    assert _step_extra(3, 8, precision="fp16-mixed") == _step_extra(3, 8) == 1_684_603_904


def test_the_traced_engine_says_one_rank_zero_is_not_traced() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.trace.engine import estimate as trace_estimate

    # one data-parallel rank: the traced step is a plain single-GPU one; the analytic engine's ZeRO buffers are said
    doc = {"model": "meta-llama/Llama-3.2-1B", "framework": "deepspeed", "hardware": {"gpu": "h100", "num_gpus": 1},
           "train": {"micro_batch_size": 1, "seq_len": 128}, "parallel": {"zero_stage": 3}}
    rep = trace_estimate(doc)
    assert any(a.startswith("not modelled: DeepSpeed ZeRO-3 on one data-parallel rank") for a in rep.assumptions)
    plain = trace_estimate({**doc, "framework": "hf-trainer", "parallel": {"zero_stage": 0}})
    assert not any("DeepSpeed ZeRO" in a for a in plain.assumptions)
