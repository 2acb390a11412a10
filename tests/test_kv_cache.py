"""KV-cache spec: the seeds' oracles with their arithmetic, each attention kind, KV dtypes, invariants."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from vramplan.analytic.kv_cache import kv_cache_bytes, kv_spec, page_capacity
from vramplan.catalog import load_model
from vramplan.units import GB


def test_llama2_7b_4096_tokens_batch_32_is_68_7_gb() -> None:
    # MHA: 2 (K, V) * 32 layers * 32 KV heads * 128 head_dim * 2 B = 524,288 B per token
    # 524,288 B * 4096 tokens * 32 sequences = 68,719,476,736 B = 68.7 GB (64 GiB)
    spec = kv_spec(load_model("meta-llama/Llama-2-7b-hf"), "fp16")
    assert spec.attention_kind == "mha"
    assert spec.bytes_per_token == 2 * 32 * 32 * 128 * 2 == 524_288
    assert spec.sequence_bytes(4096) * 32 == 68_719_476_736
    assert round(spec.sequence_bytes(4096) * 32 / GB, 1) == 68.7


def test_llama3_8b_gqa_is_a_quarter() -> None:
    # GQA, 8 KV heads instead of 32: 2 * 32 * 8 * 128 * 2 B = 131,072 B per token -> 17,179,869,184 B
    spec = kv_spec(load_model("meta-llama/Meta-Llama-3-8B"), "bf16")
    assert spec.attention_kind == "gqa"
    assert spec.bytes_per_token == 131_072
    assert spec.sequence_bytes(4096) * 32 * 4 == 68_719_476_736


def test_page_capacity_table_for_a_60_gb_budget() -> None:
    # the seeds' table (Llama 3 8B, fp16, 16-token pages, 60 GB = 60e9 B):
    # page = 2 * 32 layers * 8 heads * 128 * 16 tokens * 2 B = 2,097,152 B
    # pages = int(60e9 / 2,097,152) = 28,610 -> 457,760 tokens
    # sequences: 256 tok = 16 pages -> 1,788; 512 -> 894; 1024 -> 447; 2048 -> 223; 4096 -> 111
    cap = page_capacity(kv_spec(load_model("meta-llama/Meta-Llama-3-8B"), "fp16"), 60 * GB, 16)
    assert cap.page_bytes == 2_097_152
    assert cap.total_pages == 28_610
    assert cap.total_tokens == 457_760
    assert cap.max_sequences == {256: 1788, 512: 894, 1024: 447, 2048: 223, 4096: 111}


def test_deepseek_v3_mla_latent_bytes_per_token() -> None:
    # MLA caches c_KV (kv_lora_rank 512) + the RoPE key (qk_rope_head_dim 64) once per layer:
    # (512 + 64) * 2 B = 1,152 B per layer; 61 layers -> 70,272 B per token
    m = load_model("deepseek-ai/DeepSeek-V3")
    spec = kv_spec(m, "bf16")
    assert spec.attention_kind == "mla"
    assert spec.uniform_layer_bytes_per_token == 1152
    assert spec.bytes_per_token == 61 * 1152 == 70_272
    # the latent is replicated on every tensor-parallel rank, not split
    assert kv_spec(m, "bf16", tp=8).bytes_per_token == 70_272
    # fp8 latent: 576 B per layer
    assert kv_spec(m, "fp8").bytes_per_token == 61 * 576


def test_mqa_has_one_kv_head() -> None:
    # falcon-7b: multi-query attention, 32 layers, 1 KV head of 64: 2 * 32 * 1 * 64 * 2 B = 8,192 B
    spec = kv_spec(load_model("tiiuae/falcon-7b"), "bf16")
    assert spec.attention_kind == "mqa"
    assert spec.bytes_per_token == 8192


def test_sliding_window_keeps_only_the_window() -> None:
    # Mistral-7B v0.1: every layer has a 4096-token window; 32 layers * 8 heads * 128 * 2 * 2 B = 131,072 B/token
    spec = kv_spec(load_model("mistralai/Mistral-7B-v0.1"), "bf16")
    assert spec.sequence_bytes(1000) == 1000 * 131_072
    assert spec.sequence_bytes(32768) == spec.sequence_bytes(4096) == 4096 * 131_072


def test_hybrid_local_global_gemma3_and_gpt_oss() -> None:
    # Gemma-3-27B: 62 layers, pattern of 5 local (window 1024) then 1 global -> 52 local + 10 global.
    # per layer: 16 KV heads * 128 * 2 * 2 B = 8,192 B; at 32,768 tokens:
    # 10 * 32,768 * 8,192 + 52 * 1,024 * 8,192 = 2,684,354,560 + 436,207,616 = 3,120,562,176 B
    g3 = kv_spec(load_model("google/gemma-3-27b-pt"), "bf16")
    assert sum(1 for la in g3.layers if la.window == 1024) == 52
    assert g3.sequence_bytes(32768) == 3_120_562_176
    # gpt-oss-20b alternates window-128 and full layers: 12 + 12 of 8 heads * 64 * 2 * 2 B = 2,048 B
    oss = kv_spec(load_model("openai/gpt-oss-20b"), "bf16")
    assert oss.sequence_bytes(8192) == 12 * 8192 * 2048 + 12 * 128 * 2048


def test_kv_dtypes_fp8_halves_and_int8_adds_scales() -> None:
    m = load_model("meta-llama/Meta-Llama-3-8B")
    assert kv_spec(m, "fp8").bytes_per_token == 131_072 // 2
    # int8: 1 B per element plus an fp32 scale per token and head for K and V:
    # 32 layers * (2 * 8 * 128 * 1 + 2 * 8 * 4) = 32 * (2048 + 64) = 67,584 B
    assert kv_spec(m, "int8").bytes_per_token == 67_584
    # auto follows the model dtype: fp32 -> 4 B per element
    assert kv_spec(m, "auto", model_dtype_bytes=4).bytes_per_token == 262_144


def test_tensor_parallel_splits_heads_and_replicates_past_them() -> None:
    m = load_model("meta-llama/Meta-Llama-3-8B")  # 8 KV heads
    assert kv_spec(m, "bf16", tp=4).bytes_per_token == 131_072 // 4
    assert kv_spec(m, "bf16", tp=16).bytes_per_token == 131_072 // 8  # one head per rank, replicated


def test_functional_form_matches_the_spec() -> None:
    m = load_model("mistralai/Mistral-7B-v0.1")
    assert kv_cache_bytes(m, batch=3, tokens=5000, elem_bytes=2) == 3 * kv_spec(m, "bf16").sequence_bytes(5000)


@settings(max_examples=40, deadline=None)
@given(seq=st.integers(1, 200_000), batch=st.integers(1, 64),
       name=st.sampled_from(["meta-llama/Llama-2-7b-hf", "google/gemma-2-9b", "openai/gpt-oss-20b",
                             "deepseek-ai/DeepSeek-V2-Lite", "mistralai/Mistral-7B-v0.1"]),
       dtype=st.sampled_from(["auto", "fp16", "fp8", "int8"]))
def test_kv_is_linear_in_batch_and_monotone_in_length(seq: int, batch: int, name: str, dtype: str) -> None:
    m = load_model(name)
    spec = kv_spec(m, dtype)
    one = spec.sequence_bytes(seq)
    # the contiguous (HF) form and the spec agree, and the batch only multiplies
    assert kv_cache_bytes(m, batch, seq, spec.elem_bytes, kv_dtype=dtype) == batch * one
    assert spec.sequence_bytes(seq + 1) >= one
    assert one <= seq * spec.bytes_per_token  # windows only ever reduce it
