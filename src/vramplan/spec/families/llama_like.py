"""Llama-like decoders: RMSNorm, RoPE, gated MLP, q/k/v/o projections (transformers ``modeling_llama.py``), and
the families that differ from it by a few named facts (``Variant``): their own ``modeling_*.py`` is named in
``VARIANTS``.  Key names follow each family's ``configuration_*.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from vramplan.errors import Problem, ScenarioError
from vramplan.spec.families.base import Config, Family, Params, build_spec, get, key, prob
from vramplan.spec.model import MLASpec, ModelSpec, MoESpec, Norm, Traits

Sliding = Literal["uniform", "alternate", "every_nth", "from_layer", "nope_layers", "pattern"]
MoEKind = Literal["", "mixtral", "qwen", "deepseek", "gpt_oss", "every_layer", "ernie", "hunyuan"]
# Mixtral's expert linears in transformers 4.x (``MixtralBlockSparseTop2MLP``: w2(act(w1(x)) * w3(x))), the names
# peft's conversion maps for Mixtral (``_MOE_TARGET_MODULE_MAPPING["mixtral"]``): a scenario may spell them either way
MIXTRAL_EXPERT_NAMES = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


@dataclass(frozen=True)
class Variant:
    """What a Llama-like family's modeling file does differently from ``modeling_llama.py``."""

    modeling: str
    tied_default: bool = False  # configuration default of tie_word_embeddings
    qkv_bias_only: bool = False  # hard-coded q/k/v biases and no o_proj bias (Qwen2Attention)
    qk_norm: Literal["", "head", "full"] = ""  # q/k RMSNorm over head_dim (Qwen3, Gemma 3) or the full width (OLMo-2)
    qk_norm_key: str = ""  # the config key that switches the q/k norm on ("": always; GLM-4-MoE's use_qk_norm)
    # the q/k norms' module names (HunYuan's query_layernorm/key_layernorm, applied after RoPE: the same saved bytes)
    qk_norm_names: tuple[str, str] = ("q_norm", "k_norm")
    o_bias: bool = True  # attention_bias reaches o_proj too (False: q/k/v only, Glm4MoeAttention)
    o_bias_key: str = ""  # o_proj's bias has its own key (Seed-OSS attention_out_bias, default False)
    attention_bias_default: bool = False  # configuration default of attention_bias (Seed-OSS: True)
    sandwich_norms: bool = False  # pre/post-feedforward norms as well (Gemma 2/3)
    # the sandwich norms' module names: Gemma's, or GLM-4's post_self_attn_layernorm / post_mlp_layernorm (there
    # post_attention_layernorm is the norm before the MLP); the same four norms in the same places
    sandwich_names: tuple[str, str] = ("pre_feedforward_layernorm", "post_feedforward_layernorm")
    # the configuration class's defaults where they differ from what this builder assumes for an absent key (GLM's
    # two KV heads and head_dim 128): applied under the config's own keys
    config_defaults: tuple[tuple[str, Any], ...] = ()
    # the share of each head RoPE rotates when the config does not say (``partial_rotary_factor``; GLM: 0.5)
    partial_rotary_default: float = 1.0
    norm: Norm = "rms"
    norm_bias: bool = False  # LayerNorm with a bias (PhiMoE's nn.LayerNorm)
    mla: bool = False  # DeepSeek multi-head latent attention
    sinks: bool = False  # per-head attention sinks (gpt-oss)
    moe: MoEKind = ""
    shared_expert_gate: bool = False  # Qwen2-MoE: a gated shared expert of shared_expert_intermediate_size
    score_correction_bias: bool = False  # DeepSeek-V3's router e_score_correction_bias
    expert_bias: bool = False  # gpt-oss: router and expert biases
    sliding: Sliding = "uniform"  # how sliding_window applies to the layers (``windows``)
    sliding_default: bool = False  # configuration default of use_sliding_window
    final_logit_softcap: bool = False  # the loss reads soft-capped logits (Gemma 2 ``final_logit_softcapping``)
    # where the routed experts live: the layer's MoE module, the router's name in it, and the experts' own
    # names ("": 4.x's per-expert gate_proj/up_proj/down_proj; two names: one fused [E, 2I, h] input and one
    # [E, h, I] output parameter, GraniteMoeParallelExperts' input_linear/output_linear)
    # the two per-layer norms: before attention and MLP (Llama), or after each sublayer (post-norm: EXAONE 4's
    # post_attention_layernorm and post_feedforward_layernorm, with the trait ``post_norms``)
    norm_names: tuple[str, str] = ("input_layernorm", "post_attention_layernorm")
    # dropout: attention_dropout's configuration default, and the key of a dropout on each sublayer's output
    # (Seed-OSS residual_dropout, default 0.1 in configuration_seed_oss.py) with its default
    attention_dropout_default: float = 0.0
    residual_dropout: tuple[str, float] = ("", 0.0)
    moe_module: str = "mlp"
    correction_bias_path: str = ""  # the router's submodule holding it (ERNIE: "moe_statics.")
    bias_key: str = ""  # one key for every linear's bias (ERNIE use_bias: attention, MLPs and the LM head)
    router_name: str = "gate"
    shared_name: str = "shared_experts"  # the shared expert MLP's module (HunYuan: shared_mlp)
    fused_expert_names: tuple[str, str] | None = None
    traits: Traits = field(default_factory=Traits)


# the dense families whose every parameter bitsandbytes leaves unquantized is an embedding (embed_tokens), the head
# (lm_head), a module named *norm* or a linear's bias (``Traits.norm_embed_names``; tests/test_trainer_frameworks.py
# checks each on transformers' meta module).  Left out: MoE families (experts bitsandbytes may not quantize, routers
# named gate), MLA (kv_a_layernorm is covered but DeepSeek's experts are not), gpt-oss (sinks, fused experts).
_NORM_EMBED_NAMES = frozenset({"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "granite", "olmo2",
                               "smollm3"})

# GlmConfig / Glm4Config (transformers 5.24): the defaults an absent key takes
_GLM_DEFAULTS: tuple[tuple[str, Any], ...] = (("num_key_value_heads", 2), ("head_dim", 128),
                                              ("intermediate_size", 13696), ("max_position_embeddings", 131072))

VARIANTS: dict[str, Variant] = {
    # the rope_cache_in windows: the first release of each family with a registered ``cos_cached`` buffer built at
    # max_position_embeddings, to the first without (release wheels 4.28.1-4.49.0, analytic/hf_buffers.py)
    "llama": Variant("modeling_llama.py", traits=Traits(upcasts_all_logits=True,
                                                        causal_mask_buffer_in=((4, 38), (4, 39)),
                                                        rope_cache_in=((4, 28), (4, 41)),
                                                        rope_cache_fp32_before=(4, 31))),
    "granite": Variant("modeling_granite.py"),
    "mistral": Variant("modeling_mistral.py", sliding_default=True,
                       traits=Traits(upcasts_all_logits=True, rope_cache_in=((4, 34), (4, 42)), sdpa_since=(4, 37))),
    "qwen2": Variant("modeling_qwen2.py", qkv_bias_only=True, sliding="from_layer",
                     traits=Traits(upcasts_all_logits=True, rope_cache_in=((4, 37), (4, 45)))),
    "qwen3": Variant("modeling_qwen3.py", qk_norm="head", sliding="from_layer"),
    # OLMo-2 (modeling_olmo2.py at transformers 5.24): post-norm layers (Olmo2DecoderLayer: ``residual +
    # post_attention_layernorm(self_attn(x))``, then post_feedforward_layernorm after the MLP; no input norm),
    # full-width q/k norms, and Olmo2RMSNorm returns ``(self.weight * hidden_states).to(input_dtype)``: the
    # weight multiplies the fp32 normalized tensor, which is what the weight's gradient keeps (gpt-oss's form)
    "olmo2": Variant("modeling_olmo2.py", qk_norm="full", norm="rms_fp32",
                     norm_names=("post_attention_layernorm", "post_feedforward_layernorm"),
                     traits=Traits(post_norms=True, qk_norm_full_width=True)),
    "gemma": Variant("modeling_gemma.py", tied_default=True, norm="gemma_rms",
                     traits=Traits(upcasts_all_logits=True, causal_mask_buffer_in=((4, 38), (4, 39)))),
    # Gemma 2 soft-caps attention scores (eager tanh) and the final logits; DynamicCache from 4.44
    "gemma2": Variant("modeling_gemma2.py", tied_default=True, norm="gemma_rms", sandwich_norms=True,
                      sliding="alternate", final_logit_softcap=True,
                      traits=Traits(upcasts_all_logits=True, attn_logit_softcap=True, dynamic_cache_since=(4, 44),
                                    sdpa_dropped_in=(5, 21), static_hybrid_cache_before=(4, 56))),
    "gemma3_text": Variant("modeling_gemma3.py", tied_default=True, norm="gemma_rms", qk_norm="head",
                           sandwich_norms=True, sliding="every_nth",
                           traits=Traits(static_hybrid_cache_before=(4, 56))),
    # fused qkv_proj and gate_up_proj; q and k are rotated into new tensors (the rotation's result concatenated with
    # the passed-through part, a copy) while v stays a view of qkv_proj's output
    "phi3": Variant("modeling_phi3.py", sliding_default=True, traits=Traits(
        qkv_modules=("qkv_proj",), fused_qkv_view=True, fused_gate_up=True, upcasts_all_logits=True,
        rotary_cat_copy=True, sdpa_since=(4, 45))),
    "mixtral": Variant("modeling_mixtral.py", moe="mixtral", sliding_default=True, traits=Traits(
        upcasts_all_logits=True,
        expert_module_aliases=tuple(MIXTRAL_EXPERT_NAMES.items()), rope_cache_in=((4, 36), (4, 48)),
        sdpa_since=(4, 37))),
    "qwen2_moe": Variant("modeling_qwen2_moe.py", qkv_bias_only=True, moe="qwen", shared_expert_gate=True, sliding="from_layer",
                         traits=Traits(upcasts_all_logits=True,
                                       rope_cache_in=((4, 40), (4, 45)))),
    "qwen3_moe": Variant("modeling_qwen3_moe.py", qk_norm="head", moe="qwen", sliding="from_layer",
                         traits=Traits()),
    "deepseek_v2": Variant("modeling_deepseek_v2.py", mla=True, moe="deepseek",
                           traits=Traits()),
    "deepseek_v3": Variant("modeling_deepseek_v3.py", mla=True, moe="deepseek", score_correction_bias=True,
                           traits=Traits()),
    # GptOssRMSNorm multiplies in fp32; no SDPA path (attention sinks join the softmax); top-k router, clamped
    # SwiGLU experts kept as fused, biased parameters
    # OLMoE: OLMo-2's full-width q/k RMSNorm on a pre-norm decoder, 64 experts of intermediate_size in every
    # layer (OlmoeSparseMoeBlock: softmax over all experts, then top-k; no shared expert)
    "olmoe": Variant("modeling_olmoe.py", qk_norm="full", moe="every_layer",
                     traits=Traits(qk_norm_full_width=True)),
    # GraniteMoE: Mixtral's layout under block_sparse_moe with a top-k-then-softmax router
    # (GraniteMoeTopKRouter: logits.float().topk, softmax over the k values) and fused experts
    # (4.x GraniteMoeParallelExperts input_linear [E, 2I, h] / output_linear [E, h, I]: parameters, not
    # nn.Linear, in both releases); the multipliers scale by Python floats (nothing saved); tied by default
    "granitemoe": Variant("modeling_granitemoe.py", moe="mixtral", moe_module="block_sparse_moe",
                          router_name="router", fused_expert_names=("input_linear", "output_linear"),
                          traits=Traits(router_topk_first=True, experts_are_linears=False)),
    # PhiMoE (Phi-3.5-MoE): nn.LayerNorm with bias, attention and LM-head biases from the config
    # (attention_bias, lm_head_bias), Mixtral's experts behind a sparsemixer router (PhimoeTopKRouter, an
    # nn.Linear named router); transformers 5 fuses the experts and peft does not convert phimoe's names
    "phimoe": Variant("modeling_phimoe.py", norm="layer", norm_bias=True, moe="mixtral", router_name="router",
                      sliding_default=True, traits=Traits(experts_are_linears=False, sparsemixer_router=True)),
    # GLM-4.5 / 4.6 (modeling_glm4_moe.py): DeepSeek-V3's MoE (sigmoid router with its correction-bias buffer,
    # first_k_dense_replace dense layers, one shared expert) under GQA attention with q/k/v biases only and
    # partial rotary; q/k norm only with use_qk_norm.  The MTP layer (num_nextn_predict_layers) is not built:
    # Glm4MoePreTrainedModel ignores its checkpoint keys (_keys_to_ignore_on_load_unexpected)
    "glm4_moe": Variant("modeling_glm4_moe.py", qk_norm="head", qk_norm_key="use_qk_norm", o_bias=False,
                        moe="deepseek", score_correction_bias=True, partial_rotary_default=0.5, traits=Traits()),
    # SmolLM3: Llama with NoPE layers (SmolLM3Attention rotates q and k only where no_rope_layers[i] is 1; a
    # NoPE layer hands the projections' own outputs to the kernel, the same bytes as RoPE's rotated copies);
    # tied by default; use_sliding_window puts the window on the NoPE layers
    "smollm3": Variant("modeling_smollm3.py", tied_default=True, sliding="nope_layers"),
    # EXAONE 4: post-norm layers (post_attention_layernorm, post_feedforward_layernorm after each sublayer, no
    # input norm), per-head q/k RMSNorm, a sliding window on three layers of four (sliding_window_pattern) whose
    # global layers skip RoPE (no saved tensor changes size)
    "exaone4": Variant("modeling_exaone4.py", qk_norm="head", sliding="pattern",
                       norm_names=("post_attention_layernorm", "post_feedforward_layernorm"),
                       traits=Traits(post_norms=True)),
    # Seed-OSS: Llama with q/k/v biases (attention_bias, default True), an o_proj bias only with
    # attention_out_bias, and dropout (configuration defaults 0.1) on the attention probabilities and on each
    # sublayer's output (``nn.functional.dropout(attn_output / down_proj, p=residual_dropout)``)
    "seed_oss": Variant("modeling_seed_oss.py", o_bias_key="attention_out_bias", attention_bias_default=True,
                        attention_dropout_default=0.1, residual_dropout=("residual_dropout", 0.1)),
    # ERNIE 4.5 MoE: a dense first layer, then MoE layers with two shared experts; the router runs in fp32 with
    # autocast off and picks experts with a correction bias (a frozen parameter, moe_statics); use_bias switches
    # every linear's bias
    "ernie4_5_moe": Variant("modeling_ernie4_5_moe.py", tied_default=True, moe="ernie", score_correction_bias=True,
                            correction_bias_path="moe_statics.", bias_key="use_bias",
                            traits=Traits(fp32_router=True)),
    # HunYuan-MoE (Hunyuan-A13B): q/k RMSNorm per head after RoPE (query_layernorm/key_layernorm, built whatever
    # use_qk_norm says), routed experts and a shared_mlp of intermediate_size in every layer, the gate's nn.Linear
    # named wg (built in fp32: ``nn.Linear(..., dtype=torch.float32)``) with a fp32 softmax, top-k, renormalized
    "hunyuan_v1_moe": Variant("modeling_hunyuan_v1_moe.py", qk_norm="head",
                              qk_norm_names=("query_layernorm", "key_layernorm"), moe="hunyuan", router_name="gate.wg",
                              shared_name="shared_mlp", traits=Traits(fp32_router_weight=True, qk_norm_after_rope=True)),
    # GLM-4-9B (transformers' modeling_glm.py, 4.46+) and GLM-4-0414 (modeling_glm4.py, 4.52+): Llama's layer with
    # q/k/v biases only (attention_bias, default True; o_proj has none), one fused gate_up_proj whose output is
    # chunked (Phi-3's MLP), and RoPE over half of each head (partial_rotary_factor 0.5, GlmConfig/Glm4Config's
    # default) concatenated with the passed-through half (``torch.cat([q_embed, q_pass], dim=-1)``: Phi-3's copy).
    # GLM-4-0414 adds sandwich norms: post_self_attn_layernorm on the attention output and post_mlp_layernorm on the
    # MLP's (Glm4DecoderLayer.forward).  The configuration defaults (configuration_glm.py / configuration_glm4.py
    # 5.24) are the 9B model's shapes
    "glm": Variant("modeling_glm.py", o_bias=False, attention_bias_default=True, config_defaults=_GLM_DEFAULTS,
                   partial_rotary_default=0.5, traits=Traits(fused_gate_up=True, rotary_cat_copy=True,
                                                             rotary_per_layer_copy=True)),
    "glm4": Variant("modeling_glm4.py", o_bias=False, attention_bias_default=True, config_defaults=_GLM_DEFAULTS,
                    partial_rotary_default=0.5, sandwich_norms=True,
                    sandwich_names=("post_self_attn_layernorm", "post_mlp_layernorm"),
                    traits=Traits(fused_gate_up=True, rotary_cat_copy=True, rotary_per_layer_copy=True,
                                  sandwich_post_rms=True)),
    "gpt_oss": Variant("modeling_gpt_oss.py", norm="rms_fp32", sinks=True, moe="gpt_oss", expert_bias=True,
                       router_name="router",
                       sliding="alternate", traits=Traits(
                           attention_kernels=frozenset({"eager", "flash"}), router_topk_first=True,
                           clamped_glu_experts=True, experts_are_linears=False)),
}


@dataclass(frozen=True)
class _Dims:
    h: int
    n_heads: int
    n_kv: int
    head_dim: int
    inter: int
    layers: tuple[int, ...]


def _mla(p: Params, cfg: Config, d: _Dims, bias: tuple[bool, bool]) -> MLASpec:
    """DeepSeek MLA (modeling_deepseek_v3.py): low-rank q (q_lora_rank) and compressed kv (kv_lora_rank)."""
    qkv_bias, o_bias = bias
    q_lora = cfg.get("q_lora_rank")
    kv_lora = int(cfg["kv_lora_rank"])
    nope, rope, vdim = int(cfg["qk_nope_head_dim"]), int(cfg["qk_rope_head_dim"]), int(cfg["v_head_dim"])
    qk = d.n_heads * (nope + rope)
    L = d.layers
    if q_lora:
        p.linear("layers.self_attn.q_a_proj", d.h, int(q_lora), L, qkv_bias, "replicated")
        p.norm("layers.self_attn.q_a_layernorm", int(q_lora), L, False)
        p.linear("layers.self_attn.q_b_proj", int(q_lora), qk, L, False, "column")
    else:
        p.linear("layers.self_attn.q_proj", d.h, qk, L, False, "column")
    p.linear("layers.self_attn.kv_a_proj_with_mqa", d.h, kv_lora + rope, L, qkv_bias, "replicated")
    p.norm("layers.self_attn.kv_a_layernorm", kv_lora, L, False)
    p.linear("layers.self_attn.kv_b_proj", kv_lora, d.n_heads * (nope + vdim), L, False, "column")
    p.linear("layers.self_attn.o_proj", d.n_heads * vdim, d.h, L, o_bias, "row")
    return MLASpec(int(q_lora) if q_lora else None, kv_lora, nope, rope, vdim)


def _attention(p: Params, cfg: Config, v: Variant, d: _Dims) -> MLASpec | None:
    """The attention's tensors: q/k/v/o (fused qkv_proj for phi3), MLA, q/k norms, sinks."""
    # llama-style configs say attention_bias (all four projections); Qwen2 hard-codes q/k/v biases, no o bias
    attention_bias = bool(cfg.get(v.bias_key or "attention_bias", v.attention_bias_default))
    qkv_bias = attention_bias or v.qkv_bias_only
    o_bias = attention_bias and not v.qkv_bias_only and v.o_bias
    if v.o_bias_key:
        o_bias = bool(cfg.get(v.o_bias_key, False))
    L, hd = d.layers, d.head_dim
    if v.mla:
        return _mla(p, cfg, d, (qkv_bias, o_bias))
    if v.traits.qkv_modules == ("qkv_proj",):
        p.linear("layers.self_attn.qkv_proj", d.h, (d.n_heads + 2 * d.n_kv) * hd, L, qkv_bias, "column")
        p.linear("layers.self_attn.o_proj", d.n_heads * hd, d.h, L, o_bias, "row")
    else:
        p.attention("layers.self_attn", d.h, d.n_heads, d.n_kv, hd, L, qkv_bias, "o_proj", o_bias)
    if v.qk_norm_key and not cfg.get(v.qk_norm_key, False):
        pass
    elif v.qk_norm == "full":
        p.norm("layers.self_attn.q_norm", d.n_heads * hd, L, False)
        p.norm("layers.self_attn.k_norm", d.n_kv * hd, L, False)
    elif v.qk_norm == "head":
        p.norm(f"layers.self_attn.{v.qk_norm_names[0]}", hd, L, False)
        p.norm(f"layers.self_attn.{v.qk_norm_names[1]}", hd, L, False)
    if v.sinks:
        p.add("layers.self_attn.sinks", d.n_heads, "other", L)
    return None


MoEReader = Callable[[Config, Variant, _Dims], tuple[MoESpec, set[int]]]


def _mixtral_moe(cfg: Config, v: Variant, d: _Dims) -> tuple[MoESpec, set[int]]:
    e, k = int(cfg.get("num_local_experts", 8)), int(cfg.get("num_experts_per_tok", 2))
    return MoESpec(e, k, d.inter), set(d.layers)


def _qwen_moe(cfg: Config, v: Variant, d: _Dims) -> tuple[MoESpec, set[int]]:
    e = int(cfg["num_experts"])
    k = int(cfg.get("num_experts_per_tok", 8))
    ei = int(cfg["moe_intermediate_size"])
    shared = int(cfg.get("shared_expert_intermediate_size", 0)) if v.shared_expert_gate else 0
    step = int(cfg.get("decoder_sparse_step", 1))
    only = set(cfg.get("mlp_only_layers", []) or [])
    # modeling_qwen2_moe.py: sparse iff layer not in mlp_only_layers and (i+1) % step == 0
    sparse = {i for i in d.layers if i not in only and e > 0 and (i + 1) % step == 0}
    return MoESpec(e, k, ei, 1 if shared else 0, shared), sparse


def _deepseek_moe(cfg: Config, v: Variant, d: _Dims) -> tuple[MoESpec, set[int]]:
    e, k, ei = int(cfg["n_routed_experts"]), int(cfg["num_experts_per_tok"]), int(cfg["moe_intermediate_size"])
    ns = int(cfg.get("n_shared_experts", 0) or 0)
    first_dense = int(cfg.get("first_k_dense_replace", 0))
    freq = int(cfg.get("moe_layer_freq", 1))
    return MoESpec(e, k, ei, ns, ns * ei), {i for i in d.layers if i >= first_dense and i % freq == 0}


def _gpt_oss_moe(cfg: Config, v: Variant, d: _Dims) -> tuple[MoESpec, set[int]]:
    e = int(cfg["num_local_experts"])
    k = int(cfg.get("num_experts_per_tok", cfg.get("experts_per_token", 4)))
    return MoESpec(e, k, d.inter), set(d.layers)


def _every_layer_moe(cfg: Config, v: Variant, d: _Dims) -> tuple[MoESpec, set[int]]:
    """Routed experts of ``intermediate_size`` in every layer (OLMoE: ``num_experts``, OlmoeConfig's
    ``attribute_map`` also reads ``num_local_experts``; top-k ``num_experts_per_tok``, default 8)."""
    e = int(get(cfg, "num_experts", "num_local_experts"))
    return MoESpec(e, int(cfg.get("num_experts_per_tok", 8)), d.inter), set(d.layers)


def _ernie_moe(cfg: Config, v: Variant, d: _Dims) -> tuple[MoESpec, set[int]]:
    """ERNIE 4.5 (configuration_ernie4_5_moe.py): moe_num_experts (64) of moe_intermediate_size (1536), top
    moe_k (6), moe_num_shared_experts (2) shared experts of moe_intermediate_size each; layer i is sparse iff
    (i + 1) % moe_layer_interval == 0 and moe_layer_start_index <= i <= moe_layer_end_index (-1: the last)."""
    e, k = int(cfg.get("moe_num_experts", 64)), int(cfg.get("moe_k", 6))
    ei = int(cfg.get("moe_intermediate_size", 1536))
    ns = int(cfg.get("moe_num_shared_experts", 2) or 0)
    start, interval = int(cfg.get("moe_layer_start_index", 1)), int(cfg.get("moe_layer_interval", 1))
    end = int(cfg.get("moe_layer_end_index", -1))
    end = len(d.layers) - 1 if end == -1 else end
    sparse = {i for i in d.layers if (i + 1) % interval == 0 and start <= i <= end}
    return MoESpec(e, k, ei, ns, ns * ei), sparse


def _per_layer(cfg: Config, name: str, default: int, n: int) -> int:
    """HunYuan's ``moe_topk`` (and the remote code's per-layer lists): one int, or a list of n equal ones."""
    value = cfg.get(name, default)
    values = value if isinstance(value, list) else [value]
    if len(set(values)) != 1 or (isinstance(value, list) and len(values) != n):
        raise ScenarioError([Problem(f"model.{name}", f"{name} {value!r} differs between layers (or does not give one "
                                     f"value per layer of {n}); per-layer MoE sizes are not modelled",
                                     f"give {name} as one integer")])
    return int(values[0])


def _hunyuan_moe(cfg: Config, v: Variant, d: _Dims) -> tuple[MoESpec, set[int]]:
    """HunYuan-MoE (transformers 5.24 modeling_hunyuan_v1_moe.py): every layer holds ``num_experts`` routed experts
    (HunYuanMoEV1Experts: ``config.num_local_experts``, attribute_map -> num_experts, default 1) and one
    ``shared_mlp``, both of ``intermediate_size``; the gate picks ``moe_topk`` (an int or a per-layer list,
    HunYuanMoEV1Gate reads ``config.moe_topk[layer_idx]``).  The remote code's ``moe_intermediate_size`` and
    ``num_shared_expert`` lists are not read by transformers: a value other than what transformers builds is refused."""
    n = len(d.layers)
    experts = cfg.get("num_experts", 1)
    if isinstance(experts, list):
        # HunYuanMoEV1Experts builds torch.empty(config.num_local_experts, 2 I, h): a list does not build
        raise ScenarioError([Problem("model.num_experts", f"num_experts {experts!r} is a list; transformers 5.24's "
                                     "HunYuanMoEV1Experts builds its stack from one number of experts",
                                     "give num_experts as one integer")])
    e, k = int(experts), _per_layer(cfg, "moe_topk", 1, n)
    for name, built in (("moe_intermediate_size", d.inter), ("num_shared_expert", 1)):
        if name in cfg and _per_layer(cfg, name, built, n) != built:
            raise ScenarioError([Problem(f"model.{name}", f"{name} {cfg[name]!r}, but transformers 5.24 builds "
                                         f"{'experts and a shared MLP of intermediate_size' if built == d.inter else 'one shared MLP'} "
                                         f"({built}) and does not read {name}",
                                         f"set {name} to {built}, or use a model transformers builds as published")])
    return MoESpec(e, k, d.inter, 1, d.inter), set(d.layers)


_MOE_READERS: dict[str, MoEReader] = {"mixtral": _mixtral_moe, "qwen": _qwen_moe, "deepseek": _deepseek_moe,
                                      "gpt_oss": _gpt_oss_moe, "every_layer": _every_layer_moe, "ernie": _ernie_moe,
                                      "hunyuan": _hunyuan_moe}


def _mlp(p: Params, cfg: Config, v: Variant, d: _Dims) -> tuple[MoESpec | None, set[int]]:
    """Dense MLPs, routed experts and shared experts; returns the MoE spec and the sparse layers."""
    moe, sparse = _MOE_READERS[v.moe](cfg, v, d) if v.moe else (None, set())
    mlp_bias = bool(cfg.get(v.bias_key or "mlp_bias", False))
    h = d.h
    dense = tuple(i for i in d.layers if i not in sparse)
    if dense:
        if v.traits.fused_gate_up:
            p.linear("layers.mlp.gate_up_proj", h, 2 * d.inter, dense, mlp_bias, "column")
        else:
            p.linear("layers.mlp.gate_proj", h, d.inter, dense, mlp_bias, "column")
            p.linear("layers.mlp.up_proj", h, d.inter, dense, mlp_bias, "column")
        p.linear("layers.mlp.down_proj", d.inter, h, dense, mlp_bias, "row")
    on = tuple(sorted(sparse))
    if moe is None or not on:
        return moe, sparse
    e, ei = moe.num_experts, moe.expert_intermediate_size
    mod = f"layers.{v.moe_module}"
    p.linear(f"{mod}.{v.router_name}", h, e, on, v.expert_bias, "replicated", role="router")
    if v.score_correction_bias:
        p.add(f"{mod}.{v.router_name}.{v.correction_bias_path}e_score_correction_bias", e, "other", on)
    if v.fused_expert_names:
        fused_in, fused_out = v.fused_expert_names
        p.linear(f"{mod}.{fused_in}", h, 2 * ei, on, False, "expert", "expert", e)
        p.linear(f"{mod}.{fused_out}", ei, h, on, False, "expert", "expert", e)
    else:
        p.linear(f"{mod}.experts.gate_proj", h, ei, on, v.expert_bias, "expert", "expert", e)
        p.linear(f"{mod}.experts.up_proj", h, ei, on, v.expert_bias, "expert", "expert", e)
        p.linear(f"{mod}.experts.down_proj", ei, h, on, v.expert_bias, "expert", "expert", e)
    if moe.shared_intermediate_size:
        si = moe.shared_intermediate_size
        sb = mlp_bias if v.bias_key else False  # ERNIE: use_bias reaches the shared experts too
        shared = f"layers.mlp.{v.shared_name}"
        p.linear(f"{shared}.gate_proj", h, si, on, sb, "column")
        p.linear(f"{shared}.up_proj", h, si, on, sb, "column")
        p.linear(f"{shared}.down_proj", si, h, on, sb, "row")
        if v.shared_expert_gate:
            p.linear("layers.mlp.shared_expert_gate", h, 1, on, False, "replicated", role="router")
    return moe, sparse


def nope_pattern(cfg: Config, n_layers: int) -> list[int]:
    """SmolLM3's ``no_rope_layers`` (1: the layer rotates q and k; 0: NoPE), or its default: every
    ``no_rope_layer_interval``-th layer (default 4) without RoPE (configuration_smollm3.py)."""
    given = cfg.get("no_rope_layers")
    if isinstance(given, list) and len(given) == n_layers:
        return [int(x) for x in given]
    interval = int(cfg.get("no_rope_layer_interval", 4))
    return [int((i + 1) % interval != 0) for i in range(n_layers)]


def layer_windows(cfg: Config, n_layers: int, v: Variant) -> list[int | None]:
    """Sliding window per layer, from ``layer_types`` or the family's documented pattern."""
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if isinstance(types, list) and len(types) == n_layers:
        return [int(window) if (t == "sliding_attention" and window) else None for t in types]
    if v.sliding == "alternate" and window:
        # Gemma 2 and gpt-oss alternate local (even layers) and global attention (modeling_gemma2.py)
        return [int(window) if i % 2 == 0 else None for i in range(n_layers)]
    if v.sliding == "every_nth" and window:
        pattern = int(cfg.get("sliding_window_pattern", 6))  # Gemma 3: five local layers, then one global
        return [None if (i + 1) % pattern == 0 else int(window) for i in range(n_layers)]
    if v.sliding == "pattern" and window:
        # Exaone4Config: layer i slides unless (i + 1) % sliding_window_pattern == 0; a string pattern ("LLLG",
        # the documented form) names each layer of the repeating group (L local, G global)
        pattern = cfg.get("sliding_window_pattern", 4)
        if isinstance(pattern, str) and pattern:
            return [int(window) if pattern[i % len(pattern)] == "L" else None for i in range(n_layers)]
        return [int(window) if (i + 1) % int(pattern) else None for i in range(n_layers)]
    if not (window and cfg.get("use_sliding_window", v.sliding_default)):
        return [None] * n_layers
    if v.sliding == "nope_layers":
        # SmolLM3Config: the window applies to the NoPE layers (no_rope_layers[i] == 0; by default every
        # no_rope_layer_interval-th layer) when use_sliding_window is set
        return [int(window) if not rope else None for rope in nope_pattern(cfg, n_layers)]
    if v.sliding == "from_layer":
        # Qwen2 family: layers from max_window_layers on use the window
        max_window_layers = int(cfg.get("max_window_layers", n_layers))
        return [int(window) if i >= max_window_layers else None for i in range(n_layers)]
    return [int(window)] * n_layers


def _has_qk_norm(cfg: Config, v: Variant) -> bool:
    return bool(v.qk_norm) and (not v.qk_norm_key or bool(cfg.get(v.qk_norm_key, False)))


@dataclass(frozen=True)
class LlamaLike:
    """The builder of one Llama-like family (a ``Family.build``)."""

    variant: Variant

    def __call__(self, cfg: Config, model_type: str, name: str) -> ModelSpec:
        v = self.variant
        if v.config_defaults:
            # an absent key, or a null one, takes the configuration class's default
            cfg = {**cfg, **{k: d for k, d in v.config_defaults if cfg.get(k) is None}}
        h, n_layers, n_heads = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
        d = _Dims(h, n_heads, int(get(cfg, "num_key_value_heads", default=n_heads)),
                  int(get(cfg, "head_dim", default=h // n_heads)), int(get(cfg, "intermediate_size", default=4 * h)),
                  tuple(range(n_layers)))
        vocab = int(cfg["vocab_size"])
        tied = bool(cfg.get("tie_word_embeddings", v.tied_default))
        p = Params()
        p.add("embed_tokens.weight", vocab * h, "embedding", tp="vocab")
        mla = _attention(p, cfg, v, d)
        p.norm(f"layers.{v.norm_names[0]}", h, d.layers, v.norm_bias)
        p.norm(f"layers.{v.norm_names[1]}", h, d.layers, v.norm_bias)
        if v.sandwich_norms:
            p.norm(f"layers.{v.sandwich_names[0]}", h, d.layers, False)
            p.norm(f"layers.{v.sandwich_names[1]}", h, d.layers, False)
        moe, sparse = _mlp(p, cfg, v, d)
        p.norm("norm", h, (), v.norm_bias)
        if not tied:
            p.lm_head("lm_head", vocab, h, bool(cfg.get(v.bias_key or "lm_head_bias", False)))
        head_dim, n_kv = (mla.qk_nope_head_dim + mla.qk_rope_head_dim, n_heads) if mla else (d.head_dim, d.n_kv)
        traits = v.traits
        if model_type in _NORM_EMBED_NAMES:
            traits = replace(traits, norm_embed_names=True)
        if cfg.get("input_jitter_noise") and v.traits.sparsemixer_router:
            # PhimoeSparseMoeBlock and PhimoeTopKRouter jitter their input only when input_jitter_noise > 0
            traits = replace(traits, moe_input_jitter=True)
        if traits.attn_logit_softcap:
            # Gemma2Attention soft-caps only when attn_logit_softcapping is set (configuration default 50.0)
            traits = replace(traits, attn_logit_softcap=cfg.get("attn_logit_softcapping", 50.0) is not None)
        return build_spec(
            cfg, name, model_type, p, windows=layer_windows(cfg, n_layers, v), moe_layers=frozenset(sparse),
            hidden_size=h, num_layers=n_layers, num_attention_heads=n_heads, num_kv_heads=n_kv, head_dim=head_dim,
            vocab_size=vocab, intermediate_size=d.inter, hidden_act=str(key(cfg, "hidden_act", default="silu")),
            mlp_gated=True, norm=v.norm, position="rope", tie_word_embeddings=tied, qk_norm=_has_qk_norm(cfg, v),
            sandwich_norms=v.sandwich_norms, attention_dropout=prob(cfg, "attention_dropout", v.attention_dropout_default),
            hidden_dropout=prob(cfg, v.residual_dropout[0], v.residual_dropout[1]) if v.residual_dropout[0] else 0.0,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)), moe=moe, mla=mla,
            attention_sinks=v.sinks, traits=traits, **_partial_rotary(cfg, v),
            final_logit_softcapping=cfg.get("final_logit_softcapping") if v.final_logit_softcap else None)


def _partial_rotary(cfg: Config, v: Variant) -> dict[str, float]:
    """``partial_rotary_factor``: the config's (transformers 5 moves it into ``rope_parameters``), else the family's
    default (GLM's 0.5; a null value rotates the whole head, as transformers' rotary embedding reads it).  The
    shared cos/sin of a training step and a prefill cover the rotated dims only, and so does vLLM's rotary cache
    (vLLM's GlmForCausalLM sets 0.5 before building its Llama layers, vllm/model_executor/models/glm.py; releases
    before the fix of vLLM issue 16904 halved ``rotary_dim`` after building a whole-head cache, 2 B x max positions x
    head_dim / 2 more).  Phi-4-mini (phi3, 0.75) and GLM-4.5 (glm4_moe, 0.5) write it in their configs."""
    rope = cfg.get("rope_parameters")
    if isinstance(rope, dict) and "partial_rotary_factor" in rope:
        given = rope["partial_rotary_factor"]
    else:
        given = cfg.get("partial_rotary_factor", v.partial_rotary_default)
    factor = 1.0 if given is None else float(given)
    return {} if factor == 1.0 else {"partial_rotary_factor": factor}


def family(variant: Variant, **fields: Any) -> Family:
    """A ``Family`` for a Llama-like variant; ``fields``: the other ``Family`` fields (e.g.
    ``transformers_model_type``, the transformers classes that build it)."""
    return Family(LlamaLike(variant), variant.modeling, **fields)


LLAMA_FAMILIES: dict[str, Family] = {mt: family(v) for mt, v in VARIANTS.items()}
# torchtitan ships Llama 3 (torchtitan/models/llama3)
LLAMA_FAMILIES["llama"] = family(VARIANTS["llama"], torchtitan_model="llama3")
# HunYuanMoEV1Attention reads config.head_dim, which HunYuanMoEV1Config leaves None when absent (then head_dim**-0.5
# fails): a config without it (the remote code's spells it attention_head_dim) does not build in transformers 5.24
LLAMA_FAMILIES["hunyuan_v1_moe"] = family(VARIANTS["hunyuan_v1_moe"], required=(
    ("hidden_size",), ("num_hidden_layers",), ("num_attention_heads",), ("vocab_size",), ("head_dim",)))
# Gemma3TextConfig rejects a null rope_scaling that multimodal checkpoints write into text_config
LLAMA_FAMILIES["gemma3_text"] = family(VARIANTS["gemma3_text"], drop_null_keys=("rope_scaling",))
