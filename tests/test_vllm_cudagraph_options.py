"""vLLM's CUDA-graph options as the user sets them: ``serve.cudagraph_capture_sizes``,
``max_cudagraph_capture_size`` and ``cudagraph_mode`` (facts/vllm_cudagraphs.py, "The user's sizes and modes";
serve/vllm.py ``_cudagraph_option_notes``)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from vramplan.catalog.resolve import resolve
from vramplan.cli.main import app
from vramplan.errors import ScenarioError
from vramplan.facts.vllm_cudagraphs import (
    CUDAGRAPH_RULES,
    SEGMENT_BYTES_POINT,
    cudagraph_rule,
    graph_segments,
    user_capture_sizes,
)
from vramplan.serve.vllm import decide

LLAMA = "meta-llama/Llama-3.1-8B"
runner = CliRunner()
ENV = {"COLUMNS": "200", "NO_COLOR": "1"}
# Llama-3.1-8B: hidden 4096, intermediate 14,336, 32 layers; the graph pool is the forward of the largest size
# (serve/vllm.py forward_peak_bytes, compiled): (4 x 4096 + 3 x 14,336) x tokens x 2 B = 118,784 x tokens
POOL_PER_TOKEN = (4 * 4096 + 3 * 14336) * 2


def _decide(version: str, **serve: Any) -> Any:
    doc = {"model": LLAMA, "task": "serve", "hardware": {"gpu": "H100"},
           "serve": {"max_model_len": 16384, "gpu_memory_utilization": 0.9, "vllm_version": version, **serve}}
    return decide(resolve(doc), version=version)


def _user(release: tuple[int, int, int], tokens: int, explicit: tuple[int, ...] | None = None,
          top: int | None = None) -> tuple[int, ...]:
    return user_capture_sizes(cudagraph_rule(release)[0], release, tokens, explicit, top)


def test_largest_size_follows_each_release_grid() -> None:
    # 0.11.0 --cuda-graph-sizes 64: [1, 2, 4] + range(8, 65, 8) = 3 + 8 = 11 sizes
    assert _user((0, 11, 0), 8192, top=64) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
    # 0.19.0 --max-cudagraph-capture-size 300: 1, 2, 4, 8..248 (31), 256, 272, 288 (range(256, 301, 16)): 37 sizes
    s = _user((0, 19, 0), 8192, top=300)
    assert len(s) == 37 and s[-3:] == (256, 272, 288) and s[3:5] == (8, 16)
    # 260 batched tokens: the grid stops at min(300, 260) = 260 -> ..., 248, 256 (35 sizes); 0.21.0 appends
    # max_num_batched_tokens 260 because 260 <= 300 (36 sizes), 0.19.0 does not
    assert _user((0, 19, 0), 260, top=300)[-2:] == (248, 256) and len(_user((0, 19, 0), 260, top=300)) == 35
    assert _user((0, 21, 0), 260, top=300)[-2:] == (256, 260) and len(_user((0, 21, 0), 260, top=300)) == 36
    # the Blackwell ceiling and 0.31's max_num_seqs append shape only the default maximum: 0.33 with max 64 is
    # the 0.19 grid
    assert _user((0, 33, 0), 8192, top=64) == _user((0, 19, 0), 8192, top=64)


def test_explicit_sizes_are_dropped_above_the_batch_only_from_0_12() -> None:
    # de-duplicated and sorted; 0.11.0 keeps 10,000 although only 8,192 tokens are batched
    assert _user((0, 11, 0), 8192, explicit=(8, 4, 4, 10000)) == (4, 8, 10000)
    assert _user((0, 12, 0), 8192, explicit=(8, 4, 4, 10000)) == (4, 8)


def test_segments_of_each_user_mode() -> None:
    rule = cudagraph_rule((0, 19, 0))[0]
    sizes = (1, 2, 4, 8, 16)  # max_num_seqs 8: the decode sizes are 1, 2, 4, 8
    # 32 layers -> 33 pieces per graph
    assert graph_segments(rule, sizes, 32, 8, modes="piecewise") == (5 * 33, 5 * 33)
    assert graph_segments(rule, sizes, 32, 8, modes="full") == (5, 5 * 33)
    assert graph_segments(rule, sizes, 32, 8, modes="full_decode_only") == (4, 4 * 33)
    # the default: piecewise for all 5, FULL for 4 decode sizes: 165 + 4 graphs, (5 + 4) x 33 = 297 segments
    assert graph_segments(rule, sizes, 32, 8) == (169, 297)


def test_a_smaller_maximum_shrinks_the_graphs_by_hand() -> None:
    # 0.19.0, 1,024 sequences (H100 default), max 64: 11 sizes, all <= 1,024 decode: (11 + 11) x 33 = 726 segments
    d = _decide("0.19", max_cudagraph_capture_size=64)
    pool = POOL_PER_TOKEN * 64  # 7,602,176
    assert d.cudagraph_capture_sizes == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
    assert d.cudagraph_pool_bytes == pool == 7_602_176
    assert d.cudagraph_bytes == pool + 726 * SEGMENT_BYTES_POINT
    assert any("CUDA graphs as given (serve.max_cudagraph_capture_size 64" in n for n in d.assumptions)
    base = _decide("0.19")
    assert base.cudagraph_bytes > d.cudagraph_bytes
    # 0.19 keeps the graphs outside the budget: the KV cache does not move
    assert base.kv_cache_bytes == d.kv_cache_bytes


def test_mode_none_captures_nothing_and_piecewise_drops_the_decode_graphs() -> None:
    none = _decide("0.19", cudagraph_mode="NONE")
    assert none.cudagraph_bytes == 0 and not none.cudagraph_capture_sizes
    assert any("serve.cudagraph_mode NONE" in n for n in none.assumptions)
    # PIECEWISE: 51 sizes x 33 segments instead of (51 + 51) x 33: the pool (512 tokens) is the same
    pw, base = _decide("0.19", cudagraph_mode="PIECEWISE"), _decide("0.19")
    assert pw.cudagraph_pool_bytes == base.cudagraph_pool_bytes == POOL_PER_TOKEN * 512
    assert pw.cudagraph_bytes == POOL_PER_TOKEN * 512 + 51 * 33 * SEGMENT_BYTES_POINT
    assert base.cudagraph_bytes == POOL_PER_TOKEN * 512 + 102 * 33 * SEGMENT_BYTES_POINT


def test_where_graphs_are_subtracted_a_smaller_maximum_grows_the_kv_cache() -> None:
    base, small = _decide("0.33"), _decide("0.33", max_cudagraph_capture_size=64)
    assert base.cudagraph_subtracted and small.cudagraph_subtracted
    freed = base.cudagraph_bytes - small.cudagraph_bytes
    # the KV pool grows by what the graphs no longer take, less under one block of rounding
    # (a block: 16 tokens x 32 layers x 2 x 8 KV heads x 128 x 2 B = 2,097,152 B)
    assert 0 <= freed - (small.kv_cache_bytes - base.kv_cache_bytes) < 2_097_152


@pytest.mark.parametrize(("version", "serve", "where", "says"), [
    ("0.6.5", {"max_cudagraph_capture_size": 64}, "serve.max_cudagraph_capture_size", "V0 engine"),
    ("0.8.5", {"max_cudagraph_capture_size": 64}, "serve.max_cudagraph_capture_size", "--cuda-graph-sizes N came in 0.9.0"),
    ("0.10", {"cudagraph_mode": "FULL"}, "serve.cudagraph_mode", "CUDAGraphMode came in 0.11.0"),
    ("0.19", {"cudagraph_capture_sizes": [8], "max_cudagraph_capture_size": 8}, "serve.max_cudagraph_capture_size",
     "give one of them"),
    ("0.19", {"cudagraph_mode": "NONE", "max_cudagraph_capture_size": 8}, "serve.max_cudagraph_capture_size",
     "captures no graph"),
    ("0.19", {"cudagraph_capture_sizes": [0, 8]}, "serve.cudagraph_capture_sizes", "positive"),
    ("0.19", {"cuda_graphs": False, "cudagraph_mode": "FULL"}, "serve.cudagraph_mode", "--enforce-eager"),
    ("0.19", {"cudagraph_mode": "FULL", "speculative": {"method": "eagle", "model": "meta-llama/Llama-3.2-1B",
                                                        "num_speculative_tokens": 3}},
     "serve.cudagraph_mode", "piecewise only"),
])
def test_combinations_a_release_does_not_have_are_refused(version: str, serve: dict[str, Any], where: str,
                                                          says: str) -> None:
    with pytest.raises(ScenarioError) as e:
        _decide(version, **serve)
    p = e.value.problems[0]
    assert p.where == where and says in f"{p.message} ({p.hint})"


def test_cli_flags_and_other_engines() -> None:
    args = ["serve", "--model", LLAMA, "--gpu", "H100", "--vllm-version", "0.19", "--max-model-len", "16384"]
    res = runner.invoke(app, [*args, "--cudagraph-capture-sizes", "1,2,4,8", "--json"], env=ENV)
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["vllm"]["cudagraph_capture_sizes"] == [1, 2, 4, 8]
    bad = runner.invoke(app, [*args, "--cudagraph-mode", "FULLL"], env=ENV)
    assert bad.exit_code == 2 and "FULL" in bad.stderr
    # SGLang's option for the same thing is cuda_graph_max_bs
    sg = runner.invoke(app, ["serve", "--model", LLAMA, "--gpu", "H100", "--engine", "sglang",
                             "--max-cudagraph-capture-size", "64"], env=ENV)
    assert sg.exit_code == 2 and "cuda_graph_max_bs" in sg.stderr


@given(release=st.sampled_from([r for r in CUDAGRAPH_RULES if r.sizes != "v0" and r.first >= (0, 9, 0)]),
       top=st.integers(1, 4096), tokens=st.integers(1, 32768))
def test_user_maximum_is_never_exceeded_except_by_the_batch(release: Any, top: int, tokens: int) -> None:
    sizes = _user(release.first, tokens, top=top)
    assert list(sizes) == sorted(set(sizes))
    assert all(x <= tokens for x in sizes)
    # every size is within the maximum; 0.9-0.11 build [1, 2, 4] + range(8, N + 1, 8), so 1, 2 and 4 are captured
    # even for N below 4 (vllm/config.py _set_cudagraph_sizes does not filter them by N)
    assert all(x <= (top if release.sizes == "v1-2x-16" else max(top, 4)) for x in sizes)
