"""llama.cpp's KV cache for DeepSeek's multi-head latent attention (architecture deepseek2), by build.

facts/llamacpp_builds.py ``MLA_CACHE_SOURCES``: before b5137 the multi-head layout (K n_head x (nope + rope), V
n_head x v_head_dim); from b5137 (ggml-org/llama.cpp#12801) a 576-wide K row and a 512-wide V row per token and layer
for a file converted with the _mla keys; from b7832 (#19067) the K row only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from test_serve_llamacpp import TINY_META, gguf_bytes, tiny_tensors
from vramplan.catalog.resolve import resolve
from vramplan.facts.llamacpp_builds import MLA_CACHE_FROM, MLA_V_LESS_FROM, mla_cache_layout
from vramplan.serve.llamacpp import decide

MiB = 2**20


def _scn(model: str, build: str, ctx: int, ngl: int = -1, gpu: str = "H100-SXM", **gguf: Any) -> dict[str, Any]:
    return {"model": model, "task": "serve", "hardware": {"gpu": gpu},
            "serve": {"engine": "llamacpp", "max_model_len": ctx,
                      "gguf": {"quant": "Q4_K_M", "n_gpu_layers": ngl, "flash_attn": False, "llamacpp_build": build,
                               **gguf}}}


def test_boundaries_are_the_merge_commits_counts() -> None:
    assert (MLA_CACHE_FROM, MLA_V_LESS_FROM) == (5137, 7832)
    assert [mla_cache_layout(b) for b in (5136, 5137, 7831, 7832)] == ["mha", "mla", "mla", "mla-k"]
    assert mla_cache_layout(9000, mla_file=False) == "mha"  # a file converted before b5137


def test_deepseek_v3_before_mla_is_the_published_kv_buffer() -> None:
    # ollama 0.5.6 (llama.cpp of December 2024), DeepSeek-V3, n_ctx 2048, -ngl 1: "CUDA0 KV buffer size = 160.00 MiB"
    # one layer x 2048 cells x (128 heads x 192 K + 128 x 128 V) x 2 B = 2048 x 40,960 x 2 = 167,772,160 = 160 MiB
    d = decide(resolve(_scn("deepseek-ai/DeepSeek-V3", "b4300", 2048, ngl=1, gpu="RTX-3090")))
    assert d.kv_bytes == 167_772_160 == 160 * MiB
    # the 60 host layers: 9600 MiB ("CPU KV buffer size = 9600.00 MiB")
    assert d.kv_host_bytes == 60 * 160 * MiB


@pytest.mark.parametrize(("build", "k_mib", "v_mib"), [
    # DeepSeek-V2-Lite: 27 layers, kv_lora_rank 512, qk_rope 64, n_ctx 4096 (a multiple of the 32-cell padding)
    # b5137-b7831: K 27 x 4096 x 576 x 2 B = 121.5 MiB, V 27 x 4096 x 512 x 2 B = 108 MiB
    ("b6000", 121.5, 108.0),
    # from b7832: the K row only
    ("b7900", 121.5, 0.0),
    # before b5137: 16 heads x (128 + 64) K = 3072, 16 x 128 V = 2048: 27 x 4096 x 2 B x 3072 = 648 MiB, x 2048 = 432
    ("b5000", 648.0, 432.0),
])
def test_deepseek_v2_lite_cache_by_build(build: str, k_mib: float, v_mib: float) -> None:
    d = decide(resolve(_scn("deepseek-ai/DeepSeek-V2-Lite", build, 4096)))
    assert (d.kv_k_bytes, d.kv_v_bytes) == (int(k_mib * MiB), int(v_mib * MiB))
    assert any("deepseek2" in a and build in a for a in d.assumptions)


def test_a_file_with_the_mla_keys(tmp_path: Path) -> None:
    # a two-layer file whose metadata says MLA: one K/V head, key_length 96, value_length 64, _mla keys set
    meta = {**TINY_META, "llama.attention.head_count_kv": 1, "llama.attention.key_length": 96,
            "llama.attention.value_length": 64, "llama.attention.key_length_mla": 48,
            "llama.attention.value_length_mla": 32}
    p = tmp_path / "mla.gguf"
    p.write_bytes(gguf_bytes(meta, tiny_tensors()))
    doc = {"model": "meta-llama/Llama-3.1-8B", "task": "serve", "hardware": {"gpu": "RTX-4090"},
           "serve": {"engine": "llamacpp", "max_model_len": 1024,
                     "gguf": {"file": str(p), "flash_attn": False, "llamacpp_build": "b7000"}}}
    d = decide(resolve(doc))
    # 1024 cells x 2 layers: K 96 x 2 B = 192 B per cell and layer, V 64 x 2 B = 128
    assert (d.kv_k_bytes, d.kv_v_bytes) == (1024 * 2 * 192, 1024 * 2 * 128)
    doc["serve"]["gguf"]["llamacpp_build"] = "b7832"
    d = decide(resolve(doc))
    assert (d.kv_k_bytes, d.kv_v_bytes) == (1024 * 2 * 192, 0)
    # an older build cannot load such a file: refused, naming the build that can
    doc["serve"]["gguf"]["llamacpp_build"] = "b5000"
    with pytest.raises(Exception, match="b5137 or later"):
        decide(resolve(doc))
    doc["serve"]["gguf"]["llamacpp_build"] = "b7832"
    # without the _mla keys (a file converted before b5137) the V tensor stays
    del meta["llama.attention.key_length_mla"]
    p.write_bytes(gguf_bytes(meta, tiny_tensors()))
    assert decide(resolve(doc)).kv_v_bytes == 1024 * 2 * 128


def test_flash_attention_is_forced_off_for_unequal_heads_before_b4987() -> None:
    # DeepSeek-V2-Lite before b5137: K heads of 192, V heads of 128; llama.cpp before b4987 prints "flash_attn
    # requires n_embd_head_k == n_embd_head_v - forcing off" and runs without it (so a quantized V cache is refused)
    on = decide(resolve(_scn("deepseek-ai/DeepSeek-V2-Lite", "b4300", 4096, flash_attn=True)))
    off = decide(resolve(_scn("deepseek-ai/DeepSeek-V2-Lite", "b4300", 4096)))
    assert not on.flash_attn and on.compute_buffer_bytes == off.compute_buffer_bytes
    assert any("forces it off" in a for a in on.assumptions)
    with pytest.raises(Exception, match="V cache quantization requires flash_attn"):
        decide(resolve(_scn("deepseek-ai/DeepSeek-V2-Lite", "b4300", 4096, flash_attn=True, cache_type_v="q8_0")))
    # from b4987 the setting stands
    assert decide(resolve(_scn("deepseek-ai/DeepSeek-V2-Lite", "b5000", 4096, flash_attn=True))).flash_attn
