"""vLLM serving of the hybrid families whose mixers are not Mamba's or whose attention is shared: Qwen3-Next (Gated
DeltaNet), LFM2 (gated short convolution) and Zamba2 (Mamba2 with shared attention blocks): the state page, the raised
attention block, the groups, blocks, tokens and the start-up need (serve/mamba_pages.py, facts/vllm_releases.py
LINEAR_MIXER_V1_FROM, LINEAR_MIXER_PROFILE_READ_BEFORE), and what is refused.  Every expected value is computed by hand
in its comment."""

from __future__ import annotations

from typing import Any

import pytest

from test_families_lfm2 import LFM2_1_2B
from test_families_qwen3_next import QWEN3_NEXT_80B
from test_families_zamba2 import SECOND as ZAMBA2_GROUPED_KV
from test_families_zamba2 import TESTER as ZAMBA2_TESTER
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.errors import ScenarioError, VramplanError
from vramplan.facts.vllm_releases import (
    LINEAR_MIXER_PROFILE_READ_BEFORE,
    LINEAR_MIXER_V1_FROM,
    MAMBA_HYBRID_FIRST,
    MAMBA_HYBRID_RULES,
)
from vramplan.serve.mamba_pages import hybrid_layout, mamba_state_page_bytes, mixer_profile_width
from vramplan.serve.vllm import decide
from vramplan.spec.hf_config import model_from_config

# transformers' Zamba2Config defaults ("Zamba2-2.7B style", configuration_zamba2.py, 5.24; spec/families/zamba2.py):
# hidden 2560, 54 layers of which 9 hybrid, 32 heads (= KV heads) of attention_head_dim 2 x 2560 / 32 = 160; mixers of
# 8 heads of 2 x 2560 / 8 = 640, 1 group, d_state 64, d_conv 4; intermediate 4 x 2560
ZAMBA2_DEFAULTS: dict[str, Any] = {"model_type": "zamba2", "vocab_size": 32000, "hidden_size": 2560,
                                   "num_attention_heads": 32}
KV_10_GIB = 10 * 1024**3  # kv_cache_memory_bytes: the KV budget as given, so the blocks follow from it alone


def _doc(model: dict[str, Any], version: str, max_len: int = 8192, **serve: Any) -> dict[str, Any]:
    return {"model": model, "task": "serve", "hardware": {"gpu": "H100"},
            "serve": {"vllm_version": version, "gpu_memory_utilization": 0.9, "max_model_len": max_len, **serve}}


def _decide(model: dict[str, Any], version: str, max_len: int = 8192, **serve: Any) -> Any:
    return decide(resolve(_doc(model, version, max_len, kv_cache_memory_bytes=KV_10_GIB, **serve)), version=version)


def test_facts_rows() -> None:
    # one test per row: both classes are first registered in 0.10.2 (registry.py:77, :101), which is also the first
    # release whose hybrid rules are read; the Gated DeltaNet profile run was read before 0.12.0 only
    assert LINEAR_MIXER_V1_FROM == {"gated_deltanet": (0, 10, 2), "short_conv": (0, 10, 2)}
    assert all(first >= MAMBA_HYBRID_FIRST for first in LINEAR_MIXER_V1_FROM.values())
    assert LINEAR_MIXER_PROFILE_READ_BEFORE == {"gated_deltanet": (0, 12, 0), "short_conv": None}


def test_qwen3_next_state_page_and_layout_by_hand() -> None:
    ms = model_from_config(QWEN3_NEXT_80B).mamba
    assert ms is not None and ms.kind == "gated_deltanet" and len(ms.layers) == 36
    # conv_dim 2 x 16 x 128 + 32 x 128 = 8,192; conv state 3 x 8,192 x 2 B = 49,152; recurrent 32 x 128 x 128 x 2 B
    # = 1,048,576 -> 1,097,728 B
    assert mamba_state_page_bytes(ms, 2) == 1_097_728
    # attention per token 2 x 2 KV heads x 256 x 2 B = 2,048; block 16 x cdiv(1,097,728, 32,768) = 16 x 34 = 544
    lay = hybrid_layout(ms, 12, 2048, 2, 16, MAMBA_HYBRID_RULES[0])
    assert (lay.block_size, lay.page) == (544, 1_114_112)
    # 12 attention and 36 mixer layers: groups of 12 -> 1 attention group, 3 mixer groups; layer 0 is a mixer
    assert (lay.group_size, lay.attention_groups, lay.mamba_groups, lay.first_is_mamba) == (12, 1, 3, True)
    # 0.10.2-0.11.x: the layer returns before its input projection in the profile run
    assert mixer_profile_width(ms, 2048) == 0


def test_lfm2_state_page_and_layout_by_hand() -> None:
    ms = model_from_config(LFM2_1_2B).mamba
    assert ms is not None and ms.kind == "short_conv" and len(ms.layers) == 10
    # (conv_L_cache 3 - 1) x 2,048 channels x 2 B = 8,192 B, no recurrent state
    assert mamba_state_page_bytes(ms, 2) == 8192
    # attention per token 2 x 8 KV heads x 64 x 2 B = 2,048: 16 x cdiv(8,192, 32,768) = 16 = the given block
    lay = hybrid_layout(ms, 6, 2048, 2, 16, MAMBA_HYBRID_RULES[0])
    assert (lay.block_size, lay.page) == (16, 32_768)
    # 6 attention and 10 convolution layers: groups of 6 -> 1 attention group, cdiv(10, 6) = 2 mixer groups
    assert (lay.group_size, lay.attention_groups, lay.mamba_groups, lay.first_is_mamba) == (6, 1, 2, True)
    # profile run: B|C|x 3 x 2,048, B x x and C x Bx 2,048 each, out_proj's result and the layer's output 2,048 each
    # = 5 x 2,048 + 2 x 2,048 = 14,336 per token
    assert mixer_profile_width(ms, 2048) == 14_336


def test_zamba2_state_page_and_layout_by_hand() -> None:
    m = model_from_config(ZAMBA2_DEFAULTS)
    ms = m.mamba
    assert ms is not None and len(ms.layers) == 54 and len(ms.shared_attention_layers) == 9
    # conv_dim 5,120 + 2 x 1 x 64 = 5,248; conv 3 x 5,248 x 2 B = 31,488; SSM 8 x 640 x 64 x 2 B = 655,360 -> 686,848
    assert mamba_state_page_bytes(ms, 2) == 686_848
    # attention per token 2 x 32 KV heads x 160 x 2 B = 20,480; block 16 x cdiv(686,848, 327,680) = 16 x 3 = 48
    lay = hybrid_layout(ms, 9, 20_480, 2, 16, MAMBA_HYBRID_RULES[0])
    assert (lay.block_size, lay.page) == (48, 983_040)
    # 9 attention layers (one per hybrid layer) and 54 mixers: groups of 9 -> 1 attention group, 6 mixer groups; the
    # attention layers are registered first (zamba2.py Zamba2Model.__init__), so the first group is not a mixer group
    assert (lay.group_size, lay.attention_groups, lay.mamba_groups, lay.first_is_mamba) == (9, 1, 6, False)


def test_qwen3_next_80b_at_0_11_with_an_explicit_kv_budget() -> None:
    d = _decide(QWEN3_NEXT_80B, "0.11")
    # 10,737,418,240 // 1,114,112 = 9,637 pages; // 12 layers per group = 803 blocks; 4 groups
    assert (d.block_size, d.page_bytes, d.layers_per_group, len(d.groups)) == (544, 1_114_112, 12, 4)
    assert d.num_gpu_blocks == 803
    # GPU KV cache size: 803 // 4 groups x min(544, 8,192) = 200 x 544 = 108,800 tokens
    assert d.kv_cache_tokens == 108_800
    # a request of 8,192 tokens: cdiv(8,192, 544) = 16 attention blocks + 3 mixer blocks = 19; 803 / 19 = 42.26
    assert d.max_concurrency == pytest.approx(803 / 19)
    # needed (every layer's spec): (12 x 16 + 36) x 1,114,112 = 228 x 1,114,112 = 254,017,536 B
    assert d.needed_kv_bytes == 254_017_536
    assert d.to_dict()["mamba_state_page_bytes"] == 1_097_728 and d.to_dict()["mamba_groups"] == 3


def test_lfm2_1_2b_at_0_11_and_0_15() -> None:
    d = _decide(LFM2_1_2B, "0.11")
    # 10,737,418,240 // 32,768 = 327,680 pages; // 6 = 54,613 blocks; 3 groups
    assert (d.block_size, d.page_bytes, d.layers_per_group, len(d.groups)) == (16, 32_768, 6, 3)
    assert d.num_gpu_blocks == 54_613
    # 54,613 // 3 x 16 = 18,204 x 16 = 291,264 tokens
    assert d.kv_cache_tokens == 291_264
    # cdiv(8,192, 16) = 512 attention blocks + 2 = 514 per request; needed (6 x 512 + 10) x 32,768 = 100,990,976 B
    assert d.max_concurrency == pytest.approx(54_613 / 514)
    assert d.needed_kv_bytes == 100_990_976
    # 0.15: group size x page x the first group's blocks; layer 0 is a convolution layer: 6 x 32,768 x 1 = 196,608
    assert _decide(LFM2_1_2B, "0.15").needed_kv_bytes == 196_608


def test_zamba2_at_0_11_and_0_15() -> None:
    d = _decide(ZAMBA2_DEFAULTS, "0.11", max_len=4096)
    # 10,737,418,240 // 983,040 = 10,922 pages; // 9 = 1,213 blocks; 7 groups
    assert (d.block_size, d.page_bytes, d.layers_per_group, len(d.groups)) == (48, 983_040, 9, 7)
    assert d.num_gpu_blocks == 1213
    # 1,213 // 7 x min(48, 4,096) = 173 x 48 = 8,304 tokens
    assert d.kv_cache_tokens == 8304
    # cdiv(4,096, 48) = 86 attention blocks + 6 = 92 per request; needed (9 x 86 + 54) x 983,040 = 813,957,120 B
    assert d.max_concurrency == pytest.approx(1213 / 92)
    assert d.needed_kv_bytes == 813_957_120
    # 0.15: the first group is the attention group: 9 x 983,040 x 86 = 760,872,960 B
    assert _decide(ZAMBA2_DEFAULTS, "0.15", max_len=4096).needed_kv_bytes == 760_872_960


def test_the_report_names_the_state_and_the_groups() -> None:
    r = estimate(_doc(LFM2_1_2B, "0.11"))
    text = " ".join(r.assumptions)
    assert "gated short-convolution model: 10 mixer layers" in text and "8,192 B" in text
    assert "1 attention and 2 mixer groups of 6 layers" in text
    z = " ".join(estimate(_doc(ZAMBA2_DEFAULTS, "0.11", max_len=4096)).assumptions)
    assert "not modelled: in the profile run, Zamba2's shared transformer blocks" in z and "adapters' outputs" in z


@pytest.mark.parametrize(("model", "version", "where", "text"), [
    # no class before 0.10.2; Zamba2 runs on V0 there
    (QWEN3_NEXT_80B, "0.10.1", "serve.vllm_version", "first registered in 0.10.2"),
    (LFM2_1_2B, "0.10.1", "serve.vllm_version", "first registered in 0.10.2"),
    (ZAMBA2_DEFAULTS, "0.10.1", "serve.vllm_version", "V0 engine"),
    # the Gated DeltaNet's profile run from 0.12.0 was not read
    (QWEN3_NEXT_80B, "0.12", "serve.vllm_version", "from vLLM 0.12.0"),
    # prefix caching on by default from 0.26.0, as for every hybrid
    (LFM2_1_2B, "0.26", "serve.vllm_version", "prefix caching"),
    # grouped KV heads: vLLM's Zamba2Attention has as many KV heads as heads
    (ZAMBA2_GROUPED_KV, "0.11", "model", "as many KV heads as heads"),
])
def test_what_is_not_modelled_is_refused(model: dict[str, Any], version: str, where: str, text: str) -> None:
    with pytest.raises(ScenarioError) as err:
        estimate(_doc(model, version))
    assert str(err.value).startswith(where) and text in str(err.value)


def test_lfm2_conv_dim_other_than_hidden_is_refused() -> None:
    # vLLM sizes the state from config.json's conv_dim, transformers from hidden_size: the released configs agree
    assert model_from_config({**LFM2_1_2B, "conv_dim": 2048, "conv_dim_out": 2048}).mamba == model_from_config(
        LFM2_1_2B).mamba
    with pytest.raises(VramplanError, match="conv_dim \\(1024\\) differs from hidden_size \\(2048\\)"):
        model_from_config({**LFM2_1_2B, "conv_dim": 1024})


@pytest.mark.parametrize("model", [QWEN3_NEXT_80B, LFM2_1_2B, ZAMBA2_TESTER])
@pytest.mark.parametrize("engine", ["sglang", "llamacpp"])
def test_other_engines_are_refused(model: dict[str, Any], engine: str) -> None:
    with pytest.raises(ScenarioError) as err:
        estimate({"model": model, "task": "serve", "hardware": {"gpu": "H100"}, "serve": {"engine": engine}})
    assert str(err.value).startswith("serve.engine") and "use serve.engine vllm" in str(err.value)


def test_a_hybrid_class_without_attention_layers_is_refused() -> None:
    """vLLM runs Lfm2ForCausalLM as a hybrid whatever its layers: the state page is padded to an attention block
    (0.11.0 vllm/config/__init__.py:641), so an LFM2 config with no attention layer was estimated with an unpadded
    page, about 4 x too many blocks; no released checkpoint has no attention layer, so it is refused."""
    no_attention = {**LFM2_1_2B, "full_attn_idxs": []}
    with pytest.raises(ScenarioError, match="with no attention layer: vLLM sizes its state pages"):
        resolve(_doc(no_attention, "0.11.0"))
    resolve(_doc(LFM2_1_2B, "0.11.0"))  # the released shape is served
