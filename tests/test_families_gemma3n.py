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
    {"task": "train", "train": {"seq_len": 128}},
    {"task": "train", "train": {"seq_len": 128, "peft": {"method": "lora"}}},
])
def test_analytic_engine_refuses_training_and_names_the_traced_engine(doc: dict[str, Any]) -> None:
    with pytest.raises(VramplanError, match=r"AltUp streams .* are among the analytic engine's generate terms "
                       r"\(analytic/altup.py\) but not its training terms .*, so task train is not estimated by the "
                       r"analytic engine.*use --engine trace.*task inference \(generate\) is estimated by the analytic "
                       r"engine"):
        estimate({"model": TESTER, "hardware": {"gpu": "H100"}, **doc})


def test_serving_refused() -> None:
    with pytest.raises(VramplanError, match="no serving engine's layout of it was read"):
        estimate({"model": TESTER, "hardware": {"gpu": "H100"}, "task": "serve"})


@pytest.mark.parametrize("doc", [{"task": "inference"}, {"task": "train", "train": {"seq_len": 128}}, {"task": "serve"}])
def test_multimodal_every_task_refused(doc: dict[str, Any]) -> None:
    with pytest.raises(VramplanError, match=r"vision tower and conformer audio tower are not modelled.*text_config "
                       r"alone \(model_type gemma3n_text\) is estimated: generate by either engine, training with --engine "
                       r"trace; its parameters are "
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
    # layers 0-2 compute their own K/V (3 and 4 reuse 2's and 1's: DummyLayer in the cache). The full layer 1 holds K
    # and V of 2 sequences x 2 KV heads x (32 + 4 - 2) tokens x 8, bf16 = 2,176 bytes each (the last of the 3 decode
    # steps runs against the 34 tokens the first two left); the sliding layers 0 and 2
    # the previous decode step's cat of their 15-token view and the new token, min(34, 16) = 16 tokens: 2 x 2 x 16 x
    # 8 x 2 B = 1,024 bytes each (DynamicSlidingWindowLayer.update, cache_utils.py:242-249); the two sliding layers'
    # _sliding_window_tensor, int64 (cache_utils.py:208, :220)
    assert kv == [8, 8] + [1_024] * 4 + [2_176] * 2
    assert sum(kv) == 2 * 2 * 1_024 + 2 * 2_176 + 2 * 8 == 8_464


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


# ---- the analytic engine's generate (analytic/altup.py) -------------------------------------------------------------

def _e4b_text() -> dict[str, Any]:
    """google/gemma-3n-E4B-it's catalog row's text_config (the E4B language model)."""
    import json
    from pathlib import Path

    row = Path(__file__).parent.parent / "src/vramplan/catalog/models/google__gemma-3n-e4b-it.json"
    return dict(json.loads(row.read_text())["config"]["text_config"])


def test_spec_records_altup_kv_reuse_and_widths() -> None:
    m = model_from_config({**TESTER, "intermediate_size": [64, 48, 64, 32, 64]})
    assert m.altup is not None
    assert (m.altup.num_inputs, m.altup.per_layer_input_width, m.altup.laurel_rank) == (3, 4, 6)
    assert m.altup.sparse_layers == (0,)  # activation_sparsity_pattern [0.95, 0, 0, 0, 0]
    assert m.kv_reuse_layers == (3, 4)  # kv_sharing_modes: [None, store, store, reuse, reuse]
    assert [ls.intermediate_size for ls in m.layers] == [64, 48, 64, 32, 64]
    # the default pattern (configuration_gemma3n.py:145-149): the first 10 layers sparse when there are more than 10
    e4b = model_from_config({"model_type": "gemma3n_text"})
    assert e4b.altup is not None and e4b.altup.sparse_layers == tuple(range(10))
    assert e4b.kv_reuse_layers == tuple(range(20, 35))
    with pytest.raises(ScenarioError, match="activation_sparsity_pattern must be a list"):
        model_from_config({**TESTER, "activation_sparsity_pattern": 0.95})


def test_analytic_kv_cache_only_layers_with_their_own_kv() -> None:
    from vramplan.analytic.kv_cache import attention_layers, kv_spec

    m = model_from_config(TESTER)
    assert [ls.index for ls in attention_layers(m)] == [0, 1, 2]
    # E4B: 20 layers cache (16 sliding of window 512, 4 full), each 2 x 2 heads x 256 x 2 B = 2,048 B per token
    spec = kv_spec(model_from_config(_e4b_text()), "auto", 2)
    assert len(spec.layers) == 20 and sum(1 for la in spec.layers if la.window == 512) == 16
    assert spec.bytes_per_token == 20 * 2_048


def test_analytic_generate_small_config_by_hand() -> None:
    from vramplan.analytic.inference import inference_step
    from vramplan.catalog.resolve import resolve

    report = estimate(GENERATE)
    detail = report.to_json_dict()
    detail = detail.get("per_gpu", detail)["breakdown_detail"]
    assert report.to_json_dict().get("per_gpu", report.to_json_dict())["peak_phase"] == "prefill"
    # T = 2 x 32 = 64 tokens, h 32, n 3, L 5, P 4, I 64, bf16 (c 2): h T c = 4,096 B
    # KV at prefill: layers 0-2 (3 and 4 reuse), K and V of 2 x 2 heads x 32 tokens x 8 x 2 B = 2,048 B each:
    #   3 x 2 x 2,048 = 12,288
    assert detail["kv_cache"] == {"prompt": 12_288}
    act = detail["activations"]
    assert act["inputs_embeds (kept by the decoder's forward)"] == 4_096
    assert act["per-layer inputs (kept by the decoder's forward)"] == 64 * 5 * 4 * 2 == 2_560
    assert act["AltUp projections (kept by the decoder's forward)"] == 3 * 4_096 == 12_288
    # RoPE: one cos/sin pair per layer type (sliding and full), 2 x 2 x 32 positions x head_dim 8 x 2 B
    assert act["RoPE cos/sin"] == 2 * 2 * 32 * 8 * 2 == 2_048
    # the sliding layers' boolean mask [1, 1, 32, 32]: the prompt (32) reaches the window (16)
    assert act["sliding-window mask (SDPA)"] == 32 * 32 == 1_024
    # the running layer, its moments: predict 3n = 9 x 4,096 = 36,864; MLP ((2n + 7) h + 4I) T c = (13 x 32 + 256) x
    # 128 = 86,016; post-feed-forward norm 13 x 4,096 + 8 x 32 x 64 = 69,632; correct (4n + 9) = 21 x 4,096 = 86,016;
    # clone and scale (3n + 11) = 20 x 4,096 = 81,920; the per-layer projection's norm (3n + 10) = 19 x 4,096 +
    # 16,384 = 94,208 (the largest: the 4I MLP is only 2h wide here); attention below them
    assert act["running layer"] == 94_208
    assert sum(act.values()) == 4_096 + 2_560 + 12_288 + 2_048 + 1_024 + 94_208 == 116_224
    # the cache at the last step: 32 + 4 - 1 = 35 tokens; the sliding layers 0 and 2 keep their window (16), the full
    # layer 1 all 35: (16 + 16 + 35) x 2 (K, V) x 2 sequences x 2 heads x 8 x 2 B = 67 x 128 = 8,576
    assert inference_step(resolve(GENERATE)).final_cache_bytes == 8_576


def _parts(report: Any) -> dict[str, int]:
    d = report.to_json_dict()
    g = d.get("per_gpu", d)
    return {"peak": g["peak_allocated_bytes"], "activations": g["breakdown"]["activations"],
            "kv_cache": g["breakdown"]["kv_cache"], "phase": g["peak_phase"]}


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_analytic_generate_agrees_with_trace_small(attention: str) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.trace.engine import estimate as traced

    doc = {**GENERATE, "inference": {**GENERATE["inference"], "attention": attention}}
    a, t = _parts(estimate(doc)), _parts(traced(doc))
    assert a["phase"] == t["phase"] == "prefill"
    assert a["kv_cache"] == t["kv_cache"] == 12_288
    # the trace rounds every tensor up to 512 B (the small config's many tiny ones): within 3 %
    assert abs(a["activations"] - t["activations"]) <= 0.03 * t["activations"]
    assert abs(a["peak"] - t["peak"]) <= 0.01 * t["peak"]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_analytic_generate_agrees_with_trace_e4b(attention: str) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.trace.engine import estimate as traced

    doc = {"model": _e4b_text(), "hardware": {"gpu": "H100"}, "task": "inference",
           "inference": {"prompt_len": 1024, "new_tokens": 16, "batch_size": 2, "attention": attention}}
    a, t = _parts(estimate(doc)), _parts(traced(doc))
    assert a["phase"] == t["phase"] == "prefill"
    # 20 caching layers x K and V x 2 x 2 heads x 1,024 x 256 x 2 B = 83,886,080
    assert a["kv_cache"] == t["kv_cache"] == 83_886_080
    # SDPA: analytic 476,053,504 against the trace's 476,078,080 (the trace adds per-token row statistics)
    assert abs(a["activations"] - t["activations"]) <= 0.001 * t["activations"]
    assert abs(a["peak"] - t["peak"]) <= 0.001 * t["peak"]


def test_e4b_prefill_activations_by_hand() -> None:
    # E4B text, 2 x 1,024 tokens, bf16, SDPA: h T c = 2,048 x 2,048 x 2 = 8,388,608 B
    # inputs_embeds 8,388,608; AltUp projections 4 x 8,388,608 = 33,554,432; per-layer inputs 2,048 x 35 x 256 x 2 =
    # 36,700,160; RoPE 2 types x 2 x 1,024 x 256 x 2 = 2,097,152; the sliding mask 1,024^2 = 1,048,576; the running
    # layer's MLP moment (15 x 2,048 + 4 x 16,384) x 2,048 x 2 = 394,264,576
    doc = {"model": _e4b_text(), "hardware": {"gpu": "H100"}, "task": "inference",
           "inference": {"prompt_len": 1024, "new_tokens": 16, "batch_size": 2}}
    act = _parts(estimate(doc))["activations"]
    assert act == 8_388_608 + 33_554_432 + 36_700_160 + 2_097_152 + 1_048_576 + 394_264_576 == 476_053_504


def test_analytic_generate_under_tensor_parallelism_refused() -> None:
    doc = {**GENERATE, "hardware": {"gpu": "H100", "num_gpus": 2}, "parallel": {"tp": 2}}
    with pytest.raises(VramplanError, match=r"parallel.tp.*is 2: .*generate under tensor parallelism is not "
                       r"modelled.*set parallel.tp: 1"):
        estimate(doc)
