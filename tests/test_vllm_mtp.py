"""vLLM's MTP proposer (``serve.speculative.method: mtp``): the target's own multi-token-prediction layers, their
weights, KV layers and profile-run terms (serve/vllm.py ``_mtp_draft``, facts/vllm_mtp.py).

Every expected value is computed by hand in the comments from vLLM's source as facts/vllm_mtp.py cites it."""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.catalog.models import model_config
from vramplan.catalog.resolve import resolve
from vramplan.errors import ScenarioError
from vramplan.facts.vllm_mtp import VLLM_MTP_ARCHS, mtp_arch
from vramplan.serve.sglang_options import mtp_layer_bytes
from vramplan.serve.vllm import decide, forward_peak_bytes, mtp_forward_peak_bytes

DSV3, GLM_AIR = "deepseek-ai/DeepSeek-V3", "zai-org/GLM-4.5-Air"
MTP = {"method": "mtp", "num_speculative_tokens": 1}


def _doc(model: Any, version: str, tp: int = 8, gpu: str = "H200", spec: dict[str, Any] | None = None,
         **serve: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"model": model, "task": "serve", "hardware": {"gpu": gpu, "num_gpus": tp},
                           "parallel": {"tp": tp}, "serve": {"max_model_len": 8192, "vllm_version": version, **serve}}
    if spec is not None:
        doc["serve"]["speculative"] = spec
    return doc


def _decide(model: Any, version: str, **kw: Any) -> Any:
    return decide(resolve(_doc(model, version, **kw)), version=version)


@pytest.mark.parametrize("row", VLLM_MTP_ARCHS, ids=lambda a: a.architecture)
def test_every_architecture_row_cites_its_source_and_a_catalog_model_has_it(row: Any) -> None:
    assert row.source.startswith("0.17.0 vllm/config/speculative.py:") and "models/" in row.source
    assert row.draft.endswith(("MTPModel", "MTP"))
    assert mtp_arch(row.architecture) is row
    catalog = {DSV3: "DeepseekV3ForCausalLM", GLM_AIR: "Glm4MoeForCausalLM"}
    name = next(k for k, v in catalog.items() if v == row.architecture)
    cfg = model_config(name)
    assert cfg["architectures"][0] == row.architecture and cfg["num_nextn_predict_layers"] == 1


def test_glm_air_mtp_layer_by_hand() -> None:
    m = resolve(_doc(GLM_AIR, "0.17.0", tp=1)).model
    # GLM-4.5-Air (h 4096, 96 heads x 128, 8 KV heads, bias on q/k/v; 128 experts + 1 shared of 1408), the MTP
    # layer's decoder layer at tp 1: attention q 4096 x 12,288 = 50,331,648, k and v 4096 x 1024 = 4,194,304 each,
    # o 50,331,648, biases 12,288 + 2 x 1024 = 14,336 -> 109,066,240; experts 128 x 3 x 4096 x 1408 =
    # 2,214,592,512, shared 3 x 4096 x 1408 = 17,301,504, router 128 x 4096 + 128 (e_score_correction_bias) =
    # 524,416; two norms 8192 -> 2,341,492,864.  MTP extras: eh_proj 2 x 4096 x 4096 = 33,554,432 and enorm,
    # hnorm, shared_head.norm 3 x 4096 = 12,288 -> 2,375,059,584 parameters x 2 B (bf16) = 4,750,119,168 B.
    assert mtp_layer_bytes(m, 1, 1, 1, 2, "none") == 4_750_119_168


def test_glm_air_weights_kv_layers_and_head_by_release() -> None:
    plain = _decide(GLM_AIR, "0.17.0", tp=4)
    new = _decide(GLM_AIR, "0.17.0", tp=4, spec=MTP)
    old = _decide(GLM_AIR, "0.15.1", tp=4, spec=MTP)
    m = resolve(_doc(GLM_AIR, "0.17.0", tp=4)).model
    layer = mtp_layer_bytes(m, 4, 1, 4, 2, "none")  # vLLM without expert parallelism: experts split over tp 4
    assert new.speculative_weights_bytes == layer and new.weights_bytes - plain.weights_bytes == layer
    # 0.15.1 keeps the MTP layer's own shared_head.head: ceil(151,552 / 4) = 37,888 rows x 4096 x 2 B = 310,378,496
    assert old.speculative_weights_bytes - new.speculative_weights_bytes == 310_378_496
    # one KV layer of the target's page: 8 / 4 = 2 KV heads x 128 x 2 (K, V) x 2 B = 1024 B per token, 16,384 per
    # block of 16; it joins the target's 46 layers in one group: blocks = available // 16,384 // 47
    assert new.page_bytes == plain.page_bytes == 16 * 1024
    assert new.num_gpu_blocks == new.available_kv_bytes // (16 * 1024) // 47
    assert plain.num_gpu_blocks == plain.available_kv_bytes // (16 * 1024) // 46


def test_deepseek_v3_mla_layer_head_and_profile() -> None:
    plain = _decide(DSV3, "0.17.0", quantization="fp8-block")
    new = _decide(DSV3, "0.17.0", spec=MTP, quantization="fp8-block")
    old = _decide(DSV3, "0.15.1", spec=MTP, quantization="fp8-block")
    # the head 0.15.1 keeps: ceil(129,280 / 8) = 16,160 rows x 7168 x 2 B = 231,669,760 B
    assert old.speculative_weights_bytes - new.speculative_weights_bytes == 231_669_760
    # MLA: (kv_lora_rank 512 + rope 64) x 2 B = 1152 B per token on every rank, 18,432 per block; 61 + 1 layers
    assert new.page_bytes == 16 * 1152
    assert new.num_gpu_blocks == new.available_kv_bytes // (16 * 1152) // 62
    # the profile run's proposer terms (0.17.0 on) against none before
    assert new.proposer_forward_peak_bytes > 0 and new.speculative_buffers_bytes > 0
    assert old.proposer_forward_peak_bytes == 0 and old.speculative_buffers_bytes == 0
    assert plain.proposer_forward_peak_bytes == 0


def test_mtp_forward_peak_by_hand() -> None:
    m = resolve(_doc(DSV3, "0.17.0")).model
    # DeepSeek-V3, tp 8 (experts of 2048 split over 8: 256), 2048 tokens, bf16, compiled: the layer's 4h = 28,672
    # and its MoE width 8 x (max(2 x 256, 7168) + 256) + 256 = 59,648 -> 88,320 x 2048 x 2 = 361,758,720; the
    # prologue 6 x 7168 x 2048 x 2 = 176,160,768 is below it; the target's output 2048 x 7168 x 2 = 29,360,128
    assert forward_peak_bytes(m, 2048, 2, 8, True, 8) == 361_758_720
    assert mtp_forward_peak_bytes(m, 2048, 2, 8, True, 8) == 391_118_848


def test_buffers_are_the_eagle_proposers_at_the_targets_width() -> None:
    d = _decide(DSV3, "0.17.0", spec=MTP, quantization="fp8-block", max_num_batched_tokens=2048, max_num_seqs=128)
    # 2048 tokens x 20 B (input ids, positions, slot mapping) = 40,960; arange max(129, 2048) x 4 = 8192;
    # backup ids 128 x 4 = 512; hidden_states and inputs_embeds 2 x 2048 x 7168 x 2 = 58,720,256 -> 58,769,920 B
    assert d.speculative_buffers_bytes == 58_769_920
    assert d.proposer_forward_peak_bytes == 391_118_848  # as test_mtp_forward_peak_by_hand, 2048 tokens


def test_mtp_refusals() -> None:
    with pytest.raises(ScenarioError, match=r"read from 0\.11\.0"):
        _decide(DSV3, "0.10.0", spec=MTP, quantization="fp8-block")
    with pytest.raises(ScenarioError, match="separate MTP checkpoint"):
        _decide(DSV3, "0.17.0", spec={**MTP, "model": DSV3}, quantization="fp8-block")
    with pytest.raises(ScenarioError, match="pipeline parallelism"):
        decide(resolve({**_doc(DSV3, "0.17.0", spec=MTP, quantization="fp8-block"),
                        "hardware": {"gpu": "H200", "num_gpus": 16}, "parallel": {"tp": 8, "pp": 2}}), version="0.17.0")
    with pytest.raises(ScenarioError, match="has no MTP layers"):
        _decide("Qwen/Qwen3-8B", "0.17.0", tp=1, gpu="H100", spec=MTP)
    v2 = model_config("deepseek-ai/DeepSeek-V2-Lite") | {"num_nextn_predict_layers": 1}
    with pytest.raises(ScenarioError, match="DeepseekV2ForCausalLM, whose MTP layers are not modelled"):
        _decide(v2, "0.17.0", tp=1, gpu="H100", spec=MTP)


def test_two_mtp_layers_and_num_speculative_tokens() -> None:
    cfg = model_config(DSV3) | {"num_nextn_predict_layers": 2}
    one = _decide(DSV3, "0.17.0", spec=MTP, quantization="fp8-block")
    two = _decide(cfg, "0.17.0", spec={"method": "mtp", "num_speculative_tokens": 4}, quantization="fp8-block")
    # two layers: twice the weights (the same last-layer shape) and 61 + 2 KV layers in the group
    assert two.speculative_weights_bytes == 2 * one.speculative_weights_bytes
    assert two.num_gpu_blocks == two.available_kv_bytes // (16 * 1152) // 63
    # 3 > n_predict 2 and not a multiple: vLLM's ValueError
    with pytest.raises(ScenarioError, match="divisible by n_predict=2"):
        _decide(cfg, "0.17.0", spec={"method": "mtp", "num_speculative_tokens": 3}, quantization="fp8-block")


def test_mtp_layer_graphs_join_the_capture_count() -> None:
    sizes = {"cudagraph_capture_sizes": [1, 2, 4, 8], "quantization": "fp8-block"}
    ngram = _decide(DSV3, "0.17.0", spec={"method": "ngram", "num_speculative_tokens": 1}, **sizes)
    mtp = _decide(DSV3, "0.17.0", spec=MTP, **sizes)
    # the same sizes and query length (1 + 1); the MTP layer is captured piecewise at each of the 4 sizes:
    # 4 x (1 layer + 1) = 8 graphs more (facts/vllm_cudagraphs.py graph_segments, ``drafts``)
    assert mtp.cudagraph_capture_sizes == ngram.cudagraph_capture_sizes == (1, 2, 4, 8)
    assert mtp.cudagraph_graphs - ngram.cudagraph_graphs == 8


def test_expert_parallel_places_the_mtp_experts_as_the_targets() -> None:
    doc = _doc(DSV3, "0.17.0", spec=MTP, quantization="fp8-block")
    doc["parallel"] = {"tp": 8, "ep": 8}
    d = decide(resolve(doc), version="0.17.0")
    m = resolve(doc).model
    # --enable-expert-parallel: each of the 8 GPUs holds 256 / 8 = 32 whole experts (moe_split: ep 8, expert tp 1)
    assert d.speculative_weights_bytes == mtp_layer_bytes(m, 8, 8, 1, 2, "fp8-block")
    # the same bytes as every expert split 8 ways (2048 / 8 = 256 rows, a multiple of the 128 x 128 scale blocks):
    # 32 x 3 x 7168 x 2048 = 256 x 3 x 7168 x 256 elements; a double split (ep 8 and expert tp 8) would be 1/8 of it
    assert d.speculative_weights_bytes == _decide(DSV3, "0.17.0", spec=MTP, quantization="fp8-block").speculative_weights_bytes
    assert mtp_layer_bytes(m, 8, 8, 8, 2, "fp8-block") < d.speculative_weights_bytes


def test_model_runner_v2_is_stated_where_it_is_the_default() -> None:
    # 0.31.0 runs Model Runner V2 for DeepSeek-V3 with MTP (facts/vllm_releases.py MODEL_RUNNER_RULES: every model
    # from 0.29.0, mtp a V2 method); 0.28.0 keeps V1 (a MoE architecture not listed); 0.17.0 has no V2 default
    note = next(a for a in _decide(DSV3, "0.31.0", spec=MTP, quantization="fp8-block").assumptions
                if a.startswith("speculative mtp"))
    assert "Model Runner V2" in note
    for version in ("0.17.0", "0.28.0"):
        note = next(a for a in _decide(DSV3, version, spec=MTP, quantization="fp8-block").assumptions
                    if a.startswith("speculative mtp"))
        assert "Model Runner V2" not in note, version
