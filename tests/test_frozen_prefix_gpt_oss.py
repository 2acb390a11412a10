"""Hand oracles for the frozen prefix under PEFT and for gpt-oss's own memory terms.

The frozen prefix: without checkpointing nothing requires grad before the first adapter, so an MLP
whose input is frozen saves only what its own adapters need (activations.frozen_input_mlp).  gpt-oss:
the sinks' softmax, the clamped SwiGLU of its experts, its RMSNorm's fp32 product, its top-k router,
the eager fallback of its missing SDPA path, and the shrink that cuts its ``layer_types``.  The
engine-agreement rows for both are in test_trace_matrix.py.
"""

from __future__ import annotations

from dataclasses import replace

from vramplan.analytic import activations as act
from vramplan.analytic.attention import resolve_attention
from vramplan.analytic.inference import _grouped_experts_width, softmax_bytes_per_score
from vramplan.catalog.resolve import resolve
from vramplan.spec.model import LayerSpec, ModelSpec
from vramplan.trace.shrink import catalog_config, shrink

OSS = "openai/gpt-oss-20b"


def _model(model: object) -> ModelSpec:
    return resolve({"model": model, "hardware": {"gpu": "h100"}}).model


def _ctx(**kw: object) -> act.ActContext:
    base = act.ActContext(compute_bytes=2, residual_bytes=4, linear_input_bytes=2, autocast=True, attention="flash",
                          gqa_repeat=False, seq_len=512)
    return replace(base, **kw)  # type: ignore[arg-type]


def _moe_layer(m: ModelSpec) -> LayerSpec:
    return next(ls for ls in m.layers if ls.moe)


def test_shrink_cuts_layer_types_keeping_the_pattern() -> None:
    cfg = shrink(catalog_config(OSS), layers=3)
    assert cfg["num_hidden_layers"] == 3
    assert cfg["layer_types"] == ["sliding_attention", "full_attention", "sliding_attention"]
    # the spec reads the windows from the cut list: 128-token window on layers 0 and 2
    assert [ls.sliding_window for ls in _model(cfg).layers] == [128, None, 128]


def test_frozen_input_moe_saves_only_the_down_adapters_input() -> None:
    # shrunk Qwen3-MoE: h 256, I 96, top-2, 8 experts; bf16 experts (w 2), LoRA on down_proj only (ParamWrapper)
    m = _model(shrink(catalog_config("Qwen/Qwen3-30B-A3B"), vocab=2048))
    ctx = _ctx(residual_bytes=2, frozen_base=True, expert_bytes=2, down_wrapped=True)
    ls = _moe_layer(m)
    # frozen input: only the product (down's input) for the adapted weight's gradient, 2 x 2 x 96 = 384 B
    assert act.frozen_input_mlp(m, ls, ctx) == (384, True)
    # input requiring grad: per routed token gate/up output 2 x 192, activation 2 x 96, product 2 x 96,
    # down output 2 x 256 = 1,280, top-2 -> 2,560, plus router logits and fp32 softmax (2 + 4) x 8 = 48
    assert act.mlp_saved(m, ls, ctx) == 2_608
    # a router adapter makes the routing weights require grad: the router keeps x (autocast copy, 2 x 256),
    # its logits and softmax (48), and each routed down output (2 x 256) is saved for them
    with_router = replace(ctx, router_wrapped=True)
    assert act.frozen_input_mlp(m, ls, with_router) == (384 + 512 + 48 + 2 * 512, True)
    # no expert adapter at all: nothing recorded, the residual stays frozen for the next layer
    assert act.frozen_input_mlp(m, ls, replace(ctx, down_wrapped=False)) == (0, False)


def test_frozen_input_dense_mlp() -> None:
    # shrunk Llama: h 256, I 896; bf16 frozen base under autocast, fp32 adapters of rank 16
    m = _model(shrink(catalog_config("meta-llama/Llama-3.1-8B"), vocab=2048))
    ls = m.layers[0]
    inter = ls.intermediate_size
    assert inter == 896
    down = _ctx(residual_bytes=2, frozen_base=True, lora_targets=frozenset({"down_proj"}), lora_rank=16)
    # down only: the adapter's half copy of the product (2 x 896) and lora_A's output (2 x 16)
    assert act.frozen_input_mlp(m, ls, down) == (2 * 896 + 2 * 16, True)
    gate = replace(down, lora_targets=frozenset({"gate_proj"}))
    # gate only: its adapter's input copy (2 x 256) and lora_A output (2 x 16); the gate output saved by SiLU
    # and the up output saved by the product for the activation's gradient (2 x 2 x 896); the activation
    # output is not saved (the up output needs no gradient)
    assert act.frozen_input_mlp(m, ls, gate) == (2 * 256 + 2 * 16 + 2 * 2 * 896, True)
    assert act.frozen_input_mlp(m, ls, replace(down, lora_targets=frozenset({"q_proj"}))) == (0, False)


def test_eager_prefix_keeps_no_query_without_a_key_adapter() -> None:
    # LoRA on q_proj and v_proj, eager attention: q @ k^T saves the query only for the key's gradient
    m = _model(shrink(catalog_config("meta-llama/Llama-3.1-8B"), vocab=2048))
    ctx = _ctx(residual_bytes=2, attention="eager", gqa_repeat=True, frozen_base=True,
               lora_targets=frozenset({"q_proj", "v_proj"}), lora_rank=16)
    # 4 heads x 64 x 2 B = 512 B per token; SDPA kernels save q, k, v whatever requires grad
    assert act.frozen_input_eager_unsaved(m, m.layers[0], ctx) == 512
    assert act.frozen_input_eager_unsaved(m, m.layers[0], replace(ctx, attention="flash")) == 0


def test_gpt_oss_experts_and_router_per_token() -> None:
    # gpt-oss-20b, full fine-tuning in bf16 mixed precision: fp32 experts (w 4), h = I = 2880, top-4 of 32
    m = _model(OSS)
    ctx = _ctx(expert_bytes=4)
    # per routed token: gathered input 4h, gate/up output 8I, clamped gate, sigmoid, glu, up + 1, product
    # 5 x 4I, down output 4h: 4 x (2 x 2880 + 7 x 2880) = 103,680 B
    assert act.grouped_experts_saved(m, ctx) == 103_680
    # router: top-k's int64 indices and the softmax over the k values (bf16): (8 + 2) x 4 = 40 B
    assert act._router_saved(m, ctx) == 40
    # the router's input copy (2 x 2880) + 40 + 4 x 103,680
    assert act.mlp_saved(m, _moe_layer(m), ctx) == 5_760 + 40 + 414_720


def test_gpt_oss_sink_softmax_and_norm() -> None:
    m = _model(OSS)
    mixed = _ctx(attention="eager", gqa_repeat=True, seq_len=4096)
    # trainable fp32 sinks under autocast: torch.cat promotes the scores, so an fp32 softmax over s + 1 columns,
    # its bf16 copy for the AV matmul and max's int64 indices: 64 x (4 x 4097 + 2 x 4096 + 8) = 1,573,632 B
    assert act.eager_softmax_saved(m, mixed, 64, 4096) == 1_573_632
    # bf16-true: the softmax runs in bf16 and the AV matmul keeps a view of it: 64 x (2 x 4097 + 8) = 524,928 B
    true16 = replace(mixed, residual_bytes=2, autocast=False)
    assert act.eager_softmax_saved(m, true16, 64, 4096) == 524_928
    # GptOssRMSNorm multiplies by its weight in fp32: (4 + 4) B per element even when the residual is bf16
    assert m.norm == "rms_fp32" and act._norm_saved("rms_fp32", true16) == 8
    assert act._norm_saved("rms", true16) == 6  # Llama's form keeps the normalized tensor in bf16
    # inference in bf16: masked scores, the concatenation with the sinks and its max-shifted copy
    assert softmax_bytes_per_score(m, "bf16") == 6


def test_gpt_oss_has_no_sdpa_path() -> None:
    doc = {"model": OSS, "hardware": {"gpu": "h100"}, "train": {"seq_len": 1024}}
    r = resolve(doc)
    from vramplan.analytic.precision import policy

    # 64 query heads over 8 KV heads: eager repeats K/V
    assert resolve_attention(r.scenario, r.model, policy(r.scenario)) == ("eager", True)


def test_eager_mask_is_kept_only_by_checkpoints() -> None:
    # the additive mask is only added to the scores (add saves nothing); a checkpoint keeps its inputs
    m = _model(OSS)
    ctx = _ctx(attention="eager", seq_len=512)
    rope = 2 * 2 * 64
    assert act.shared_saved_per_token(m, ctx) == rope
    # sliding-window and full masks, [b, 1, s, s] bf16: 2 x 2 x 512 B per token
    assert act.shared_saved_per_token(m, ctx, "full") == rope + 2 * 2 * 512
    assert act.shared_saved_per_token(m, ctx, "none", attention_recorded=False) == 0


def test_grouped_experts_prefill_width() -> None:
    # Mixtral-8x7B: 2 x (4096 + 4 x 14336) + 8 = 122,888 elements per token at the gating
    assert _grouped_experts_width(_model("mistralai/Mixtral-8x7B-v0.1"), 1) == 122_888
    # gpt-oss-20b: gathered input, gate/up biases and output, five gating tensors: 4 x (2880 + 9 x 2880) + 32
    assert _grouped_experts_width(_model(OSS), 1) == 4 * 10 * 2880 + 32
