"""llama.cpp's start-up memory (serve/llamacpp.py), the GGUF tables (facts/gguf.py) and the GGUF reader
(serve/gguf.py).  The small GGUF files are written here by hand, following ggml/docs/gguf.md."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from vramplan import estimate
from vramplan.analytic.moment import KEYS, key_for
from vramplan.catalog.resolve import resolve
from vramplan.cli.main import app
from vramplan.errors import ScenarioError
from vramplan.facts.gguf import (
    GGML_TYPES,
    MixContext,
    file_type,
    mix_type,
    row_bytes,
    tensor_bytes,
    use_more_bits,
)
from vramplan.facts.llamacpp_builds import llamacpp_build
from vramplan.serve.gguf import model_tensors, read_gguf
from vramplan.serve.llamacpp import Hparams, compute_buffer_bytes, decide, kv_cache_bytes, split_weights
from vramplan.units import MiB

# ------------------------------------------------------------------ a GGUF writer (ggml/docs/gguf.md)

_U32, _I32, _F32, _BOOL, _STR, _ARR, _U64 = 4, 5, 6, 7, 8, 9, 10


def _s(text: str | bytes) -> bytes:
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def _kv(key: str, value: Any) -> bytes:
    if isinstance(value, bool):
        return _s(key) + struct.pack("<I?", _BOOL, value)
    if isinstance(value, int):
        return _s(key) + struct.pack("<II", _U32, value)
    if isinstance(value, float):
        return _s(key) + struct.pack("<If", _F32, value)
    if isinstance(value, str):
        return _s(key) + struct.pack("<I", _STR) + _s(value)
    assert isinstance(value, list)  # an array of strings
    return _s(key) + struct.pack("<IIQ", _ARR, _STR, len(value)) + b"".join(_s(v) for v in value)


def gguf_bytes(meta: dict[str, Any], tensors: list[tuple[str, tuple[int, ...], str]], *, version: int = 3,
               data: bool = True) -> bytes:
    """A GGUF file: header, metadata, tensor infos, alignment padding (32) and zeroed tensor data."""
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(meta))
    head += b"".join(_kv(k, v) for k, v in meta.items())
    offset, infos = 0, b""
    for name, shape, tname in tensors:
        t = GGML_TYPES[tname]
        infos += _s(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape)
        infos += struct.pack("<IQ", t.id, offset)
        offset += -(-tensor_bytes(t, shape) // 32) * 32
    out = head + infos
    out += b"\0" * (-len(out) % 32)
    return out + (b"\0" * offset if data else b"")


# a two-layer llama: n_embd 512, 8 heads of 64, 2 KV heads, n_ff 1024, vocabulary 1000
TINY_META = {"general.architecture": "llama", "llama.block_count": 2, "llama.context_length": 4096,
             "llama.embedding_length": 512, "llama.feed_forward_length": 1024, "llama.attention.head_count": 8,
             "llama.attention.head_count_kv": 2, "general.file_type": 7, "tokenizer.ggml.tokens": ["a", "b", "c"]}


def tiny_tensors(tied: bool = False) -> list[tuple[str, tuple[int, ...], str]]:
    out: list[tuple[str, tuple[int, ...], str]] = [("token_embd.weight", (512, 1000), "Q8_0")]
    for il in range(2):
        out += [(f"blk.{il}.attn_norm.weight", (512,), "F32"), (f"blk.{il}.attn_q.weight", (512, 512), "Q8_0"),
                (f"blk.{il}.attn_k.weight", (512, 128), "Q8_0"), (f"blk.{il}.attn_v.weight", (512, 128), "Q8_0"),
                (f"blk.{il}.attn_output.weight", (512, 512), "Q8_0"), (f"blk.{il}.ffn_norm.weight", (512,), "F32"),
                (f"blk.{il}.ffn_gate.weight", (512, 1024), "Q8_0"), (f"blk.{il}.ffn_up.weight", (512, 1024), "Q8_0"),
                (f"blk.{il}.ffn_down.weight", (1024, 512), "Q8_0")]
    out.append(("output_norm.weight", (512,), "F32"))
    if not tied:
        out.append(("output.weight", (512, 1000), "Q8_0"))
    return out


def _scenario(gguf: dict[str, Any], gpu: str = "RTX-4090", **serve: Any) -> dict[str, Any]:
    return {"model": "meta-llama/Llama-3.1-8B", "task": "serve", "hardware": {"gpu": gpu},
            "serve": {"engine": "llamacpp", "gguf": gguf, **serve}}


# ------------------------------------------------------------------ facts


def test_block_sizes_are_ggml_common_structs() -> None:
    # block_q4_K: d, dmin (2 x 2) + scales[12] + qs[256 / 2] = 144 bytes per 256 weights = 4.5 bits
    assert (GGML_TYPES["Q4_K"].block, GGML_TYPES["Q4_K"].block_bytes) == (256, 144)
    assert GGML_TYPES["Q4_K"].bits_per_weight == 4.5
    # block_q8_0: d (2) + qs[32] = 34 per 32; block_q6_K: ql[128] + qh[64] + scales[16] + d (2) = 210 per 256
    assert (GGML_TYPES["Q8_0"].block_bytes, GGML_TYPES["Q6_K"].block_bytes) == (34, 210)
    # block_iq4_xs: d (2) + scales_h (2) + scales_l[4] + qs[128] = 136; block_q4_0: 2 + 16 = 18 per 32
    assert (GGML_TYPES["IQ4_XS"].block_bytes, GGML_TYPES["Q4_0"].block_bytes) == (136, 18)
    # a row of 4096 Q4_K values: 16 blocks x 144 = 2304 bytes; a 4096 x 14336 matrix: 14336 rows of them
    assert row_bytes(GGML_TYPES["Q4_K"], 4096) == 2304
    assert tensor_bytes(GGML_TYPES["Q4_K"], (4096, 14336)) == 14336 * 2304
    assert len({t.id for t in GGML_TYPES.values()}) == len(GGML_TYPES)


def test_use_more_bits_selects_sixteen_of_32_layers() -> None:
    # i < 4, i >= 28, and (i - 4) % 3 == 2 between: 6, 9, ..., 27 -> 4 + 4 + 8
    chosen = [i for i in range(32) if use_more_bits(i, 32)]
    assert chosen == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]


def test_q4_k_m_mix_of_llama_31_8b_matches_the_published_file() -> None:
    # the published Meta-Llama-3.1-8B-Instruct Q4_K_M: "type q4_K: 193 tensors, type q6_K: 33 tensors"
    # (f32 66 there includes rope_freqs, which the catalog model has no parameter for)
    m = resolve(_scenario({})).model
    counts: dict[str, int] = {}
    for t in model_tensors(m, "Q4_K_M"):
        counts[t.type.name] = counts.get(t.type.name, 0) + 1
    assert counts == {"Q4_K": 193, "Q6_K": 33, "F32": 65}


def test_mix_rules() -> None:
    ctx = MixContext(n_layer=32, n_gqa=4, n_expert=0, tied_embeddings=False)
    assert mix_type("Q4_K_M", "output", 0, ctx, 4096) == "Q6_K"
    assert mix_type("Q8_0", "output", 0, ctx, 4096) == "Q8_0"  # a Q8_0 output stays Q8_0
    assert mix_type("Q4_K_M", "attn_v", 5, ctx, 4096) == "Q4_K"  # (5 - 4) % 3 == 1: no more bits
    assert mix_type("Q4_K_M", "ffn_down", 6, ctx, 14336) == "Q6_K"
    assert mix_type("IQ4_XS", "attn_v", 5, ctx, 4096) == "Q5_K"  # n_gqa >= 4
    assert mix_type("Q3_K_M", "attn_v", 1, ctx, 4096) == "Q5_K"
    # a row of 2880 is not a multiple of 256: Q4_K falls back to Q5_0 (tensor_type_fallback)
    assert mix_type("Q4_K_M", "ffn_up", 3, ctx, 2880) == "Q5_0"
    tied = MixContext(n_layer=32, n_gqa=4, n_expert=0, tied_embeddings=True)
    assert mix_type("Q4_K_M", "token_embd", 0, tied, 4096) == "Q6_K"  # tied: the output's rule
    assert file_type("q4_k") is not None and file_type("q4_k").name == "Q4_K_M"  # type: ignore[union-attr]


# ------------------------------------------------------------------ the reader


def test_reader_reads_tensors_and_metadata(tmp_path: Path) -> None:
    p = tmp_path / "tiny.gguf"
    p.write_bytes(gguf_bytes(TINY_META, tiny_tensors()))
    g = read_gguf(p)
    assert g.version == 3 and g.architecture == "llama" and g.file_type == "Q8_0"
    assert g.arch_value("block_count") == 2 and g.metadata["tokenizer.ggml.tokens"] == ["a", "b", "c"]
    embd = g.tensors[0]
    # 1000 rows of 512 Q8_0 values: 16 blocks x 34 B = 544 B per row
    assert (embd.name, embd.shape, embd.type.name, embd.nbytes) == ("token_embd.weight", (512, 1000), "Q8_0", 544_000)
    assert [t.layer for t in g.tensors[1:3]] == [0, 0] and g.tensors[-1].layer is None


def test_decide_from_a_file(tmp_path: Path) -> None:
    p = tmp_path / "tiny.gguf"
    p.write_bytes(gguf_bytes(TINY_META, tiny_tensors()))
    d = decide(resolve(_scenario({"file": str(p)}, max_model_len=1000)))
    # per layer: norms 2 x 512 x 4 = 4096; q, o 512 rows x 544 = 278,528 each; k, v 128 x 544 = 69,632 each;
    # gate, up 1024 x 544 = 557,056 each; down 512 rows of 1024 (32 blocks x 34 = 1088) = 557,056.
    # 512 is a multiple of MATRIX_ROW_PADDING (512): no padding; every size is a multiple of 128.
    layer = 4096 + 2 * 278_528 + 2 * 69_632 + 3 * 557_056
    # output 544,000 (a multiple of 128) + output_norm 2048; token_embd stays on the host
    assert d.model_buffer_bytes == 2 * layer + 544_000 + 2048
    assert d.host_weights_bytes == 544_000
    # 1000 cells padded to 1024; K and V rows: 2 heads x 64 = 128 f16 values = 256 B; 2 layers
    assert d.kv_size == 1024 and d.kv_bytes == 2 * 2 * 1024 * 256
    assert d.file_type == "Q8_0" and d.starts


def test_tied_output_is_the_embeddings_on_the_gpu(tmp_path: Path) -> None:
    p = tmp_path / "tied.gguf"
    p.write_bytes(gguf_bytes(TINY_META, tiny_tensors(tied=True)))
    g = read_gguf(p)
    all_gpu, host, slots = split_weights(g.tensors, 2, 3)
    # TENSOR_DUPLICATED: token_embd read again as the output, on the output's device (the GPU)
    untied = read_gguf(_write(tmp_path / "untied.gguf", gguf_bytes(TINY_META, tiny_tensors())))
    assert all_gpu == split_weights(untied.tensors, 2, 3)[0] and host == 544_000 and slots == 3


def _write(p: Path, b: bytes) -> Path:
    p.write_bytes(b)
    return p


def test_n_gpu_layers_offloads_from_the_last_slot(tmp_path: Path) -> None:
    g = read_gguf(_write(tmp_path / "t.gguf", gguf_bytes(TINY_META, tiny_tensors())))
    layer = 4096 + 2 * 278_528 + 2 * 69_632 + 3 * 557_056
    output = 544_000 + 2048
    # i_gpu_start = max(n_layer + 1 - ngl, 0): ngl 1 -> only slot 2 (the output); ngl 2 -> layer 1 and the output
    assert split_weights(g.tensors, 2, 0)[0] == 0
    assert split_weights(g.tensors, 2, 1)[:2] == (output, 2 * layer + 544_000)
    assert split_weights(g.tensors, 2, 2)[0] == layer + output
    assert split_weights(g.tensors, 2, 99)[2] == 3
    # before ggml-org/llama.cpp#18148 (b3410): i_gpu_start = max(n_layer - ngl, 0), the output only when ngl > 2
    old = llamacpp_build("b3410")[0]
    assert split_weights(g.tensors, 2, 1, old)[:2] == (layer, layer + 2 * 544_000 + 2048)
    assert split_weights(g.tensors, 2, 2, old)[0] == 2 * layer
    assert split_weights(g.tensors, 2, 3, old)[0] == 2 * layer + output


HOSTILE: dict[str, bytes] = {
    "magic": b"GGUX" + b"\0" * 40,
    "version 1": b"GGUF" + struct.pack("<IQQ", 1, 0, 0),
    "truncated": gguf_bytes(TINY_META, tiny_tensors())[:100],
    "huge string": b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 2**60),
    "huge counts": b"GGUF" + struct.pack("<IQQ", 3, 2**40, 2**40),
    "no data": gguf_bytes(TINY_META, tiny_tensors(), data=False),
    "bad type": b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + _s("t") + struct.pack("<IQIQ", 1, 32, 999, 0),
    "0 dims": b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + _s("t") + struct.pack("<IIQ", 0, 0, 0),
    "partial block": b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + _s("t") + struct.pack("<IQIQ", 1, 100, 12, 0),
    "bad value type": b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _s("k") + struct.pack("<I", 77),
    "nested array": b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _s("k") + struct.pack("<IIQ", _ARR, _ARR, 1),
    "not utf-8": b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _s(b"\xff\xfe") + struct.pack("<II", _U32, 1),
    "alignment 0": gguf_bytes({"general.alignment": 0}, []),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_files_give_a_scenario_error(tmp_path: Path, name: str) -> None:
    with pytest.raises(ScenarioError, match="serve.gguf.file"):
        read_gguf(_write(tmp_path / "bad.gguf", HOSTILE[name]))


def test_missing_file_is_a_scenario_error(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="no such file"):
        estimate(_scenario({"file": str(tmp_path / "absent.gguf")}))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(min_value=0, max_value=2000), noise=st.binary(max_size=64))
def test_damaged_files_never_raise_anything_else(tmp_path: Path, cut: int, noise: bytes) -> None:
    good = gguf_bytes(TINY_META, tiny_tensors())
    p = _write(tmp_path / "damaged.gguf", good[:cut] + noise)
    try:
        read_gguf(p)
    except ScenarioError:
        pass


# ------------------------------------------------------------------ the memory model

LLAMA3_8B = Hparams(arch="llama", n_layer=32, n_embd=4096, n_head=32, n_head_kv=8, head_k=128, head_v=128,
                    n_vocab=128256, n_ctx_train=131072, n_ff=14336)


def test_kv_cache_bytes_in_cache_types() -> None:
    f16, q8 = GGML_TYPES["F16"], GGML_TYPES["Q8_0"]
    # 32 layers x 8192 cells x 1024 values x 2 B = 512 MiB for K, as much for V (llama.cpp: "K (f16): 512.00 MiB")
    assert kv_cache_bytes(LLAMA3_8B, 8192, 32, f16, f16) == (512 * MiB, 512 * MiB)
    # q8_0: 1024 values = 32 blocks x 34 B = 1088 B per cell and layer: 32 x 8192 x 1088 = 272 MiB
    assert kv_cache_bytes(LLAMA3_8B, 8192, 32, q8, q8) == (272 * MiB, 272 * MiB)


def test_compute_buffer_at_a_short_context_is_the_logits() -> None:
    # n_ctx 512, n_ubatch 512: the peak is the output: logits 128,256 x 512 x 4 B + the normed hidden
    # states 4096 x 512 x 4 B = 250.5 + 8 = 258.5 MiB, the "CUDA0 compute buffer size = 258.50 MiB" users'
    # llama.cpp logs of Llama-3-8B at n_ctx 512 print
    for flash in (False, True):
        assert compute_buffer_bytes(LLAMA3_8B, 512, 512, flash, 2, True) == 258.5 * MiB


def test_compute_buffer_grows_with_the_context_without_flash_attention() -> None:
    sizes = [compute_buffer_bytes(LLAMA3_8B, 512, n, False, 2, True) for n in (2048, 4096, 8192, 16384)]
    assert sizes == sorted(sizes)
    # 8192 cells: the scores 8192 x 512 x 32 x 4 B = 512 MiB dominate
    assert sizes[2] > 512 * MiB
    fa = [compute_buffer_bytes(LLAMA3_8B, 512, n, True, 2, True) for n in (2048, 16384)]
    assert fa[1] - fa[0] < 64 * MiB  # with flash attention only the mask grows


def test_llama_31_8b_q4_k_m_matches_its_published_buffers() -> None:
    # Meta-Llama-3.1-8B-Instruct Q4_K_M, -c 8192, all layers: "CUDA0 model buffer size = 4403.49 MiB",
    # "CPU_Mapped model buffer size = 281.81 MiB", "CUDA0 KV buffer size = 1024.00 MiB"
    d = decide(resolve(_scenario({"quant": "Q4_K_M"}, max_model_len=8192)))
    assert round(d.model_buffer_bytes / MiB, 2) == 4403.49
    assert round(d.host_weights_bytes / MiB, 2) == 281.81
    assert d.kv_bytes == 1024 * MiB
    assert any("CUDA0 model buffer size =  4403.49 MiB" in line for line in d.log_lines())


def test_quantized_v_cache_needs_flash_attention() -> None:
    # -fa off, given or b3410's default, refuses a quantized V cache
    for gguf in ({"cache_type_v": "q8_0", "flash_attn": False}, {"cache_type_v": "q8_0", "llamacpp_build": "b3410"}):
        with pytest.raises(ScenarioError, match="V cache quantization requires flash_attn"):
            decide(resolve(_scenario(gguf)))
    # from b6327 -fa defaults to auto, on for a CUDA GPU: the same cache starts
    auto = decide(resolve(_scenario({"cache_type_v": "q8_0", "cache_type_k": "q8_0"}, max_model_len=8192)))
    assert auto.flash_attn and auto.kv_bytes == 2 * 272 * MiB
    d = decide(resolve(_scenario({"cache_type_v": "q8_0", "cache_type_k": "q8_0", "flash_attn": True},
                                 max_model_len=8192)))
    assert d.kv_bytes == 2 * 272 * MiB


@pytest.mark.parametrize(("gguf", "serve", "parallel", "match"), [
    ({}, {"gpu_memory_utilization": 0.8}, {}, "option of vLLM, not of engine llamacpp"),
    ({}, {}, {"tp": 2}, "one GPU"),
    ({}, {"quantization": "awq-4bit"}, {}, "GGUF tensors"),
    ({"quant": "Q9"}, {}, {}, "unknown GGUF file type"),
    ({"cache_type_k": "q3_k"}, {}, {}, "unsupported cache type"),
])
def test_options_llama_cpp_lacks_are_refused(gguf: dict[str, Any], serve: dict[str, Any],
                                            parallel: dict[str, Any], match: str) -> None:
    doc = _scenario(gguf, **serve)
    if parallel:
        doc["parallel"] = parallel
        doc["hardware"]["num_gpus"] = parallel["tp"]
    with pytest.raises(ScenarioError, match=match):
        estimate(doc)


def test_a_pre_quantized_hub_checkpoint_does_not_decide_the_gguf_weights() -> None:
    # DeepSeek-V3's config.json declares block-wise fp8 (quantization_config); llama.cpp loads a GGUF file, so the
    # Q4_K_M file type decides the weights and the checkpoint's format is only named (it was refused before)
    doc = {**_scenario({"quant": "Q4_K_M", "n_gpu_layers": 0}), "model": "deepseek-ai/DeepSeek-V3"}
    rep = estimate(doc)
    assert rep.serve.engine == "llamacpp"
    assert any("not used by llama.cpp" in a for a in rep.assumptions)
    # a model without a quantization_config gets no such note
    assert not any("not used by llama.cpp" in a for a in estimate(_scenario({"quant": "Q4_K_M"})).assumptions)
    # a quantization the scenario itself names is still refused
    with pytest.raises(ScenarioError, match="GGUF tensors"):
        estimate({**doc, "serve": {**doc["serve"], "quantization": "fp8"}})


def test_stray_gguf_is_refused_for_the_other_engines() -> None:
    # SGLang goes through its own start-up model (serve/sglang.py), not llama.cpp's
    assert estimate({**_scenario({}), "serve": {"engine": "sglang"}}).serve.engine == "sglang"
    for engine in ("vllm", "sglang"):
        with pytest.raises(ScenarioError, match="only serve.engine: llamacpp"):
            estimate({**_scenario({}), "serve": {"engine": engine, "gguf": {"quant": "Q8_0"}}})


# ------------------------------------------------------------------ the report and the CLI


def test_report_serve_keys_and_breakdown() -> None:
    rep = estimate(_scenario({"quant": "Q4_K_M"}, max_model_len=8192))
    d = decide(resolve(_scenario({"quant": "Q4_K_M"}, max_model_len=8192)))
    sv = rep.serve
    assert (sv.weights_gpu_bytes, sv.weights_host_bytes, sv.kv_cache_bytes, sv.compute_buffer_bytes) == (
        d.model_buffer_bytes, d.host_weights_bytes, d.kv_bytes, d.compute_buffer_bytes)
    assert sv.kv_cache_tokens == 8192 and sv.max_concurrency == 1 and rep.fits
    assert rep.per_gpu.peak_allocated_bytes == d.model_buffer_bytes + d.kv_bytes + d.compute_buffer_bytes
    for part, rows in rep.per_gpu.breakdown_detail.items():
        for label in rows:
            assert key_for(part, label) or any(k.templated and k.part == part for k in KEYS)


def test_a_model_too_large_does_not_start_and_says_what_to_change() -> None:
    doc = {**_scenario({"quant": "Q4_K_M"}), "model": "meta-llama/Llama-3.1-70B"}
    rep = estimate(doc)
    assert not rep.fits and any("would not start" in a for a in rep.assumptions)
    d = decide(resolve({**doc}))
    assert "n_gpu_layers" in d.fix and not d.starts
    # keeping layers on the host brings it under the card's 24 GiB
    part = decide(resolve({**_scenario({"quant": "Q4_K_M", "n_gpu_layers": 30}, max_model_len=4096),
                           "model": "meta-llama/Llama-3.1-70B"}))
    assert part.starts and part.gpu_slots == 30 and part.kv_host_bytes > 0


def test_vllm_reports_keep_their_keys() -> None:
    rep = estimate({"model": "meta-llama/Llama-3.1-8B", "task": "serve", "hardware": {"gpu": "H100"}})
    assert rep.serve.weights_gpu_bytes is None and rep.serve.num_gpu_blocks > 0


def test_cli_serve_engine_llamacpp_json() -> None:
    res = CliRunner().invoke(app, ["serve", "--model", "llama-3.1-8b", "--gpu", "RTX-4090", "--engine", "llamacpp",
                                   "--gguf-quant", "Q4_K_M", "--max-model-len", "8192", "--json"],
                             env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["fits"] and out["llamacpp"]["kv_size"] == 8192
    assert any("CUDA0 KV buffer size =  1024.00 MiB" in line for line in out["log_lines"])


def test_cli_serve_refuses_with_the_option() -> None:
    res = CliRunner().invoke(app, ["serve", "--model", "llama-3.1-8b", "--gpu", "RTX-4090", "--engine", "llamacpp",
                                   "--cache-type-v", "q4_0", "--llamacpp-build", "b3410"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert res.exit_code != 0 and "flash_attn" in res.output  # b3410's -fa default is off


def test_published_llamacpp_rows_score_within_the_target() -> None:
    # validation/published.yaml, the llamacpp-* rows: the ggml-org/ci pythia-2.8b logs (b3410), a llama-cpp-python
    # Llama-3-8B log and an ollama 0.5.4 Llama-3.1-8B log. Every buffer, the compute buffer included, is reproduced to
    # the printed 0.01 MiB (relative error under 1e-4: the compute buffers are 162.00, 258.50 and 560.00 MiB)
    from vramplan.validate import load_dataset
    from vramplan.validate.runner import default_engines, run_validation

    ds = load_dataset(Path(__file__).resolve().parents[1] / "validation" / "published.yaml")
    rows = tuple(e for e in ds.entries if e.id.startswith("llamacpp-"))
    assert len(rows) >= 13 and len({e.source for e in rows}) >= 3
    assert sum(e.measured.quantity == "compute_buffer" for e in rows) >= 3
    res = run_validation(type(ds)(path=ds.path, entries=rows), engines={"analytic": default_engines("analytic")["analytic"]})
    for e in res.entries:
        p = e.predictions["analytic"]
        assert p.status == "ok" and p.abs_error is not None
        assert p.abs_error <= 0.0001, (e.id, p.abs_error)
