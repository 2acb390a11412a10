"""One adapter from a Hugging Face ``config.json`` to a ``ModelSpec``.

Key names follow each family's ``configuration_*.py`` in transformers; the
tensors listed per family follow its ``modeling_*.py`` (module names such as
``q_proj`` are the ones PEFT's ``target_modules`` match).  Where a key is absent,
the default is the one the family's configuration class uses, and the default is
named in the code so it can be checked.

Supported ``model_type`` values are in ``SUPPORTED_MODEL_TYPES``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vramplan.errors import Problem, ScenarioError
from vramplan.spec.model import LayerSpec, MLASpec, ModelSpec, MoESpec, Norm, ParamGroup, Role, TPSplit

LLAMA_LIKE = {
    "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3",
    "mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "gpt_oss", "olmo2", "granite",
}
SUPPORTED_MODEL_TYPES = tuple(sorted(
    LLAMA_LIKE | {"gpt2", "gpt_bigcode", "gptj", "gpt_neox", "falcon", "bloom", "opt", "bert",
                  "phi", "starcoder2", "stablelm", "cohere", "olmo"}))

# Keys each family needs, spelled as in its config.json; used for clear errors.
_REQUIRED: dict[str, tuple[str, ...]] = {
    "gpt2": ("n_embd", "n_layer", "n_head", "vocab_size"),
    "gpt_bigcode": ("n_embd", "n_layer", "n_head", "vocab_size"),
    "gptj": ("n_embd", "n_layer", "n_head", "vocab_size"),
    "bloom": ("n_layer", "vocab_size"),
    "opt": ("hidden_size", "num_hidden_layers", "num_attention_heads", "ffn_dim", "vocab_size"),
    "bert": ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"),
    "falcon": ("hidden_size", "num_attention_heads", "vocab_size"),
}
_LLAMA_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


class _Params:
    """Accumulates ParamGroup rows for one model."""

    def __init__(self) -> None:
        self.rows: list[ParamGroup] = []

    def add(
        self,
        name: str,
        numel: int,
        role: Role,
        layers: tuple[int, ...] = (),
        per_layer: int = 1,
        in_features: int = 0,
        out_features: int = 0,
        tp: TPSplit = "replicated",
    ) -> None:
        if numel <= 0:
            return
        count = per_layer * (len(layers) if layers else 1)
        if count <= 0:
            return
        module = name.split(".")[-2] if name.endswith((".weight", ".bias")) else name.split(".")[-1]
        self.rows.append(
            ParamGroup(name, module, numel, count, role, in_features, out_features, tp, layers)
        )

    def linear(
        self,
        name: str,
        fan_in: int,
        fan_out: int,
        layers: tuple[int, ...],
        bias: bool,
        tp: TPSplit,
        role: Role = "linear",
        per_layer: int = 1,
    ) -> None:
        self.add(f"{name}.weight", fan_in * fan_out, role, layers, per_layer, fan_in, fan_out, tp)
        if bias:
            # a column-parallel bias is split with its output; a row-parallel one is replicated
            btp: TPSplit = "column" if tp == "column" else ("expert" if tp == "expert" else "replicated")
            self.add(f"{name}.bias", fan_out, "bias", layers, per_layer, tp=btp)

    def norm(self, name: str, width: int, layers: tuple[int, ...], bias: bool) -> None:
        self.add(f"{name}.weight", width, "norm", layers)
        if bias:
            self.add(f"{name}.bias", width, "bias", layers)


def _get(cfg: Mapping[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    return default


def _check_required(cfg: Mapping[str, Any], model_type: str, where: str) -> None:
    need = _REQUIRED.get(model_type, _LLAMA_REQUIRED)
    missing = [k for k in need if k not in cfg and not (model_type == "falcon" and k == "hidden_size" and "n_embed" in cfg)]
    if missing:
        raise ScenarioError(
            [Problem(where, f"config.json of model_type {model_type!r} lacks required key(s) {', '.join(missing)}",
                     "give a complete config.json as the model's Hugging Face repository has it")]
        )


def _flatten_text_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Multimodal configs (Gemma 3, Llama 4, Mistral 3) nest the language model in ``text_config``."""
    out = dict(cfg)
    text = cfg.get("text_config")
    if isinstance(text, Mapping) and "hidden_size" not in cfg:
        merged = dict(text)
        for k in ("tie_word_embeddings", "torch_dtype", "quantization_config"):
            if k in cfg and k not in merged:
                merged[k] = cfg[k]
        out = merged
        if out.get("model_type") == "gemma3":
            out["model_type"] = "gemma3_text"
    return out


def model_from_config(config: Mapping[str, Any], name: str = "custom", where: str = "model") -> ModelSpec:
    """Build a ``ModelSpec`` from a config.json mapping; raises ScenarioError with every problem."""
    cfg = _flatten_text_config(config)
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str):
        raise ScenarioError([Problem(where, "config.json has no 'model_type'",
                                     f"add one of: {', '.join(SUPPORTED_MODEL_TYPES)}")])
    if model_type not in SUPPORTED_MODEL_TYPES:
        from vramplan.errors import suggest

        close = suggest(model_type, SUPPORTED_MODEL_TYPES)
        hint = f"did you mean {', '.join(close)}?" if close else f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        raise ScenarioError([Problem(where, f"model_type {model_type!r} is not supported", hint)])
    _check_required(cfg, model_type, where)
    bad = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size",
                       "n_embd", "n_layer", "n_head")
           if k in cfg and (not isinstance(cfg[k], int) or isinstance(cfg[k], bool) or cfg[k] <= 0)]
    if bad:
        raise ScenarioError([Problem(f"{where}.{k}", f"must be a positive integer, got {cfg[k]!r}",
                                     "fix the config.json") for k in bad])
    if model_type == "gpt2":
        return _gpt2(cfg, name)
    if model_type == "gpt_bigcode":
        return _bigcode(cfg, name)
    if model_type == "gptj":
        return _gptj(cfg, name)
    if model_type == "bloom":
        return _bloom(cfg, name)
    if model_type == "gpt_neox":
        return _neox(cfg, name)
    if model_type == "falcon":
        return _falcon(cfg, name)
    if model_type == "opt":
        return _opt(cfg, name)
    if model_type == "bert":
        return _bert(cfg, name)
    if model_type == "phi":
        return _phi(cfg, name)
    if model_type == "starcoder2":
        return _starcoder2(cfg, name)
    if model_type in ("stablelm", "cohere", "olmo"):
        return _gated_layernorm(cfg, model_type, name)
    return _llama_like(cfg, model_type, name)


def _dtype(cfg: Mapping[str, Any]) -> str:
    raw = str(_get(cfg, "torch_dtype", "dtype", default="bfloat16"))
    return {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(raw, "bf16")


def _quant(cfg: Mapping[str, Any]) -> str | None:
    q = cfg.get("quantization_config")
    if not isinstance(q, Mapping):
        return None
    method = str(q.get("quant_method", "")).lower()
    if method == "fp8":
        return "fp8"
    if method == "mxfp4":
        return "mxfp4"
    if method in ("gptq", "awq"):
        return f"{method}-{q.get('bits', 4)}bit"
    if method == "bitsandbytes":
        return "nf4" if q.get("load_in_4bit") else "int8"
    return method or None


def _layer_types(cfg: Mapping[str, Any], n_layers: int, model_type: str) -> list[int | None]:
    """Sliding window per layer, from ``layer_types`` or the family's documented pattern."""
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if isinstance(types, list) and len(types) == n_layers:
        return [int(window) if (t == "sliding_attention" and window) else None for t in types]
    if model_type == "gemma2" and window:
        # Gemma 2 alternates local (even layers) and global attention (modeling_gemma2.py).
        return [int(window) if i % 2 == 0 else None for i in range(n_layers)]
    if model_type == "gemma3_text" and window:
        pattern = int(cfg.get("sliding_window_pattern", 6))  # five local layers, then one global
        return [None if (i + 1) % pattern == 0 else int(window) for i in range(n_layers)]
    if model_type == "gpt_oss" and window:
        return [int(window) if i % 2 == 0 else None for i in range(n_layers)]
    use_sw = cfg.get("use_sliding_window", model_type in ("mistral", "mixtral", "phi3"))
    if window and use_sw:
        if model_type in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
            max_window_layers = int(cfg.get("max_window_layers", n_layers))
            return [int(window) if i >= max_window_layers else None for i in range(n_layers)]
        return [int(window)] * n_layers
    return [None] * n_layers


def _llama_like(cfg: Mapping[str, Any], model_type: str, name: str) -> ModelSpec:
    h = int(cfg["hidden_size"])
    n_layers = int(cfg["num_hidden_layers"])
    n_heads = int(cfg["num_attention_heads"])
    n_kv = int(_get(cfg, "num_key_value_heads", default=n_heads))
    head_dim = int(_get(cfg, "head_dim", default=h // n_heads))
    vocab = int(cfg["vocab_size"])
    inter = int(_get(cfg, "intermediate_size", default=4 * h))
    tied = bool(cfg.get("tie_word_embeddings", model_type in ("gemma", "gemma2", "gemma3_text")))
    all_layers = tuple(range(n_layers))
    p = _Params()
    notes: list[str] = []

    # qkv/o biases: Qwen2 (and Qwen2-MoE) hard-code q/k/v biases and no o bias;
    # llama-style configs say so with attention_bias (applies to all four).
    qkv_bias = bool(cfg.get("attention_bias", False)) or model_type in ("qwen2", "qwen2_moe")
    o_bias = bool(cfg.get("attention_bias", False)) and model_type not in ("qwen2", "qwen2_moe")
    mlp_bias = bool(cfg.get("mlp_bias", False))

    p.add("embed_tokens.weight", vocab * h, "embedding", tp="vocab")

    # ---- attention ----
    mla: MLASpec | None = None
    if model_type in ("deepseek_v2", "deepseek_v3"):
        q_lora = cfg.get("q_lora_rank")
        kv_lora = int(cfg["kv_lora_rank"])
        nope = int(cfg["qk_nope_head_dim"])
        rope = int(cfg["qk_rope_head_dim"])
        vdim = int(cfg["v_head_dim"])
        mla = MLASpec(int(q_lora) if q_lora else None, kv_lora, nope, rope, vdim)
        qk = n_heads * (nope + rope)
        if q_lora:
            p.linear("layers.self_attn.q_a_proj", h, int(q_lora), all_layers, qkv_bias, "replicated")
            p.norm("layers.self_attn.q_a_layernorm", int(q_lora), all_layers, False)
            p.linear("layers.self_attn.q_b_proj", int(q_lora), qk, all_layers, False, "column")
        else:
            p.linear("layers.self_attn.q_proj", h, qk, all_layers, False, "column")
        p.linear("layers.self_attn.kv_a_proj_with_mqa", h, kv_lora + rope, all_layers, qkv_bias, "replicated")
        p.norm("layers.self_attn.kv_a_layernorm", kv_lora, all_layers, False)
        p.linear("layers.self_attn.kv_b_proj", kv_lora, n_heads * (nope + vdim), all_layers, False, "column")
        p.linear("layers.self_attn.o_proj", n_heads * vdim, h, all_layers, o_bias, "row")
        head_dim = nope + rope
        n_kv = n_heads
    elif model_type == "phi3":
        op = n_heads * head_dim + 2 * n_kv * head_dim
        p.linear("layers.self_attn.qkv_proj", h, op, all_layers, qkv_bias, "column")
        p.linear("layers.self_attn.o_proj", n_heads * head_dim, h, all_layers, o_bias, "row")
    else:
        p.linear("layers.self_attn.q_proj", h, n_heads * head_dim, all_layers, qkv_bias, "column")
        p.linear("layers.self_attn.k_proj", h, n_kv * head_dim, all_layers, qkv_bias, "column")
        p.linear("layers.self_attn.v_proj", h, n_kv * head_dim, all_layers, qkv_bias, "column")
        p.linear("layers.self_attn.o_proj", n_heads * head_dim, h, all_layers, o_bias, "row")
    qk_norm = model_type in ("qwen3", "qwen3_moe", "gemma3_text", "olmo2")
    if qk_norm:
        width = head_dim if model_type != "olmo2" else None
        if width is None:
            p.norm("layers.self_attn.q_norm", n_heads * head_dim, all_layers, False)
            p.norm("layers.self_attn.k_norm", n_kv * head_dim, all_layers, False)
        else:
            p.norm("layers.self_attn.q_norm", width, all_layers, False)
            p.norm("layers.self_attn.k_norm", width, all_layers, False)
    sinks = model_type == "gpt_oss"
    if sinks:
        p.add("layers.self_attn.sinks", n_heads, "other", all_layers)

    # ---- norms ----
    p.norm("layers.input_layernorm", h, all_layers, False)
    p.norm("layers.post_attention_layernorm", h, all_layers, False)
    sandwich = model_type in ("gemma2", "gemma3_text")
    if sandwich:
        p.norm("layers.pre_feedforward_layernorm", h, all_layers, False)
        p.norm("layers.post_feedforward_layernorm", h, all_layers, False)

    # ---- MLP / MoE ----
    moe: MoESpec | None = None
    moe_layers: set[int] = set()
    if model_type == "mixtral":
        e = int(cfg.get("num_local_experts", 8))
        k = int(cfg.get("num_experts_per_tok", 2))
        moe = MoESpec(e, k, inter)
        moe_layers = set(all_layers)
    elif model_type in ("qwen2_moe", "qwen3_moe"):
        e = int(cfg["num_experts"])
        k = int(cfg.get("num_experts_per_tok", 8))
        ei = int(cfg["moe_intermediate_size"])
        shared = int(cfg.get("shared_expert_intermediate_size", 0)) if model_type == "qwen2_moe" else 0
        moe = MoESpec(e, k, ei, 1 if shared else 0, shared)
        step = int(cfg.get("decoder_sparse_step", 1))
        only = set(cfg.get("mlp_only_layers", []) or [])
        # modeling_qwen2_moe.py: sparse iff layer not in mlp_only_layers and (i+1) % step == 0
        moe_layers = {i for i in all_layers if i not in only and e > 0 and (i + 1) % step == 0}
    elif model_type in ("deepseek_v2", "deepseek_v3"):
        e = int(cfg["n_routed_experts"])
        k = int(cfg["num_experts_per_tok"])
        ei = int(cfg["moe_intermediate_size"])
        ns = int(cfg.get("n_shared_experts", 0) or 0)
        moe = MoESpec(e, k, ei, ns, ns * ei)
        first_dense = int(cfg.get("first_k_dense_replace", 0))
        freq = int(cfg.get("moe_layer_freq", 1))
        moe_layers = {i for i in all_layers if i >= first_dense and i % freq == 0}
    elif model_type == "gpt_oss":
        e = int(cfg["num_local_experts"])
        k = int(cfg.get("num_experts_per_tok", cfg.get("experts_per_token", 4)))
        moe = MoESpec(e, k, inter)
        moe_layers = set(all_layers)

    dense_layers = tuple(i for i in all_layers if i not in moe_layers)
    sparse_layers = tuple(sorted(moe_layers))
    if dense_layers:
        if model_type == "phi3":
            p.linear("layers.mlp.gate_up_proj", h, 2 * inter, dense_layers, mlp_bias, "column")
        else:
            p.linear("layers.mlp.gate_proj", h, inter, dense_layers, mlp_bias, "column")
            p.linear("layers.mlp.up_proj", h, inter, dense_layers, mlp_bias, "column")
        p.linear("layers.mlp.down_proj", inter, h, dense_layers, mlp_bias, "row")
    if moe is not None and sparse_layers:
        e, ei = moe.num_experts, moe.expert_intermediate_size
        router_bias = model_type == "gpt_oss"
        p.linear("layers.mlp.gate", h, e, sparse_layers, router_bias, "replicated", role="router")
        if model_type == "deepseek_v3":
            p.add("layers.mlp.gate.e_score_correction_bias", e, "other", sparse_layers)
        ebias = model_type == "gpt_oss"
        p.linear("layers.mlp.experts.gate_proj", h, ei, sparse_layers, ebias, "expert", "expert", e)
        p.linear("layers.mlp.experts.up_proj", h, ei, sparse_layers, ebias, "expert", "expert", e)
        p.linear("layers.mlp.experts.down_proj", ei, h, sparse_layers, ebias, "expert", "expert", e)
        if moe.shared_intermediate_size:
            si = moe.shared_intermediate_size
            p.linear("layers.mlp.shared_experts.gate_proj", h, si, sparse_layers, False, "column")
            p.linear("layers.mlp.shared_experts.up_proj", h, si, sparse_layers, False, "column")
            p.linear("layers.mlp.shared_experts.down_proj", si, h, sparse_layers, False, "row")
            if model_type == "qwen2_moe":
                p.linear("layers.mlp.shared_expert_gate", h, 1, sparse_layers, False, "replicated", role="router")

    p.norm("norm", h, (), False)
    if not tied:
        p.add("lm_head.weight", vocab * h, "lm_head", in_features=h, out_features=vocab, tp="vocab")

    windows = _layer_types(cfg, n_layers, model_type)
    layers = tuple(
        LayerSpec(i, i in moe_layers, inter if i not in moe_layers else 0, windows[i]) for i in all_layers
    )
    act = str(_get(cfg, "hidden_act", "hidden_activation", default="silu"))
    norm_kind: Norm = "gemma_rms" if model_type in ("gemma", "gemma2", "gemma3_text") else "rms"
    if model_type == "gpt_oss":
        norm_kind = "rms_fp32"  # GptOssRMSNorm (modeling_gpt_oss.py): weight * fp32 normalized, then cast
    return ModelSpec(
        name=name,
        model_type=model_type,
        hidden_size=h,
        num_layers=n_layers,
        num_attention_heads=n_heads,
        num_kv_heads=n_kv,
        head_dim=head_dim,
        vocab_size=vocab,
        intermediate_size=inter,
        hidden_act=act,
        mlp_gated=True,
        norm=norm_kind,
        position="rope",
        tie_word_embeddings=tied,
        parallel_residual=False,
        qk_norm=qk_norm,
        sandwich_norms=sandwich,
        attention_dropout=float(cfg.get("attention_dropout", 0.0) or 0.0),
        hidden_dropout=0.0,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        layers=layers,
        params=tuple(p.rows),
        moe=moe,
        mla=mla,
        attention_sinks=sinks,
        final_logit_softcapping=cfg.get("final_logit_softcapping"),
        checkpoint_dtype=_dtype(cfg),
        checkpoint_quantization=_quant(cfg),
        notes=tuple(notes),
    )


def _simple(
    cfg: Mapping[str, Any], name: str, model_type: str, p: _Params, *, h: int, n_layers: int, n_heads: int,
    n_kv: int, vocab: int, inter: int, act: str, position: str, tied: bool, parallel: bool,
    attn_drop: float, hidden_drop: float, max_pos: int, encoder_only: bool = False, head_dim: int = 0,
    windows: list[int | None] | None = None, mlp_gated: bool = False, norm: Norm = "layer",
    qk_norm: bool = False, notes: tuple[str, ...] = (),
) -> ModelSpec:
    win = windows or [None] * n_layers
    layers = tuple(LayerSpec(i, False, inter, win[i]) for i in range(n_layers))
    return ModelSpec(
        name=name, model_type=model_type, hidden_size=h, num_layers=n_layers, num_attention_heads=n_heads,
        num_kv_heads=n_kv, head_dim=head_dim or h // n_heads, vocab_size=vocab, intermediate_size=inter,
        hidden_act=act, mlp_gated=mlp_gated, norm=norm, position=position,  # type: ignore[arg-type]
        tie_word_embeddings=tied, parallel_residual=parallel, qk_norm=qk_norm, sandwich_norms=False,
        attention_dropout=attn_drop, hidden_dropout=hidden_drop, max_position_embeddings=max_pos,
        layers=layers, params=tuple(p.rows), encoder_only=encoder_only, checkpoint_dtype=_dtype(cfg),
        checkpoint_quantization=_quant(cfg), notes=notes,
    )


def _gpt2(cfg: Mapping[str, Any], name: str) -> ModelSpec:
    # modeling_gpt2.py: Conv1D layers with biases, learned positions, LayerNorm with bias, tied lm_head.
    return _gpt2_layout(cfg, name, "gpt2", n_kv=int(cfg["n_head"]), act_default="gelu_new")


def _bigcode(cfg: Mapping[str, Any], name: str) -> ModelSpec:
    # modeling_gpt_bigcode.py (StarCoder, OctoCoder): GPT-2 layout with nn.Linear; with multi_query
    # (configuration default True) c_attn projects to h + 2 * head_dim: one shared K and V head (MQA).
    n_kv = 1 if bool(cfg.get("multi_query", True)) else int(cfg["n_head"])
    return _gpt2_layout(cfg, name, "gpt_bigcode", n_kv=n_kv, act_default="gelu_pytorch_tanh")


def _gpt2_layout(cfg: Mapping[str, Any], name: str, model_type: str, n_kv: int, act_default: str) -> ModelSpec:
    """GPT-2's tensors: c_attn projects to h + 2 * n_kv * head_dim (3h for multi-head attention)."""
    h, n_layers, n_heads = int(cfg["n_embd"]), int(cfg["n_layer"]), int(cfg["n_head"])
    vocab, npos = int(cfg["vocab_size"]), int(cfg.get("n_positions", 1024))
    inter = int(cfg.get("n_inner") or 4 * h)
    hd = h // n_heads
    L = tuple(range(n_layers))
    p = _Params()
    p.add("wte.weight", vocab * h, "embedding", tp="vocab")
    p.add("wpe.weight", npos * h, "position")
    p.norm("h.ln_1", h, L, True)
    p.linear("h.attn.c_attn", h, h + 2 * n_kv * hd, L, True, "column")
    p.linear("h.attn.c_proj", h, h, L, True, "row")
    p.norm("h.ln_2", h, L, True)
    p.linear("h.mlp.c_fc", h, inter, L, True, "column")
    p.linear("h.mlp.c_proj", inter, h, L, True, "row")
    p.norm("ln_f", h, (), True)
    return _simple(cfg, name, model_type, p, h=h, n_layers=n_layers, n_heads=n_heads, n_kv=n_kv, vocab=vocab,
                   inter=inter, act=str(cfg.get("activation_function", act_default)), position="learned",
                   tied=True, parallel=False, attn_drop=float(cfg.get("attn_pdrop", 0.1) or 0.0),
                   hidden_drop=float(cfg.get("resid_pdrop", 0.1) or 0.0), max_pos=npos)


def _attention_linears(p: _Params, h: int, n_heads: int, n_kv: int, hd: int, layers: tuple[int, ...], bias: bool,
                       out: str) -> None:
    """``layers.self_attn``'s q/k/v projections (column-parallel) and its output projection ``out`` (row)."""
    p.linear("layers.self_attn.q_proj", h, n_heads * hd, layers, bias, "column")
    p.linear("layers.self_attn.k_proj", h, n_kv * hd, layers, bias, "column")
    p.linear("layers.self_attn.v_proj", h, n_kv * hd, layers, bias, "column")
    p.linear(f"layers.self_attn.{out}", n_heads * hd, h, layers, bias, "row")


def _head_with_bias(p: _Params, cfg: Mapping[str, Any], vocab: int, h: int) -> bool:
    """An untied LM head with a bias (GPT-J, phi), unless the config ties it; returns whether it is tied."""
    tied = bool(cfg.get("tie_word_embeddings", False))
    if not tied:
        p.add("lm_head.weight", vocab * h, "lm_head", in_features=h, out_features=vocab, tp="vocab")
        p.add("lm_head.bias", vocab, "bias", tp="vocab")
    return tied


def _gptj(cfg: Mapping[str, Any], name: str) -> ModelSpec:
    # modeling_gptj.py: separate q/k/v/out_proj without bias, one ln_1 feeding attention and MLP in
    # parallel, fc_in/fc_out with bias, partial rotary (rotary_dim), untied lm_head *with* bias.
    h, n_layers, n_heads = int(cfg["n_embd"]), int(cfg["n_layer"]), int(cfg["n_head"])
    vocab = int(cfg["vocab_size"])
    inter = int(cfg.get("n_inner") or 4 * h)
    L = tuple(range(n_layers))
    p = _Params()
    p.add("wte.weight", vocab * h, "embedding", tp="vocab")
    p.norm("h.ln_1", h, L, True)
    for m in ("q_proj", "k_proj", "v_proj"):
        p.linear(f"h.attn.{m}", h, h, L, False, "column")
    p.linear("h.attn.out_proj", h, h, L, False, "row")
    p.linear("h.mlp.fc_in", h, inter, L, True, "column")
    p.linear("h.mlp.fc_out", inter, h, L, True, "row")
    p.norm("ln_f", h, (), True)
    tied = _head_with_bias(p, cfg, vocab, h)
    return _simple(cfg, name, "gptj", p, h=h, n_layers=n_layers, n_heads=n_heads, n_kv=n_heads, vocab=vocab,
                   inter=inter, act=str(cfg.get("activation_function", "gelu_new")), position="rope", tied=tied,
                   parallel=True, attn_drop=float(cfg.get("attn_pdrop", 0.0) or 0.0),
                   hidden_drop=float(cfg.get("resid_pdrop", 0.0) or 0.0),
                   max_pos=int(cfg.get("n_positions", 2048)))


def _bloom(cfg: Mapping[str, Any], name: str) -> ModelSpec:
    # modeling_bloom.py: word_embeddings + word_embeddings_layernorm, fused query_key_value with bias,
    # ALiBi (no position table), LayerNorms with bias, tied lm_head.  configuration_bloom.py spells
    # hidden_size as "hidden_size" or the legacy "n_embed", and heads as "n_head".
    h = int(_get(cfg, "hidden_size", "n_embed", default=64))
    n_layers = int(cfg["n_layer"])
    n_heads = int(_get(cfg, "n_head", "num_attention_heads", default=8))
    vocab = int(cfg["vocab_size"])
    inter = 4 * h
    L = tuple(range(n_layers))
    p = _Params()
    p.add("word_embeddings.weight", vocab * h, "embedding", tp="vocab")
    p.norm("word_embeddings_layernorm", h, (), True)
    p.norm("h.input_layernorm", h, L, True)
    p.linear("h.self_attention.query_key_value", h, 3 * h, L, True, "column")
    p.linear("h.self_attention.dense", h, h, L, True, "row")
    p.norm("h.post_attention_layernorm", h, L, True)
    p.linear("h.mlp.dense_h_to_4h", h, inter, L, True, "column")
    p.linear("h.mlp.dense_4h_to_h", inter, h, L, True, "row")
    p.norm("ln_f", h, (), True)
    return _simple(cfg, name, "bloom", p, h=h, n_layers=n_layers, n_heads=n_heads, n_kv=n_heads, vocab=vocab,
                   inter=inter, act="gelu", position="alibi", tied=True, parallel=False,
                   attn_drop=float(cfg.get("attention_dropout", 0.0) or 0.0),
                   hidden_drop=float(cfg.get("hidden_dropout", 0.0) or 0.0),
                   max_pos=int(cfg.get("seq_length", 2048) or 2048))


def _neox(cfg: Mapping[str, Any], name: str) -> ModelSpec:
    # modeling_gpt_neox.py: fused query_key_value with bias, parallel residual, untied embed_out.
    h, n_layers, n_heads = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
    vocab, inter = int(cfg["vocab_size"]), int(cfg.get("intermediate_size", 4 * h))
    bias = bool(cfg.get("attention_bias", True))
    L = tuple(range(n_layers))
    p = _Params()
    p.add("embed_in.weight", vocab * h, "embedding", tp="vocab")
    p.norm("layers.input_layernorm", h, L, True)
    p.norm("layers.post_attention_layernorm", h, L, True)
    p.linear("layers.attention.query_key_value", h, 3 * h, L, bias, "column")
    p.linear("layers.attention.dense", h, h, L, bias, "row")
    p.linear("layers.mlp.dense_h_to_4h", h, inter, L, True, "column")
    p.linear("layers.mlp.dense_4h_to_h", inter, h, L, True, "row")
    p.norm("final_layer_norm", h, (), True)
    tied = bool(cfg.get("tie_word_embeddings", False))
    if not tied:
        p.add("embed_out.weight", vocab * h, "lm_head", in_features=h, out_features=vocab, tp="vocab")
    return _simple(cfg, name, "gpt_neox", p, h=h, n_layers=n_layers, n_heads=n_heads, n_kv=n_heads, vocab=vocab,
                   inter=inter, act=str(cfg.get("hidden_act", "gelu")), position="rope", tied=tied,
                   parallel=bool(cfg.get("use_parallel_residual", True)),
                   attn_drop=float(cfg.get("attention_dropout", 0.0) or 0.0),
                   hidden_drop=float(cfg.get("hidden_dropout", 0.0) or 0.0),
                   max_pos=int(cfg.get("max_position_embeddings", 2048)))


def _falcon(cfg: Mapping[str, Any], name: str) -> ModelSpec:
    # modeling_falcon.py; configuration_falcon.py defaults: ffn_hidden_size = 4*h, bias False,
    # parallel_attn True, new_decoder_architecture False, multi_query True.
    h = int(_get(cfg, "hidden_size", "n_embed"))
    n_layers = int(_get(cfg, "num_hidden_layers", "n_layer", default=32))
    n_heads = int(_get(cfg, "num_attention_heads", "n_head"))
    vocab = int(cfg["vocab_size"])
    hd = h // n_heads
    new_arch = bool(cfg.get("new_decoder_architecture", False))
    if new_arch:
        n_kv = int(_get(cfg, "num_kv_heads", "n_head_kv", default=n_heads))
    else:
        n_kv = 1 if cfg.get("multi_query", True) else n_heads
    inter = int(cfg.get("ffn_hidden_size") or 4 * h)
    bias = bool(cfg.get("bias", False))
    L = tuple(range(n_layers))
    p = _Params()
    p.add("word_embeddings.weight", vocab * h, "embedding", tp="vocab")
    if new_arch and int(cfg.get("num_ln_in_parallel_attn") or 2) == 2:
        p.norm("h.ln_attn", h, L, True)
        p.norm("h.ln_mlp", h, L, True)
    else:
        p.norm("h.input_layernorm", h, L, True)
        if not bool(cfg.get("parallel_attn", True)):
            p.norm("h.post_attention_layernorm", h, L, True)
    p.linear("h.self_attention.query_key_value", h, (n_heads + 2 * n_kv) * hd, L, bias, "column")
    p.linear("h.self_attention.dense", h, h, L, bias, "row")
    p.linear("h.mlp.dense_h_to_4h", h, inter, L, bias, "column")
    p.linear("h.mlp.dense_4h_to_h", inter, h, L, bias, "row")
    p.norm("ln_f", h, (), True)
    tied = bool(cfg.get("tie_word_embeddings", True))
    if not tied:
        p.add("lm_head.weight", vocab * h, "lm_head", in_features=h, out_features=vocab, tp="vocab")
    position = "alibi" if cfg.get("alibi") else "rope"
    return _simple(cfg, name, "falcon", p, h=h, n_layers=n_layers, n_heads=n_heads, n_kv=n_kv, vocab=vocab,
                   inter=inter, act="gelu", position=position, tied=tied,
                   parallel=bool(cfg.get("parallel_attn", True)),
                   attn_drop=float(cfg.get("attention_dropout", 0.0) or 0.0),
                   hidden_drop=float(cfg.get("hidden_dropout", 0.0) or 0.0),
                   max_pos=int(cfg.get("max_position_embeddings", 2048)))


def _opt(cfg: Mapping[str, Any], name: str) -> ModelSpec:
    # modeling_opt.py: learned positions with an offset of 2, biased projections, optional project_in/out.
    h, n_layers, n_heads = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
    vocab, ffn = int(cfg["vocab_size"]), int(cfg["ffn_dim"])
    proj = int(cfg.get("word_embed_proj_dim", h) or h)
    max_pos = int(cfg.get("max_position_embeddings", 2048))
    bias = bool(cfg.get("enable_bias", True))
    L = tuple(range(n_layers))
    p = _Params()
    p.add("embed_tokens.weight", vocab * proj, "embedding", tp="vocab")
    p.add("embed_positions.weight", (max_pos + 2) * h, "position")
    if proj != h:
        p.linear("project_in", proj, h, (), False, "replicated")
        p.linear("project_out", h, proj, (), False, "replicated")
    for m in ("q_proj", "k_proj", "v_proj"):
        p.linear(f"layers.self_attn.{m}", h, h, L, bias, "column")
    p.linear("layers.self_attn.out_proj", h, h, L, bias, "row")
    ln_affine = bool(cfg.get("layer_norm_elementwise_affine", True))
    if ln_affine:
        p.norm("layers.self_attn_layer_norm", h, L, True)
        p.norm("layers.final_layer_norm", h, L, True)
    p.linear("layers.fc1", h, ffn, L, bias, "column")
    p.linear("layers.fc2", ffn, h, L, bias, "row")
    if cfg.get("do_layer_norm_before", True) and not cfg.get("_remove_final_layer_norm", False) and ln_affine:
        p.norm("final_layer_norm", h, (), True)
    return _simple(cfg, name, "opt", p, h=h, n_layers=n_layers, n_heads=n_heads, n_kv=n_heads, vocab=vocab,
                   inter=ffn, act=str(cfg.get("activation_function", "relu")), position="learned", tied=True,
                   parallel=False, attn_drop=float(cfg.get("attention_dropout", 0.0) or 0.0),
                   hidden_drop=float(cfg.get("dropout", 0.1) or 0.0), max_pos=max_pos)


def _bert(cfg: Mapping[str, Any], name: str) -> ModelSpec:
    # modeling_bert.py, BertForMaskedLM (no pooler): the encoder plus the MLM head whose decoder is tied.
    h, n_layers, n_heads = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
    vocab, inter = int(cfg["vocab_size"]), int(cfg["intermediate_size"])
    max_pos = int(cfg.get("max_position_embeddings", 512))
    L = tuple(range(n_layers))
    p = _Params()
    p.add("embeddings.word_embeddings.weight", vocab * h, "embedding", tp="vocab")
    p.add("embeddings.position_embeddings.weight", max_pos * h, "position")
    p.add("embeddings.token_type_embeddings.weight", int(cfg.get("type_vocab_size", 2)) * h, "position")
    p.norm("embeddings.LayerNorm", h, (), True)
    for m in ("query", "key", "value"):
        p.linear(f"encoder.layer.attention.self.{m}", h, h, L, True, "column")
    p.linear("encoder.layer.attention.output.dense", h, h, L, True, "row")
    p.norm("encoder.layer.attention.output.LayerNorm", h, L, True)
    p.linear("encoder.layer.intermediate.dense", h, inter, L, True, "column")
    p.linear("encoder.layer.output.dense", inter, h, L, True, "row")
    p.norm("encoder.layer.output.LayerNorm", h, L, True)
    p.linear("cls.predictions.transform.dense", h, h, (), True, "replicated")
    p.norm("cls.predictions.transform.LayerNorm", h, (), True)
    p.add("cls.predictions.bias", vocab, "bias")
    return _simple(cfg, name, "bert", p, h=h, n_layers=n_layers, n_heads=n_heads, n_kv=n_heads, vocab=vocab,
                   inter=inter, act=str(cfg.get("hidden_act", "gelu")), position="learned", tied=True,
                   parallel=False, attn_drop=float(cfg.get("attention_probs_dropout_prob", 0.1)),
                   hidden_drop=float(cfg.get("hidden_dropout_prob", 0.1)), max_pos=max_pos, encoder_only=True)


def _phi(cfg: Mapping[str, Any], name: str) -> ModelSpec:
    # modeling_phi.py (phi-1, phi-1.5, phi-2): one input_layernorm (LayerNorm with bias) feeding attention
    # and MLP in parallel, q/k/v_proj and dense with bias, fc1/fc2 with bias, partial rotary
    # (partial_rotary_factor of each head), final_layernorm, untied lm_head *with* bias.
    # configuration_phi.py defaults: intermediate_size 8192, tie_word_embeddings False, qk_layernorm False.
    h, n_layers, n_heads = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
    n_kv = int(_get(cfg, "num_key_value_heads", default=n_heads))
    hd = h // n_heads
    vocab, inter = int(cfg["vocab_size"]), int(cfg.get("intermediate_size") or 8192)
    L = tuple(range(n_layers))
    p = _Params()
    p.add("embed_tokens.weight", vocab * h, "embedding", tp="vocab")
    p.norm("layers.input_layernorm", h, L, True)
    _attention_linears(p, h, n_heads, n_kv, hd, L, True, "dense")
    if cfg.get("qk_layernorm"):
        # one LayerNorm (weight and bias) over head_dim, shared by all heads
        p.norm("layers.self_attn.q_layernorm", hd, L, True)
        p.norm("layers.self_attn.k_layernorm", hd, L, True)
    p.linear("layers.mlp.fc1", h, inter, L, True, "column")
    p.linear("layers.mlp.fc2", inter, h, L, True, "row")
    p.norm("final_layernorm", h, (), True)
    tied = _head_with_bias(p, cfg, vocab, h)
    return _simple(cfg, name, "phi", p, h=h, n_layers=n_layers, n_heads=n_heads, n_kv=n_kv, vocab=vocab,
                   inter=inter, act=str(cfg.get("hidden_act", "gelu_new")), position="rope", tied=tied,
                   parallel=True, attn_drop=float(cfg.get("attention_dropout", 0.0) or 0.0),
                   hidden_drop=float(cfg.get("resid_pdrop", 0.0) or 0.0),
                   max_pos=int(cfg.get("max_position_embeddings", 2048)), qk_norm=bool(cfg.get("qk_layernorm")))


def _starcoder2(cfg: Mapping[str, Any], name: str) -> ModelSpec:
    # modeling_starcoder2.py: Llama-style q/k/v/o_proj and a non-gated c_fc -> act -> c_proj MLP, all with
    # bias when use_bias (configuration default True); input/post_attention LayerNorms with bias, a final
    # LayerNorm; GQA; sliding window (every layer) from sliding_window; residual_dropout after attention
    # and MLP.  configuration_starcoder2.py: tie_word_embeddings True, hidden_act gelu_pytorch_tanh.
    h, n_layers, n_heads = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
    n_kv = int(_get(cfg, "num_key_value_heads", default=n_heads))
    hd = int(_get(cfg, "head_dim", default=h // n_heads))
    vocab, inter = int(cfg["vocab_size"]), int(cfg.get("intermediate_size") or 4 * h)
    bias = bool(cfg.get("use_bias", True))
    L = tuple(range(n_layers))
    p = _Params()
    p.add("embed_tokens.weight", vocab * h, "embedding", tp="vocab")
    p.norm("layers.input_layernorm", h, L, True)
    _attention_linears(p, h, n_heads, n_kv, hd, L, bias, "o_proj")
    p.norm("layers.post_attention_layernorm", h, L, True)
    p.linear("layers.mlp.c_fc", h, inter, L, bias, "column")
    p.linear("layers.mlp.c_proj", inter, h, L, bias, "row")
    p.norm("norm", h, (), True)
    tied = bool(cfg.get("tie_word_embeddings", True))
    if not tied:
        p.add("lm_head.weight", vocab * h, "lm_head", in_features=h, out_features=vocab, tp="vocab")
    window = cfg.get("sliding_window")
    windows: list[int | None] = [int(window) if window else None] * n_layers
    return _simple(cfg, name, "starcoder2", p, h=h, n_layers=n_layers, n_heads=n_heads, n_kv=n_kv, vocab=vocab,
                   inter=inter, act=str(cfg.get("hidden_act", "gelu_pytorch_tanh")), position="rope", tied=tied,
                   parallel=False, attn_drop=float(cfg.get("attention_dropout", 0.0) or 0.0),
                   hidden_drop=float(cfg.get("residual_dropout", 0.0) or 0.0),
                   max_pos=int(cfg.get("max_position_embeddings", 4096)), head_dim=hd, windows=windows)


def _gated_layernorm(cfg: Mapping[str, Any], model_type: str, name: str) -> ModelSpec:
    """Llama's gated MLP and q/k/v/o projections with LayerNorm-family norms.

    * stablelm (modeling_stablelm.py): nn.LayerNorm with bias; q/k/v bias when use_qkv_bias, o_proj
      without; a post_attention_layernorm unless use_parallel_residual; per-head q/k LayerNorms (weight
      only, one per head) when qk_layernorm; partial rotary; untied lm_head (configuration default).
    * cohere (modeling_cohere.py, Command-R): CohereLayerNorm, weight only, computed in fp32 by eager
      ops; one input_layernorm feeding attention and MLP in parallel; q/k/v/o bias when attention_bias;
      per-head q/k norms over (heads, head_dim) when use_qk_norm; tied lm_head; logits * logit_scale.
    * olmo (modeling_olmo.py, OLMo-1): OlmoLayerNorm without weight or bias (F.layer_norm on fp32); q/k/v/o
      bias when attention_bias; untied lm_head unless tie_word_embeddings.
    """
    h, n_layers, n_heads = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
    n_kv = int(_get(cfg, "num_key_value_heads", default=n_heads))
    hd = h // n_heads
    vocab = int(cfg["vocab_size"])
    inter = int(cfg.get("intermediate_size") or {"stablelm": 6912, "cohere": 22528, "olmo": 11008}[model_type])
    L = tuple(range(n_layers))
    p = _Params()
    notes: list[str] = []
    p.add("embed_tokens.weight", vocab * h, "embedding", tp="vocab")
    parallel = model_type == "cohere" or (model_type == "stablelm" and bool(cfg.get("use_parallel_residual")))
    if model_type == "stablelm":
        qkv_bias, o_bias = bool(cfg.get("use_qkv_bias", False)), False
    else:
        qkv_bias = o_bias = bool(cfg.get("attention_bias", False))
    norm_bias = model_type == "stablelm"
    if model_type != "olmo":  # OLMo-1's norms hold no parameters
        p.norm("layers.input_layernorm", h, L, norm_bias)
        if not parallel:
            p.norm("layers.post_attention_layernorm", h, L, norm_bias)
    p.linear("layers.self_attn.q_proj", h, n_heads * hd, L, qkv_bias, "column")
    p.linear("layers.self_attn.k_proj", h, n_kv * hd, L, qkv_bias, "column")
    p.linear("layers.self_attn.v_proj", h, n_kv * hd, L, qkv_bias, "column")
    p.linear("layers.self_attn.o_proj", n_heads * hd, h, L, o_bias, "row")
    qk_norm = bool(cfg.get("qk_layernorm" if model_type == "stablelm" else "use_qk_norm", False))
    if qk_norm and model_type != "olmo":
        # one weight per head: StableLmLayerNormPerHead (a LayerNorm without bias per head) or CohereLayerNorm
        # over (heads, head_dim)
        names = ("q_layernorm", "k_layernorm") if model_type == "stablelm" else ("q_norm", "k_norm")
        p.norm(f"layers.self_attn.{names[0]}", n_heads * hd, L, False)
        p.norm(f"layers.self_attn.{names[1]}", n_kv * hd, L, False)
        notes.append("per-head q/k LayerNorm activations are counted as RMSNorm's (approximation)")
    p.linear("layers.mlp.gate_proj", h, inter, L, False, "column")
    p.linear("layers.mlp.up_proj", h, inter, L, False, "column")
    p.linear("layers.mlp.down_proj", inter, h, L, False, "row")
    if model_type != "olmo":
        p.norm("norm", h, (), norm_bias)
    tied = bool(cfg.get("tie_word_embeddings", model_type == "cohere"))
    if not tied:
        p.add("lm_head.weight", vocab * h, "lm_head", in_features=h, out_features=vocab, tp="vocab")
    if model_type == "olmo" and cfg.get("clip_qkv"):
        notes.append("clip_qkv clamps q/k/v in place; its saved tensors are not modelled")
    norm: Norm = {"stablelm": "layer", "cohere": "layer_fp32", "olmo": "layer_nonparam"}[model_type]  # type: ignore[assignment]
    default_pos = {"stablelm": 4096, "cohere": 8192, "olmo": 2048}[model_type]
    return _simple(cfg, name, model_type, p, h=h, n_layers=n_layers, n_heads=n_heads, n_kv=n_kv, vocab=vocab,
                   inter=inter, act=str(cfg.get("hidden_act", "silu")), position="rope", tied=tied,
                   parallel=parallel, attn_drop=float(cfg.get("attention_dropout", 0.0) or 0.0),
                   hidden_drop=float(cfg.get("hidden_dropout", 0.0) or 0.0) if model_type == "stablelm" else 0.0,
                   max_pos=int(cfg.get("max_position_embeddings", default_pos)), mlp_gated=True, norm=norm,
                   qk_norm=qk_norm, notes=tuple(notes))
