"""vLLM's speculative decoding at start-up (0.17.0-0.33.0): the rejection sampler's dummy run, the proposer's forward
and buffers in the profile run, and the proposer's rotary cache (serve/vllm.py ``_speculative_terms``).

Every expected value is computed by hand in the comments from vLLM's source (facts/vllm_releases.py
``SPECULATIVE_PROFILE_FROM`` names the files and functions)."""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.analytic.layout import rank_params
from vramplan.analytic.weights import weights_bytes
from vramplan.catalog.resolve import resolve
from vramplan.serve.vllm import (
    decide,
    proposer_buffer_bytes,
    proposer_forward_peak_bytes,
    rejection_sampler_peak_bytes,
    sampler_peak_bytes,
)

QWEN3_8B, QWEN3_06B, LLAMA, LLAMA_1B = "Qwen/Qwen3-8B", "Qwen/Qwen3-0.6B", "meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.2-1B"
DRAFT = {"method": "draft", "model": QWEN3_06B, "num_speculative_tokens": 2}


def _model(name: str) -> Any:
    return resolve({"model": name, "task": "serve", "hardware": {"gpu": "H100"}}).model


def _l4(version: str, **serve: Any) -> Any:
    """The published row vllm-akamas-study17-qwen3-8b-fp8-draft-qwen3-0.6b-l4-v0290's setup (2048 tokens, 128
    sequences on an L4), with or without its draft model."""
    doc = {"model": QWEN3_8B, "task": "serve", "hardware": {"gpu": "L4"},
           "serve": {"max_model_len": 4096, "gpu_memory_utilization": 0.88, "max_num_seqs": 128,
                     "quantization": "fp8-block", "vllm_version": version, **serve}}
    return decide(resolve(doc), version=version)


def test_rejection_sampler_peak_by_hand() -> None:
    m = _model(QWEN3_8B)
    assert (m.hidden_size, m.vocab_size) == (4096, 151936)
    # 128 x 151,936 = 19,447,808 entries; randn(256, V) + the bonus rows in bf16: 3 x 2 = 6 B; then the larger of
    # the bonus sampling (raw fp32 copy 4 + flashinfer's 12 = 16) and the recovered tokens (raw 4 + target fp32 4 +
    # clone 4 + probabilities 4 + q 4 + 1/q 4 = 24): 30 B -> 583,434,240; hidden (2048 + 256) x 4096 x 2 = 18,874,368
    assert rejection_sampler_peak_bytes(m, 2048, 128, 2, "flashinfer") == 583_434_240 + 18_874_368
    # the native (sort) sampler needs 36 B beyond the logits: bonus stage 4 + 36 = 40 > 24 -> 46 B per entry
    assert rejection_sampler_peak_bytes(m, 2048, 128, 2, "native") == 19_447_808 * 46 + 18_874_368
    # above the plain dummy sampler run of the same logits: 19,447,808 x (2 + 12) + 18,874,368 = 291,143,680
    assert sampler_peak_bytes(m, 2048, 128, 2, "flashinfer") == 291_143_680


def test_proposer_forward_and_buffers_by_hand() -> None:
    target, draft = _model(QWEN3_8B), _model(QWEN3_06B)
    assert (draft.hidden_size, draft.layers[0].intermediate_size) == (1024, 3072)
    # target output 2048 x 4096 x 2 = 16,777,216 + compiled draft forward (4 x 1024 + 3 x 3072) x 2048 x 2 = 54,525,952
    assert proposer_forward_peak_bytes(target, draft, 2048, 2, 1, compiled=True) == 16_777_216 + 54_525_952
    # eager: (2 x 1024 + 3 x 3072) x 2048 x 2 = 46,137,344
    assert proposer_forward_peak_bytes(target, draft, 2048, 2, 1, compiled=False) == 16_777_216 + 46_137_344
    # ints 2048 x 20 = 40,960 + arange max(129, 2048) x 4 = 8192 + backup 128 x 4 = 512; hidden_states and
    # inputs_embeds 2 x 2048 x 1024 x 2 = 8,388,608; a draft model's two bool masks 2 x 2048 = 4096
    assert proposer_buffer_bytes(draft, 2048, 128, 2, draft_model=True) == 40_960 + 8192 + 512 + 8_388_608 + 4096
    # an EAGLE head takes the target's hidden states: no masks; arange max(1025, 512) x 4 = 4100
    assert proposer_buffer_bytes(draft, 512, 1024, 2, draft_model=False) == 512 * 20 + 4100 + 4096 + 2 * 512 * 1024 * 2


def test_draft_model_row_terms_at_0_29() -> None:
    plain, spec = _l4("0.29.0"), _l4("0.29.0", speculative=DRAFT)
    d = spec.to_dict()
    assert d["profile_rejection_sampler_peak_bytes"] == 602_308_608  # test_rejection_sampler_peak_by_hand
    assert d["profile_proposer_forward_peak_bytes"] == 71_303_168  # 16,777,216 + 54,525,952
    assert d["speculative_buffers_bytes"] == 8_442_368  # 40,960 + 8192 + 512 + 8,388,608 + 4096
    # the rejection sampler sets the torch peak: 602,308,608 above the sampler's 291,143,680 and the forward's
    # (4 x 4096 + 3 x 12,288) x 2048 x 2 = 218,103,808
    assert spec.forward_peak_bytes == 218_103_808 and spec.sampler_peak_bytes == 291_143_680
    assert spec.activation_peak_bytes - spec.cublas_workspace_bytes == 602_308_608
    # the plain engine runs Model Runner V2 at 0.29.0 (the draft method keeps V1: facts/vllm_releases.py
    # MODEL_RUNNER_RULES), whose dummy sampler holds 128 x 151,936 x 2 = 38,895,616 + gumbel 128 x 149 x 12 = 228,864
    # + (2048 + 128) x 4096 x 2 = 17,825,792 -> 56,950,272, below its forward's 218,103,808
    assert plain.sampler_peak_bytes == 56_950_272
    assert plain.activation_peak_bytes - plain.cublas_workspace_bytes == 218_103_808
    # the KV budget loses the proposer's weights (Qwen3-0.6B shares the target's rotary cache: head size 128 and
    # 40,960 positions in both), its buffers and 602,308,608 - 218,103,808 = 384,204,800 of peak
    assert spec.speculative_weights_bytes == spec.weights_bytes - plain.weights_bytes
    lost = spec.speculative_weights_bytes + 8_442_368 + 384_204_800
    # and more CUDA-graph memory (0.29.0 subtracts its estimate; facts/vllm_cudagraphs.py, 0.13.0 rule), 36 layers:
    #   plain: max min(128 x 2, 512, 2048) = 256 -> 35 sizes, FULL decode 19 (<= 128): (35 + 19) x 37 = 1,998
    #     segments; pool (4 x 4096 + 3 x 12,288) x 256 x 2 = 27,262,976 + 1,998 x 204,111 = 435,076,754
    #   2 speculative tokens (query 3): max min(128 x 3 x 2, 512, 2048) = 512 -> 51 sizes, FULL decode 41 (from 3 to
    #     384), the draft's 28 layers piecewise 51 x 29 = 1,479: (51 + 41) x 37 + 1,479 = 4,883 segments; pool at 512
    #     54,525,952 + 4,883 x 204,111 = 1,051,199,965; 616,123,211 more
    assert (plain.cudagraph_bytes, spec.cudagraph_bytes) == (435_076_754, 1_051_199_965)
    assert (plain.cudagraph_graphs, spec.cudagraph_graphs) == (35 * 37 + 19, 51 * 37 + 41 + 1479)
    graphs = 1_051_199_965 - 435_076_754
    assert plain.available_kv_bytes - spec.available_kv_bytes == lost + graphs
    assert spec.device_used_bytes - plain.device_used_bytes == (
        lost + graphs + spec.kv_cache_bytes - plain.kv_cache_bytes)


def test_releases_before_0_17_keep_the_stated_assumption() -> None:
    # 0.15.0/0.16.0 sample recovered tokens without 1/q (facts/vllm_releases.py SPECULATIVE_PROFILE_FROM): not read,
    # so their report keeps saying the proposer's profile run is assumed to peak below the target's
    old, new = _l4("0.16.0", speculative=DRAFT), _l4("0.17.0", speculative=DRAFT)
    assert old.activation_peak_bytes == _l4("0.16.0").activation_peak_bytes
    assert "profile_rejection_sampler_peak_bytes" not in old.to_dict()
    assert [a for a in old.assumptions if "assumed to peak below the target's" in a]
    assert new.to_dict()["profile_rejection_sampler_peak_bytes"] == 602_308_608
    assert not [a for a in new.assumptions if "assumed to peak below the target's" in a]


def test_ngram_pays_the_rejection_sampler_at_vllm_serve_defaults() -> None:
    # an n-gram proposer has no weights, but _dummy_sampler_run still runs the rejection sampler.  Llama-3.1-8B on
    # an H100 (>= 70 GiB: 8192 tokens, 1024 sequences): 1024 x 128,256 = 131,334,144 entries x 30 B = 3,940,024,320
    # + (8192 + 2048) x 4096 x 2 = 83,886,080 -> 4,023,910,400.  The plain engine runs Model Runner V2 at 0.29.0
    # (ngram keeps V1: "Model Runner V2 does not yet support ngram/ngram_gpu speculative decoding"), whose sampler
    # holds 131,334,144 x 2 + gumbel 1024 x 126 x 12 = 1,548,288 + (8192 + 1024) x 4096 x 2 = 75,497,472 ->
    # 339,714,048, below its forward's (4 x 4096 + 3 x 14,336) x 8192 x 2 = 973,078,528; the KV budget loses
    # 4,023,910,400 - 973,078,528 = 3,050,831,872 B (2.84 GiB)
    doc = {"model": LLAMA, "task": "serve", "hardware": {"gpu": "H100"},
           "serve": {"max_model_len": 16384, "gpu_memory_utilization": 0.9, "vllm_version": "0.29.0"}}
    plain = decide(resolve(doc), version="0.29.0")
    doc["serve"] = {**doc["serve"], "speculative": {"method": "ngram", "num_speculative_tokens": 4}}
    ngram = decide(resolve(doc), version="0.29.0")
    assert (plain.max_num_batched_tokens, plain.max_num_seqs) == (8192, 1024)
    assert plain.sampler_peak_bytes == 339_714_048
    assert plain.activation_peak_bytes - plain.cublas_workspace_bytes == 973_078_528
    assert ngram.to_dict()["profile_rejection_sampler_peak_bytes"] == 4_023_910_400
    # and its CUDA graphs (facts/vllm_cudagraphs.py): a decode step of 1 + 4 tokens leaves the FULL decode graphs
    # of sizes 1, 2 and 4 out (sizes from 5 to 1024 x 5), 3 x 33 = 99 segments x 204,111 B = 20,206,989 fewer
    assert plain.cudagraph_bytes - ngram.cudagraph_bytes == 20_206_989
    assert plain.available_kv_bytes - ngram.available_kv_bytes == 3_050_831_872 - 20_206_989
    assert "speculative_buffers_bytes" not in ngram.to_dict()  # the n-gram proposer runs on the host


@pytest.mark.parametrize("version", ["0.11", "0.29.0"])
def test_a_draft_with_another_head_size_brings_its_own_rotary_cache(version: str) -> None:
    # get_rope shares one instance per (head size, rotary dim, max position, rope parameters, dtype): Llama-3.2-1B
    # (head size 64) beside Llama-3.1-8B (128) gets its own 131,072 x 64 x 2 B = 16,777,216 B, loaded with the weights
    draft, target = _model(LLAMA_1B), _model(LLAMA)
    assert (draft.head_dim, target.head_dim, draft.max_position_embeddings) == (64, 128, 131072)
    doc = {"model": LLAMA, "task": "serve", "hardware": {"gpu": "H100"},
           "serve": {"max_model_len": 16384, "gpu_memory_utilization": 0.9, "vllm_version": version,
                     "speculative": {"method": "draft", "model": LLAMA_1B}}}
    d = decide(resolve(doc), version=version)
    assert d.speculative_weights_bytes == weights_bytes(rank_params(draft, 1, 1, 1, 0, None), 2, "none") + 16_777_216
    assert [a for a in d.assumptions if "with its own rotary cache, 0.02 GiB" in a]
