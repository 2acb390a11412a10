"""Llama 3.2 Vision (``model_type: mllama``, ``MllamaForConditionalGeneration``).

transformers 5.24 ``models/mllama/modeling_mllama.py``: ``MllamaModel`` holds ``vision_model``
(``MllamaVisionModel``), ``language_model`` (``MllamaTextModel``) and ``multi_modal_projector`` (one biased
``nn.Linear(vision_output_dim, text hidden_size)``); ``MllamaForConditionalGeneration`` adds an untied ``lm_head``
(``text_config.vocab_size`` rows).  Defaults are ``configuration_mllama.py``'s (``MllamaVisionConfig``,
``MllamaTextConfig``).

The vision model (d = ``hidden_size``, P = (image_size // patch_size)^2 + 1 positions per tile, the patches and the
class token; T = ``max_num_tiles``; A = ``len(supported_aspect_ratios)``, the aspect-ratio ids 1..A with 0 for
padding):

- ``patch_embedding``: ``Conv2d(channels, d, patch, stride=patch, bias=False)``; ``class_embedding`` [d];
- ``gated_positional_embedding`` (``MllamaPrecomputedPositionEmbedding``): ``gate`` [1], ``embedding`` [P, d] and
  ``tile_embedding`` ``Embedding(A + 1, T x P x d)``;
- ``pre_tile_positional_embedding`` and ``post_tile_positional_embedding``
  (``MllamaPrecomputedAspectRatioEmbedding``, gated): ``embedding`` ``Embedding(A + 1, T x d)`` and ``gate`` [1];
- ``layernorm_pre``, ``layernorm_post``: ``nn.LayerNorm(d)`` (weight and bias);
- ``transformer`` (``num_hidden_layers`` local layers, each tile alone) and ``global_transformer``
  (``num_global_layers``, over all tiles of an image): ``MllamaVisionEncoderLayer``, q/k/v/o without bias,
  ``mlp.fc1`` / ``mlp.fc2`` biased, ``input_layernorm`` / ``post_attention_layernorm`` LayerNorms; the global
  layers add ``gate_attn`` and ``gate_ffn`` [1] each;
- the output: the global encoder's last hidden state concatenated with the local encoder's hidden states at
  ``intermediate_layers_indices`` (5 by default): d x (1 + 5) = 7,680 = ``vision_output_dim``, the projector's
  input width.

The language model (``MllamaTextModel``): ``embed_tokens`` ``Embedding(vocab_size + 8, h)`` (eight more rows than
the LM head), ``num_hidden_layers`` decoder layers and the final RMSNorm.  A layer whose index is in
``cross_attention_layers`` is a ``MllamaCrossAttentionDecoderLayer``: ``cross_attn`` (q/k/v/o without bias, k and v
read the projected vision states of width h; ``q_norm`` and ``k_norm`` RMSNorms over head_dim),
``cross_attn_attn_gate`` and ``cross_attn_mlp_gate`` [1], the two RMSNorms and the gated SiLU MLP; every other
layer is Llama's (``MllamaSelfAttentionDecoderLayer``).  head_dim is hidden_size // num_attention_heads.

Images: ``MllamaProcessor`` writes one ``<|image|>`` token per image into the text; the image itself reaches the
language model only through the cross-attention layers' keys and values, over every tile of the padded
``max_image_tiles`` (``MllamaImageProcessor`` pads each image to T tiles) and every position of a tile:
T x P tokens per image (4 x 1,025 = 4,100 for 448-pixel tiles of 14-pixel patches).

Estimated: the parameters.  Refused (``spec/checks.py`` ``cross_attention_problems``): training, inference and
serving, whose cross-attention KV cache and activations the engines do not model.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from vramplan.spec.families.base import Config, Family, Params, get, inherit_outer, non_null
from vramplan.spec.families.llama_like import LLAMA_FAMILIES
from vramplan.spec.model import ModelSpec, ParamGroup, VisionSpec

__all__ = ["MLLAMA", "mllama_text_config", "vision_params"]

# MllamaVisionConfig defaults (transformers 5.24 configuration_mllama.py)
_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 1280, "hidden_act": "gelu", "num_hidden_layers": 32, "num_global_layers": 8,
    "attention_heads": 16, "num_channels": 3, "intermediate_size": 5120, "vision_output_dim": 7680,
    "image_size": 448, "patch_size": 14, "max_num_tiles": 4,
    "intermediate_layers_indices": [3, 7, 15, 23, 30],
    "supported_aspect_ratios": [[1, 1], [1, 2], [1, 3], [1, 4], [2, 1], [2, 2], [3, 1], [4, 1]]}
# MllamaTextConfig defaults (the same file)
_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 128_256, "hidden_size": 4096, "hidden_act": "silu", "num_hidden_layers": 40,
    "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14_336, "rms_norm_eps": 1e-5,
    "max_position_embeddings": 131_072, "tie_word_embeddings": False, "rope_theta": 500_000.0,
    "cross_attention_layers": [3, 8, 13, 18, 23, 28, 33, 38], "dropout": 0.0}
# MllamaTextModel.embed_tokens: nn.Embedding(config.vocab_size + 8, ...)
EXTRA_EMBEDDING_ROWS = 8
PREFIXES = ("vision_model.", "multi_modal_projector.")


def _vision_config(cfg: Config) -> dict[str, Any]:
    given = non_null(cfg.get("vision_config"))
    out = {**_VISION_DEFAULTS, **given}
    if "num_attention_heads" in given and "attention_heads" not in given:  # MllamaVisionConfig.attribute_map
        out["attention_heads"] = given["num_attention_heads"]
    return out


def mllama_text_config(cfg: Config) -> dict[str, Any]:
    """The language model's keys (``MllamaTextConfig``'s defaults under ``text_config``), as a Llama config for the
    shared builder; the outer dtype and quantization keys are inherited."""
    text = {**_TEXT_DEFAULTS, **non_null(cfg.get("text_config"))}
    inherit_outer(text, cfg)
    text["model_type"] = "llama"
    # MllamaTextSelfAttention / MllamaTextCrossAttention: head_dim = hidden_size // num_attention_heads, no bias,
    # dropout = config.dropout
    text.pop("head_dim", None)
    text["attention_bias"] = False
    text["attention_dropout"] = text["dropout"]
    return text


def _encoder(p: Params, prefix: str, d: int, i: int, n: int, gated: bool) -> None:
    """``MllamaVisionEncoder``'s ``n`` layers (``MllamaVisionEncoderLayer``), as one row per tensor, n times."""
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        p.add(f"{prefix}.self_attn.{name}.weight", d * d, "other", per_layer=n)  # bias=False
    p.add(f"{prefix}.mlp.fc1.weight", d * i, "other", per_layer=n)
    p.add(f"{prefix}.mlp.fc1.bias", i, "bias", per_layer=n)
    p.add(f"{prefix}.mlp.fc2.weight", i * d, "other", per_layer=n)
    p.add(f"{prefix}.mlp.fc2.bias", d, "bias", per_layer=n)
    for name in ("input_layernorm", "post_attention_layernorm"):
        p.add(f"{prefix}.{name}.weight", d, "norm", per_layer=n)
        p.add(f"{prefix}.{name}.bias", d, "bias", per_layer=n)
    if gated:
        p.add(f"{prefix}.gate_attn", 1, "other", per_layer=n)
        p.add(f"{prefix}.gate_ffn", 1, "other", per_layer=n)


def vision_params(p: Params, vc: Config, d_text: int) -> dict[str, int]:
    """Add ``MllamaVisionModel``'s and the projector's tensors to ``p``; returns the tower's sizes."""
    d, i = int(get(vc, "hidden_size")), int(get(vc, "intermediate_size"))
    n, g, heads = int(get(vc, "num_hidden_layers")), int(get(vc, "num_global_layers")), int(get(vc, "attention_heads"))
    image, patch, ch = int(get(vc, "image_size")), int(get(vc, "patch_size")), int(get(vc, "num_channels"))
    tiles, ratios = int(get(vc, "max_num_tiles")), len(vc["supported_aspect_ratios"])
    if d % heads:
        raise ValueError(f"vision hidden_size {d} is not a multiple of its {heads} attention heads")
    positions = (image // patch) ** 2 + 1  # MllamaPrecomputedPositionEmbedding.num_patches: patches and class token
    v = "vision_model"
    p.add(f"{v}.patch_embedding.weight", d * ch * patch * patch, "other")  # Conv2d, bias=False
    p.add(f"{v}.class_embedding", d, "other")
    p.add(f"{v}.gated_positional_embedding.gate", 1, "other")
    p.add(f"{v}.gated_positional_embedding.embedding", positions * d, "other")
    p.add(f"{v}.gated_positional_embedding.tile_embedding.weight", (ratios + 1) * tiles * positions * d, "other")
    for name in ("pre_tile_positional_embedding", "post_tile_positional_embedding"):
        p.add(f"{v}.{name}.embedding.weight", (ratios + 1) * tiles * d, "other")
        p.add(f"{v}.{name}.gate", 1, "other")
    for name in ("layernorm_pre", "layernorm_post"):
        p.add(f"{v}.{name}.weight", d, "norm")
        p.add(f"{v}.{name}.bias", d, "bias")
    _encoder(p, f"{v}.transformer.layers", d, i, n, gated=False)
    _encoder(p, f"{v}.global_transformer.layers", d, i, g, gated=True)
    out = int(get(vc, "vision_output_dim"))
    p.add("multi_modal_projector.weight", out * d_text, "other")
    p.add("multi_modal_projector.bias", d_text, "bias")
    return {"d": d, "i": i, "layers": n + g, "heads": heads, "image": image, "patch": patch, "channels": ch,
            "tiles": tiles, "positions": positions}


def _text_params(text: ModelSpec, cross: tuple[int, ...], vocab: int) -> tuple[ParamGroup, ...]:
    """The Llama language model's rows made Mllama's: ``embed_tokens`` 8 rows longer, self-attention on the
    self-attention layers only, and the cross-attention layers' own tensors."""
    selfs = tuple(i for i in range(text.num_layers) if i not in cross)
    h, hd = text.hidden_size, text.head_dim
    rows: list[ParamGroup] = []
    for r in text.params:
        if r.name == "embed_tokens.weight":
            r = replace(r, numel=(vocab + EXTRA_EMBEDDING_ROWS) * h)
        elif r.name.startswith("layers.self_attn."):
            if not selfs:
                continue
            r = replace(r, count=len(selfs), layer_span=selfs)
        rows.append(r)
    p = Params()
    if cross:
        p.attention("layers.cross_attn", h, text.num_attention_heads, text.num_kv_heads, hd, cross, False, "o_proj")
        p.norm("layers.cross_attn.q_norm", hd, cross, False)
        p.norm("layers.cross_attn.k_norm", hd, cross, False)
        p.add("layers.cross_attn_attn_gate", 1, "other", cross)
        p.add("layers.cross_attn_mlp_gate", 1, "other", cross)
    at = next(k for k, r in enumerate(rows) if r.name.startswith("layers.")) if rows else 0
    return (*rows[:at], *p.rows, *rows[at:])


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    text_cfg = mllama_text_config(cfg)
    n = int(text_cfg["num_hidden_layers"])
    cross = tuple(sorted({int(x) for x in text_cfg["cross_attention_layers"]}))
    if any(x < 0 or x >= n for x in cross):
        raise ValueError(f"cross_attention_layers {list(cross)} name layers outside the {n} decoder layers")
    text = LLAMA_FAMILIES["llama"].build(text_cfg, "llama", name)
    vc = _vision_config(cfg)
    p = Params()
    t = vision_params(p, vc, text.hidden_size)
    patches = t["tiles"] * (t["image"] // t["patch"]) ** 2
    vision = VisionSpec(hidden_size=t["d"], num_layers=t["layers"], num_attention_heads=t["heads"],
                        intermediate_size=t["i"], image_size=t["image"], patch_size=t["patch"],
                        patches_per_image=patches, tokens_per_image=1, hidden_act=str(vc["hidden_act"]),
                        source="transformers 5.24 MllamaProcessor (one <|image|> token per image) and "
                               "MllamaImageProcessor (each image padded to max_image_tiles tiles)",
                        param_prefixes=PREFIXES, num_channels=t["channels"], extra_tokens=1,
                        cross_attention_layers=cross,
                        cross_attention_tokens_per_image=t["tiles"] * t["positions"],
                        global_layers=int(get(vc, "num_global_layers")), output_dim=int(get(vc, "vision_output_dim")))
    params = _text_params(text, cross, int(text_cfg["vocab_size"]))
    return replace(text, model_type=model_type, params=params + tuple(p.rows), vision=vision)


MLLAMA = Family(build, "modeling_mllama.py", required=(("vision_config",),), text_model_type="mllama_text_model")
