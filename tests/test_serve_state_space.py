"""vLLM serving of models whose every layer is a mixer (``mamba``, ``falcon_mamba``, ``mamba2``) and of Jamba (Mamba-1
mixers beside attention): the Mamba-1 state page, the one group of a state-space model, the profile run's Mamba-1
mixer width, and what is refused (serve/mamba_pages.py, serve/vllm.py ``_hybrid_rule``, facts/vllm_releases.py
``MAMBA1_V1_FROM`` and ``STATE_SPACE_V1_FROM``).  Every expected value is computed by hand in its comment."""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.errors import ScenarioError
from vramplan.facts.vllm_releases import MAMBA_HYBRID_RULES
from vramplan.serve.mamba_pages import (
    hybrid_layout,
    mamba_state_page_bytes,
    mixer_profile_width,
    state_space_layout,
)
from vramplan.serve.vllm import decide, forward_peak_bytes
from vramplan.spec.hf_config import model_from_config

FALCON_MAMBA = "tiiuae/falcon-mamba-7b"  # catalog: 64 layers, hidden 4096, intermediate 8192, d_state 16, d_conv 4
CODESTRAL = "mistralai/mamba-codestral-7b-v0.1"  # catalog: 64 layers, 128 heads of 64, 8 groups, d_state 128
# ai21labs/Jamba-v0.1's shape (tests/test_families_jamba.py JAMBA_V01): attention in layers 4, 12, 20, 28
JAMBA_V01: dict[str, Any] = {
    "model_type": "jamba", "vocab_size": 65536, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "attn_layer_offset": 4,
    "attn_layer_period": 8, "expert_layer_offset": 1, "expert_layer_period": 2, "mamba_d_conv": 4, "mamba_d_state": 16,
    "mamba_expand": 2, "mamba_dt_rank": 256, "num_experts": 16, "num_experts_per_tok": 2,
    "tie_word_embeddings": False, "max_position_embeddings": 262144, "torch_dtype": "bfloat16"}
KV_10_GIB = 10 * 1024**3  # kv_cache_memory_bytes: 10,737,418,240 B, so the blocks follow from it alone


def _doc(model: Any, version: str, max_len: int | None = 8192, **serve: Any) -> dict[str, Any]:
    sv: dict[str, Any] = {"vllm_version": version, "gpu_memory_utilization": 0.9, **serve}
    if max_len is not None:
        sv["max_model_len"] = max_len
    return {"model": model, "task": "serve", "hardware": {"gpu": "H100"}, "serve": sv}


def test_mamba1_state_page_and_profile_width_by_hand() -> None:
    m = resolve(_doc(FALCON_MAMBA, "0.11")).model
    assert m.mamba is not None and m.mamba.kind == "mamba1"
    # mamba1_state_shape: conv (4 - 1) x 8,192 x 2 B = 49,152; SSM 8,192 x 16 x 2 B = 262,144; 311,296 B
    assert mamba_state_page_bytes(m.mamba, 2) == 311_296
    # MambaMixer.forward_cuda's profile run: in_proj 2 x 8,192 + contiguous x 8,192 + out_proj's result 4,096 + the
    # layer's empty output 4,096 = 32,768 per token
    assert mixer_profile_width(m.mamba, m.hidden_size) == 32_768
    # compiled: 4 x 4,096 hidden + 32,768 = 49,152 per token x 8,192 tokens x 2 B = 805,306,368 B
    assert forward_peak_bytes(m, 8192, 2, 1, True) == 805_306_368


def test_state_space_layout_by_hand() -> None:
    m = resolve(_doc(FALCON_MAMBA, "0.11")).model
    assert m.mamba is not None
    lay = state_space_layout(m.mamba, 2, 8192)
    # one group of all 64 layers, the page the unpadded state page, the block max_model_len: one block per request
    assert (lay.page, lay.group_size, lay.attention_groups, lay.mamba_groups, lay.block_size) == (311_296, 64, 0, 1,
                                                                                                 8192)
    assert lay.blocks_per_request(8192) == 1
    # every release's start-up check asks one block of every layer: 64 x 311,296 = 19,922,944 B
    assert {lay.needed(8192, rule) for rule in MAMBA_HYBRID_RULES} == {19_922_944}


@pytest.mark.parametrize("version", ["0.11", "0.15", "0.19", "0.24"])
def test_falcon_mamba_with_an_explicit_kv_budget(version: str) -> None:
    d = decide(resolve(_doc(FALCON_MAMBA, version, kv_cache_memory_bytes=KV_10_GIB)), version=version)
    assert (d.page_bytes, d.layers_per_group, len(d.groups), d.block_size) == (311_296, 64, 1, 8192)
    # 10,737,418,240 // 311,296 = 34,492 pages; // 64 layers = 538 blocks
    assert d.num_gpu_blocks == 538
    # GPU KV cache size: 538 // 1 group x 8,192 (before 0.24) or int(538 / 1 x 8,192) (0.24 on): 4,407,296 tokens
    assert d.kv_cache_tokens == 4_407_296
    assert (d.blocks_per_request, d.max_concurrency) == (1, 538.0)
    assert d.needed_kv_bytes == 19_922_944
    assert d.to_dict()["mamba_state_page_bytes"] == 311_296 and d.to_dict()["mamba_layers"] == 64


def test_codestral_mamba2_state_space_layout() -> None:
    d = decide(resolve(_doc(CODESTRAL, "0.18", kv_cache_memory_bytes=KV_10_GIB)), version="0.18")
    # conv_dim 8,192 + 2 x 8 x 128 = 10,240; conv 3 x 10,240 x 2 = 61,440; SSM 128 x 64 x 128 x 2 = 2,097,152;
    # page 2,158,592 B; 10,737,418,240 // 2,158,592 = 4,974 pages // 64 layers = 77 blocks
    assert (d.page_bytes, d.layers_per_group, d.num_gpu_blocks) == (2_158_592, 64, 77)
    assert d.kv_cache_tokens == 77 * 8192  # 630,784
    # the Mamba2 profile width: 2 x 8,192 + 2 x 10,240 + 128 = 36,992 per token (no hidden terms for Mamba2)
    m = resolve(_doc(CODESTRAL, "0.18")).model
    assert m.mamba is not None and mixer_profile_width(m.mamba, m.hidden_size) == 36_992


def test_a_budget_too_small_for_one_request() -> None:
    # 64 x 311,296 = 19,922,944 B are needed; 19,000,000 B hold 61 pages, not 64
    d = decide(resolve(_doc(FALCON_MAMBA, "0.11", kv_cache_memory_bytes=19_000_000)), version="0.11")
    assert d.num_gpu_blocks == 0 and not d.starts
    assert "KV cache is needed" in d.problem and d.fix == "raise serve.gpu_memory_utilization"


def test_jamba_hybrid_layout_by_hand() -> None:
    ms = model_from_config(JAMBA_V01).mamba
    assert ms is not None and len(ms.layers) == 28
    # attention per token 2 x 8 KV heads x 128 x 2 B = 4,096; state page 311,296 (as Falcon-Mamba's: I = 2 x 4,096);
    # block 16 x cdiv(311,296, 65,536) = 16 x 5 = 80; page 80 x 4,096 = 327,680 (the state page padded by 16,384)
    lay = hybrid_layout(ms, 4, 4096, 2, 16, MAMBA_HYBRID_RULES[1])
    assert (lay.block_size, lay.page, lay.state_page) == (80, 327_680, 311_296)
    # 4 attention and 28 mixer layers: 28 >= 4 x 1.25, so groups of 4: 1 attention group, 7 mixer groups
    assert (lay.group_size, lay.attention_groups, lay.mamba_groups) == (4, 1, 7)


@pytest.mark.parametrize(("version", "needed", "tokens"), [
    # to 0.14: every layer's spec, (4 x cdiv(8,192, 80) + 28) x 327,680 = (4 x 103 + 28) x 327,680 = 144,179,200
    ("0.11", 144_179_200, 81_920),
    # 0.15-0.18: the first group's (layer 0 is a mixer): 4 x 327,680 x 1 = 1,310,720
    ("0.15", 1_310_720, 81_920),
    # 0.19 on: the sum over the groups, 4 x 327,680 x (103 + 7) = 144,179,200
    ("0.19", 144_179_200, 81_920),
    # 0.24 on: tokens int(8,192 / 110 x 8,192) = int(610,080.58) = 610,080
    ("0.24", 144_179_200, 610_080),
])
def test_jamba_with_an_explicit_kv_budget(version: str, needed: int, tokens: int) -> None:
    d = decide(resolve(_doc(JAMBA_V01, version, kv_cache_memory_bytes=KV_10_GIB)), version=version)
    # 10,737,418,240 // 327,680 = 32,768 pages // 4 layers per group = 8,192 blocks; before 0.24 the tokens are
    # 8,192 // 8 groups x min(80, 8,192) = 81,920
    assert (d.block_size, d.page_bytes, d.layers_per_group, len(d.groups), d.num_gpu_blocks) == (80, 327_680, 4, 8,
                                                                                                 8192)
    assert (d.needed_kv_bytes, d.kv_cache_tokens) == (needed, tokens)
    # a request: 103 attention blocks + 7 mixer blocks = 110; 8,192 / 110 = 74.47
    assert d.max_concurrency == pytest.approx(8192 / 110)


def test_the_estimate_reports_the_state_space_layout() -> None:
    rep = estimate(_doc(FALCON_MAMBA, "0.11"))
    text = " ".join(rep.assumptions)
    assert "64 Mamba mixer layers form one KV-cache group" in text and "311,296 B" in text
    assert "mamba1_state_shape" in text and "V1 profile run" in text
    jam = " ".join(estimate(_doc(JAMBA_V01, "0.11")).assumptions)
    assert "hybrid attention + Mamba model: 28 mixer layers" in jam and "raised from 16 to 80 tokens" in jam


@pytest.mark.parametrize(("doc", "where", "words"), [
    (_doc(JAMBA_V01, "0.10.2"), "serve.vllm_version", "was not read: it is modelled from 0.11.0"),
    (_doc(FALCON_MAMBA, "0.10.2"), "serve.vllm_version", "was not read: it is modelled from 0.11.0"),
    (_doc(JAMBA_V01, "0.10.1"), "serve.vllm_version", "V0 engine"),
    (_doc(JAMBA_V01, "0.26"), "serve.vllm_version", "prefix caching on for hybrid models"),
    (_doc(FALCON_MAMBA, "0.26"), "serve.vllm_version", "layout of attention-free models was not read"),
    (_doc(FALCON_MAMBA, "0.11", max_len=None), "serve.max_model_len", "tokenizer_config"),
    (_doc(CODESTRAL, "0.11", quantization="fp8"), "serve.quantization", "quantized weights for a state-space model"),
    # tensor parallelism is modelled (tests/test_serve_hybrid_tp.py) where vLLM can split the mixers: 8 groups over 16
    # ranks it cannot (MambaMixer2's assertion)
    ({**_doc(CODESTRAL, "0.11"), "parallel": {"tp": 16}, "hardware": {"gpu": "H100", "num_gpus": 16}},
     "parallel.tp", "its 8 groups are neither 1 nor a multiple of tp 16"),
    ({**_doc(JAMBA_V01, "0.11", max_loras=1, max_lora_rank=8), "parallel": {"tp": 2},
      "hardware": {"gpu": "H100", "num_gpus": 2}}, "serve.max_loras", "hybrid attention + Mamba model"),
])
def test_what_vllm_does_not_serve_as_modelled_is_refused(doc: dict[str, Any], where: str, words: str) -> None:
    with pytest.raises(ScenarioError) as exc:
        estimate(doc)
    assert exc.value.problems[0].where == where
    assert words in str(exc.value)


@pytest.mark.parametrize(("model", "engine"), [(FALCON_MAMBA, "sglang"), (JAMBA_V01, "llamacpp")])
def test_other_engines_are_refused(model: Any, engine: str) -> None:
    doc = _doc(model, "0.11")
    doc["serve"] = {"engine": engine, "max_model_len": 8192}
    with pytest.raises(ScenarioError) as exc:
        estimate(doc)
    assert exc.value.problems[0].where == "serve.engine"


@pytest.mark.parametrize(("version", "serve", "starts"), [
    # 0.21 on, FULL graphs (auto: FULL_AND_PIECEWISE): max_num_seqs 1,024 (vllm serve's default on an H100) above the
    # 538 state blocks -> "max_num_seqs (1024) exceeds available Mamba cache blocks (538)"
    ("0.21", {}, False),
    ("0.21", {"max_num_seqs": 538}, True),  # 538 <= 538 blocks
    ("0.21", {"cuda_graphs": False}, True),  # no graph captured: no check
    ("0.21", {"cudagraph_mode": "PIECEWISE"}, True),  # no FULL graph: no check
    ("0.17", {}, True),  # before 0.18 neither the cap nor the check
])
def test_max_num_seqs_above_the_state_blocks(version: str, serve: dict[str, Any], starts: bool) -> None:
    d = decide(resolve(_doc(FALCON_MAMBA, version, kv_cache_memory_bytes=KV_10_GIB, **serve)), version=version)
    assert d.num_gpu_blocks == 538 and d.starts is starts
    if not starts:
        assert "max_num_seqs (1024) exceeds available Mamba cache blocks (538)" in d.problem
        assert d.fix == "serve.max_num_seqs <= 538"


def test_capture_sizes_capped_or_not_read() -> None:
    # 100 pages of every layer: 100 x 64 x 311,296 = 1,992,294,400 B -> 100 blocks, below the largest capture size 512
    d = decide(resolve(_doc(FALCON_MAMBA, "0.18", kv_cache_memory_bytes=1_992_294_400)), version="0.18")
    assert d.num_gpu_blocks == 100 and d.starts
    assert any("caps the CUDA graph capture sizes to the 100 state blocks" in a for a in d.assumptions)
    # 0.19-0.20 were not read: stated, not applied
    d = decide(resolve(_doc(FALCON_MAMBA, "0.19", kv_cache_memory_bytes=KV_10_GIB)), version="0.19")
    assert any(a.startswith("not read: whether vLLM 0.19 caps") for a in d.assumptions) and d.starts


def test_the_planner_and_kv_count_refuse_a_state_space_model(tmp_path: Any) -> None:
    # the planner's decode step time attends in every layer; `vramplan kv --budget-gb` counts attention pages only
    import json

    from typer.testing import CliRunner

    from vramplan.cli.main import app
    from vramplan.plan import ServeJob, plan

    with pytest.raises(ScenarioError, match="decode step time of its mixers is not modelled"):
        plan(FALCON_MAMBA, "H100", 1, ServeJob(max_model_len=8192))
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "mamba", "vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 3,
                               "state_size": 16, "time_step_rank": 8}))
    env = {"COLUMNS": "120", "NO_COLOR": "1", "TERM": "dumb"}
    res = CliRunner().invoke(app, ["kv", str(cfg), "--budget-gb", "10", "--json"], env=env)
    assert res.exit_code != 0 and "--budget-gb" in res.stderr
