"""The phi, starcoder2, stablelm, cohere and olmo families: tensors counted by hand from each modeling file,
and the activation terms that differ from Llama's (norm kinds, the parallel block's shared norm output)."""

from __future__ import annotations

import pytest

from vramplan.analytic.activations import ActContext, _norm_saved, frozen_input_mlp, mlp_saved
from vramplan.catalog.models import load_model
from vramplan.spec.hf_config import SUPPORTED_MODEL_TYPES, model_from_config


def test_new_model_types_are_supported() -> None:
    assert {"phi", "starcoder2", "stablelm", "cohere", "olmo"} <= set(SUPPORTED_MODEL_TYPES)


def test_phi2_count_by_hand() -> None:
    # h 2560, 32 layers, V 51200, I 10240, every linear with bias, one LayerNorm per layer, untied head with bias:
    # embed 51200*2560 = 131,072,000
    # layer: LN 2*2560 = 5,120; q/k/v/dense 4*(2560*2560 + 2560) = 26,224,640; fc1 2560*10240 + 10240 = 26,224,640;
    #        fc2 10240*2560 + 2560 = 26,216,960 -> 78,671,360, x 32 = 2,517,483,520
    # final LN 5,120; lm_head 131,072,000 + 51,200 = 131,123,200  -> 2,779,683,840
    m = load_model("microsoft/phi-2")
    assert m.num_parameters == 2_779_683_840
    assert m.parallel_residual and m.norm == "layer" and not m.mlp_gated and not m.tie_word_embeddings
    assert {p.name for p in m.params if p.role == "bias"} >= {"lm_head.bias", "layers.self_attn.dense.bias"}


def test_olmo_norms_hold_no_parameters() -> None:
    # OLMo-1B: h 2048, 16 layers, V 50304 tied, I 8192, no biases, parameter-free LayerNorms:
    # embed 50304*2048 = 103,022,592; layer 4*2048^2 + 3*2048*8192 = 16,777,216 + 50,331,648 = 67,108,864,
    # x 16 = 1,073,741,824 -> 1,176,764,416
    m = load_model("allenai/OLMo-1B-hf")
    assert m.num_parameters == 1_176_764_416
    assert m.parameters_by_role().get("norm", 0) == 0 and m.norm == "layer_nonparam"


def test_cohere_count_by_hand() -> None:
    # Aya-23-8B: h 4096, 32 layers, 32 query / 8 KV heads of 128, I 14336, V 256000 tied, weight-only norms:
    # embed 256000*4096 = 1,048,576,000
    # layer: norm 4,096; q 4096^2 = 16,777,216; k+v 2*4096*1024 = 8,388,608; o 16,777,216; MLP 3*4096*14336 =
    #        176,160,768 -> 218,107,904, x 32 = 6,979,452,928; final norm 4,096  -> 8,028,033,024
    m = load_model("CohereForAI/aya-23-8B")
    assert m.num_parameters == 8_028_033_024
    assert m.tie_word_embeddings and m.parallel_residual and m.norm == "layer_fp32"


def test_starcoder2_and_stablelm_layout() -> None:
    sc = load_model("bigcode/starcoder2-7b")
    assert {ls.sliding_window for ls in sc.layers} == {4096}
    assert sc.num_kv_heads == 4 and not sc.mlp_gated and sc.tie_word_embeddings
    # StableLM-2: q/k/v biases but no o_proj bias, LayerNorm with bias, two norms per layer (no parallel residual)
    st = load_model("stabilityai/stablelm-2-zephyr-1_6b")
    names = {p.name for p in st.params}
    assert "layers.self_attn.q_proj.bias" in names and "layers.self_attn.o_proj.bias" not in names
    assert "layers.post_attention_layernorm.bias" in names and not st.parallel_residual


def test_stablelm_parallel_variant_drops_the_second_norm() -> None:
    cfg = {"model_type": "stablelm", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
           "intermediate_size": 512, "vocab_size": 1000, "use_parallel_residual": True}
    m = model_from_config(cfg)
    assert m.parallel_residual and not any("post_attention" in p.name for p in m.params)


def _ctx(frozen: bool, autocast: bool = True, residual: int = 4) -> ActContext:
    return ActContext(compute_bytes=2, residual_bytes=residual, linear_input_bytes=2, autocast=autocast,
                      attention="flash", gqa_repeat=False, seq_len=512, frozen_base=frozen)


def test_norm_kinds_by_hand() -> None:
    # CohereLayerNorm: (x - mean) saved by pow (4) and again, recomputed, by the rsqrt product (4), the fp32
    # normalized tensor by the weight product (4, not with a frozen weight)
    assert _norm_saved("layer_fp32", _ctx(False)) == 12
    assert _norm_saved("layer_fp32", _ctx(True)) == 8
    # OLMo: F.layer_norm on an fp32 copy, no weight: 4 B with or without autocast (nn.LayerNorm in bf16-true: 2)
    assert _norm_saved("layer_nonparam", _ctx(False, autocast=False, residual=2)) == 4
    assert _norm_saved("layer", _ctx(False, autocast=False, residual=2)) == 2


def test_parallel_block_saves_its_norm_output_once_without_casts() -> None:
    # bf16-true phi-2 (no autocast, residual and compute 2 B): attention's q/k/v and the MLP's fc1 read the same
    # normalised tensor, saved once: the MLP's share drops by 2 * 2560 = 5,120 B per token
    m = load_model("microsoft/phi-2")
    ctx = ActContext(compute_bytes=2, residual_bytes=2, linear_input_bytes=2, autocast=False, attention="flash",
                     gqa_repeat=False, seq_len=512, dropout=False)
    # fc1 input (shared: 0) + gelu_new without autocast 4 x 2 B x 10240 + fc2 input 2 x 10240 = 102,400 B
    assert mlp_saved(m, m.layers[0], ctx) == 4 * 2 * 10240 + 2 * 10240


def test_first_parallel_mlp_saves_nothing_under_attention_lora() -> None:
    m = load_model("CohereForAI/aya-23-8B")
    def lora(*targets: str) -> ActContext:
        return ActContext(compute_bytes=2, residual_bytes=4, linear_input_bytes=2, autocast=True, attention="flash",
                          gqa_repeat=False, seq_len=512, frozen_base=True, lora_rank=8,
                          lora_targets=frozenset(targets))

    # the parallel block's MLP reads the normalised frozen input: no MLP adapter, nothing recorded
    assert frozen_input_mlp(m, m.layers[0], lora("q_proj", "v_proj")) == (0, False)
    # an up adapter: its input's half copy (2 x 4096) and lora_A's output (2 x 8), and the activation
    # output the product saves for the up output's gradient (2 x 14336) = 36,880 B per token
    assert frozen_input_mlp(m, m.layers[0], lora("q_proj", "up_proj")) == (2 * 4096 + 2 * 8 + 2 * 14336, True)


@pytest.mark.parametrize("model_type", ["phi", "starcoder2", "stablelm", "cohere", "olmo"])
def test_minimal_configs_use_configuration_defaults(model_type: str) -> None:
    cfg = {"model_type": model_type, "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
           "intermediate_size": 512, "vocab_size": 1000}
    assert model_from_config(cfg).num_parameters > 0


@pytest.mark.parametrize("model_id", ["microsoft/phi-2", "bigcode/starcoder2-7b", "stabilityai/stablelm-2-zephyr-1_6b",
                                      "CohereForAI/aya-23-8B", "allenai/OLMo-1B-hf"])
def test_inference_prefill_matches_trace(model_id: str) -> None:
    # HF generate with SDPA, shrunken config: the analytic prefill/decode peak within 3% of the traced one
    # (StableLM keeps five hidden-sized tensors through its MLP: without that term it read -6.1%)
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.engine import estimate as analytic
    from vramplan.trace.engine import estimate as traced
    from vramplan.trace.shrink import catalog_config, shrink

    doc = {"model": shrink(catalog_config(model_id), vocab=2048), "task": "inference", "hardware": {"gpu": "a100"},
           "inference": {"batch_size": 4, "prompt_len": 512, "new_tokens": 16, "attention": "sdpa"}}
    a, t = analytic(doc).per_gpu.peak_allocated_bytes, traced(doc).per_gpu.peak_allocated_bytes
    assert abs(a / t - 1) < 0.03
