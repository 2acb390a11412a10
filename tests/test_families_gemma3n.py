"""Gemma 3n (``gemma3n_text``, ``gemma3n``; transformers ``modeling_gemma3n.py``): AltUp, LAuReL, per-layer embeddings,
KV-cache sharing, a MobileNetV5 vision tower and a conformer audio tower, the parameters counted by hand and against
transformers' module on the meta device; every task refused (the layers' mechanisms are not memory terms)."""

from __future__ import annotations

from typing import Any

import pytest

from meta_build import meta_causal_lm_count, meta_module
from vramplan import estimate
from vramplan.catalog.models import load_model
from vramplan.errors import ScenarioError, VramplanError
from vramplan.spec.families.gemma3n import kv_sharing_modes, layer_types, mobilenetv5_300m_enc_tensors
from vramplan.spec.hf_config import model_from_config

LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "full_attention", "sliding_attention"]
# A test input: 5 layers, the last 2 reading the K/V of layers 2 (sliding) and 1 (full)
TESTER: dict[str, Any] = {
    "model_type": "gemma3n_text", "hidden_size": 32, "num_hidden_layers": 5, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 64, "vocab_size": 99,
    "vocab_size_per_layer_input": 50, "hidden_size_per_layer_input": 4, "altup_num_inputs": 3, "laurel_rank": 6,
    "num_kv_shared_layers": 2, "layer_types": LAYER_TYPES, "sliding_window": 16,
    "activation_sparsity_pattern": [0.95, 0.0, 0.0, 0.0, 0.0]}

# gemma-3n-E2B's language model shape as public sources quote it (hidden 2048, 30 layers, MLP 8192, 10 KV-shared
# layers, the first 10 layers sparse): its config.json was not read verbatim, so it is a test input, not a catalog row
E2B_TEXT: dict[str, Any] = {
    "model_type": "gemma3n_text", "hidden_size": 2048, "num_hidden_layers": 30, "intermediate_size": [8192] * 30,
    "num_kv_shared_layers": 10, "activation_sparsity_pattern": [0.95] * 10 + [0.0] * 20}

# a small audio tower (width 16, 2 heads, 2 conformer blocks, kernel 3, subsampling channels 4 and 2)
AUDIO: dict[str, Any] = {"model_type": "gemma3n_audio", "hidden_size": 16, "conf_num_attention_heads": 2,
                         "conf_num_hidden_layers": 2, "conf_conv_kernel_size": 3, "sscp_conv_channel_size": [4, 2]}
MULTIMODAL: dict[str, Any] = {"model_type": "gemma3n", "text_config": TESTER, "audio_config": AUDIO,
                              "vision_config": {"model_type": "gemma3n_vision", "hidden_size": 2048}}


def test_tester_count_by_hand() -> None:
    # embed 99 x 32 = 3,168 (lm_head tied)
    # attention: q 32 x 32 = 1,024 and o 1,024 on 5 layers = 10,240; q_norm 8 x 5 = 40; k, v 32 x 16 = 512 each and
    #   k_norm 8 on the 3 layers computing their own K/V = 3 x 1,032 = 3,096 -> 13,376
    # MLP 3 x 32 x 64 = 6,144 x 5 = 30,720; four norms 4 x 32 x 5 = 640
    # AltUp (n 3): correct_output_scale 32 + correction 9 + prediction 27 + router 96 + router_norm 32 = 196 x 5 = 980
    # LAuReL (rank 6): 2 x 32 x 6 + 32 = 416 x 5 = 2,080; per-layer input gate/projection 2 x 32 x 4 + norm 32 = 288 x 5
    #   = 1,440; final norm 32
    # embed_tokens_per_layer 50 x (5 x 4) = 1,000; per_layer_model_projection 32 x 20 = 640; its norm 4
    # altup_projections and altup_unembed_projections 2 x 2 x 32 x 32 = 4,096
    # 3,168 + 13,376 + 30,720 + 640 + 980 + 2,080 + 1,440 + 32 + 1,000 + 640 + 4 + 4,096 = 58,176
    m = model_from_config(TESTER)
    assert m.num_parameters == 58_176
    assert [ls.sliding_window for ls in m.layers] == [16, None, 16, None, 16]


def test_kv_sharing_modes_as_transformers() -> None:
    # first shared layer 5 - 2 = 3; the last sliding layer before it is 2, the last full one 1
    assert kv_sharing_modes(LAYER_TYPES, 2) == [None, "store", "store", "reuse", "reuse"]
    assert kv_sharing_modes(LAYER_TYPES, 0) == [None] * 5
    with pytest.raises(ValueError, match="layer types producing a cache"):
        kv_sharing_modes(["sliding_attention"] * 4 + ["full_attention"], 1)
    # E4B (35 layers, every fifth full, 15 shared): layers 0-19 keep a cache, 18 (sliding) and 19 (full) store theirs
    # for layers 20-34
    e4b = kv_sharing_modes(layer_types({}, 35), 15)
    assert [i for i, mode in enumerate(e4b) if mode != "reuse"] == list(range(20))
    assert [i for i, mode in enumerate(e4b) if mode == "store"] == [18, 19]
    transformers = pytest.importorskip("transformers")
    assert transformers.Gemma3nTextConfig().kv_sharing_modes == e4b
    cfg = transformers.Gemma3nTextConfig(**{k: v for k, v in TESTER.items() if k != "model_type"})
    assert cfg.kv_sharing_modes == kv_sharing_modes(LAYER_TYPES, 2)


@pytest.mark.parametrize("cfg", [
    TESTER,
    {**TESTER, "attention_bias": True, "tie_word_embeddings": False, "intermediate_size": [64, 48, 64, 32, 64]},
    {**TESTER, "num_kv_shared_layers": 0},
    E2B_TEXT,
])
def test_text_count_matches_transformers_meta_module(cfg: dict[str, Any]) -> None:
    assert model_from_config(cfg).num_parameters == meta_causal_lm_count(cfg)


def test_e4b_text_defaults_count() -> None:
    # Gemma3nTextConfig's defaults (E4B): per layer with its own K/V 112,484,944 and with shared K/V 110,387,536
    #   (q 4,194,304 + k, v 2 x 1,048,576 + o 4,194,304 + q/k norms 512; MLP 3 x 2,048 x 16,384 = 100,663,296; norms
    #   8,192; AltUp 2,048 + 16 + 64 + 8,192 + 2,048 = 12,368; LAuReL 264,192; per-layer input 1,050,624)
    # 20 x 112,484,944 + 15 x 110,387,536 = 3,905,511,920; embed 262,400 x 2,048 = 537,395,200; norm 2,048;
    # embed_tokens_per_layer 262,144 x 35 x 256 = 2,348,810,240; projection 2,048 x 8,960 = 18,350,080; its norm 256;
    # AltUp projections 6 x 2,048^2 = 25,165,824 -> 6,835,235,568
    assert model_from_config({"model_type": "gemma3n_text"}).num_parameters == 6_835_235_568


def test_mobilenetv5_blocks_by_hand() -> None:
    rows = mobilenetv5_300m_enc_tensors()
    # stem: conv 64 x 3 x 3 x 3 + bias 64 + norm 64 = 1,856
    assert rows[0] == ("conv_stem", 1_856)
    # first EdgeResidual (64 -> 128, k3, e4): conv_exp 256 x 64 x 9 = 147,456 + bn 256 + conv_pwl 128 x 256 = 32,768
    #   + bn 128 = 180,608
    assert rows[1] == ("blocks.er", 180_608)
    # first UIR (128 -> 256, a3 k5 e6): dw_start 128 x 9 + 128 = 1,280; pw_exp 768 x 128 + 768 = 99,072; dw_mid
    #   768 x 25 + 768 = 19,968; pw_proj 256 x 768 + 256 = 196,864; layer scale 256 -> 317,440
    assert rows[4] == ("blocks.uir", 317_440)
    # first stage-2 attention (640, 12 heads of 64, kv stride 2): norm 640; query 640 x 768 = 491,520; key and value
    #   down_conv 640 x 9 + norm 640 = 6,400 and proj 640 x 64 = 40,960 each; output 768 x 640 = 491,520; scale 640
    #   -> 640 + 491,520 + 2 x 47,360 + 491,520 + 640 = 1,079,040
    assert rows[18] == ("blocks.mqa", 1_079_040)
    # the fusion adapter: UIR 1,920 -> 2,048 at e2 (pw_exp 3,840 x 1,920 + 3,840, pw_proj 2,048 x 3,840 + 2,048) and
    #   a norm 2,048 = 7,372,800 + 3,840 + 7,864,320 + 2,048 + 2,048 = 15,245,056
    assert rows[-1] == ("msfa", 15_245_056)
    assert len(rows) == 1 + 3 + 5 + 37 + 39 + 1  # stem, four stages (timm's arch_def), adapter
    assert sum(n for _, n in rows) == 294_126_912


def test_vision_tower_matches_timm() -> None:
    torch = pytest.importorskip("torch")
    timm = pytest.importorskip("timm")
    with torch.device("meta"):
        tower = timm.create_model("mobilenetv5_300m_enc")
    assert sum(p.numel() for p in tower.parameters()) == sum(n for _, n in mobilenetv5_300m_enc_tensors())


def test_multimodal_count_by_hand() -> None:
    # audio tower (d 16): conv_0 4 x 1 x 9 = 36 + norm 4; frequency 128 -> (128 + 2 - 3) // 2 + 1 = 64; conv_1
    #   2 x 4 x 9 = 72 + norm 2; frequency 64 -> 32; input_proj 2 x 32 x 16 = 1,024 -> 1,138
    #   conformer block 24 d^2 + 9 d + head_dim + d x kernel = 6,144 + 144 + 8 + 48 = 6,344, x 2 = 12,688
    # embed_vision 128 x 2,048 + 2 x 2,048 + 2,048 x 32 = 262,144 + 4,096 + 65,536 = 331,776
    # embed_audio 128 x 16 + 2 x 16 + 16 x 32 = 2,048 + 32 + 512 = 2,592
    # 58,176 + 294,126,912 + 1,138 + 12,688 + 331,776 + 2,592 = 294,533,282
    assert model_from_config(MULTIMODAL).num_parameters == 294_533_282


def test_multimodal_count_matches_transformers_meta_module() -> None:
    pytest.importorskip("timm")  # the vision tower is a TimmWrapperModel
    module = meta_module(MULTIMODAL)
    assert model_from_config(MULTIMODAL).num_parameters == sum(p.numel() for p in module.parameters())


def test_catalog_row() -> None:
    # language model 6,835,235,568 + vision tower 294,126,912 + audio tower 681,348,640 (subsampling 1,611,040 +
    # 12 x 56,644,800) + embedders 7,805,952 (4,460,544 + 3,345,408) = 7,818,517,072
    assert load_model("gemma-3n-e4b-it").num_parameters == 7_818_517_072


def test_other_vision_architecture_refused() -> None:
    cfg = {**MULTIMODAL, "vision_config": {"model_type": "gemma3n_vision", "architecture": "resnet50"}}
    with pytest.raises(ScenarioError, match="only timm's mobilenetv5_300m_enc"):
        model_from_config(cfg)


@pytest.mark.parametrize(("inter", "match"), [([64] * 4, "one width per layer"), ([64, 0, 64, 64, 64], "positive")])
def test_intermediate_size_list_checked(inter: list[int], match: str) -> None:
    with pytest.raises(ScenarioError, match=match):
        model_from_config({**TESTER, "intermediate_size": inter})


@pytest.mark.parametrize("doc", [
    {"task": "inference"},
    {"task": "train", "train": {"seq_len": 128}},
    {"task": "train", "train": {"seq_len": 128, "peft": {"method": "lora"}}},
])
def test_analytic_engine_refuses_and_names_the_traced_engine(doc: dict[str, Any]) -> None:
    with pytest.raises(VramplanError, match=r"AltUp streams .* are not among the analytic engine's terms, so task "
                       r"\w+ is not estimated by the analytic engine.*use --engine trace"):
        estimate({"model": TESTER, "hardware": {"gpu": "H100"}, **doc})


def test_serving_refused() -> None:
    with pytest.raises(VramplanError, match="no serving engine's layout of it was read"):
        estimate({"model": TESTER, "hardware": {"gpu": "H100"}, "task": "serve"})


@pytest.mark.parametrize("doc", [{"task": "inference"}, {"task": "train", "train": {"seq_len": 128}}, {"task": "serve"}])
def test_multimodal_every_task_refused(doc: dict[str, Any]) -> None:
    with pytest.raises(VramplanError, match=r"vision tower and conformer audio tower are not modelled.*text_config "
                       r"alone \(model_type gemma3n_text\) is estimated with --engine trace; its parameters are "
                       r"counted \(294,533,282\)"):
        estimate({"model": MULTIMODAL, "hardware": {"gpu": "H100"}, **doc})


GENERATE = {"model": TESTER, "hardware": {"gpu": "H100"}, "task": "inference",
            "inference": {"prompt_len": 32, "new_tokens": 4, "batch_size": 2}}


def _before(st: Any, phase: str) -> list[Any]:
    """The trace's allocation events before the mark ``phase``."""
    start = next(seq for seq, ph in st.marks if ph == phase)
    return [e for e in st.events if e.seq < start]


def test_trace_prefill_holds_the_per_layer_inputs_and_altup_streams() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.trace.engine import trace

    _, st = trace(GENERATE)
    events = [e for e in _before(st, "decode-setup") if e.nbytes > 0]
    # the per-layer inputs (Gemma3nTextModel.get_per_layer_inputs and project_per_layer_inputs, modeling_gemma3n.py:1738 and :1747): batch 2 x prompt 32 x
    # 5 layers x 4 = 1,280 elements, bf16: 2,560 bytes each for the embedding lookup and the projection's matmul
    assert [e.nbytes for e in events if e.module == "model.embed_tokens_per_layer" and e.op == "aten.embedding.default"
            ] == [2_560]
    assert [e.nbytes for e in events if e.module == "model.per_layer_model_projection"] == [2_560]
    # AltUp's streams, stacked twice (modeling_gemma3n.py:1694, the embeddings and altup_num_inputs - 1 projections
    # before the layers; :1729, the unembedded streams after them): 3 x 2 x 32 x 32 elements, bf16 = 12,288 bytes each
    assert [e.nbytes for e in events if e.module == "model" and e.op == "aten.stack.default"] == [12_288, 12_288]


def test_trace_decode_cache_holds_only_the_layers_that_store_one() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.trace.engine import trace

    _, st = trace(GENERATE)
    live: dict[int, Any] = {}
    for e in _before(st, "decode"):
        if e.nbytes > 0:
            live[e.storage_id] = e
        else:
            live.pop(e.storage_id, None)
    kv = sorted(e.nbytes for e in live.values() if e.category == "kv_cache")
    # layers 0-2 compute their own K/V (3 and 4 reuse 2's and 1's: DummyLayer in the cache); each holds K and V of
    # 2 sequences x 2 KV heads x (32 + 4 - 1) tokens x 8, bf16 = 2,240 bytes (the sliding layers' cat result, a view of
    # which the window keeps); the two sliding layers' _sliding_window_tensor, int64 (cache_utils.py:208, :220)
    assert kv == [8, 8] + [2_240] * 6
    assert sum(kv) == 3 * 2 * 2_240 + 2 * 8 == 13_456


def test_trace_training_holds_every_parameter() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.trace.engine import trace

    _, st = trace({"model": TESTER, "hardware": {"gpu": "H100"}, "train": {"micro_batch_size": 1, "seq_len": 32}})
    # fp32 parameters under bf16-mixed: 4 x 58,176 bytes; as many gradient bytes; AdamW's two fp32 states
    def total(category: str) -> int:
        return sum(e.nbytes for e in st.events if e.nbytes > 0 and e.category == category)

    assert total("weights") == total("gradients") == 4 * 58_176
    assert total("optimizer_states") == 8 * 58_176
    assert [ph for _, ph in st.marks] == ["forward", "backward", "optimizer", "end"]
