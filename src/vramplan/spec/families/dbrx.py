"""DBRX (transformers ``modeling_dbrx.py`` and ``configuration_dbrx.py``, 5.24).

The sizes live in two nested dictionaries (``DbrxConfig.sub_configs``): ``attn_config`` (``kv_n_heads``, default
1; ``clip_qkv``, default None; ``attn_pdrop``) and ``ffn_config`` (``ffn_hidden_size``, default 3584;
``moe_num_experts``, default 4; ``moe_top_k``, default 1; ``ffn_act_fn`` ``{"name": "silu"}``); the outer keys are
``d_model``, ``n_heads``, ``n_layers``, ``max_seq_len`` and ``vocab_size``, ``resid_pdrop``/``emb_pdrop``.

Tensors, in ``DbrxForCausalLM``'s order: ``transformer.wte``; per block ``norm_attn_norm.norm_1`` and ``norm_2``
(``nn.LayerNorm(d_model, bias=False)``), ``norm_attn_norm.attn.Wqkv`` (one ``nn.Linear`` of d_model -> d_model +
2 kv_n_heads head_dim, no bias) and ``attn.out_proj`` (no bias), ``ffn.router.layer`` (``nn.Linear(d_model,
moe_num_experts, bias=False)``), ``ffn.experts.mlp.w1``/``v1``/``w2`` (``DbrxExpertGLU``: three 2-D parameters of
[moe_num_experts x ffn_hidden_size, d_model], not ``nn.Linear``, sliced per expert by ``view``); ``norm_f``
(LayerNorm without bias) and the untied ``lm_head`` (``DbrxConfig.validate_architecture`` refuses tied weights).

Run time: ``DbrxAttention`` clamps the fused q/k/v output to +-clip_qkv (``ClampBackward1`` keeps its whole input)
and rotates q and k while v stays a view of the clamped buffer; the router takes a softmax in the logits' dtype,
the top-k and divides by their p-norm (``moe_normalize_expert_weights``); ``DbrxExperts.forward`` is an eager loop
over the experts hit, on ``view``-slices of the 2-D parameters, accumulating with ``index_add_`` into a
``zeros_like`` of the hidden states.  Under autocast with fp32 hidden states that ``index_add_`` refuses the
half-precision expert output ("index_add_(): self (Float) and source (BFloat16) must have the same scalar type",
transformers 5.24 on torch 2.13): DBRX does not train under mixed precision in transformers.  Its training
activations (the sliced loop, the clamp) are not modelled: training is refused (``Traits.sliced_expert_loop``,
spec/checks.py ``expert_loop_problems``); the parameters, generate (the experts' loop as 4.x's:
analytic/inference.py ``_mlp_width``) and serving are estimated.  Generate's prefill does not count the clamp's
moment (the Wqkv output and its clamped copy alive together, 2 (q + 2 kv) per token beside the layer input and the
normed input): for DBRX's sizes it is below the experts' (2 x 8,192 + 2 x 6,144 against 3 x 6,144 + 3 x 10,752 + 16
elements per token).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vramplan.spec.families.base import Config, Family, Params, build_spec, prob
from vramplan.spec.model import ModelSpec, MoESpec, Traits

# the fused Wqkv and out_proj (casts per consumer, adapter inputs); the value handed to the kernel is a view of the
# clamped fused output (phi3's form); experts are 2-D parameters run in an eager loop over their slices (neither
# bitsandbytes nor peft's all-linear reach them, and no release fuses them into grouped GEMMs)
TRAITS = Traits(qkv_modules=("Wqkv",), out_proj_module="out_proj", fused_qkv_view=True, experts_are_linears=False,
                sliced_expert_loop=True)


def _sub(cfg: Config, name: str) -> Mapping[str, Any]:
    sub = cfg.get(name)
    return sub if isinstance(sub, Mapping) else {}


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    h, n_layers, n_heads = int(cfg["d_model"]), int(cfg["n_layers"]), int(cfg["n_heads"])
    attn, ffn = _sub(cfg, "attn_config"), _sub(cfg, "ffn_config")
    # configuration_dbrx.py defaults: kv_n_heads 1, ffn_hidden_size 3584, moe_num_experts 4, moe_top_k 1
    n_kv = int(attn.get("kv_n_heads", 1))
    hd = h // n_heads  # DbrxAttention: head_dim = hidden_size // num_heads
    inter, e, k = int(ffn.get("ffn_hidden_size", 3584)), int(ffn.get("moe_num_experts", 4)), int(ffn.get("moe_top_k", 1))
    vocab = int(cfg["vocab_size"])
    L = tuple(range(n_layers))
    p = Params()
    p.add("wte.weight", vocab * h, "embedding", tp="vocab")
    p.norm("blocks.norm_attn_norm.norm_1", h, L, False)
    p.linear("blocks.norm_attn_norm.attn.Wqkv", h, h + 2 * n_kv * hd, L, False, "column")
    p.linear("blocks.norm_attn_norm.attn.out_proj", h, h, L, False, "row")
    p.norm("blocks.norm_attn_norm.norm_2", h, L, False)
    p.linear("blocks.ffn.router.layer", h, e, L, False, "replicated", role="router")
    # DbrxExpertGLU: w1 (gate) and v1 (up) as [E * I, h], w2 (down) as [E * I, h] used untransposed
    p.add("blocks.ffn.experts.mlp.w1", e * inter * h, "expert", L, 1, h, inter, "expert")
    p.add("blocks.ffn.experts.mlp.v1", e * inter * h, "expert", L, 1, h, inter, "expert")
    p.add("blocks.ffn.experts.mlp.w2", e * inter * h, "expert", L, 1, inter, h, "expert")
    p.norm("norm_f", h, (), False)
    p.lm_head("lm_head", vocab, h)
    act = ffn.get("ffn_act_fn")
    return build_spec(
        cfg, name, model_type, p, moe_layers=frozenset(L), hidden_size=h, num_layers=n_layers,
        num_attention_heads=n_heads, num_kv_heads=n_kv, head_dim=hd, vocab_size=vocab, intermediate_size=inter,
        hidden_act=str(act.get("name", "silu")) if isinstance(act, Mapping) else "silu", mlp_gated=True,
        norm="layer", position="rope", tie_word_embeddings=False,
        attention_dropout=prob(attn, "attn_pdrop"), hidden_dropout=prob(cfg, "resid_pdrop"),
        max_position_embeddings=int(cfg.get("max_seq_len", 2048)), moe=MoESpec(e, k, inter), traits=TRAITS)


DBRX = Family(build, "modeling_dbrx.py", required=(("d_model",), ("n_layers",), ("n_heads",), ("vocab_size",)),
              float_keys=("ffn_config.moe_normalize_expert_weights",))
