"""llama.cpp's reserve graph and ggml-alloc's replay (serve/ggml_graph.py), and the build rows
(facts/llamacpp_builds.py).  Expected buffers are the ones llama.cpp logs print, derived by hand below."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vramplan.catalog.resolve import resolve
from vramplan.errors import ScenarioError
from vramplan.facts.llamacpp_builds import LLAMACPP_BUILDS, llamacpp_build, parse_build
from vramplan.serve.ggml_graph import (
    GraphShape,
    GTensor,
    ReserveGraph,
    _alloc,
    _release,
    gallocr_max_size,
    reserve_nodes,
)
from vramplan.serve.llamacpp import decide
from vramplan.units import MiB

KiB = 1024


def _pythia(n_kv: int = 2048) -> GraphShape:
    # Pythia-2.8B: n_embd 2560, 32 heads of 80, n_ff 10240 (GELU, no gate), vocabulary 50304
    return GraphShape("gptneox", 2560, 32, 32, 80, 80, 10240, 50304, 512, n_kv, 512, False, gated=False)


def _llama3_8b(n_kv: int, flash: bool = False) -> GraphShape:
    return GraphShape("llama", 4096, 32, 8, 128, 128, 14336, 128256, 512, n_kv, 512, flash)


def test_pythia_b3410_compute_buffer_is_the_ci_logs_162_mib() -> None:
    # ggml-org/ci b3410, pythia-2.8b, n_ctx 2048, n_ubatch 512, -fa off: "CUDA0 compute buffer size = 162.00 MiB".
    # The split inputs first: embeddings 2560 x 512 x 4 B = 5 MiB, inp_pos 512 x 4 = 2 KiB, KQ_mask 2048 x 512 x 4 =
    # 4 MiB, inp_out_ids 2 KiB: 9 MiB + 4 KiB. Layer 0: norm 5 MiB at 9 MiB + 4 KiB; the fused QKV 7680 x 512 x 4 =
    # 15 MiB above it; Q, K, V (ggml_cont, 5 MiB each) reuse the norm's hole in turn, the roped Q and K (rope of a
    # view: never in place) go above the QKV at 29 and 34 MiB + 4 KiB; after the stores the QKV's 15 MiB and the
    # hole below merge (20 MiB) and the roped K returns to the tail: the scores 2048 x 512 x 32 x 4 B = 128 MiB at
    # 34 MiB + 4 KiB end at 162 MiB + 4 KiB, the peak (later layers reuse the same offsets).
    nodes = reserve_nodes(_pythia(), 32, True)
    assert gallocr_max_size(nodes, 128) == 162 * MiB + 4 * KiB
    # the log's "graph nodes = 1287": these 1093, the 193 bias additions left out (6 per layer, 1 at the output),
    # and the CPU split's get_rows of the embeddings
    assert len(nodes) + 6 * 32 + 1 + 1 == 1287


def test_llama3_8b_compute_buffers_are_the_published_logs() -> None:
    # n_ctx 512 (llama-cpp-python log, 258.50 MiB): at the output only the last hidden state 4096 x 512 x 4 B = 8 MiB
    # (its RMS norm in place) and the logits 128256 x 512 x 4 B = 250.5 MiB are live, at offsets 0 and 8 MiB
    assert gallocr_max_size(reserve_nodes(_llama3_8b(512), 32, True), 128) == 258.5 * MiB
    # n_ctx 8192 (ollama 0.5.4 log, 560.00 MiB): the scores 8192 x 512 x 32 x 4 B = 512 MiB above the inputs
    # (8 MiB + 2 KiB + 16 MiB + 2 KiB), the layer input, the roped Q (8 MiB each) and the holes below them: 560 MiB + 4 KiB
    assert gallocr_max_size(reserve_nodes(_llama3_8b(8192), 32, True), 128) == 560 * MiB + 4 * KiB
    # with flash attention no score matrix: the logits are the peak again, whatever the context
    assert gallocr_max_size(reserve_nodes(_llama3_8b(8192, flash=True), 32, True), 128) == 258.5 * MiB


def test_set_rows_builds_copy_the_v_indices_without_flash_attention() -> None:
    # b6327's stores are ggml_set_rows: without flash attention V is transposed and v_idxs holds one I64 index per
    # value, 512 x 1024 x 8 B = 4 MiB, plus k_idxs 512 x 8 B = 4 KiB, both split inputs alive through the layers:
    # 560 MiB + 4 KiB + 4 MiB + 4 KiB
    s = GraphShape("llama", 4096, 32, 8, 128, 128, 14336, 128256, 512, 8192, 512, False, set_rows=True)
    assert gallocr_max_size(reserve_nodes(s, 32, True), 128) == 564 * MiB + 8 * KiB


def test_best_fit_takes_the_smallest_block_that_fits_else_the_tail() -> None:
    free = [[0, 10], [20, 5], [40, 1 << 40]]
    assert _alloc(free, 5) == (20, 25)  # the 5-byte block, not the first one that fits
    assert _alloc(free, 11) == (40, 51)  # nothing but the tail holds 11
    _release(free, 20, 5)
    _release(free, 10, 10)  # merges with [0, 10) and then with [20, 25)
    assert free[0] == [0, 25]


def test_an_element_wise_op_takes_its_only_sources_memory() -> None:
    x = GTensor("x", "leaf", (256,), split_input=True)  # 1 KiB
    a = ReserveGraph.op("a", "mul_mat", (1024,), x)  # 4 KiB
    g = ReserveGraph()
    g.expand(ReserveGraph.op("c", "mul_mat", (256,), ReserveGraph.op("b", "unary", (1024,), a)))
    # b in place of a; c (1 KiB) then fits in x's freed block: 1 + 4 KiB
    assert gallocr_max_size(g.nodes, 128) == 5 * KiB
    # a second reader of a forbids the reuse: b needs its own 4 KiB
    g2 = ReserveGraph()
    a2 = ReserveGraph.op("a", "mul_mat", (1024,), GTensor("x", "leaf", (256,), split_input=True))
    g2.expand(ReserveGraph.op("d", "add", (1024,), ReserveGraph.op("b", "unary", (1024,), a2), a2))
    assert gallocr_max_size(g2.nodes, 128) == 9 * KiB


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5000), st.sampled_from(["mul_mat", "unary", "cont"])), min_size=1,
                max_size=25))
def test_the_buffer_lies_between_the_largest_tensor_and_the_sum(ops: list[tuple[int, str]]) -> None:
    x: GTensor = GTensor("x", "leaf", (64,), split_input=True)
    g, sizes = ReserveGraph(), [256]
    for i, (n, op) in enumerate(ops):
        n = x.ne[0] if op == "unary" else n  # an element-wise op keeps its source's shape
        x = ReserveGraph.op(f"t{i}", op, (n,), x)
        sizes.append(-(-n * 4 // 128) * 128)
    g.expand(x)
    got = gallocr_max_size(g.nodes, 128)
    assert max(sizes) <= got <= sum(sizes)


def test_build_rows_and_the_nearest_earlier() -> None:
    assert parse_build("b3410") == parse_build("3410") == parse_build("b3410 (b3283448)") == 3410
    assert parse_build("latest") is None
    assert llamacpp_build("b7377") == (LLAMACPP_BUILDS[-1], "")
    assert llamacpp_build("b6327")[0].build == 6327 and not llamacpp_build("b7376")[0].output_first
    row, note = llamacpp_build("b5000")
    assert row.build == 3410 and "nearest earlier" in note
    row, note = llamacpp_build("b2000")
    assert row.build == 3410 and "older than" in note
    assert llamacpp_build(None)[0] is LLAMACPP_BUILDS[-1]
    with pytest.raises(ValueError):
        llamacpp_build("tuesday")
    b3410 = llamacpp_build("3410")[0]
    # llama_kv_cache_get_padding: 32 cells without flash attention, 256 with it
    assert (b3410.kv_cells(4000, False), b3410.kv_cells(4001, False), b3410.kv_cells(4001, True)) == (4000, 4032, 4096)


def _scenario(gguf: dict[str, Any], max_model_len: int = 4000) -> dict[str, Any]:
    return {"model": "meta-llama/Llama-3.1-8B", "task": "serve", "hardware": {"gpu": "RTX-4090"},
            "serve": {"engine": "llamacpp", "max_model_len": max_model_len, "gguf": {"quant": "Q4_K_M", **gguf}}}


def test_the_build_sets_the_flash_attention_default_and_the_kv_padding() -> None:
    old = decide(resolve(_scenario({"llamacpp_build": "b3410"})))
    # b3410, -fa off by default: 4000 cells (a multiple of 32); 32 layers x 2 x 1024 x 2 B x 4000 = 524,288,000 B
    assert (old.flash_attn, old.kv_size, old.kv_bytes, old.llamacpp_build) == (False, 4000, 524_288_000, "b3410")
    new = decide(resolve(_scenario({})))
    # the newest row (b7377, b6327's -fa auto): on for a CUDA GPU, and 256-cell padding with it: 4096 cells
    assert (new.flash_attn, new.kv_size, new.llamacpp_build) == (True, 4096, "b7377")
    assert any("-fa default is auto" in a for a in new.assumptions)
    off = decide(resolve(_scenario({"flash_attn": False})))
    assert (off.flash_attn, off.kv_size) == (False, 4000)
    between = decide(resolve(_scenario({"llamacpp_build": "b5000"})))
    assert between.llamacpp_build == "b3410" and any("nearest earlier" in a for a in between.assumptions)
    with pytest.raises(ScenarioError, match="llamacpp_build"):
        decide(resolve(_scenario({"llamacpp_build": "newest"})))


# Llama-3.1-8B in Q4_K_M (catalog tensor list, CUDA alloc sizes): a layer with attn_v and ffn_down in Q6_K (layers 0-3,
# 6, 9, ..., 27-31: llama_tensor_get_type's use_more_bits) is H = 2 x 9,437,184 (q, o Q4_K) + 2,359,296 (k Q4_K)
# + 3,440,640 (v Q6_K) + 2 x 16,384 (norms) + 2 x 33,030,144 (gate, up Q4_K) + 48,168,960 (down Q6_K) = 138,936,320;
# the others have v 2,359,296 and down 33,030,144 in Q4_K: L = 122,716,160. Output 430,940,160 (Q6_K) + norm 16,384.
H, L, OUT = 138_936_320, 122_716_160, 430_940_160 + 16_384


def _offload(build: str, ngl: int) -> Any:
    return decide(resolve(_scenario({"llamacpp_build": build, "n_gpu_layers": ngl}, 4096)))


@pytest.mark.parametrize(("build", "ngl", "slots", "model_bytes", "kv_layers", "log"), [
    # before #18148: i_gpu_start = max(32 - ngl, 0), the output only when ngl > 32
    ("b3410", 1, 1, H, 1, ["offloading 1 repeating layers to GPU"]),  # layer 31
    ("b3410", 16, 16, 8 * H + 8 * L, 16, ["offloading 16 repeating layers to GPU"]),  # layers 16-31: 8 H, 8 L
    ("b3410", 32, 32, 16 * H + 16 * L, 32, ["offloading 32 repeating layers to GPU"]),  # the output on the host
    ("b3410", 33, 33, 16 * H + 16 * L + OUT, 32,
     ["offloading 32 repeating layers to GPU", "offloading output layer to GPU"]),
    ("b6327", 16, 16, 8 * H + 8 * L, 16, ["offloading 16 repeating layers to GPU"]),
    # from #18148: i_gpu_start = max(33 - ngl, 0), the output first; the log counts it out of min(ngl, 32)
    ("b7377", 1, 1, OUT, 0, ["offloading output layer to GPU", "offloading 0 repeating layers to GPU"]),
    ("b7377", 16, 16, 8 * H + 7 * L + OUT, 15,  # layers 17-31: 8 H, 7 L
     ["offloading output layer to GPU", "offloading 15 repeating layers to GPU"]),
    ("b7377", 32, 32, 15 * H + 16 * L + OUT, 31,  # layers 1-31 (layer 0, an H, on the host)
     ["offloading output layer to GPU", "offloading 31 repeating layers to GPU"]),
    ("b7377", 33, 33, 16 * H + 16 * L + OUT, 32,
     ["offloading output layer to GPU", "offloading 31 repeating layers to GPU"]),
])
def test_the_build_sets_the_offload_order(build: str, ngl: int, slots: int, model_bytes: int, kv_layers: int,
                                          log: list[str]) -> None:
    d = _offload(build, ngl)
    assert (d.gpu_slots, d.model_buffer_bytes) == (slots, model_bytes)
    # per-layer KV on the layer's device: 2 x 1024 (8 heads x 128) f16 x 4096 cells = 16 MiB a layer
    assert d.kv_bytes == kv_layers * 2 * 1024 * 2 * 4096
    assert [x.removeprefix("load_tensors: ") for x in d.log_lines()[:len(log)]] == log
    assert d.log_lines()[len(log)] == f"load_tensors: offloaded {slots}/33 layers to GPU"
