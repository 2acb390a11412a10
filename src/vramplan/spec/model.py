"""The internal model spec: the architecture facts every memory term reads.

A ``ModelSpec`` is built from a Hugging Face ``config.json`` by
``vramplan.spec.hf_config.model_from_config`` and never from anything else, so the
catalog, a local file and an inline mapping all go through one adapter per family
(``vramplan.spec.families``).  What a family does differently at run time is a *trait*
(``Traits``), set by its adapter: the engines read traits, never the family's name.

Parameters are listed as ``ParamGroup`` rows, one per tensor name pattern, so that
counts are exact (the adapter is tested against published counts), quantization
knows which tensors are quantized (linear weights only), LoRA knows which modules
it targets, and tensor parallelism knows how each tensor is split.

Glossary: *parameters* are a count of elements; *weights* are the bytes that hold
them.  A *degree* is how many GPUs share one kind of parallelism (tp=4); a *rank*
is one GPU's index inside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

from vramplan.facts.peft_targets import (
    MOE_ROUTER_MODULES,
    MoePattern,
    default_lora_targets,
    moe_pattern,
    router_kind,
)
from vramplan.facts.transformers import STACKED_EXPERT_CHECKPOINTS

Role = Literal["embedding", "position", "linear", "expert", "router", "norm", "bias", "lm_head", "other"]
TPSplit = Literal["column", "row", "replicated", "vocab", "expert"]
# layer_fp32: Cohere's LayerNorm, weight only, computed in fp32 by eager ops; layer_nonparam: OLMo-1's
# LayerNorm without weight or bias, run on an fp32 copy of its input; rms_fp32: gpt-oss's RMSNorm, which
# multiplies by its weight in fp32 and casts afterwards (``(self.weight * hidden_states).to(input_dtype)``; OLMo-2 too)
Norm = Literal["rms", "rms_fp32", "gemma_rms", "layer", "layer_fp32", "layer_nonparam"]
# relative: T5's bucketed relative position bias added to the attention scores (no position tensor in the stream)
Position = Literal["rope", "learned", "alibi", "none", "relative"]


@dataclass(frozen=True)
class CheckpointQuant:
    """A pre-quantized checkpoint, as its config.json's ``quantization_config`` declares it.

    A declared fact of the checkpoint, read by the family adapter (``spec/families/base.py``
    ``read_quantization_config``).  ``format`` is the row of ``facts/quantization.py`` that stores these
    weights byte for byte, or None when no row does (``why_not`` says why); ``trained_dequantized``:
    transformers cannot train the format as stored, so a training run loads it dequantized to the
    checkpoint's ``torch_dtype`` (MXFP4: ``Mxfp4HfQuantizer.is_trainable`` is False and asks for
    ``Mxfp4Config(dequantize=True)``; block-wise fp8: ``FineGrainedFP8Config(dequantize=True)``, or
    DeepSeek-V3's ``fp8_cast_bf16.py``).  ``skip_modules``: bitsandbytes' ``llm_int8_skip_modules`` or
    ``modules_to_not_convert``, left in the half dtype.
    """

    method: str  # quant_method as written (bitsandbytes, gptq, awq, fp8, fbgemm_fp8, mxfp4, ...)
    description: str  # what the config declares, in words (bits, group size, quant type, compute dtype)
    format: str | None = None
    why_not: str = ""
    trained_dequantized: bool = False
    skip_modules: tuple[str, ...] = ()
    compute_dtype: str | None = None  # bitsandbytes 4-bit ``bnb_4bit_compute_dtype`` (fp32, fp16, bf16)


@dataclass(frozen=True)
class ParamGroup:
    """One parameter tensor pattern, repeated ``count`` times (layers x experts).

    ``in_features``/``out_features`` are set for matrices used as linear maps, so
    that LoRA adapters (r*(in+out)) and int4 group scales (out*in/group) can be sized.
    """

    name: str
    module: str
    numel: int
    count: int
    role: Role
    in_features: int = 0
    out_features: int = 0
    tp: TPSplit = "replicated"
    layer_span: tuple[int, ...] = ()  # which decoder layers hold it; () = outside the layers

    @property
    def total(self) -> int:
        return self.numel * self.count

    @property
    def decays(self) -> bool:
        """Hugging Face's Trainer applies weight decay to all but biases and norm weights."""
        return self.role not in ("norm", "bias")


@dataclass(frozen=True)
class CheckpointFiles:
    """A checkpoint's tensors as its safetensors headers list them (``catalog/hub.py`` reads them).

    A safetensors file starts with an 8-byte little-endian header length and a JSON header naming each
    tensor's ``dtype``, ``shape`` and ``data_offsets`` (the safetensors format,
    https://huggingface.co/docs/safetensors/index#format): ``parameters`` is the sum of the shapes'
    products, ``weight_bytes`` the sum of ``end - begin`` of the data offsets (exact for every dtype,
    packed 4-bit ones included).  ``source``: which files, at which commit.
    """

    files: int
    tensors: int
    parameters: int
    weight_bytes: int
    bytes_by_dtype: tuple[tuple[str, int], ...]
    source: str

    def summary(self) -> dict[str, Any]:
        """The report's ``model.checkpoint`` record."""
        return {"files": self.files, "tensors": self.tensors, "parameters": self.parameters,
                "weight_bytes": self.weight_bytes, "bytes_by_dtype": dict(self.bytes_by_dtype),
                "source": self.source}


@dataclass(frozen=True)
class MoESpec:
    num_experts: int
    top_k: int
    expert_intermediate_size: int
    num_shared_experts: int = 0
    shared_intermediate_size: int = 0  # total width of the shared expert MLP
    # gated experts (SwiGLU: a fused gate_up projection of 2 x I, then down) or plain ones (one up projection of I,
    # the activation, then down: NemotronHExperts, ``use_experts_implementation(has_gate=False)``, transformers 5.24
    # modeling_nemotron_h.py; its shared expert is the plain NemotronHMLP too)
    gated: bool = True


@dataclass(frozen=True)
class MLASpec:
    """DeepSeek multi-head latent attention (arXiv 2405.04434, section 2.1)."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class MambaSpec:
    """The Mamba2 mixers of a hybrid (attention + state-space) model, as transformers' ``BambaMixer`` builds them
    (``modeling_bamba.py``, transformers 5.24): ``intermediate = mamba_expand * hidden_size``, the causal
    convolution over ``conv_dim = intermediate + 2 * n_groups * state_size`` channels (x, B and C) with a
    ``conv_kernel``-tap depthwise kernel, and ``n_heads`` heads of ``head_dim`` channels whose recurrent state is
    ``head_dim x state_size`` each.  ``layers``: the decoder layers that hold a mixer instead of attention (they
    keep no KV cache)."""

    layers: tuple[int, ...]
    n_heads: int
    head_dim: int
    n_groups: int
    state_size: int
    conv_kernel: int
    intermediate_size: int
    chunk_size: int
    # decoder layers that hold neither attention nor a mixer, only an MLP (Nemotron-H's "-" blocks): no KV cache there
    ffn_only_layers: tuple[int, ...] = ()
    # the config's ``mamba_ssm_cache_dtype`` (Nemotron-H's config.json), which vLLM reads for some families
    ssm_cache_dtype: str | None = None
    # "mamba2": the Mamba2 mixer above; "mamba1": Mamba's ``MambaMixer`` (``modeling_mamba.py``, 5.24), one state of
    # ``state_size`` per channel (written here as ``intermediate_size`` heads of ``head_dim`` 1 in ``n_groups`` 0, so
    # that ``conv_dim`` is ``intermediate_size`` and ``ssm_state_elements`` is ``intermediate_size x state_size``)
    # "gated_deltanet": Qwen3-Next's ``Qwen3NextGatedDeltaNet`` (``modeling_qwen3_next.py``, 5.24): the convolution over
    # ``conv_dim = 2 key_dim + value_dim`` channels (``intermediate_size`` here, ``n_groups`` 0) and ``n_heads`` value
    # heads of ``head_dim`` by ``state_size`` (the key head dim) fp32 recurrent state each; "short_conv": LFM2's
    # ``Lfm2ShortConv`` (``modeling_lfm2.py``, 5.24), a gated depthwise convolution over ``intermediate_size`` (the hidden
    # size) channels and no recurrent state (``n_heads`` 0); "rwkv4": RWKV-4's ``state`` (``modeling_rwkv.py``, 5.24),
    # per layer two token-shift vectors of the hidden size in the compute dtype (``intermediate_size`` h, ``conv_kernel``
    # 2) and the wkv numerator, denominator and maximum in fp32 (``h`` heads of width 1, ``state_size`` 3); "rg_lru":
    # RecurrentGemma's ``RecurrentGemmaRecurrentBlock`` (``modeling_recurrent_gemma.py``, 5.24), its state on the module:
    # ``conv1d_state`` of ``intermediate_size`` (``lru_width``) channels by ``conv_kernel - 1`` taps in the compute
    # dtype and the RG-LRU's fp32 ``recurrent_states`` (``lru_width`` heads of width 1, ``state_size`` 1)
    # "lightning": MiniMax's ``MiniMaxLightningAttention`` (``modeling_minimax.py``, 5.24), no convolution
    # (``intermediate_size`` 0) and per layer ``n_heads`` states of ``head_dim x state_size`` (both the head dim) in the
    # compute dtype (``MiniMaxCache.linear_cache``), its prefill run block-wise over ``chunk_size`` (``block_size``)
    kind: Literal["mamba2", "mamba1", "gated_deltanet", "short_conv", "rwkv4", "rg_lru", "lightning"] = "mamba2"
    # Gated DeltaNet: ``linear_num_key_heads`` (the query/key heads that value heads share; unused by the other kinds)
    key_heads: int = 0
    time_step_rank: int = 0  # Mamba-1's ``x_proj`` -> ``dt_proj`` rank (unused by the Mamba2 mixer)
    # FalconMamba's weightless RMS norms on dt's low-rank input, B and C (``FalconMambaMixer.dt_layernorm``,
    # ``b_layernorm``, ``c_layernorm``): three more tensors of the mixer at the prefill
    bc_dt_norms: bool = False
    # those norms hold their weights as parameters (Jamba's ``JambaRMSNorm`` ``dt_layernorm``, ``b_layernorm``,
    # ``c_layernorm``, modeling_jamba.py 5.24, counted among the weights); False: FalconMamba's weightless norms
    bc_dt_norm_params: bool = False
    # every mixer layer also runs attention beside its mixer, on the same normalized input, and keeps a KV cache
    # (Falcon-H1: ``FalconH1DecoderLayer`` holds ``mamba`` and ``self_attn`` and sums their scaled outputs,
    # modeling_falcon_h1.py, transformers 5.24); False: a mixer layer holds the mixer in the attention's place
    parallel_attention: bool = False
    # the mixer's gated RMSNorm before ``out_proj`` (Bamba, Nemotron-H, Mamba2); False: ``scan_output * silu(gate)``
    # instead (FalconH1Mixer without ``mamba_rms_norm``: ``self.norm`` is ``nn.Identity``, modeling_falcon_h1.py 5.24)
    gated_norm: bool = True
    # mixer layers that also run a shared transformer block ahead of their mixer and keep its KV cache beside the
    # mixer's state (Zamba2's "hybrid" layers: ``Zamba2HybridLayer`` runs ``shared_transformer`` then ``mamba_decoder``,
    # and transformers 5.24's cache gives such a layer a ``LinearAttentionAndFullAttentionLayer``, cache_utils.py)
    shared_attention_layers: tuple[int, ...] = ()
    # the shared block's per-layer low-rank adapters (Zamba2: ``Zamba2MLP.gate_up_proj_adapter_list`` always,
    # ``Zamba2Attention.linear_q/k/v_adapter_list`` with ``use_shared_attention_adapter``), their rank
    # (``adapter_rank``): what a training step saves of them (analytic/terms/shared_block.py)
    shared_adapter_rank: int = 0
    shared_attention_adapters: bool = False

    @property
    def conv_dim(self) -> int:
        """Channels of the causal convolution: x (intermediate) and the B and C projections of every group."""
        return self.intermediate_size + 2 * self.n_groups * self.state_size

    @property
    def ssm_state_elements(self) -> int:
        """One layer's recurrent (SSM) state per sequence: ``n_heads x head_dim x state_size``."""
        return self.n_heads * self.head_dim * self.state_size


@dataclass(frozen=True)
class LayerSpec:
    """What one decoder layer computes, for activation and KV-cache terms."""

    index: int
    moe: bool
    intermediate_size: int  # dense MLP width (0 for MoE-only layers)
    sliding_window: int | None  # None: full attention


@dataclass(frozen=True)
class AltUpSpec:
    """Gemma 3n's layer mechanisms beside attention and the MLP (transformers 5.24 ``modeling_gemma3n.py``), read by
    the analytic generate (``analytic/altup.py``).

    ``num_inputs``: AltUp's streams (``altup_num_inputs``): the residual stream runs as ``num_inputs`` stacked copies
    ``[num_inputs, batch, seq, hidden]`` through every layer (``Gemma3nTextModel.forward``, :1694).
    ``per_layer_input_width``: ``hidden_size_per_layer_input``, each layer's slice of the per-layer inputs
    ``[batch, seq, layers, width]`` (``get_per_layer_inputs``, ``project_per_layer_inputs``, :1734-1769).
    ``laurel_rank``: LAuReL's low-rank branch (``Gemma3nTextLaurelBlock``, :920-935).
    ``sparse_layers``: the layers whose MLP gate runs through the Gaussian top-k (``activation_sparsity_pattern``
    above 0, ``Gemma3nTextMLP._gaussian_topk``, :955-974).
    """

    num_inputs: int
    per_layer_input_width: int
    laurel_rank: int
    sparse_layers: tuple[int, ...] = ()


@dataclass(frozen=True)
class Traits:
    """Run-time behaviour of a family that the engines need, set only by the family's adapter.

    The defaults are Llama's (transformers ``modeling_llama.py``); each adapter under
    ``vramplan.spec.families`` overrides what its ``modeling_*.py`` does differently.  The engines
    (analytic, trace, measure, export, plan) read these fields and never test ``ModelSpec.family``.
    """

    # ---- attention ----
    # the attention's input projections as the activation model counts them (one cast and one saved input per
    # module under autocast; the names LoRA targets match)
    qkv_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj")
    out_proj_module: str = "o_proj"  # the attention's output projection (its input is saved for its gradient)
    # a fused QKV projection whose q and k are rotated into new tensors while the value handed to the kernel is
    # a view of the fused output, which keeps the whole [q|k|v] buffer alive (phi3, GPT-NeoX)
    fused_qkv_view: bool = False
    # attention implementations the transformers class offers (``_supports_sdpa`` False: no "sdpa"; transformers'
    # default then falls back to eager, modeling_utils ``get_correct_attn_implementation``)
    attention_kernels: frozenset[str] = frozenset({"eager", "sdpa", "flash"})
    # the first transformers release whose class sets ``_supports_sdpa = False`` (Gemma 2 from 5.21.0, "sdpa does
    # not support softcapping", read off the 5.20.0 and 5.21.0 wheels): from it the default falls back to eager
    sdpa_dropped_in: tuple[int, ...] | None = None
    # the first transformers release whose class has an SDPA path (``_supports_sdpa = True``): before it the default
    # attention is eager (transformers 4.36.0 added ``_check_and_enable_sdpa``, which makes SDPA the default where the
    # class supports it and torch >= 2.1.1; read off the release wheels 4.28.1-4.49.0); None: the family's every
    # release runs SDPA by default (Falcon called ``F.scaled_dot_product_attention`` itself before 4.36)
    sdpa_since: tuple[int, ...] | None = (4, 36)
    # transformers releases [first, next) whose model registers a max_position_embeddings^2 bool ``causal_mask``
    # buffer at construction (transformers 4.38.2 ``LlamaModel.__init__``; 4.37.2 and 4.39.3 have none)
    causal_mask_buffer_in: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    # transformers releases [first, next) whose every attention layer builds a rotary embedding that registers
    # ``cos_cached`` and ``sin_cached`` buffers of max_position_embeddings x head_dim at construction (in
    # ``torch.get_default_dtype()``, the dtype ``from_pretrained`` builds the model in), on the GPU with the model
    # (analytic/hf_buffers.py; read off the release wheels: modeling_llama.py 4.28.1-4.40.2, none in 4.41.2)
    rope_cache_in: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    # releases before this one build those buffers from the fp32 ``inv_freq`` with no cast, fp32 whatever the model's
    # dtype (modeling_llama.py 4.28.1-4.30.2 ``emb.cos()[None, None, :, :]``; 4.31.0 adds ``.to(dtype)``)
    rope_cache_fp32_before: tuple[int, ...] | None = None
    # one shared K/V head handed to SDPA without ``enable_gqa`` (FalconAttention with multi_query): the fused
    # kernels need equal head counts (sdp_utils_cpp.h ``check_batch_size_and_num_heads_dense``), so SDPA runs math
    mqa_sdpa_math: bool = False
    # inference, eager: the attention keeps its raw scores bound while the softmax runs over their masked copy, and
    # the model's layer loop keeps the previous block's returned probabilities (``outputs``) through the next block
    # (FalconAttention.forward ``attention_scores``, FalconModel.forward ``outputs = block(...)``, transformers 5.24)
    eager_probs_kept_by_loop: bool = False
    # eager attention soft-caps the scores with tanh (Gemma 2 ``attn_logit_softcapping``): tanh saves its output
    attn_logit_softcap: bool = False
    # eager softmax in the compute dtype, no ``dtype=torch.float32`` (GPT-2 ``eager_attention_forward``, Falcon)
    eager_softmax_compute_dtype: bool = False
    # inference: the block keeps the attention output bound to a local through the MLP (``GPT2Block``)
    keeps_attn_output: bool = False
    # inference: hidden-sized tensors alive through the MLP (Llama: layer input, residual, normalised MLP input)
    hidden_kept_through_mlp: int = 3
    # ---- parameter names ----
    # every parameter bitsandbytes leaves unquantized (all but the decoder layers' linear weights) lives in a module
    # whose name holds "norm", embed_tokens or lm_head, or is a linear's bias: transformers' Llama-style names, which
    # axolotl's cast back after k-bit preparation reaches whole (facts/trainer_frameworks.py; checked on transformers'
    # meta modules in tests/test_trainer_frameworks.py)
    norm_embed_names: bool = False

    # ---- MLP ----
    # the layer's norms follow its sublayers (``residual + norm(sublayer(x))``: OLMo-2, EXAONE 4), so each
    # normalizes a compute-dtype tensor rather than the residual stream (analytic/activations.py layer_norm_saved)
    post_norms: bool = False
    # the sandwich's two post-sublayer norms (on the attention's and the MLP's output) are Llama's RMSNorm, whose
    # weight multiplies the normalized tensor cast back to the input dtype, so each saves what a post-norm saves
    # (GLM-4-0414's post_self_attn_layernorm and post_mlp_layernorm); Gemma's multiply in fp32 (8 B, as a pre-norm)
    sandwich_post_rms: bool = False
    # the q/k norms normalize the whole projection (OLMo-2, OLMoE: ``RMSNorm(num_heads * head_dim)`` on
    # ``q_proj``'s output) rather than each head (Qwen3, Gemma 3: ``RMSNorm(head_dim)``), so they keep one
    # row statistic per token instead of one per head (analytic/activations.py ``qk_norm_tensors``)
    qk_norm_full_width: bool = False
    # the norm casts its weight to fp32 before the product (NemotronHRMSNorm, modeling_nemotron_h.py 5.24 line
    # 633: ``(self.weight.to(torch.float32) * hidden_states).to(input_dtype)``): a half weight is copied once per
    # call and the product keeps the copy for its input's gradient (analytic/activations.py ``norm_weight_tensors``);
    # gpt-oss's and OLMo-2's ``self.weight * hidden_states`` (the same norm kind, "rms_fp32") keep the weight itself
    norm_weight_to_fp32: bool = False
    # ``residual_in_fp32`` (Mamba2Block, MambaBlock, FalconMambaBlock: ``residual = residual.to(torch.float32)``
    # before ``residual + mixer(...)``, transformers 5.24): the residual stream between blocks, and so the final
    # norm's output (``weight * hidden_states.to(input_dtype)`` with an fp32 input), is fp32 whatever the weights' dtype
    residual_in_fp32: bool = False
    # the forward takes and returns its recurrent state as its own ``state`` argument, not through
    # ``past_key_values`` (RwkvForCausalLM, modeling_rwkv.py 5.24: ``state`` in, ``out.state`` back): the traced
    # engine's decode step passes the filled state there (trace/step.py)
    state_argument: bool = False
    # the recurrent state is kept on the modules, not in the cache: attributes of these names hold it after the prefill
    # (RecurrentGemma: ``RecurrentGemmaRecurrentBlock.conv1d_state`` and ``RecurrentGemmaRglru.recurrent_states``,
    # modeling_recurrent_gemma.py 5.24 lines 299, 413, 434-451): the traced engine counts them as the cache and fills
    # no cache state for those layers (trace/step.py)
    module_state: tuple[str, ...] = ()
    # the model's forward refuses any cache but its own class, from its modeling module (MiniMax:
    # ``MiniMaxModel.forward`` raises unless ``cache`` is a ``MiniMaxCache``, modeling_minimax.py 5.24 lines 652-657):
    # the traced engine makes one of that class, and fills its ``set_linear_cache`` for the mixer layers (trace/step.py);
    # "": transformers' DynamicCache
    cache_class: str = ""
    fused_gate_up: bool = False  # one ``gate_up_proj`` instead of ``gate_proj`` and ``up_proj`` (phi3)
    # ``apply_rotary_pos_emb`` splits each head into its rotated and its passed-through part and concatenates them back
    # (``torch.cat([(q_rot * cos) + (rotate_half(q_rot) * sin), q_pass], dim=-1)``, ``modeling_phi3.py`` 5.24 line
    # 184): a copy of the rotated query and key, made even when nothing passes through (phi3)
    rotary_cat_copy: bool = False
    # ``apply_rotary_pos_emb`` makes each layer its own cos and sin (GLM: ``cos[..., : rot // 2].repeat_interleave(2,
    # dim=-1)``, modeling_glm4.py 5.24 lines 180-181), which the products with q and k save: a pair per layer, of
    # the rotated dims in the position embeddings' dtype, per position (``position_ids`` has batch 1)
    rotary_per_layer_copy: bool = False
    fc_modules: tuple[str, str] = ("dense_h_to_4h", "dense_4h_to_h")  # a non-gated MLP's two linears
    # bitsandbytes' fc1 returns the (fp32) hidden states' dtype and the activation runs in it (phi, StarCoder2)
    fc_act_in_output_dtype: bool = False
    # one norm feeds attention and MLP in parallel and its output is saved once for both (phi, Command-R,
    # StableLM's parallel variant)
    shared_norm_output: bool = False
    # the q/k norms run after RoPE (HunYuanMoEV1Attention: ``apply_rotary_pos_emb``, then query_layernorm and
    # key_layernorm): under autocast the rotation by the fp32 cos/sin yields fp32 q and k, which the norm keeps
    # as its input (no copy) and normalizes in fp32 for its weight's gradient (analytic/activations.py
    # ``qk_norm_tensors``)
    qk_norm_after_rope: bool = False
    # ---- mixture of experts ----
    router_topk_first: bool = False  # ``GptOssTopKRouter``: top-k on the logits, then a k-wide softmax
    clamped_glu_experts: bool = False  # ``GptOssExperts._apply_gate``: clamped gate/up, sigmoid gating
    # PhiMoE's ``sparsemixer`` (modeling_phimoe.py): two masked softmaxes over the experts, each kept by
    # ``PhimoeMultiplier`` with the logits, plus the two masks (analytic/activations.py ``_router_saved``)
    sparsemixer_router: bool = False
    # the router runs in fp32 with autocast disabled (Ernie4_5_MoeTopKRouter: ``F.linear(x.float(), W.float())``)
    fp32_router: bool = False
    # the router's weight is built in fp32 whatever the model's dtype (HunYuanMoEV1Gate: ``nn.Linear(...,
    # dtype=torch.float32)``, then ``hidden_states.float()`` when it is): half-precision training, whose fp32 input
    # copy and weight are not modelled, is refused (spec/checks.py ``fp32_router_weight_problems``)
    fp32_router_weight: bool = False
    # PhiMoE multiplies the MoE input in place by uniform noise in training, in the block and again in the
    # router (``hidden_states *= torch.empty_like(...).uniform_(...)``), when input_jitter_noise > 0
    moe_input_jitter: bool = False
    # the routed experts were ``nn.Linear`` modules in transformers 4.x (bitsandbytes converts them, peft's
    # ``all-linear`` adapts them); gpt-oss keeps fused, biased parameters in every release
    experts_are_linears: bool = True
    # the routed experts are ``view``-slices of 2-D [experts x I, h] parameters run in an eager loop in every
    # release (DBRX's ``DbrxExperts.forward``), never transformers 5's grouped experts: generate counts the loop
    # (analytic/inference.py), training is refused (spec/checks.py ``expert_loop_problems``)
    sliced_expert_loop: bool = False
    # every routed expert runs every token, each token pre-scaled by its router score (0 for the experts it did not
    # pick): Llama4TextMoe.forward (transformers 5.24 modeling_llama4.py) repeats the hidden states num_experts times
    # and runs Llama4TextExperts' batched matmuls over all of them, so its saved and transient tensors are
    # num_experts x tokens wide, not top_k x tokens; the analytic engine refuses training and generate (engine.py,
    # spec/checks.py ``every_token_expert_problems``), the traced engine runs them
    experts_run_every_token: bool = False
    # chunked local attention (Llama 4's ``attention_chunk_size`` on its RoPE layers): a block-diagonal causal mask
    # whose cache vLLM keeps as ``ChunkedLocalAttentionSpec`` (chunk + scheduled tokens, no window offset block)
    # and transformers 5.24 as a ``DynamicSlidingWindowLayer`` of the chunk; neither is modelled, and serving is
    # refused (spec/checks.py ``unmodelled_layer_problems``); 0: none
    attention_chunk_size: int = 0
    # the image path is not modelled (Llama 4's tiles, pixel shuffle and vision adapter): the tower's and projector's
    # parameters are counted, every task is refused (spec/checks.py ``unmodelled_layer_problems``)
    image_path_unmodelled: bool = False
    # a layer mechanism that is not modelled, named (no family sets it at present): the parameters are
    # counted, every task is refused (spec/checks.py ``unmodelled_layer_problems``); "": none
    unmodelled_mixer: str = ""
    # modules the model builds and holds beside its language model and vision tower that no estimated task runs, as
    # (parameter-name prefix, what it is) pairs (Qwen3-Omni's audio encoder, talker and Code2Wav,
    # modeling_qwen3_omni_moe.py): their weights are counted, full fine-tuning and serving are refused, generate and PEFT training run
    # the language model alone (spec/checks.py ``held_module_problems``, ``held_module_notes``); (): none
    held_modules: tuple[tuple[str, str], ...] = ()
    # layer mechanisms the analytic engine's terms leave out, named (Gemma 3n's AltUp streams, per-layer inputs, KV
    # reads across layers): the analytic engine refuses training and generate (engine.py, spec/checks.py
    # ``analytic_unmodelled_problems``), the traced engine runs transformers' own forward, serving is refused
    # (``unmodelled_layer_problems``); "": none
    analytic_unmodelled: str = ""
    # ... but its generate is among the analytic engine's terms (Gemma 3n: analytic/altup.py, ModelSpec.altup and
    # kv_reuse_layers), so only training is refused there
    analytic_generate: bool = False
    # other spellings of the expert linears a scenario may use (Mixtral 4.x: w1/w3/w2), as (alias, name) pairs
    expert_module_aliases: tuple[tuple[str, str], ...] = ()
    # a dense MLP's linears under the model's own names, as (name, role) pairs, the role being the name the
    # activation terms read an adapter by (gate_proj, up_proj, down_proj; gate_up_proj when fused): LFM2's
    # feed_forward w1 / w3 / w2 (Lfm2MLP: w2(silu(w1 x) * w3 x)), Granite 4.0-H's shared_mlp input_linear /
    # output_linear (GraniteMoeHybridMLP: input_linear's output chunked into gate and up).  Without them an adapter on
    # those linears was counted (its parameters and states) but not what it saves (analytic/terms/context.py)
    mlp_module_roles: tuple[tuple[str, str], ...] = ()
    # modules a LoRA target may name that are not layers peft can adapt, as (name, class) pairs: peft 0.21's LoRA
    # ``_create_new_module`` raises "Target module ... is not supported" for them (Nemotron 3's ``experts``, a
    # NemotronHExperts of 3-D parameters, and ``gate``, a NemotronHTopkRouter holding a bare weight): refused
    # (spec/load.py ``_lora_target_problems``)
    unadaptable_modules: tuple[tuple[str, str], ...] = ()
    # linear modules peft refuses as LoRA targets of this model type, named or reached by ``all-linear`` (peft 0.21
    # tuners_utils.py ``_check_lora_target_modules_mamba``: out_proj and conv1d of falcon_h1, mamba, mamba2,
    # falcon_mamba and nemotron_h raise "Module ... is incompatible with Mamba-based models"): refused
    peft_refused_targets: tuple[str, ...] = ()
    # ---- dropout sites ----
    embedding_dropout: bool = False  # the embeddings' output is dropped with the hidden dropout probability
    # ---- generate (transformers releases) ----
    dynamic_cache_since: tuple[int, int] = (4, 42)  # first release whose ``generate`` updates a DynamicCache
    upcasts_all_logits: bool = False  # the 4.44 causal-LM head did ``logits.float()`` on the whole output
    # the forward takes no ``logits_to_keep`` and runs its head on every position (Qwen3-Omni's Thinker, transformers
    # 5.24 modeling_qwen3_omni_moe.py:2223-2244, 2313; applied to every release, earlier ones not read): generate's
    # prefill computes the whole prompt's logits (analytic/inference.py ``generate_behaviour``)
    head_on_every_position: bool = False
    # first release whose causal-LM forward takes ``(num_)logits_to_keep``, so that generate's prefill runs the head on
    # the last position only (4.45 for Llama and its kin: analytic/inference.py ``LOGITS_TO_KEEP_SINCE``); before it
    # the prefill computes every prompt position's logits.  Qwen2-VL: 5.0 (modeling_qwen2_vl.py has no
    # logits_to_keep from 4.45 to 4.57, 5.0 takes it), Qwen2.5-VL: 4.54 (none in 4.49-4.53)
    logits_to_keep_since: tuple[int, int] = (4, 45)
    # the release from which generate stops honouring the checkpoint's generation_config.json ``cache_implementation:
    # "hybrid"`` (a HybridCache allocated before the prefill for prompt + new tokens, the window on sliding layers:
    # analytic/inference.py ``SLIDING_WINDOW_CACHE_SINCE``); () for checkpoints that name no such cache.  Gemma 2 and
    # Gemma 3 release theirs with it (generation_config.json of google/gemma-2-* and google/gemma-3-*: "cache_implementation":
    # "hybrid"; Gemma2Model.forward builds a HybridCache itself when given none, modeling_gemma2.py 4.45.0:840)
    static_hybrid_cache_before: tuple[int, ...] = ()
    # the release from which the head no longer upcasts every position's logits to fp32 at inference (the 4.44
    # causal-LM head's ``logits.float()``, ``upcasts_all_logits``); Qwen2-VL's 4.45 forward still did
    # (modeling_qwen2_vl.py:1720 at 4.45.0), 4.46 casts only with labels
    float_logits_before: tuple[int, int] = (4, 45)
    # first release whose causal-LM forward calls ``self.loss_function`` (loss_utils ``ForCausalLMLoss``) instead
    # of its own ``CrossEntropyLoss`` (4.46 for Llama and its kin; 4.49 for GPT-2, GPT-J, GPT-NeoX, Falcon,
    # BLOOM, OPT: their 4.48 modeling files still shift and call CrossEntropyLoss), analytic/logits.py
    loss_function_since: tuple[int, int] = (4, 46)
    # ---- attention mask ----
    # every forward hands the attention a 4-D boolean mask (PaliGemma's prefix LM: ``block_sequence_ids`` from the
    # processor's ``token_type_ids``, transformers 5.24 modeling_paligemma.py): SDPA cannot take flash then and runs
    # the memory-efficient kernel, which saves the mask converted to the query dtype per layer (aten attention.cpp
    # ``convert_boolean_attn_mask``), and transformers repeats grouped K/V to every head (``use_gqa_in_sdpa`` asks
    # for no mask); the analytic/activations.py sliding-window mask rule, applied at every length
    sdpa_mask_always: bool = False


@dataclass(frozen=True)
class VisionSpec:
    """A vision-language model's image path: the vision tower (a ViT over patches) and the projector that
    maps its output into the language model's embedding space.

    ``tokens_per_image``: image tokens each image puts into the language model's sequence (the processor's
    rule); ``patches_per_image``: tokens the tower itself runs over, per image; ``param_prefixes``: the
    ``ParamGroup`` name prefixes of the tower and the projector (their parameters are in ``ModelSpec.params``);
    ``tower``: one encoder layer's shape as a ``ModelSpec`` of its own (no parameters listed), which the
    activation model reads as it reads a decoder layer (analytic/terms/vision.py).
    """

    hidden_size: int
    num_layers: int
    num_attention_heads: int
    intermediate_size: int
    image_size: int
    patch_size: int
    patches_per_image: int
    tokens_per_image: int
    hidden_act: str
    source: str
    param_prefixes: tuple[str, ...] = ("vision_tower.", "multi_modal_projector.")
    tower: ModelSpec | None = None
    num_channels: int = 3
    # the patch embedding's frames per patch (Qwen2.5-VL's Conv3d: 2; a 2-D patch convolution: 1)
    temporal_patch_size: int = 1
    # side of the square of patches merged into one image token (Qwen2.5-VL: 2; 1: none)
    merge_size: int = 1
    # the processor resizes each image within [min_pixels, max_pixels] keeping its size (Qwen2-VL's
    # ``smart_resize``) rather than to ``image_size`` (Gemma 3); ``image_size`` is then the largest image's side
    min_pixels: int = 0
    max_pixels: int = 0
    # max_pixels as the family's released checkpoints write it in preprocessor_config.json (not read), which vLLM's
    # dummy image of the most features follows (facts/vllm_multimodal.py; Qwen2-VL, Qwen2.5-VL: 12,845,056); 0:
    # not known, vLLM's multimodal profile run is then not modelled
    checkpoint_max_pixels: int = 0
    # the processor resizes every image to one ``image_size`` square (Gemma 3's, pan-and-scan off by default), so
    # vLLM's dummy image of the most features is one such square: its profile run is modelled from the rows of
    # facts/vllm_multimodal.py ``GEMMA3_MM_ROWS``
    fixed_image_profile: bool = False
    # tokens the processor writes around each image's ``tokens_per_image`` (Gemma 3's full_image_sequence: "\n\n",
    # <start_of_image>, <end_of_image>, "\n\n": 4), counted by vLLM 0.11.0-0.12.x's encoder budget
    image_wrap_tokens: int = 0
    # what the tower saves per patch after its last layer, as (kind, elements) with kind "norm" (that many
    # norms of the tower's kind), "residual" or "compute" (elements in that dtype): Gemma 3's post-layernorm
    # and average pool's input, Qwen2.5-VL's merger norm and MLP inputs
    head_saved_per_patch: tuple[tuple[str, int], ...] = ()
    # what the adapter knows the activation model approximates in this tower (the report's assumptions)
    notes: tuple[str, ...] = ()
    # tokens the tower runs over besides the image's patches (CLIP's class token: 1)
    extra_tokens: int = 0
    # what the tower saves per tower token (patches and extra tokens) before its first layer, as
    # head_saved_per_patch's (kind, elements): CLIP's pre_layrnorm
    stem_saved_per_token: tuple[tuple[str, int], ...] = ()
    # what the projector saves per image token, as head_saved_per_patch's (kind, elements), kind "cast" also:
    # elements an autocast cast copies into the compute dtype (none when the residual stream is in it): LLaVA's
    # linear_1 input, GELU input and linear_2 input
    head_saved_per_token: tuple[tuple[str, int], ...] = ()
    # tower layers run after the hidden state the projector takes (LLaVA's vision_feature_layer -2: 1); in
    # training their saved tensors reach no gradient and are freed before the backward
    unused_layers: int = 0
    # what the tower saves per image after the unused layers, freed with them (CLIP's post_layernorm on the class
    # token), as head_saved_per_patch's (kind, elements)
    unused_saved_per_image: tuple[tuple[str, int], ...] = ()
    # tokens per tower pass the projector does not take (LLaVA's class token under
    # vision_feature_select_strategy "default": 1)
    dropped_tokens: int = 0
    # LLaVA-NeXT's "anyres": the resolutions (height, width) an image is resized and padded to
    # (image_grid_pinpoints), cut into tiles of tile_size pixels a side, each through the tower with the whole
    # image at tile_size besides; image_size is then the default image's side
    grid_pinpoints: tuple[tuple[int, int], ...] = ()
    tile_size: int = 0
    # Llama 3.2 Vision (mllama): the decoder layers whose attention reads the image through cross-attention
    # (MllamaCrossAttentionDecoderLayer) instead of image tokens in the sequence, and the keys/values per image
    # those layers attend over (max_num_tiles x (patches + class token)); () and 0 for a model whose image tokens
    # are in the sequence
    cross_attention_layers: tuple[int, ...] = ()
    cross_attention_tokens_per_image: int = 0
    # mllama's vision model: of num_layers, the global encoder's layers (num_global_layers; the rest are the local
    # encoder's) and the width of its output (vision_output_dim: the last global state and the kept local ones)
    global_layers: int = 0
    output_dim: int = 0
    # a prefix LM (PaliGemma): the image and prefix tokens attend to each other both ways, so every forward hands
    # the attention a 4-D mask (no mask-free SDPA or flash path)
    prefix_lm: bool = False
    # Pixtral (mistral3): the processor scales each image down to fit longest_edge pixels, keeping its aspect ratio,
    # and rounds each side up to a multiple of patch x merge; image_size is then the largest image's side
    longest_edge: int = 0
    # Pixtral: the tower packs a forward's images into one sequence with a block-diagonal mask unless flash
    # attention runs (varlen segments): SDPA's memory-efficient kernel keeps the mask (analytic/terms/vision.py);
    # eager over the pack is not modelled
    block_mask_unless_flash: bool = False
    # Qwen2-VL / Qwen2.5-VL: the vision model packs a forward's images into one sequence (cu_seqlens); before
    # transformers 4.54 its non-flash attention runs over the whole pack under a block-diagonal [1, S, S] mask, from
    # 4.54 within each image (facts/transformers.py QWEN_VL_PACKED_ATTENTION, spec/vision.py packed_attention)
    packs_images: bool = False
    # Idefics3 / SmolVLM: tower passes per image (its tiles and the whole image), the same for every square image
    # (the processor rescales it to a fixed longest edge); 0: one pass, or grid_pinpoints' tiles
    fixed_tiles: int = 0
    # why the model cannot take an image at all (its forward fails), refused for images_per_sample > 0; "": it can
    images_refused: str = ""
    # the tower's and the projector's ``nn.Linear`` weights as (ParamGroup name, in_features, out_features): what
    # transformers' quantizers replace and vLLM's quant_config reaches (spec/vision_quant.py); their ParamGroups
    # keep the role "other", so PEFT, the optimizer and the decoder's linear count never see them
    linears: tuple[tuple[str, int, int], ...] = ()
    # of ``linears``, (name, in_features, out_features, instances) stored quantized whenever the weights are:
    # every instance unless the checkpoint's quantization_config skips it (spec/vision_quant.py
    # ``with_tower_quantization``); ``quant_refused``: why a quantized tower cannot be estimated ("": it can)
    quantized_linears: tuple[tuple[str, int, int, int], ...] = ()
    quant_refused: str = ""
    # InternVL (GotOcr2ImageProcessor with crop_to_patches): each image cut into between min_tiles and max_tiles
    # tiles of image_size (get_optimal_tiled_canvas) and a thumbnail when more than one; max_tiles 0 or 1: one tile
    min_tiles: int = 0
    max_tiles: int = 0
    # what each tower layer saves per tower token besides the decoder layer's terms, as head_saved_per_patch's
    # (kind, elements): InternViT's layer scales (lambda_1, lambda_2) keep the sublayers' outputs
    layer_saved_per_token: tuple[tuple[str, int], ...] = ()
    # Phi-4-multimodal (Phi4MultimodalImageProcessor.dynamic_preprocess): each image resized onto a grid of
    # ceil(side / image_size) crops a side, at most dynamic_hd crops (else the closest aspect ratio of at most that
    # many), each through the tower with the whole image at image_size besides (spec/vision.py phi4_hd_crops); 0: not
    dynamic_hd: int = 0
    # tower hidden states alive per tower token besides the running layer's own while the tower's last layer runs
    # (spec/families/base.py held_tower_states: the encoder's input, bound in the vision model's forward, and any
    # selected hidden state before the last layer's input; Pixtral's patch_conv output besides: 2)
    kept_hidden_states: int = 0
    # elements per merged image token (patches / merge_size^2) kept in the compute dtype while the tower's last layer
    # runs besides its hidden states (Qwen3-VL: the DeepStack mergers' outputs of the blocks before the last,
    # out_hidden_size each, appended to deepstack_feature_lists)
    kept_merged_elements: int = 0
    # what the vision model's forward holds per tower patch through all its blocks besides hidden states, as (kind,
    # elements) with kind "compute" (the compute dtype), "fp32" or "int64": the 2-D rotary tables cos and sin
    # (Pixtral's in the compute dtype, Qwen2-VL's to Qwen3-VL's in fp32), their int64 (row, column) position ids, and
    # Qwen3-VL's interpolated pos_embeds (fp32) with its four int64 indices and fp32 weights a patch
    held_per_patch: tuple[tuple[str, int], ...] = ()
    # what the tower's parameters hold besides the tower and the projector, said in every report (Phi-4-multimodal:
    # its audio encoder); "": nothing
    param_note: str = ""
    # why a trained tower (full fine-tuning without train.freeze_vision_tower) is not modelled, refused; "": it is
    train_refused: str = ""
    # why serving the model is not modelled, refused; "": it is
    serve_refused: str = ""


@dataclass(frozen=True)
class AudioSpec:
    """A speech encoder's front end (Whisper, transformers 5.24 ``models/whisper/modeling_whisper.py``
    ``WhisperEncoder``): ``input_features`` of ``mel_bins`` x ``input_frames`` log-mel values per sample (the feature
    extractor's 30 s of audio: ``WhisperFeatureExtractor`` pads or cuts every clip to ``n_samples`` = 480,000 at 16 kHz,
    3,000 frames of hop 160), then ``conv1`` (``nn.Conv1d(mel_bins, d_model, kernel 3, padding 1)``) and ``conv2``
    (``nn.Conv1d(d_model, d_model, kernel 3, stride 2, padding 1)``), each followed by a GELU, give the encoder its
    ``input_frames // 2`` positions (``max_source_positions``).  ``WhisperEncoder.forward`` raises a ValueError for any
    other length ("Whisper expects the mel input features to be of length ...")."""

    mel_bins: int
    input_frames: int
    conv_strides: tuple[int, ...] = (1, 2)

    @property
    def encoder_frames(self) -> int:
        """The encoder's positions: ``input_frames`` over the convolutions' strides."""
        n = self.input_frames
        for stride in self.conv_strides:
            n //= stride
        return n


@dataclass(frozen=True)
class EncoderDecoderSpec:
    """An encoder-decoder model (T5, BART, Whisper): an encoder stack over the source sequence and a decoder stack
    over the target, each decoder layer with self-attention, cross-attention over the encoder's output, and an MLP.
    ``audio``: a speech encoder's front end (Whisper), whose source is log-mel features, not tokens.

    ``ModelSpec``'s own shape fields (``num_layers``, ``num_attention_heads``, ``intermediate_size``, ``layers``)
    describe the decoder stack, whose self-attention is what a generate's cache grows with; ``encoder`` is the
    encoder stack's layer shape as a ``ModelSpec`` of its own (no parameters listed: they are the outer model's,
    under ``encoder_prefix``; the decoder's under ``decoder_prefix``), read as a decoder layer is read.
    ``relative_bias_layers``: the self-attention layers holding a relative position bias table of
    ``relative_attention_num_buckets`` x heads ("first": T5 and mT5, the first layer of each stack; "every":
    UMT5; "none": BART).  ``cross_attention_heads``: the decoder's cross-attention heads (each of ``head_dim``).
    """

    encoder: ModelSpec
    encoder_prefix: str
    decoder_prefix: str
    cross_attention_heads: int
    relative_bias_layers: Literal["first", "every", "none"] = "none"
    relative_attention_num_buckets: int = 0
    source: str = ""
    notes: tuple[str, ...] = ()
    # a T5 checkpoint whose config.json says ``tie_word_embeddings: false`` (T5 v1.1, Flan-T5, mT5, UMT5): transformers
    # 5.24 ties the head anyway (spec/families/t5.py); 4.x honours the key (a separate lm_head, no rescaling of the
    # decoder output): ``spec/families/t5.py`` ``untied_head`` gives that model for a 4.x scenario
    config_untied_head: bool = False
    # BART's ``final_logits_bias`` buffer, added into a new logits tensor (``lm_logits + self.final_logits_bias``)
    final_logits_bias: bool = False
    # a speech encoder's convolutional front end over log-mel features (Whisper), None for a token encoder
    audio: AudioSpec | None = None
    # parameters the model itself leaves frozen (``requires_grad_(False)`` in its ``__init__``: Whisper's sinusoidal
    # encoder positions), which full fine-tuning gives no gradient and no optimizer state
    frozen_params: tuple[str, ...] = ()

    @property
    def encoder_layers(self) -> int:
        return self.encoder.num_layers


@dataclass(frozen=True)
class ModelSpec:
    name: str
    model_type: str
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int
    hidden_act: str
    mlp_gated: bool
    norm: Norm
    position: Position
    tie_word_embeddings: bool
    parallel_residual: bool
    qk_norm: bool
    sandwich_norms: bool  # Gemma 2/3: norms before and after each sublayer
    attention_dropout: float
    hidden_dropout: float
    max_position_embeddings: int
    layers: tuple[LayerSpec, ...]
    params: tuple[ParamGroup, ...]
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    attention_sinks: bool = False
    encoder_only: bool = False
    final_logit_softcapping: float | None = None
    checkpoint_dtype: str = "bf16"
    checkpoint_quantization: str | None = None
    checkpoint_quant: CheckpointQuant | None = None  # the config's quantization_config, read (None: none)
    source: str = ""
    notes: tuple[str, ...] = field(default=())
    traits: Traits = Traits()
    # the checkpoint's safetensors headers, read for a Hub id (catalog/hub.py); None: not read
    checkpoint_files: CheckpointFiles | None = None
    # what reading a Hub id's files could not establish (its headers not cached while offline), for the
    # report's assumptions (catalog/hub.py checkpoint_notes)
    source_notes: tuple[str, ...] = ()
    # a vision-language model's vision tower and projector (None: a text-only model)
    vision: VisionSpec | None = None
    # a hybrid model's Mamba2 mixer layers (None: every layer is attention)
    mamba: MambaSpec | None = None
    # the share of each head's dimensions that RoPE rotates (BambaConfig hardcodes 0.5, configuration_bamba.py
    # __post_init__ "hardcode for BC"); read by vLLM's rotary cache (serve/vllm.py rotary_cache_bytes)
    partial_rotary_factor: float = 1.0
    # an encoder-decoder model's encoder stack and cross-attention (None: a decoder-only or encoder-only model)
    encoder_decoder: EncoderDecoderSpec | None = None
    # Gemma 3n's AltUp streams, per-layer inputs and LAuReL (None: none of them)
    altup: AltUpSpec | None = None
    # the layers that read an earlier layer's keys and values and write no cache of their own (Gemma 3n's last
    # ``num_kv_shared_layers``: ``Gemma3nTextConfig.kv_sharing_modes`` "reuse"); analytic/kv_cache.py
    # ``attention_layers`` leaves them out
    kv_reuse_layers: tuple[int, ...] = ()
    # the config's ``use_cache``, the forward's default (``merge_with_config_defaults``, transformers 5.24)
    config_use_cache: bool = True

    @property
    def family(self) -> str:
        """The config's ``model_type``, for display only: behaviour reads ``traits``."""
        return self.model_type

    @property
    def peft_default_targets(self) -> tuple[str, ...] | None:
        """The LoRA targets PEFT picks for this model type when none are given (facts/peft_targets.py), or None
        where PEFT has no default and raises."""
        return default_lora_targets(self.model_type)

    @property
    def stacked_expert_checkpoint(self) -> bool:
        """Whether the checkpoint holds each routed expert's projections as their own tensors, which transformers 5
        stacks on the device at load (facts/transformers.py ``STACKED_EXPERT_CHECKPOINTS``)."""
        return self.moe is not None and self.model_type in STACKED_EXPERT_CHECKPOINTS

    @property
    def peft_moe_pattern(self) -> MoePattern | None:
        """How peft converts this MoE model's expert and router targets on transformers 5 (facts/peft_targets.py
        ``moe_pattern``), or None where it does not."""
        return moe_pattern(self.model_type)

    def router_kind(self, module: str) -> str:
        """"module" (not an ``nn.Linear`` on transformers 5), "tuple" (an ``nn.Linear`` whose forward returns a
        tuple) or "" for the router-role module ``module`` (facts/peft_targets.py ``router_kind``)."""
        return router_kind(self.model_type, module)

    def router_module(self) -> tuple[str, str, str] | None:
        """(leaf name, class, kind) of the router when it is not a plain ``nn.Linear`` (``MOE_ROUTER_MODULES``)."""
        return MOE_ROUTER_MODULES.get(self.model_type)

    # ---- parameter counts -------------------------------------------------
    @property
    def num_parameters(self) -> int:
        """Every parameter the Hugging Face model holds (tied weights counted once)."""
        return sum(p.total for p in self.params)

    def parameters_by_role(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.params:
            out[p.role] = out.get(p.role, 0) + p.total
        return out

    @property
    def num_active_parameters(self) -> int:
        """Parameters touched per token: MoE counts top_k of num_experts experts."""
        if self.moe is None:
            return self.num_parameters
        expert = sum(p.total for p in self.params if p.role == "expert")
        return self.num_parameters - expert + expert * self.moe.top_k // self.moe.num_experts

    def summary(self) -> dict[str, Any]:
        """The report's ``model`` block: what was modelled, with its source (and the checkpoint's tensors
        when its safetensors headers were read)."""
        out: dict[str, Any] = {"name": self.name, "model_type": self.model_type, "parameters": self.num_parameters,
                               "active_parameters": self.num_active_parameters, "source": self.source}
        if self.checkpoint_files is not None:
            out["checkpoint"] = self.checkpoint_files.summary()
        if self.vision is not None:
            out["vision"] = {"parameters": self.vision_parameters, "tokens_per_image": self.vision.tokens_per_image,
                             "patches_per_image": self.vision.patches_per_image, "image_size": self.vision.image_size,
                             "layers": self.vision.num_layers}
        if self.encoder_decoder is not None:
            ed = self.encoder_decoder
            out["encoder_decoder"] = {"encoder_layers": ed.encoder_layers, "decoder_layers": self.num_layers,
                                      "encoder_parameters": self.encoder_parameters}
        return out

    @property
    def encoder_parameters(self) -> int:
        """Parameters of an encoder-decoder model's encoder stack (its own tensors, not the shared embedding)."""
        if self.encoder_decoder is None:
            return 0
        return sum(p.total for p in self.params if p.name.startswith(self.encoder_decoder.encoder_prefix))

    @property
    def vision_parameters(self) -> int:
        """Parameters of the vision tower and the projector (0 for a text-only model)."""
        if self.vision is None:
            return 0
        return sum(p.total for p in self.params if p.name.startswith(self.vision.param_prefixes))

    def layer_params(self, index: int) -> int:
        return sum(p.numel * _per_layer_count(p) for p in self.params if index in p.layer_span)

    @property
    def outside_layer_params(self) -> int:
        return sum(p.total for p in self.params if not p.layer_span)

    # ---- attention facts --------------------------------------------------
    @property
    def q_width(self) -> int:
        if self.mla is not None:
            return self.num_attention_heads * (self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim)
        return self.num_attention_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Width of K (and of V) per token for one layer, before any cache compression."""
        if self.mla is not None:
            return self.num_attention_heads * (self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim)
        return self.num_kv_heads * self.head_dim

    @property
    def v_width(self) -> int:
        if self.mla is not None:
            return self.num_attention_heads * self.mla.v_head_dim
        return self.num_kv_heads * self.head_dim

    @property
    def attention_kind(self) -> str:
        if self.mla is not None:
            return "mla"
        if self.num_kv_heads == 1 and self.num_attention_heads > 1:
            return "mqa"
        if self.num_kv_heads < self.num_attention_heads:
            return "gqa"
        return "mha"


def _per_layer_count(p: ParamGroup) -> int:
    return p.count // max(1, len(p.layer_span))


def for_release(m: ModelSpec, transformers: tuple[int, ...] | None) -> ModelSpec:
    """``m`` as ``transformers`` runs it where a release changes the attention's inputs: in the releases of
    ``Traits.causal_mask_buffer_in`` (Llama and Gemma 4.38) ``_update_causal_mask`` hands every layer a 4-D mask
    whatever the padding (modeling_llama.py 4.38.2: eager and SDPA; flash-attention-2 returns before it), so SDPA
    runs the memory-efficient kernel on a mask and grouped K/V repeated to every head: ``Traits.sdpa_mask_always``.
    ``m`` itself otherwise."""
    window = m.traits.causal_mask_buffer_in
    if window is None or transformers is None or not window[0] <= transformers < window[1] or m.traits.sdpa_mask_always:
        return m
    return replace(m, traits=replace(m.traits, sdpa_mask_always=True))
