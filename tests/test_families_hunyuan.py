"""HunYuan-MoE (``hunyuan_v1_moe``, transformers 5.24 ``modeling_hunyuan_v1_moe.py``): tensors counted by hand and
against ``HunYuanMoEV1ForCausalLM`` on the meta device, the q/k norms after RoPE (checked against what autograd
saves), the MoE layer's saved bytes, and what transformers does not build as published, refused."""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.analytic.activations import ActContext, attention_tensors, layer_tensors, mlp_saved
from vramplan.engine import estimate
from vramplan.errors import ScenarioError
from vramplan.spec.hf_config import SUPPORTED_MODEL_TYPES, model_from_config

# tencent/Hunyuan-A13B-Instruct's config.json as a public code base quotes it (an MLX port's test fixture): its
# model_type is "hunyuan" (the repository's remote code, which vramplan does not model), its head size
# attention_head_dim.  Here in transformers' format: model_type hunyuan_v1_moe and head_dim (HunYuanMoEV1Attention
# reads config.head_dim); the other keys as quoted.
A13B: dict[str, Any] = {
    "architectures": ["HunYuanMoEV1ForCausalLM"], "attention_bias": False, "head_dim": 128, "hidden_size": 4096,
    "intermediate_size": 3072, "model_type": "hunyuan_v1_moe", "moe_intermediate_size": [3072] * 32,
    "moe_topk": [8] * 32, "num_attention_heads": 32, "num_experts": 64, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "num_shared_expert": [1] * 32, "rms_norm_eps": 1e-05,
    "rope_scaling": {"alpha": 1000.0, "factor": 1.0, "type": "dynamic"}, "rope_theta": 10000.0,
    "tie_word_embeddings": True, "use_cla": False, "use_mixed_mlp_moe": True, "use_qk_norm": True,
    "vocab_size": 128167}
TINY: dict[str, Any] = {"model_type": "hunyuan_v1_moe", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 48,
                        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                        "num_experts": 4, "moe_topk": 2}
MIXED = ActContext(compute_bytes=2, residual_bytes=4, linear_input_bytes=2, autocast=True, attention="flash",
                   gqa_repeat=False, seq_len=2048, dropout=False)


def test_hunyuan_is_supported() -> None:
    assert "hunyuan_v1_moe" in SUPPORTED_MODEL_TYPES


def test_hunyuan_a13b_count_by_hand() -> None:
    # h 4096, 32 layers, 32 heads / 8 KV heads of 128, 64 experts of I 3072 top-8 and one shared MLP of 3072,
    # V 128167 tied:  embed 128167 * 4096 = 524,972,032
    # layer: q, o 2 * 4096^2 = 33,554,432; k, v 2 * 4096 * 1024 = 8,388,608; query/key_layernorm 2 * 128 = 256;
    #        two norms 8,192; gate.wg 64 * 4096 = 262,144; experts 64 * 3 * 4096 * 3072 = 2,415,919,104;
    #        shared_mlp 3 * 4096 * 3072 = 37,748,736 -> 2,495,881,472, x 32 = 79,868,207,104
    # + embed + final norm 4,096 = 80,393,183,232 (the model card's "80B total")
    m = model_from_config(A13B, name="Hunyuan-A13B")
    assert m.num_parameters == 80_393_183_232
    # active: - 32 * 2,415,919,104 * 56 / 64 = - 67,645,734,912 -> 12,747,448,320 (the card's "13B active")
    assert m.num_active_parameters == 12_747_448_320
    assert m.moe is not None and (m.moe.num_experts, m.moe.top_k, m.moe.shared_intermediate_size) == (64, 8, 3072)
    names = {p.name for p in m.params}
    assert {"layers.self_attn.query_layernorm.weight", "layers.mlp.gate.wg.weight",
            "layers.mlp.shared_mlp.gate_proj.weight"} <= names


def test_hunyuan_equals_the_meta_module() -> None:
    from meta_build import meta_module

    cfg = {k: v for k, v in A13B.items() if k not in ("moe_intermediate_size", "num_shared_expert", "rope_scaling")}
    module = meta_module(cfg, auto="AutoModelForCausalLM")
    assert model_from_config(A13B).num_parameters == sum(p.numel() for p in module.parameters())
    theirs = {".".join(x for x in n.removeprefix("model.").split(".") if not x.isdigit()) for n, _ in
              module.named_parameters()}
    # the routed experts are listed with transformers 4.x's names (gate_proj/up_proj/down_proj, as every MoE
    # family here); transformers 5 stacks them as gate_up_proj and down_proj
    ours = {p.name for p in model_from_config(A13B).params if ".experts." not in p.name}
    assert ours == {n for n in theirs if ".experts." not in n}


def test_hunyuan_qk_norms_after_rope_by_hand() -> None:
    m = model_from_config(A13B)
    # under autocast RoPE multiplies q_proj's bf16 output by the fp32 cos/sin: the norm keeps that fp32 input and its
    # fp32 normalized tensor, 8 B per element, and one fp32 rsqrt per head:
    # q 8 * 4096 + 4 * 32 = 32,896 B, k 8 * 1024 + 4 * 8 = 8,224 B per token (Qwen3's norm before RoPE: 24,704, 6,176)
    recs = {t.name: t.nbytes for t in attention_tensors(m, m.layers[0], MIXED)}
    assert (recs["attention.q_norm"], recs["attention.k_norm"]) == (32_896, 8_224)
    # in half precision without autocast cos/sin are half: the fp32 copy and the half normalized tensor, 4 + 2 B
    half = ActContext(compute_bytes=2, residual_bytes=2, linear_input_bytes=2, autocast=False, attention="flash",
                      gqa_repeat=False, seq_len=2048, dropout=False)
    recs = {t.name: t.nbytes for t in attention_tensors(m, m.layers[0], half)}
    assert (recs["attention.q_norm"], recs["attention.k_norm"]) == (6 * 4096 + 4 * 32, 6 * 1024 + 4 * 8)


def test_hunyuan_attention_bytes_match_autograd_under_autocast() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    conf = transformers.AutoConfig.for_model(**TINY)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(conf, attn_implementation="sdpa").train()

    def saved(b: int, s: int) -> int:
        # distinct storages autograd saves inside the second layer's attention (parameters and cos/sin left out)
        skip = {p.untyped_storage().data_ptr() for p in model.parameters()}
        inside, seen = [False], {}
        attn = model.model.layers[1].self_attn

        def pre(_m: Any, _a: Any, kw: dict[str, Any]) -> None:
            inside[0] = True
            skip.update(t.untyped_storage().data_ptr() for t in kw.get("position_embeddings") or ())

        def post(*_a: Any) -> None:
            inside[0] = False

        def pack(t: Any) -> Any:
            if inside[0] and t.untyped_storage().data_ptr() not in skip:
                seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        hs = [attn.register_forward_pre_hook(pre, with_kwargs=True), attn.register_forward_hook(post)]
        ids = torch.randint(0, 128, (b, s))
        with torch.autocast("cpu", dtype=torch.bfloat16), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(input_ids=ids, labels=ids)
        for h in hs:
            h.remove()
        return sum(seen.values())

    hook = (saved(2, 12) - saved(2, 8)) // (2 * 4)
    m = model_from_config(TINY)
    ctx = ActContext(compute_bytes=2, residual_bytes=4, linear_input_bytes=2, autocast=True, attention="flash",
                     gqa_repeat=False, seq_len=12, dropout=False)
    engine = sum(t.nbytes * t.copies for t in layer_tensors(m, m.layers[1], ctx) if t.name.startswith("attention."))
    # per token: q_proj/k_proj/v_proj's input cast 2 * 64 = 128; q norm 8 * 64 + 4 * 4 = 528, k norm 8 * 32 + 4 * 2
    # = 264; SDPA's q, k, v 2 * (64 + 32 + 32) = 256; output 2 * 64 = 128; logsumexp 4 * 4 = 16 -> 1,320 + 256 = 1,576
    # (with the norm before RoPE, Qwen3's form, it would be 6 * 96 + 4 * 6 = 600 B for the norms: 1,384)
    assert engine == hook == 1_576


def test_hunyuan_moe_layer_bytes_by_hand() -> None:
    m = model_from_config(A13B)
    layer = m.layers[0]
    # bf16 mixed precision, per token: the router's bf16 input cast 2 * 4096 = 8,192, logits 2 * 64 and fp32 softmax
    # 4 * 64 = 384; per routed token (transformers 5 grouped experts) gathered input 8,192, gate/up output 12,288,
    # activation output 6,144, down input 6,144, down output 8,192 = 40,960, x top-8 = 327,680; shared_mlp: the
    # gate/up inputs' cast 16,384, gate, activation and up outputs 3 * 6,144, down input 6,144 = 40,960
    # -> 8,192 + 384 + 327,680 + 40,960 = 377,216
    assert mlp_saved(m, layer, MIXED) == 377_216


@pytest.mark.parametrize(("changes", "where"), [
    ({"num_experts": [64] * 32}, "model.num_experts"),
    ({"moe_topk": [8] * 31 + [4]}, "model.moe_topk"),
    ({"moe_intermediate_size": [1536] * 32}, "model.moe_intermediate_size"),
    ({"num_shared_expert": [2] * 32}, "model.num_shared_expert"),
])
def test_hunyuan_configs_transformers_does_not_build_are_refused(changes: dict[str, Any], where: str) -> None:
    with pytest.raises(ScenarioError) as exc:
        model_from_config({**A13B, **changes})
    assert where in str(exc.value)


def test_hunyuan_without_head_dim_is_refused() -> None:
    with pytest.raises(ScenarioError) as exc:
        model_from_config({k: v for k, v in A13B.items() if k != "head_dim"})
    assert "head_dim" in str(exc.value)


def test_hunyuan_remote_code_model_type_is_refused_with_a_suggestion() -> None:
    with pytest.raises(ScenarioError) as exc:
        model_from_config({**A13B, "model_type": "hunyuan"})
    assert "hunyuan_v1_moe" in str(exc.value)


@pytest.mark.parametrize(("precision", "refused"), [("bf16-true", True), ("bf16-mixed", False)])
def test_hunyuan_half_precision_training_is_refused(precision: str, refused: bool) -> None:
    doc = {"model": TINY, "task": "train", "hardware": {"gpu": "H100"},
           "train": {"micro_batch_size": 1, "seq_len": 64, "precision": precision}}
    if refused:
        with pytest.raises(ScenarioError) as exc:
            estimate(doc)
        assert "train.precision" in str(exc.value) and "HunYuanMoEV1Gate" in str(exc.value)
    else:
        assert estimate(doc).fits


SMALL: dict[str, Any] = {"model_type": "hunyuan_v1_moe", "vocab_size": 2048, "hidden_size": 256, "intermediate_size": 192,
                         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64,
                         "num_experts": 8, "moe_topk": 2, "tie_word_embeddings": True}


def test_hunyuan_training_step_matches_trace() -> None:
    # bf16 mixed precision, SDPA: the analytic peak within 0.5% of the traced one (measured -0.09%, as Qwen3-MoE's
    # at the same sizes)
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.trace.engine import estimate as traced

    doc = {"model": SMALL, "hardware": {"gpu": "h100"},
           "train": {"micro_batch_size": 2, "seq_len": 512, "attention": "sdpa"}}
    a, t = estimate(doc).per_gpu.peak_allocated_bytes, traced(doc).per_gpu.peak_allocated_bytes
    assert abs(a / t - 1) < 0.005


@pytest.mark.xfail(strict=True, reason="generate's prefill is not reconciled: the analytic peak reads -15.8% of the "
                   "traced one here (-0.19% at Hunyuan-A13B, batch 1 x 2048, of which 16,793,600 B are weights: the "
                   "fp32 gate.wg); unverified candidates: HunYuanMoEV1Moe computes shared_mlp before the routed experts "
                   "and keeps its output through them, and the gate's fp32 copy of its input")
def test_hunyuan_prefill_matches_trace() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.trace.engine import estimate as traced

    doc = {"model": SMALL, "task": "inference", "hardware": {"gpu": "a100"},
           "inference": {"batch_size": 4, "prompt_len": 512, "new_tokens": 16, "attention": "sdpa"}}
    a, t = estimate(doc).per_gpu.peak_allocated_bytes, traced(doc).per_gpu.peak_allocated_bytes
    assert abs(a / t - 1) < 0.03


def test_hunyuan_generate_states_what_is_not_modelled() -> None:
    """The prefill gap above is stated in the report (the band widens), not left silent."""
    from vramplan.engine import estimate as _estimate

    rep = _estimate({"model": dict(A13B), "task": "inference", "hardware": {"gpu": "H200"},
                     "inference": {"batch_size": 1, "prompt_len": 512, "new_tokens": 8}})
    assert any(a.startswith("not modelled: generate's prefill of a model whose router weight is fp32") for a in rep.assumptions)
