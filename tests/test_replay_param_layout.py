"""The allocator replay's parameter tensors: each layer its own, transformers 5's experts one tensor per projection.

The caching allocator's pool and segment depend on a request's size (requests of 1-10 MB share 20 MiB segments,
larger ones get a segment of their own rounded to 2 MiB: c10/cuda/CUDACachingAllocator.cpp ``get_allocation_size``),
so the replay must see the tensors the model really holds.  A hybrid's layers differ, and transformers 5 holds a MoE
layer's experts as one 3-D parameter per projection; averaging them over the layers or splitting them per expert
makes blocks the run never makes.
"""

from __future__ import annotations

import pytest

from vramplan.analytic.layout import rank_layer_tensors, rank_params, rank_tensors
from vramplan.catalog.resolve import resolve

NEMOTRON3 = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"


def _model(mid: str):  # type: ignore[no-untyped-def]
    return resolve({"model": mid, "hardware": {"gpu": "a100"}}).model


def test_hybrid_layers_hold_their_own_tensors() -> None:
    # Nemotron 3 Nano: 52 layers, 23 Mamba2 mixers, 23 MoE blocks, 6 attention layers (h = 2688)
    m = _model(NEMOTRON3)
    rp = rank_params(m, 1, 1, 1, 0, None)
    layers = rank_layer_tensors(m, rp, 1, fused_experts=True)
    assert len(layers) == 52
    moe = layers[1]
    # norm 2688; router 128 x 2688 = 344,064 and its correction bias 128; the fused experts up_proj [128, 1856, 2688]
    # = 638,582,784 and down_proj [128, 2688, 1856] alike; the shared expert's up and down 3712 x 2688 = 9,977,856
    assert moe == (2688, 344_064, 128, 638_582_784, 638_582_784, 9_977_856, 9_977_856)
    # an attention layer: the norm, q 2688 x 4096 = 11,010,048, k and v 2688 x 256 = 688,128, o as q
    assert layers[5] == (2688, 11_010_048, 688_128, 688_128, 11_010_048)
    # every layer kind once per layer it is: the layers' tensors sum to the model's layer parameters
    outside = sum(rank_tensors(m, rp, 1)[1])
    assert sum(map(sum, layers)) + outside == m.num_parameters


def test_experts_per_expert_on_transformers_4() -> None:
    # 4.x held each expert as its own linear: 128 tensors of 1856 x 2688 = 4,988,928 per projection
    m = _model(NEMOTRON3)
    layer = rank_layer_tensors(m, rank_params(m, 1, 1, 1, 0, None), 1, fused_experts=False)[1]
    assert layer.count(4_988_928) == 256 and len(layer) == 5 + 256


def test_dense_model_lists_unchanged() -> None:
    # a model whose groups all span every layer: each layer's list is rank_tensors' one-layer list
    m = _model("meta-llama/Llama-3.1-8B")
    rp = rank_params(m, 1, 1, 1, 0, None)
    inner, _ = rank_tensors(m, rp, 1)
    assert set(rank_layer_tensors(m, rp, 1)) == {tuple(x for x, _ in inner)}


def test_nemotron3_lora_reserved_close_to_allocated() -> None:
    # LoRA on the attention, batch 1 x 512 on an A100: the step's reserved bytes were 11.2 GB above its allocated
    # bytes when the experts were replayed as 13,312 blocks of 4.4 MB (each 20 MiB segment holding four, 3.3 MB of
    # it never used: 58.7 GB x (20,971,520 / 17,653,760 - 1) = 11.0 GB); the traced engine, whose replay reads the
    # real tensors, keeps 0.7 GiB above allocated
    from vramplan import estimate

    doc = {"model": NEMOTRON3, "hardware": {"gpu": "A100-80GB"}, "task": "train",
           "train": {"micro_batch_size": 1, "seq_len": 512, "precision": "bf16-true",
                     "peft": {"method": "lora", "rank": 8, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}}}
    g = estimate(doc).per_gpu
    assert g.peak_reserved_bytes - g.peak_allocated_bytes < 1.0 * 2**30
    assert g.peak_reserved_bytes < 67 * 2**30  # 76.42 GiB before


def test_nemotron3_lora_reserved_matches_trace() -> None:
    pytest.importorskip("torch")
    from vramplan import estimate
    from vramplan.trace import estimate as trace_estimate

    doc = {"model": NEMOTRON3, "hardware": {"gpu": "A100-80GB"}, "task": "train",
           "train": {"micro_batch_size": 1, "seq_len": 512, "precision": "bf16-true",
                     "peft": {"method": "lora", "rank": 8, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}}}
    a, t = estimate(doc).per_gpu, trace_estimate(doc).per_gpu
    # measured here: analytic 65.99 GiB, traced 65.78 GiB
    assert abs(a.peak_reserved_bytes - t.peak_reserved_bytes) < 0.01 * t.peak_reserved_bytes


OLMOE = "allenai/OLMoE-1B-7B-0924"


def test_fused_gate_up_is_one_tensor() -> None:
    # OLMoE: 64 experts of I = 1024 on h = 2048 in each of 16 layers; transformers 5 holds gate_up_proj [64, 2048, 2048]
    # = 268,435,456 elements and down_proj [64, 2048, 1024] = 134,217,728
    m = _model(OLMOE)
    layer = rank_layer_tensors(m, rank_params(m, 1, 1, 1, 0, None), 1, fused_experts=True)[0]
    assert 268_435_456 in layer and 134_217_728 in layer
    assert layer.count(64 * 1024 * 2048) == 1  # down only: gate and up are no longer two tensors of that size


def _load_plan(model: str, transformers: str | None = None):  # type: ignore[no-untyped-def]
    from vramplan.analytic.lifecycle.load import load_plan
    from vramplan.analytic.train import train_step

    doc: dict[str, object] = {"model": model, "hardware": {"gpu": "H100-80GB"},
                              "train": {"seq_len": 512, "micro_batch_size": 1, "precision": "bf16-true",
                                        "peft": {"method": "lora"}}}
    if transformers:
        doc["software"] = {"transformers": transformers}
    c = train_step(resolve(doc)).context
    assert c is not None
    return load_plan(c)


def test_load_stacks_per_expert_checkpoint_tensors() -> None:
    # transformers 5 loads OLMoE's per-expert checkpoint tensors on the GPU and stacks them there (MergeModulelist,
    # then Concatenate for gate and up): each fused tensor's pieces are as large as it and alive while it is made.
    # bf16: gate_up 268,435,456 x 2 = 536,870,912 B, down 268,435,456 B; 16 layers, two each
    plan = _load_plan(OLMOE)
    staged = [(n, s) for n, s in zip(plan.sizes, plan.staging, strict=True) if s]
    assert len(staged) == 32 and all(n == s for n, s in staged)
    assert {n for n, _ in staged} == {536_870_912, 268_435_456}
    # transformers 4.x: 64 x 3 per-expert linears a layer, nothing stacked
    old = _load_plan(OLMOE, "4.46")
    assert not any(old.staging) and old.sizes.count(1024 * 2048 * 2) == 16 * 64 * 3


def test_fused_checkpoints_are_not_stacked() -> None:
    # gpt-oss ships its experts fused (no converter in transformers 5.24): loaded as they are
    assert not any(_load_plan("openai/gpt-oss-20b").staging)


def test_quantized_linears_take_their_format_bytes_in_the_replay() -> None:
    # Llama-2-7B QLoRA (nf4): each q_proj is 4096 x 4096 = 16,777,216 elements, 8,388,608 B of codes and 262,144 fp32
    # absmax = 9,437,184 B (weights.py quantized_linear_bytes); the embedding, 32,000 x 4096 = 131,072,000 elements,
    # is not quantized (2 or 4 B an element: prepare_model_for_kbit_training casts it to fp32).  One average over
    # both had made the q_proj block 0.6 B an element and the embedding's too
    from vramplan.analytic.train import train_step
    from vramplan.analytic.weights import quantized_linear_bytes

    r = resolve({"model": "meta-llama/Llama-2-7b-hf", "hardware": {"gpu": "A100-40GB"},
                 "train": {"micro_batch_size": 1, "seq_len": 512, "quantization": "nf4",
                           "peft": {"method": "qlora", "rank": 16}}})
    lay = train_step(r).layout
    assert lay is not None
    q = quantized_linear_bytes(4096 * 4096, 4096, "nf4")
    assert q == 9_437_184
    # within the rounding of the shared scale (the rank's linears' rows differ: q/k/v/o 4096, gate/up 11008)
    assert any(abs(x - q) <= q // 100 for x in lay.layers[0].params)
    assert max(lay.param_tensors) >= 2 * 131_072_000
