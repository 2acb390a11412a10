"""vLLM by release (facts/vllm_releases.py) and the serve options that change the budget (serve/vllm.py)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vramplan.catalog.resolve import resolve
from vramplan.errors import ScenarioError, VramplanError
from vramplan.facts.vllm_releases import NEWEST, OLDEST, VLLM_RELEASES, parse_release, release_row
from vramplan.serve.vllm import decide, default_batch_limits, lora_slot_bytes
from vramplan.units import GiB

LLAMA = "meta-llama/Llama-3.1-8B"


def _doc(version: str = "0.11", **serve: Any) -> dict[str, Any]:
    return {"model": LLAMA, "task": "serve", "hardware": {"gpu": "H100"},
            "serve": {"max_model_len": 16384, "gpu_memory_utilization": 0.9, "vllm_version": version, **serve}}


def _decide(version: str = "0.11", **serve: Any) -> Any:
    return decide(resolve(_doc(version, **serve)), version=version)


def test_rows_are_ordered_and_each_cites_its_source() -> None:
    firsts = [r.first for r in VLLM_RELEASES]
    assert firsts == sorted(firsts) and len(set(firsts)) == len(firsts)
    for row in VLLM_RELEASES:
        assert row.sources and all(row.first <= rel for rel in row.read_at)
        assert all(s.strip() for s in row.sources)


def test_release_strings() -> None:
    assert parse_release("0.11") == (0, 11, 0)
    assert parse_release("v0.8.5.post1") == (0, 8, 5)
    assert parse_release("0.10.1.1") == (0, 10, 1)
    for bad, words in (("0.5.4", "nearest is 0.6.0"), ("0.34", "nearest is 0.33.0"), ("eleven", "release string")):
        with pytest.raises(ValueError, match=words):
            parse_release(bad)


def test_a_release_between_rows_uses_the_earlier_row_and_says_so() -> None:
    row, exact = release_row("0.8.4")
    assert row.first == (0, 8, 0) and not exact
    assert release_row("0.11")[1] and release_row("0.19")[1]
    d = _decide("0.8.4")
    assert any("0.8.4: its source was not read" in a and "0.8.0" in a for a in d.assumptions)
    assert not any("source was not read" in a for a in _decide("0.11").assumptions)


@given(st.integers(6, 32), st.integers(0, 9))
def test_every_release_in_range_has_the_latest_row_not_after_it(minor: int, patch: int) -> None:
    rel = (0, minor, patch)
    row, _ = release_row(f"0.{minor}.{patch}")
    assert OLDEST <= row.first <= rel <= NEWEST
    assert not [r for r in VLLM_RELEASES if row.first < r.first <= rel]


def test_out_of_range_release_is_a_scenario_error_naming_range_and_nearest() -> None:
    with pytest.raises(ScenarioError, match=r"0\.6 to 0\.33.*nearest is 0\.6\.0"):
        resolve(_doc("0.5"))


def test_batch_defaults_by_release() -> None:
    h100, a100 = 79 * GiB, 79 * GiB
    # V0 (vllm/config.py SchedulerConfig): max(max_model_len, 2048), 256 sequences; above 32K chunked prefill: 512
    # to 0.6.4, 2048 after
    assert default_batch_limits(h100, "H100", rule="v0-512", max_model_len=16384) == (16384, 256)
    assert default_batch_limits(h100, "H100", rule="v0-512", max_model_len=1024) == (2048, 256)
    assert default_batch_limits(h100, "H100", rule="v0-512", max_model_len=131072) == (512, 256)
    assert default_batch_limits(h100, "H100", rule="v0-2048", max_model_len=131072) == (2048, 256)
    # 0.8.0: by the device name; 0.8.5: >= 70 GiB, A100s included; 0.9.0+: A100s excluded
    assert default_batch_limits(h100, "L40S", rule="v1-h100-name") == (2048, 1024)
    assert default_batch_limits(a100, "A100-80GB", rule="v1-70gib") == (8192, 1024)
    assert default_batch_limits(a100, "A100-80GB", rule="v1-70gib-not-a100") == (2048, 256)


def test_budget_rules_differ_only_by_what_they_charge() -> None:
    # Same model and profile run (V0 0.6.0, 0.6.4 and 0.6.6 all profile 16,384 tokens over 256 requests eagerly):
    # 0.6.4 also takes the CUDA context from the budget; 0.6.0 and 0.6.6 do not (tp 1: no NCCL)
    d60, d64, d66 = _decide("0.6.0"), _decide("0.6.4"), _decide("0.6.6")
    assert d60.available_kv_bytes == d66.available_kv_bytes
    assert d60.available_kv_bytes - d64.available_kv_bytes == d64.cuda_context_bytes
    assert d60.max_num_batched_tokens == 16384 and d60.max_num_seqs == 256


def test_cudagraph_estimate_subtracted_from_0_20() -> None:
    # vllm/envs.py VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS default "1" from 0.20.0: the graphs' estimate
    # comes out of the KV budget; 0.19 captures the graphs outside it.  Both capture the same graphs (0.13.0's
    # sizes, serve/cudagraphs.py): Llama-3.1-8B, 1024 sequences, 8192 tokens -> 51 sizes up to 512, (51 + 51) x 33
    # = 3,366 segments; pool (4 x 4096 + 3 x 14,336) x 512 x 2 = 60,817,408; + 3,366 x 204,111 = 747,855,034
    d19, d20 = _decide("0.19"), _decide("0.20")
    assert d20.cudagraph_subtracted and not d19.cudagraph_subtracted
    assert d19.cudagraph_bytes == d20.cudagraph_bytes == 747_855_034
    assert d19.available_kv_bytes - d20.available_kv_bytes == 747_855_034


def test_kv_cache_memory_bytes_bypasses_utilisation() -> None:
    d = _decide("0.11", kv_cache_memory_bytes=20 * GiB)
    # 20 GiB // (16 tokens x 4,096 B x 32 layers = 2 MiB per block) = 10,240 blocks = 163,840 tokens
    assert d.available_kv_bytes == 20 * GiB and d.num_gpu_blocks == 10_240 and d.kv_cache_tokens == 163_840
    assert d.to_dict()["kv_cache_memory_bytes"] == 20 * GiB
    # the same with another utilisation: the budget does not move
    assert decide(resolve(_doc("0.11", kv_cache_memory_bytes=20 * GiB, gpu_memory_utilization=0.5))).num_gpu_blocks \
        == 10_240
    with pytest.raises(ScenarioError, match=r"0\.10\.2"):
        _decide("0.10.1", kv_cache_memory_bytes=20 * GiB)
    # 70 GiB of KV beside 15 GiB of weights does not fit an H100's 79.6 GiB: start-up fails, with the largest budget
    big = _decide("0.11", kv_cache_memory_bytes=70 * GiB)
    assert not big.starts and "kv_cache_memory_bytes" in big.problem
    room = int(big.fix.rsplit(" ", 1)[1])
    assert 0 < room < 70 * GiB and _decide("0.11", kv_cache_memory_bytes=room).starts


def test_cpu_offload_moves_weights_to_the_host() -> None:
    plain, off = _decide(), _decide(cpu_offload_gb=4)
    # 4 GiB = 4,294,967,296 B fewer on the GPU, as many more for the KV cache, reported as host bytes
    assert plain.weights_bytes - off.weights_bytes == 4 * GiB
    assert off.available_kv_bytes - plain.available_kv_bytes == 4 * GiB
    assert off.to_dict()["host_weights_bytes"] == 4 * GiB and "host_weights_bytes" not in plain.to_dict()


def test_lora_slots_hand_computed() -> None:
    m = resolve(_doc()).model
    # Llama-3.1-8B per layer at rank 16 (lora_slot_bytes docstring): 1,310,720 elements; x 32 layers x 2 B
    assert lora_slot_bytes(m, 16, 1, 1, 2) == 1_310_720 * 32 * 2 == 83_886_080
    # tp 2: qkv 3 x 16 x 4096 + 16 x (2048 + 512 + 512) = 245,760; o 16 x 2048 + 16 x 4096 = 98,304;
    # gate_up 2 x 16 x 4096 + 16 x 2 x 7168 = 360,448; down 16 x 7168 + 16 x 4096 = 180,224 -> 884,736
    assert lora_slot_bytes(m, 16, 1, 2, 2) == 884_736 * 32 * 2
    plain, lora = _decide(), _decide(max_loras=4, max_lora_rank=64)
    assert lora.weights_bytes - plain.weights_bytes == 83_886_080 * 4 * 4 == lora.to_dict()["lora_bytes"]


def test_lora_rank_outside_the_release_set_is_refused() -> None:
    with pytest.raises(ScenarioError, match="max_lora_rank"):
        _decide(max_loras=2, max_lora_rank=48)
    # rank 1 arrived in 0.12.0 (vllm/config/lora.py MaxLoRARanks); 512 in 0.8.0
    with pytest.raises(ScenarioError, match="max_lora_rank"):
        _decide("0.11", max_loras=1, max_lora_rank=1)
    assert _decide("0.12", max_loras=1, max_lora_rank=1).lora_bytes > 0
    with pytest.raises(ScenarioError, match="max_lora_rank"):
        _decide("0.7", max_loras=1, max_lora_rank=512)


def test_speculative_ngram_adds_nothing_and_draft_adds_weights_and_kv_layers() -> None:
    plain = _decide()
    ngram = _decide(speculative={"method": "ngram", "num_speculative_tokens": 3})
    assert ngram.num_gpu_blocks == plain.num_gpu_blocks and ngram.weights_bytes == plain.weights_bytes
    d = _decide(speculative={"method": "draft", "model": "meta-llama/Llama-3.2-1B", "num_speculative_tokens": 4})
    draft = resolve({"model": "meta-llama/Llama-3.2-1B", "task": "serve", "hardware": {"gpu": "H100"}}).model
    assert d.weights_bytes - plain.weights_bytes == d.speculative_weights_bytes > 0
    # one block: 16 tokens x (32 target layers x 4,096 B + 16 draft layers x 2 x 8 heads x 64 x 2 B = 2,048 B)
    assert draft.num_layers == 16
    block = 16 * (32 * 4096 + 16 * 2048)
    assert d.page_bytes == block and d.num_gpu_blocks == d.available_kv_bytes // block


def test_speculative_bad_combinations() -> None:
    with pytest.raises(VramplanError, match="unknown model"):
        _decide(speculative={"method": "draft", "model": "nobody/no-such-draft"})
    with pytest.raises(ScenarioError, match="needs a model"):
        _decide(speculative={"method": "eagle3"})
    with pytest.raises(ScenarioError, match="'draft', 'eagle', 'eagle3', 'mtp' or 'ngram'"):
        resolve(_doc(speculative={"method": "medusa"}))
    # Llama-3.1-8B's config has no num_nextn_predict_layers (tests/test_vllm_mtp.py: the modelled ones)
    with pytest.raises(ScenarioError, match="has no MTP layers"):
        _decide(speculative={"method": "mtp"})


def test_vllm_budget_options_are_refused_for_sglang() -> None:
    # the options exist for vLLM only here (spec/scenario.py VLLM_ONLY_OPTIONS): engine sglang names the offender
    # (serve.speculative is SGLang's too: serve/sglang_options.py, tests/test_serve_sglang_options.py)
    for extra, key in (({"max_loras": 2}, "serve.max_loras"),
                       ({"kv_cache_memory_bytes": 10 * GiB}, "serve.kv_cache_memory_bytes"),
                       ({"cpu_offload_gb": 2}, "serve.cpu_offload_gb")):
        doc = {"model": LLAMA, "task": "serve", "hardware": {"gpu": "H100"}, "serve": {"engine": "sglang", **extra}}
        with pytest.raises(VramplanError, match=key):
            resolve(doc)


# A Qwen2.5-VL-7B-like config: the language model's keys (model_type qwen2) with the checkpoint's architecture and
# vision_config (validation/published.yaml, vllm-qwen3vl-issue1057-qwen25-vl-7b-h100-v082).
_TEXT = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "max_position_embeddings": 32768,
         "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-6,
         "rope_theta": 1e6, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 152064,
         "hidden_act": "silu"}
_VL = {**_TEXT, "architectures": ["Qwen2_5_VLForConditionalGeneration"],
       "vision_config": {"depth": 32, "hidden_size": 1280, "out_hidden_size": 3584}}


def _serve(model: Any, version: str = "0.23") -> Any:
    return resolve({"model": model, "task": "serve", "hardware": {"gpu": "H100"},
                    "serve": {"max_model_len": 16384, "gpu_memory_utilization": 0.9, "vllm_version": version}})


def test_multimodal_encoder_is_stated_as_not_modelled() -> None:
    # vLLM loads and profiles the encoder of a ...ForConditionalGeneration model (gpu_model_runner.py profile_run);
    # the spec counts the language model only, so the report says so instead of answering silently
    from vramplan.serve.vllm import multimodal_architecture

    vl, text = _serve(_VL), _serve({**_TEXT, "architectures": ["Qwen2ForCausalLM"]})
    assert multimodal_architecture(vl) == "Qwen2_5_VLForConditionalGeneration"
    assert multimodal_architecture(text) == ""
    # the catalog's Gemma 3 4B keeps its Gemma3ForConditionalGeneration class (its text_config is what is modelled)
    assert multimodal_architecture(_serve("google/gemma-3-4b-pt")) == "Gemma3ForConditionalGeneration"
    assert multimodal_architecture(_serve(LLAMA)) == ""
    d_vl, d_text = decide(vl, version="0.23"), decide(text, version="0.23")
    notes = [a for a in d_vl.assumptions if a.startswith("not modelled: the multimodal encoder")]
    assert len(notes) == 1 and "Qwen2_5_VLForConditionalGeneration" in notes[0]
    assert not [a for a in d_text.assumptions if "multimodal encoder" in a]
    # stated, not guessed: the KV pool is the language model's either way
    assert d_vl.kv_cache_bytes == d_text.kv_cache_bytes


def test_multimodal_encoder_widens_the_band() -> None:
    # an assumption starting "not modelled: " widens the band (report/band.py NOT_MODELLED_PREFIX); 0.19, whose
    # CUDA graphs are captured outside the budget, has no other input not modelled
    from vramplan.engine import estimate

    plain = {**_TEXT, "architectures": ["Qwen2ForCausalLM"]}
    vl, text = estimate(_serve(_VL, "0.19")), estimate(_serve(plain, "0.19"))
    assert vl.serve.kv_cache_bytes == text.serve.kv_cache_bytes
    # the serving class is already the calibration's widest (x1.505), so the bounds stay; the report names the widening
    assert vl.serve.kv_cache_bytes_low is not None and vl.serve.kv_cache_bytes_low <= (text.serve.kv_cache_bytes_low or 0)
    assert [a for a in vl.assumptions if a.startswith("band widened")]
    assert not [a for a in text.assumptions if a.startswith("band widened")]


def test_ngram_changes_no_start_up_memory_but_its_graph_sizes_are_stated() -> None:
    # vLLM 0.18.0 printed the same KV pool with and without an n-gram proposer (validation/published.yaml
    # vllm-vllmlab-ngram-qwen3-8b-4090-48gb-v0180): no GPU weights, no KV layers; with that log's 8 sequences and 4096
    # tokens the rejection sampler's dummy run (8 x 128,256 x 30 B = 30,781,440 + (4096 + 16) x 4096 x 2 = 33,685,504 -> 64,466,944 B) stays
    # below the forward's peak (tests/test_vllm_speculative.py: at 1024 sequences it does not)
    ngram = {"method": "ngram", "num_speculative_tokens": 4}
    small = {"max_num_seqs": 8, "max_num_batched_tokens": 4096}
    plain, spec = _decide("0.18", **small), _decide("0.18", speculative=ngram, **small)
    assert spec.kv_cache_bytes == plain.kv_cache_bytes and spec.speculative_weights_bytes == 0
    assert spec.to_dict()["profile_rejection_sampler_peak_bytes"] == 64_466_944
    graph_note = "not modelled: with speculative decoding"
    assert not [a for a in spec.assumptions if a.startswith(graph_note)]  # 0.18 does not subtract its estimate
    # from 0.20 the subtracted estimate is measured on graphs sized for num_speculative_tokens + 1 query tokens
    # (CompilationConfig.adjust_cudagraph_sizes_for_spec_decode): stated, not modelled; eager mode captures none
    assert [a for a in _decide("0.20", speculative=ngram).assumptions if a.startswith(graph_note)]
    eager = _decide("0.20", speculative=ngram, cuda_graphs=False)
    assert not [a for a in eager.assumptions if a.startswith(graph_note)]


def test_lora_slots_outside_the_budget_in_v0_0_6_5_to_0_7_3() -> None:
    # V0 0.6.5-0.7.3 measures the weights before create_lora_manager and the profile's torch increase from its first
    # snapshot: the slots are in neither term, so the KV pool is that of the plain engine (vllm issue #14450); V1
    # (0.8.0 on) and V0 0.6.4 take them from the budget. Llama-3.1-8B, 4 slots of rank 64: 4 x 4 x 83,886,080 B.
    # 0.8.0 runs LoRA on its V0 engine unless VLLM_USE_V1=1 (arg_utils.py 0.8.0:1586, tests/test_vllm_v0_fallback.py):
    # 0.7.3's rules, the slots outside (compared with the plain engine forced to V0, as the LoRA one runs); with
    # serve.vllm_engine v1 they are inside.
    slots = 83_886_080 * 4 * 4
    for version, inside, engine, plain_engine in (
            ("0.6.4", True, "auto", "auto"), ("0.6.5", False, "auto", "auto"), ("0.7.3", False, "auto", "auto"),
            ("0.8.0", False, "auto", "v0"), ("0.8.0", True, "v1", "v1"), ("0.8.5", True, "auto", "auto"),
            ("0.11", True, "auto", "auto")):
        plain = _decide(version, vllm_engine=plain_engine)
        lora = _decide(version, max_loras=4, max_lora_rank=64, vllm_engine=engine)
        assert lora.to_dict()["lora_bytes"] == slots
        if inside:
            assert lora.weights_bytes - plain.weights_bytes == slots
            assert lora.available_kv_bytes == plain.available_kv_bytes - slots
            assert "lora_outside_budget" not in lora.to_dict()
        else:
            assert lora.weights_bytes == plain.weights_bytes
            assert lora.kv_cache_bytes == plain.kv_cache_bytes
            assert lora.to_dict()["lora_outside_budget"] is True
            # the slots still occupy the device, outside gpu_memory_utilization
            assert lora.device_used_bytes - plain.device_used_bytes == slots
            assert [a for a in lora.assumptions if "outside gpu_memory_utilization" in a and a.startswith("LoRA")]
