"""PaliGemma and PaliGemma 2 (``model_type: paligemma``, ``PaliGemmaForConditionalGeneration``).

transformers 5.24 ``models/paligemma/modeling_paligemma.py``: ``PaliGemmaModel`` holds ``vision_tower``
(``AutoModel.from_config(config.vision_config)``, a ``SiglipVisionModel``, whose tensors sit directly
under ``vision_tower``: 5.24's has no ``vision_model`` wrapper), ``multi_modal_projector`` (``PaliGemmaMultiModalProjector``: one biased
``nn.Linear(vision_config.hidden_size, vision_config.projection_dim)``, ``projection_dim`` the outer config's,
2048 by default) and ``language_model`` (``AutoModel.from_config(text_config)``: a ``GemmaModel`` for
PaliGemma, a ``Gemma2Model`` for PaliGemma 2); ``lm_head`` is tied to the text embeddings (``_tied_weights_keys``).

Sub-configs (``configuration_paligemma.py`` ``sub_configs_defaults``, ``configuration_utils.py``
``SubConfigSpec.create_subconfig``): a ``vision_config`` / ``text_config`` given as a dict is built with its own
class's defaults (``SiglipVisionConfig``, ``GemmaConfig`` / ``Gemma2Config``); the ``init_kwargs`` (SigLIP
So400m/14 at 224 pixels without the pooling head; Gemma-2B with 257,152 tokens and one K/V head) apply only when
the sub-config is absent (such a config is refused: ``Family.required``).

Image tokens: ``get_image_features`` projects every patch of the tower's ``last_hidden_state`` (no pooling, no
class token), so an image is (image_size / patch_size)^2 tokens (``PaliGemmaConfig.__post_init__``
``text_config.num_image_tokens``); ``PaliGemmaProcessor`` writes ``image_seq_length`` image tokens per image
(``build_string_from_input``, ``_get_num_multimodal_tokens``), the image processor's value (256 for the 224-pixel
checkpoints), after ``SiglipImageProcessor`` resizes every image to ``image_size``.

Attention: a prefix LM.  ``PaliGemmaModel.forward`` builds the mask with ``block_sequence_ids`` from
``token_type_ids`` (the processor always returns them: ``return_token_type_ids = True``), so the image and prefix
tokens attend to each other both ways and the suffix causally, and ``PaliGemmaConfig.__post_init__`` sets the
text model's ``use_bidirectional_attention`` (``GemmaAttention.is_causal`` False).  Every forward hands the
attention a 4-D mask: eager adds it to the scores as it adds a causal one (the engines' eager model holds); SDPA
cannot run flash with a mask and runs the memory-efficient kernel, which saves the boolean mask converted to the
query dtype per layer (aten ``convert_boolean_attn_mask``), with K/V repeated to every head
(``integrations/sdpa_attention.py`` ``use_gqa_in_sdpa`` needs no mask): ``Traits.sdpa_mask_always``.  Flash is
refused (``_supports_flash_attn = False``), and so is PaliGemma 2 under sdpa, whose Gemma 2 runs eager
(``Traits.sdpa_dropped_in``) beside an SDPA tower (spec/vision.py ``image_problems``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from vramplan.spec.families.base import Config, Family, Params, held_tower_states, inherit_outer, non_null
from vramplan.spec.families.gemma3 import siglip_tower, tower_layer_spec
from vramplan.spec.families.llama_like import LLAMA_FAMILIES
from vramplan.spec.model import ModelSpec, VisionSpec

__all__ = ["PALIGEMMA"]

PREFIX = "vision_tower"
# the class defaults (transformers 5.24 configuration_gemma.py GemmaConfig, configuration_gemma2.py Gemma2Config,
# configuration_siglip.py SiglipVisionConfig) a sub-config given as a dict is built with
_GEMMA: dict[str, Any] = {"vocab_size": 256_000, "hidden_size": 3072, "intermediate_size": 24_576,
                          "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 16,
                          "head_dim": 256, "hidden_act": "gelu_pytorch_tanh", "max_position_embeddings": 8192,
                          "tie_word_embeddings": True}
_GEMMA2: dict[str, Any] = {"vocab_size": 256_000, "hidden_size": 2304, "intermediate_size": 9216,
                           "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
                           "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
                           "max_position_embeddings": 8192, "query_pre_attn_scalar": 256, "sliding_window": 4096,
                           "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0,
                           "tie_word_embeddings": True}
_SIGLIP: dict[str, Any] = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                           "num_attention_heads": 12, "num_channels": 3, "image_size": 224, "patch_size": 16,
                           "hidden_act": "gelu_pytorch_tanh", "vision_use_head": True}
def _text_config(cfg: Config) -> dict[str, Any]:
    inner = non_null(cfg["text_config"])
    kind = str(inner.get("model_type") or "gemma")
    if kind not in ("gemma", "gemma2"):
        raise ValueError(f"a paligemma language model of model_type {kind!r} is not modelled (gemma, gemma2)")
    text = {**(_GEMMA if kind == "gemma" else _GEMMA2), **inner, "model_type": kind}
    inherit_outer(text, cfg)
    return text


def _notes(head: bool) -> tuple[str, ...]:
    out = [("prefix LM: the image and prefix tokens attend to each other both ways (PaliGemma's block_sequence_ids "
            "mask); eager attention adds that [b, 1, s, s] mask to the scores as it adds a causal one")]
    if head:
        out.append("not modelled: the SigLIP attention-pooling head (vision_use_head) runs on the last layer's output, "
                   "which the projector does not take; its saved tensors reach no gradient")
    return tuple(out)


def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    tc = _text_config(cfg)
    kind = str(tc["model_type"])
    text = LLAMA_FAMILIES[kind].build(tc, kind, name)
    vc = {**_SIGLIP, **non_null(cfg["vision_config"])}
    p = Params()
    t = siglip_tower(p, vc, PREFIX)
    proj = int(cfg.get("projection_dim", 2048))
    if proj != text.hidden_size:
        # masked_scatter writes the projected features into the text embeddings (get_placeholder_mask checks it)
        raise ValueError(f"projection_dim {proj} differs from the language model's hidden_size {text.hidden_size}")
    p.vision_linear("multi_modal_projector.linear", t["d"], proj)
    act = str(vc["hidden_act"])
    vision = VisionSpec(hidden_size=t["d"], num_layers=t["layers"], num_attention_heads=t["heads"],
                        intermediate_size=t["i"], image_size=t["image"], patch_size=t["patch"],
                        patches_per_image=t["patches"], tokens_per_image=t["patches"], hidden_act=act,
                        source="transformers 5.24 PaliGemmaConfig (num_image_tokens = (image_size // patch_size)^2) "
                               "and PaliGemmaProcessor (image_seq_length image tokens per image)",
                        tower=tower_layer_spec(t, act, name), num_channels=t["channels"],
                        # post_layernorm, then the projector's nn.Linear saves its input: the norm's output in the
                        # compute dtype (autocast's cast, or the bf16 output itself)
                        head_saved_per_patch=(("norm", 1), ("compute", t["d"])),
                        notes=_notes(bool(vc["vision_use_head"])), prefix_lm=True, linears=tuple(p.vision_linears),
                        # SiglipVisionTransformer.forward binds the embeddings' output through the encoder's layers
                        kept_hidden_states=held_tower_states(t["layers"]))
    # every forward hands the language model's attention a 4-D mask (module docstring): SDPA's memory-efficient
    # kernel with the mask and repeated K/V (analytic/activations.py, analytic/inference.py)
    traits = replace(text.traits, sdpa_mask_always=True)
    return replace(text, model_type=model_type, params=text.params + tuple(p.rows), vision=vision, traits=traits)


# both sub-configs required: a config without them is built from PaliGemmaConfig's init_kwargs, which the traced
# engine's language model alone (transformers_config) could not see
PALIGEMMA = Family(build, "modeling_paligemma.py", required=(("vision_config",), ("text_config",)),
                   text_model_type="gemma")
