"""vLLM serving of a hybrid attention + Mamba2 model: the state page, the raised attention block, the groups, the
blocks, tokens and concurrency by release (serve/mamba_pages.py, facts/vllm_releases.py MAMBA_HYBRID_RULES), and
what is refused.  Every expected value is computed by hand in its comment."""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.errors import ScenarioError
from vramplan.facts.vllm_releases import MAMBA_HYBRID_RULES, mamba_hybrid_rule
from vramplan.serve.mamba_pages import hybrid_layout, mamba_state_page_bytes, mixer_profile_width
from vramplan.serve.vllm import decide
from vramplan.spec.hf_config import model_from_config

# Bamba-9B's shape (tests/test_families_hybrid.py BAMBA_9B_SHAPE: its model card on BambaConfig's defaults)
BAMBA_9B = {"model_type": "bamba", "vocab_size": 128000, "hidden_size": 4096, "num_hidden_layers": 32,
            "num_attention_heads": 32, "attn_layer_indices": [9, 18, 27], "mamba_d_state": 128}
KV_10_GIB = 10 * 1024**3  # kv_cache_memory_bytes: the KV budget as given, so the blocks follow from it alone


def _doc(version: str, max_len: int = 8192, model: Any = None, **serve: Any) -> dict[str, Any]:
    return {"model": model or BAMBA_9B, "task": "serve", "hardware": {"gpu": "H100"},
            "serve": {"vllm_version": version, "gpu_memory_utilization": 0.9, "max_model_len": max_len, **serve}}


def test_state_page_and_layout_by_hand() -> None:
    ms = model_from_config(BAMBA_9B).mamba
    assert ms is not None
    # conv_dim 8192 + 2*1*128 = 8,448; conv state 3 x 8,448 x 2 B = 50,688; SSM 128 x 64 x 128 x 2 B = 2,097,152
    assert mamba_state_page_bytes(ms, 2) == 2_147_840
    # attention per token 2 x 8 KV heads x 128 x 2 B = 4,096; block 16 x cdiv(2,147,840, 65,536) = 16 x 33 = 528
    lay = hybrid_layout(ms, 3, 4096, 2, 16, MAMBA_HYBRID_RULES[0])
    assert (lay.block_size, lay.page) == (528, 528 * 4096)
    # 3 attention and 29 mixer layers: groups of 3 -> 1 attention group, cdiv(29, 3) = 10 mixer groups
    assert (lay.group_size, lay.attention_groups, lay.mamba_groups) == (3, 1, 10)
    # one request of 8,192 tokens: cdiv(8,192, 528) = 16 attention blocks + one per mixer group = 26
    assert lay.blocks_per_request(8192) == 26
    # the mixers' profile-run width: 2 x 8,192 + 2 x 8,448 + 128 = 33,408 per token (below the MLP's 3 x 14,336)
    assert mixer_profile_width(ms) == 33_408


def test_block_rules_differ_when_a_block_size_is_given() -> None:
    ms = model_from_config(BAMBA_9B).mamba
    assert ms is not None
    raise_rule, align_rule = mamba_hybrid_rule("0.19"), mamba_hybrid_rule("0.20")
    assert raise_rule is not None and align_rule is not None
    # 0.19 keeps the larger of the given 32 and 16 x 33 = 528; 0.20 aligns to 32: 32 x cdiv(2,147,840, 131,072) = 544
    assert hybrid_layout(ms, 3, 4096, 2, 32, raise_rule).block_size == 528
    assert hybrid_layout(ms, 3, 4096, 2, 32, align_rule).block_size == 544
    # a given block larger than needed is kept by the raise rule: 1,024
    assert hybrid_layout(ms, 3, 4096, 2, 1024, raise_rule).block_size == 1024


def test_bamba_with_an_explicit_kv_budget_at_0_11() -> None:
    d = decide(resolve(_doc("0.11", kv_cache_memory_bytes=KV_10_GIB)), version="0.11")
    # 10,737,418,240 // 2,162,688 = 4,964 pages; // 3 layers per group = 1,654 blocks
    assert (d.block_size, d.page_bytes, d.layers_per_group, len(d.groups)) == (528, 2_162_688, 3, 11)
    assert d.num_gpu_blocks == 1654
    # GPU KV cache size: 1,654 // 11 groups x min(528, 8,192) = 150 x 528 = 79,200 tokens
    assert d.kv_cache_tokens == 79_200
    # maximum concurrency: 1,654 / 26 = 63.615...
    assert d.max_concurrency == pytest.approx(1654 / 26)
    # needed (every layer's spec): (3 x 16 + 29) x 2,162,688 = 77 x 2,162,688 = 166,526,976 B
    assert d.needed_kv_bytes == 166_526_976
    assert d.to_dict()["mamba_state_page_bytes"] == 2_147_840 and d.to_dict()["mamba_groups"] == 10
    # rotary cache: 262,144 positions x (128 x 0.5, BambaConfig's partial_rotary_factor) x 2 B = 33,554,432 B
    assert d.rotary_cache_bytes == 33_554_432


@pytest.mark.parametrize(("version", "needed", "tokens"), [
    # 0.15-0.18: group size x page x the first group's blocks; layer 0 is a mixer: 3 x 2,162,688 x 1
    ("0.15", 3 * 2_162_688, 79_200),
    # 0.19 on: the sum over the groups: 3 x 2,162,688 x 26 = 168,689,664 B
    ("0.19", 168_689_664, 79_200),
    ("0.23", 168_689_664, 79_200),
])
def test_needed_and_tokens_by_release(version: str, needed: int, tokens: int) -> None:
    d = decide(resolve(_doc(version, kv_cache_memory_bytes=KV_10_GIB)), version=version)
    assert d.num_gpu_blocks == 1654
    assert (d.needed_kv_bytes, d.kv_cache_tokens) == (needed, tokens)


def test_a_budget_too_small_for_one_request() -> None:
    # 150,000,000 B: 69 pages // 3 = 23 blocks; 0.19 needs 168,689,664 B: start-up fails, and the largest length
    # that fits is the one whose blocks fit: 3 x 2,162,688 x (cdiv(n, 528) + 10) <= 150,000,000 -> cdiv <= 13 ->
    # n = 13 x 528 = 6,864
    d = decide(resolve(_doc("0.19", kv_cache_memory_bytes=150_000_000)), version="0.19")
    assert not d.starts and "max seq len (8192)" in d.problem
    assert d.max_model_len_that_fits == 6864


def test_the_estimate_reports_the_hybrid_layout() -> None:
    rep = estimate(_doc("0.11"))
    text = " ".join(rep.assumptions)
    assert "29 mixer layers keep one state page per request (2,147,840 B" in text
    assert "raised from 16 to 528 tokens" in text
    # no published start-up log of a hybrid model checks it: stated as not modelled, the band widened
    assert any(a.startswith("band widened") for a in rep.assumptions)


def test_release_rows_cover_the_served_range() -> None:
    assert mamba_hybrid_rule("0.10.1") is None and mamba_hybrid_rule("0.26") is None
    assert mamba_hybrid_rule("0.10.2") is MAMBA_HYBRID_RULES[0]
    assert mamba_hybrid_rule("0.25.1") is MAMBA_HYBRID_RULES[-1]


@pytest.mark.parametrize(("doc", "where", "words"), [
    (_doc("0.10.1"), "serve.vllm_version", "V0 engine"),
    (_doc("0.8.5"), "serve.vllm_version", "V0 engine"),
    (_doc("0.26"), "serve.vllm_version", "prefix caching on for hybrid models"),
    (_doc("0.24"), "serve.vllm_version", "no longer serves bamba models (removed in 0.24.0"),
    (_doc("0.11", quantization="fp8"), "serve.quantization", "quantized weights"),
    (_doc("0.11", max_loras=1, max_lora_rank=8), "serve.max_loras", "LoRA slots"),
    # tensor parallelism is modelled (tests/test_serve_hybrid_tp.py) where MambaMixer2 splits the groups: 3 over 2
    # ranks it does not
    ({**_doc("0.11", model={**BAMBA_9B, "mamba_n_groups": 3}), "parallel": {"tp": 2},
      "hardware": {"gpu": "H100", "num_gpus": 2}}, "parallel.tp", "neither 1 nor a multiple of tp 2"),
])
def test_what_vllm_does_not_serve_as_modelled_is_refused(doc: dict[str, Any], where: str, words: str) -> None:
    with pytest.raises(ScenarioError) as exc:
        estimate(doc)
    assert exc.value.problems[0].where == where
    assert words in str(exc.value)


@pytest.mark.parametrize("engine", ["sglang", "llamacpp"])
def test_other_engines_are_refused(engine: str) -> None:
    doc = _doc("0.11")
    doc["serve"] = {"engine": engine}
    with pytest.raises(ScenarioError) as exc:
        estimate(doc)
    assert f"serving it with {engine} is not estimated" in str(exc.value)


def test_tokens_from_concurrency_from_0_24(monkeypatch: pytest.MonkeyPatch) -> None:
    # the 0.24 row holds for any hybrid architecture vLLM still ships; Bamba's removal lifted to test it with Bamba's
    # shape: GPU KV cache size = int(1,654 / 26 x 8,192) = int(521,137.23...) = 521,137 tokens
    from vramplan.facts.vllm_releases import MAMBA_HYBRID_REMOVED

    monkeypatch.delitem(MAMBA_HYBRID_REMOVED, "bamba")
    d = decide(resolve(_doc("0.25", kv_cache_memory_bytes=KV_10_GIB)), version="0.25")
    assert (d.num_gpu_blocks, d.kv_cache_tokens, d.needed_kv_bytes) == (1654, 521_137, 168_689_664)


def test_the_planner_does_not_rank_hybrid_serving_setups() -> None:
    # its decode step time attends in every layer; the mixers' state reads are not modelled there
    from vramplan.plan import ServeJob, plan

    with pytest.raises(ScenarioError, match="decode step time of its mixers is not modelled"):
        plan(BAMBA_9B, "H100", 1, ServeJob(max_model_len=8192))


def test_kv_page_count_refused_for_a_hybrid(tmp_path: Any) -> None:
    # `vramplan kv --budget-gb` counts attention pages only; a hybrid's mixer state would be left out silently
    import json

    from typer.testing import CliRunner

    from vramplan.cli.main import app

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(BAMBA_9B))
    env = {"COLUMNS": "120", "NO_COLOR": "1", "TERM": "dumb"}
    res = CliRunner().invoke(app, ["kv", str(cfg), "--budget-gb", "10", "--json"], env=env)
    assert res.exit_code != 0 and "--budget-gb" in res.stderr and "Mamba mixers' state" in res.stderr
    ok = CliRunner().invoke(app, ["kv", str(cfg), "--json"], env=env)
    assert ok.exit_code == 0 and "ssm_state_bytes_per_sequence" in json.loads(ok.stdout)
