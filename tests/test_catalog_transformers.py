"""Independent check of the config adapter: transformers' own module, built from the same config.json on the
meta device (no memory, no download), has exactly the adapter's parameter count, for every catalog row."""

from __future__ import annotations

import warnings

import pytest

from vramplan.catalog.models import list_models
from vramplan.spec.families import typed_for_transformers
from vramplan.spec.hf_config import model_from_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ROWS = list_models()

# Tensors the adapter counts as parameters but transformers registers as buffers.  DeepSeek-V3's router keeps
# its aux-loss-free balancing bias ``e_score_correction_bias`` (one per routed expert) as a buffer: 58 MoE layers
# x 256 experts = 14,848 elements, which the published 671,026,419,200 includes.
BUFFERS_COUNTED = {"deepseek-ai/DeepSeek-V3": 58 * 256,
                   # GLM-4.5-Air's router keeps the same bias as a buffer (Glm4MoeTopkRouter): 45 MoE layers x 128
                   "zai-org/GLM-4.5-Air": 45 * 128,
                   # DeepSeek-R1 has DeepSeek-V3's architecture: the same 58 MoE layers x 256 experts
                   "deepseek-ai/DeepSeek-R1": 58 * 256,
                   # DeepSeek-V3.1: the same architecture again
                   "deepseek-ai/DeepSeek-V3.1": 58 * 256,
                   # GLM-4.5: 92 layers, the first 3 dense, 89 MoE layers x 160 routed experts
                   "zai-org/GLM-4.5": 89 * 160,
                   # GLM-4.7: GLM-4.5's layers (92, the first 3 dense) and experts (160), longer positions only
                   "zai-org/GLM-4.7": 89 * 160,
                   # INTELLECT-3-Base: GLM-4.5-Air's shapes, 45 MoE layers x 128 routed experts
                   "PrimeIntellect/INTELLECT-3-Base": 45 * 128,
                   # Nemotron 3 Nano's router keeps it too (NemotronHTopkRouter): 23 "E" blocks x 128 routed experts
                   "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": 23 * 128}


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_adapter_count_equals_transformers_module(row) -> None:  # type: ignore[no-untyped-def]
    spec = model_from_config(row.config, name=row.id)
    vision = row.config.get("vision_config") or {}
    if vision.get("model_type") == "gemma3n_vision":
        # Gemma 3n's vision tower is AutoModel.from_config(vision_config), a TimmWrapperModel: transformers builds it
        # only with timm installed (spec/families/gemma3n.py counts it from timm's mobilenetv5.py)
        pytest.importorskip("timm")
    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # (DBRX's published integer moe_normalize_expert_weights as the float its strict config class takes)
        cfg = transformers.AutoConfig.for_model(**typed_for_transformers(row.config))
        cls = transformers.AutoModelForMaskedLM if spec.model_type == "bert" else transformers.AutoModelForCausalLM
        if spec.vision is not None and type(cfg) in transformers.AutoModelForImageTextToText._model_mapping:
            # the whole vision-language model: tower, projector and language model (Phi-4-multimodal's whole model is
            # the causal LM class itself: Phi4MultimodalForCausalLM, modeling_auto.py's causal-LM mapping)
            cls = transformers.AutoModelForImageTextToText
        if spec.traits.held_modules:
            # modules held beside the language model and the tower (Qwen3-Omni's audio encoder, talker and Code2Wav):
            # the class that builds them all, Qwen3OmniMoeForConditionalGeneration (MODEL_FOR_MULTIMODAL_LM_MAPPING)
            cls = transformers.AutoModelForMultimodalLM
        if spec.encoder_decoder is not None:
            # the class Seq2SeqTrainer fine-tunes: WhisperForConditionalGeneration for a speech encoder (the
            # convolutional front end over log-mel features), ...ForConditionalGeneration of T5 and BART otherwise
            audio = spec.encoder_decoder.audio is not None
            cls = transformers.AutoModelForSpeechSeq2Seq if audio else transformers.AutoModelForSeq2SeqLM
        with torch.device("meta"):
            module = cls.from_config(cfg)
    counted = sum(p.numel() for p in module.parameters())
    assert spec.num_parameters == counted + BUFFERS_COUNTED.get(row.id, 0)
