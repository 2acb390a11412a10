"""generate()'s allocator cache: the prefill's holes and DynamicCache's torch.cat growth (analytic/generate_replay.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vramplan.analytic.generate_replay import applies, cached_excess, generate_stream, weight_tensors
from vramplan.analytic.inference import GenerateCall
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate

GPU_RUN = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "h200-2026-11-26" / "results.jsonl"


def _doc(model: str = "meta-llama/Llama-3.2-1B", gpu: str = "H200", **inf: Any) -> dict[str, Any]:
    return {"model": model, "task": "inference", "hardware": {"gpu": gpu},
            "inference": {"batch_size": 2, "prompt_len": 64, "new_tokens": 5, "dtype": "bf16", **inf}}


def _live_after(events: list[int]) -> int:
    sizes: list[int] = []
    live = 0
    for e in events:
        if e > 0:
            sizes.append(e)
            live += e
        else:
            live -= sizes[-e - 1]
    return live


def test_stream_leaves_exactly_the_weights_inputs_cache_and_scores() -> None:
    # Llama 3.2 1B, bf16 (c = 2), b 2, prompt 64, 5 new tokens: 4 decode steps, the cache ends at 68 tokens.
    # Left alive after the stream: the weights (1,235,814,400 parameters x 2 B, tied head), the cuBLAS workspace
    # (33,554,432 B on an H200, the traced engine's, kept from the first matmul), the prompt's
    # embeddings (2 x 64 x 2048 x 2 = 524,288), RoPE cos and sin (2 x 64 x 64 x 2 = 16,384), the cache
    # (16 layers x 2 (K, V) x 2 x 68 x 512 (8 K/V heads x 64) x 2 = 4,456,448) and the last fp32 scores
    # (2 x 128,256 x 4 = 1,026,048)
    g = GenerateCall.of(resolve(_doc()))
    weights = weight_tensors(g)
    assert sum(weights) == 1_235_814_400 * 2
    events = generate_stream(g, weights)
    assert _live_after(events) == 1_235_814_400 * 2 + 33_554_432 + 524_288 + 16_384 + 4_456_448 + 1_026_048


def test_every_block_is_freed_at_most_once() -> None:
    events = generate_stream(GenerateCall.of(resolve(_doc())), [])
    freed = [-e - 1 for e in events if e < 0]
    assert len(freed) == len(set(freed))
    assert all(0 <= i < sum(e > 0 for e in events) for i in freed)


@pytest.mark.parametrize(("doc", "replayed"), [
    (_doc(), True),
    (_doc(model="Qwen/Qwen3-30B-A3B"), False),            # mixture of experts
    (_doc(quantization="nf4"), False),                    # bitsandbytes weights
    (_doc(attention="eager"), False),
    (_doc(new_tokens=1), False),                          # no decode step
])
def test_what_is_replayed(doc: dict[str, Any], replayed: bool) -> None:
    g = GenerateCall.of(resolve(doc))
    assert applies(g) is replayed
    if not replayed:
        assert cached_excess(g).bytes == 0
    rep = estimate(doc)
    assert any(("replayed through PyTorch's caching-allocator" in a) is replayed for a in rep.assumptions
               if a.startswith("reserved bytes"))


def test_reserved_is_the_peak_plus_the_cached_excess() -> None:
    doc = _doc(batch_size=16, prompt_len=2048, new_tokens=128, model="microsoft/Phi-3.5-mini-instruct")
    rep = estimate(doc)
    g = GenerateCall.of(resolve(doc))
    assert rep.per_gpu.peak_reserved_bytes == rep.per_gpu.peak_allocated_bytes + cached_excess(g).bytes


def _row(name: str) -> dict[str, Any]:
    """A measured row, its scenario given the releases that ran (env.json: transformers 5.17, torch 2.11)."""
    for line in GPU_RUN.read_text().splitlines():
        row = json.loads(line)
        if row["id"] == name:
            result = dict(row["result"])
            result["scenario"] = {**result["scenario"], "software": {"transformers": "5.17", "torch": "2.11"}}
            return result
    raise KeyError(name)


@pytest.mark.parametrize("name", ["phi35-mini-gen-b16", "llama31-8b-gen-b8", "qwen25-7b-gen-b32"])
def test_h200_generate_reserved_within_three_percent(name: str) -> None:
    """Measured max_memory_reserved after generate on an H200 (torch 2.11, transformers 5.17); the peak's
    tensors packed into empty segments were 3.5% to 17.6% under on these calls."""
    row = _row(name)
    predicted = estimate(row["scenario"]).per_gpu.peak_reserved_bytes
    measured = row["peak_reserved_bytes"]
    assert abs(predicted - measured) / measured < 0.03


GPU_RUNS = sorted(p for pat in ("h200-2026-11-26*", "h100-2026-11-26*", "h100-2026-11-27*")
                  for p in GPU_RUN.parents[1].glob(pat))
# the replayed call whose layer is not the replayed one: OLMo 2 normalizes after each sublayer (post_norms) and over
# the whole q/k projections; -12.0% (-11.2% with the former simplified layer)
REPLAYED_OUTSIDE = {"olmo2-7b-gen-b8"}


def _replayed_rows() -> list[tuple[str, dict[str, Any], int]]:
    """(id, scenario with the releases that ran, measured reserved bytes) of every replayed generate call."""
    out = []
    for run in GPU_RUNS:
        env = json.loads((run / "env.json").read_text())
        sw = {k: ".".join(str(env[k]).split("+")[0].split(".")[:2]) for k in ("transformers", "torch")}
        for line in (run / "results.jsonl").read_text().splitlines():
            row = json.loads(line)
            res = row["result"]
            if not res or res["scenario"]["task"] != "inference":
                continue
            sc = {**res["scenario"], "software": sw}
            if applies(GenerateCall.of(resolve(sc))):
                out.append((row["id"], sc, res["peak_reserved_bytes"]))
    return out


def test_every_replayed_gpu_generate_call_within_four_percent_reserved() -> None:
    """The 21 replayed generate calls measured on H100/H200 (benchmarks/gpu/h200-2026-11-26*, h100-2026-11-26*,
    h100-2026-11-27*): each within 4% of the measured max_memory_reserved but OLMo 2's, and 2.5% on average.  The
    former simplified layer missed six by more (SmolLM2-1.7B b64 -21.9%, Mistral 7B v0.1 s8192 -6.1%, Gemma 2 2B
    -5.7%, Mistral 7B v0.3 -4.7%, Llama 3.1 8B s32k -4.4%, Qwen2.5 7B s16k +4.1%) and averaged 4.0%."""
    rows = _replayed_rows()
    assert len(rows) == 21
    errs = {sid: (estimate(sc).per_gpu.peak_reserved_bytes - meas) / meas for sid, sc, meas in rows}
    assert {sid for sid, e in errs.items() if abs(e) >= 0.04} == REPLAYED_OUTSIDE, errs
    assert sum(map(abs, errs.values())) / len(errs) < 0.025


def test_growth_late_in_the_call_is_stated_and_widens_the_band() -> None:
    # SmolLM2-1.7B, batch 64, prompt 512, 128 new tokens: the replay's excess doubles between step 63 and
    # step 127 (measured on an H200 the call kept 28% more reserved than the estimate): stated, band widened
    grows = estimate(_doc(model="HuggingFaceTB/SmolLM2-1.7B-Instruct", batch_size=64, prompt_len=512,
                          new_tokens=128))
    assert any(a.startswith("not modelled: the allocator's cached excess") for a in grows.assumptions)
    # Llama 3 8B, batch 8, prompt 2048, 256 new tokens: the excess is set by the first steps
    flat = estimate(_doc(model="meta-llama/Meta-Llama-3-8B", batch_size=8, prompt_len=2048, new_tokens=256))
    assert not any(a.startswith("not modelled") for a in flat.assumptions)
    assert (grows.band["classes"]["reserved"]["factor_high"]
            > flat.band["classes"]["reserved"]["factor_high"])


# a Llama layer small enough to write out: hidden 32, 4 query heads and 2 K/V heads of 8, MLP width 64, vocabulary 99
LLAMA_TINY: dict[str, Any] = {"model_type": "llama", "vocab_size": 99, "hidden_size": 32, "intermediate_size": 64,
                              "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2}


def _tiny_call(model: dict[str, Any]) -> GenerateCall:
    return GenerateCall.of(resolve({"model": model, "task": "inference", "hardware": {"gpu": "H100"},
                                    "inference": {"batch_size": 2, "prompt_len": 10, "new_tokens": 4, "dtype": "bf16"}}))


def test_dense_layer_prefill_events_by_hand() -> None:
    # batch 2, prompt 10, bf16 (c = 2): 20 rows.  input_layernorm: fp32 copy 20 x 32 x 4 = 2,560 (id 0), pow(2) (1)
    # freed, the normalised product (2), the copy freed, the cast 20 x 32 x 2 = 1,280 (3), the weight's product (4),
    # then the cast and the normalised product freed (bound to hidden_states until the return).  q 20 x 32 x 2 = 1,280
    # (5), k and v 20 x 16 x 2 = 640 (6, 7).  q's rotation: x * cos 1,280 (8), the negated half 640 (9), rotate_half's
    # cat 1,280 (10), the half freed, * sin (11), the cat freed, the sum (12), the products freed; k's likewise over
    # 640 (13-17); then both projections freed.  The first cache update copies: keys 2 x 10 x 16 x 2 = 640 (18), values
    # (19); the rotated key and v freed.  SDPA's output 1,280 (20), no copy of it; o_proj 1,280 (21); the output, the
    # rotated query and the norm's output freed.  The residual sum 1,280 (22), o_proj's freed.  The second norm as
    # the first (23-27); gate 20 x 64 x 2 = 2,560 (28), its activation (29), gate freed, up (30), the product (31),
    # the activation and up freed; down 1,280 (32), the product and the norm's output freed; the sum (33), down and
    # the first sum freed
    from vramplan.analytic.generate_replay import _layer
    from vramplan.analytic.stream import AllocStream

    st = AllocStream()
    out, keys, values = _layer(st, _tiny_call(LLAMA_TINY), 20, -1, -1, -1, 10)
    assert (out, keys, values) == (33, 18, 19)
    assert st.events == [2560, 2560, -2, 2560, -1, 1280, 1280, -4, -3,
                         1280, 640, 640,
                         1280, 640, 1280, -10, 1280, -11, 1280, -9, -12,
                         640, 320, 640, -15, 640, -16, 640, -14, -17, -6, -7,
                         640, 640, -18, -8,
                         1280, 1280, -21, -13, -5, 1280, -22,
                         2560, 2560, -25, 2560, -24, 1280, 1280, -27, -26,
                         2560, 2560, -29, 2560, 2560, -30, -31, 1280, -32, -28, 1280, -33, -23]


def test_dense_layer_decode_holds_its_input_to_the_end() -> None:
    # one decode row per sequence (2 rows): the cache's keys and values (ids 7 and 8 given) are replaced by
    # 2 x 11 x 16 x 2 = 704 B copies, each old one freed as its new one is bound; the layer's input (id 99 given)
    # is freed last, after the residual sum of the MLP (the model's loop holds it)
    from vramplan.analytic.generate_replay import _layer
    from vramplan.analytic.stream import AllocStream

    st = AllocStream()
    _layer(st, _tiny_call(LLAMA_TINY), 2, 99, 7, 8, 11)
    assert st.events[32:36] == [704, -8, 704, -9]
    assert st.events[-1] == -100


PHI3_TINY: dict[str, Any] = {"model_type": "phi3", "vocab_size": 99, "hidden_size": 32, "intermediate_size": 64,
                             "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
                             "pad_token_id": 0}


def test_phi3_fused_projections_by_hand() -> None:
    # Phi-3 (fused qkv_proj and gate_up_proj, the rotation's cat copy), 20 rows as above: after the norm (ids 0-4),
    # qkv_proj's output 20 x (32 + 2 x 16) x 2 = 2,560 (5), q, k and v its views; q's rotation (6-10) then its cat with
    # the passed-through part, a copy 1,280 (11), the sum freed; k's (12-16, 17); nothing of the projection freed;
    # keys and values 640 (18, 19), the rotated key freed; SDPA's output (20), o_proj (21), then the output, qkv_proj's
    # output, the rotated query and the norm's output freed.  After the sum (22) and the second norm (23-27):
    # gate_up_proj 20 x 128 x 2 = 5,120 (28), the activation 2,560 (29), the product (30), the activation freed; down
    # 1,280 (31), then the product, gate_up_proj's output and the norm's output freed
    from vramplan.analytic.generate_replay import _layer
    from vramplan.analytic.stream import AllocStream

    st = AllocStream()
    _layer(st, _tiny_call(PHI3_TINY), 20, -1, -1, -1, 10)
    ev = st.events
    assert ev[9] == 2560
    assert ev[10:20] == [1280, 640, 1280, -8, 1280, -9, 1280, -7, -10, 1280]
    assert ev[20] == -11  # the sum freed once its cat copy is made
    assert ev[32:43] == [640, 640, -18, 1280, 1280, -21, -6, -12, -5, 1280, -22]
    assert ev[52:60] == [5120, 2560, 2560, -30, 1280, -31, -29, -28]


# LFM2 (gated short-convolution blocks beside attention), tests/test_families_lfm2.py's tester: hidden 32, MLP width
# int(2 x 96 / 3) = 64, 4 layers (convolution at 0 and 2, attention at 1 and 3), 4 query heads and 2 K/V heads of 8,
# conv_L_cache 3 (the config's default), vocabulary 99, tied embeddings
LFM2_TESTER: dict[str, Any] = {
    "model_type": "lfm2", "vocab_size": 99, "hidden_size": 32, "block_ff_dim": 96, "block_multiple_of": 16,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "full_attn_idxs": [1, 3]}


def _lfm2_call(**inf: Any) -> GenerateCall:
    return GenerateCall.of(resolve({"model": LFM2_TESTER, "task": "inference", "hardware": {"gpu": "H100"},
                                    "inference": {"batch_size": 2, "prompt_len": 10, "new_tokens": 4, "dtype": "bf16",
                                                  **inf}}))


def test_lfm2_generate_is_replayed_other_hybrids_are_not() -> None:
    assert applies(_lfm2_call())
    assert not applies(_lfm2_call(attention="eager"))
    qwen3next = GenerateCall.of(resolve({"model": "benchmarks/gpu/configs/qwen3next-synthetic-3b.json",
                                         "task": "inference", "hardware": {"gpu": "H100"},
                                         "inference": {"batch_size": 1, "prompt_len": 64, "new_tokens": 4}}))
    assert not applies(qwen3next) and cached_excess(qwen3next).bytes == 0


def test_lfm2_conv_block_prefill_events_by_hand() -> None:
    # batch 2, prompt 10, bf16 (c = 2): 20 rows of 32.  operator_norm: the fp32 copy 20 x 32 x 4 = 2,560 (id 0),
    # pow(2) (1) freed, the normalised product (2), the copy freed, the cast 20 x 32 x 2 = 1,280 (3), the weight's
    # product (4), then the cast and the product freed; in_proj's BCx 20 x 96 x 2 = 3,840 (5); B * x 1,280 (6); the
    # cache's zeros 2 x 32 x 3 x 2 = 384 (7); the padded convolution 2 x 32 x (10 + 2) x 2 = 1,536 (8), B * x freed;
    # y = C * conv 1,280 (9); out_proj 1,280 (10); y, the convolution, BCx and the norm's output freed; the residual sum
    # 1,280 (11), out_proj's output freed
    from vramplan.analytic.generate_replay import _short_conv_layer
    from vramplan.analytic.stream import AllocStream

    st = AllocStream()
    _, state = _short_conv_layer(st, _lfm2_call(), 20, -1, -1)
    assert state == 7
    assert st.events[:22] == [2560, 2560, -2, 2560, -1, 1280, 1280, -4, -3,
                              3840, 1280, 384, 1536, -7, 1280, 1280, -10, -9, -6, -5, 1280, -11]


def test_lfm2_conv_block_decode_events_by_hand() -> None:
    # one token of 2 sequences: the norm as above over 2 rows (256 fp32, 128 bf16); BCx 2 x 96 x 2 = 384 (5); B * x
    # 128 (6); causal_conv1d_update's cat of the state and the token 2 x 32 x (3 + 1) x 2 = 512 (7); its convolution
    # 2 x 32 x 2 x 2 = 256 (8), the cat freed at its return, then B * x; y 128 (9), out_proj 128 (10); no new state
    from vramplan.analytic.generate_replay import _short_conv_layer
    from vramplan.analytic.stream import AllocStream

    st = AllocStream()
    _, state = _short_conv_layer(st, _lfm2_call(), 2, -1, 99)
    assert state == 99
    assert st.events[9:20] == [384, 128, 512, 256, -8, -7, 128, 128, -10, -9, -6]


def test_lfm2_stream_leaves_the_weights_workspace_inputs_caches_and_scores() -> None:
    # batch 2, prompt 10, 4 new tokens (3 decode steps, the cache ends at 13 tokens), bf16.  Alive after the stream:
    # the weights; the cuBLAS workspace (33,554,432 B on an H100, the traced engine's); the prompt's embeddings
    # 2 x 10 x 32 x 2 = 1,280; RoPE cos and sin 2 x 10 x 8 x 2 = 320; the attention layers' caches, each prefill and
    # step a torch.cat copy, 2 layers x 2 (K, V) x 2 x 13 x 16 x 2 = 3,328; the convolution states 2 layers x 2 x 32
    # x 3 x 2 = 768; the last fp32 scores 2 x 99 x 4 = 792
    g = _lfm2_call()
    weights = weight_tensors(g)
    assert sum(weights) == 2 * g.m.num_parameters
    events = generate_stream(g, weights)
    assert _live_after(events) == sum(weights) + 33_554_432 + 1_280 + 320 + 3_328 + 768 + 792
    freed = [-e - 1 for e in events if e < 0]
    assert len(freed) == len(set(freed))


LFM2_SYNTH = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "configs" / "lfm2-synthetic-1b.json"


@pytest.mark.parametrize(("hidden", "layer_types", "batch", "prompt", "new"), [
    (512, ["conv", "full_attention", "conv", "full_attention"], 4, 1024, 8),
    (1024, ["conv", "conv", "full_attention", "conv"], 2, 2048, 8),
    (512, ["conv", "full_attention", "conv", "full_attention"], 8, 512, 20),
])
def test_lfm2_reserved_agrees_with_the_traced_engine(hidden: int, layer_types: list[str], batch: int, prompt: int,
                                                     new: int) -> None:
    """Reserved bytes of the analytic engine (live peak + the replay's cached excess) against the traced engine's
    (every real call replayed) on small LFM2 shapes (the H100 run's synthetic config, narrowed): within 2 MiB, the
    small pool's segment, where the traced engine's sub-MiB tensors that the replay leaves out (the norms' row
    statistics, position ids, the RoPE tables' intermediates) are carved (1,050,112 B apart on the first and third
    shapes, 768 B on the second); the cached excess itself is 17 to 40 MB there, so a packed-only estimate fails."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.trace.engine import estimate as traced

    cfg = {**json.loads(LFM2_SYNTH.read_text()), "hidden_size": hidden, "num_hidden_layers": len(layer_types),
           "layer_types": layer_types, "intermediate_size": 3 * hidden, "vocab_size": 4096,
           "num_attention_heads": hidden // 64, "num_key_value_heads": max(1, hidden // 256)}
    doc = {"task": "inference", "model": cfg, "hardware": {"gpu": "H100"},
           "inference": {"batch_size": batch, "prompt_len": prompt, "new_tokens": new, "dtype": "bf16"},
           "software": {"transformers": "5.17", "torch": "2.11"}}
    a, t = estimate(doc).per_gpu, traced(doc).per_gpu
    assert a.peak_reserved_bytes - a.peak_allocated_bytes > 16 * 2**20
    assert abs(a.peak_reserved_bytes - t.peak_reserved_bytes) <= 2 * 2**20


def test_dense_reserved_agrees_with_the_traced_engine() -> None:
    """Reserved bytes of the analytic engine (live peak + the replay's cached excess) against the traced engine's on
    Llama 3.2 1B, batch 8, prompt 1024, 2 new tokens (the prefill and one decode step, which the trace runs as
    generate does): within 2 MiB, the small pool's segment (1,048,576 B apart).  The replay's former simplified
    layer (the first cache update storing the new tensors, a copy of SDPA's output, the norm's fp32 product freed
    early, the layer's input freed after the attention) was 34,603,008 B under."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.trace.engine import estimate as traced

    doc = {"task": "inference", "model": "meta-llama/Llama-3.2-1B", "hardware": {"gpu": "H100"},
           "inference": {"batch_size": 8, "prompt_len": 1024, "new_tokens": 2, "dtype": "bf16"},
           "software": {"transformers": "5.17", "torch": "2.11"}}
    a, t = estimate(doc).per_gpu, traced(doc).per_gpu
    assert abs(a.peak_reserved_bytes - t.peak_reserved_bytes) <= 2 * 2**20


def test_a_mixer_kind_not_replayed_is_refused_by_the_stream() -> None:
    g = GenerateCall.of(resolve({"model": "benchmarks/gpu/configs/qwen3next-synthetic-3b.json", "task": "inference",
                                 "hardware": {"gpu": "H100"},
                                 "inference": {"batch_size": 1, "prompt_len": 64, "new_tokens": 4}}))
    with pytest.raises(ValueError, match="gated_deltanet layers are not replayed"):
        generate_stream(g, [])


def test_a_remembered_replay_is_the_replay_of_the_same_stream() -> None:
    """``_excess`` keeps each replay's result under everything the stream reads: calls that differ in one of them
    (the GPU's cuBLAS workspace, the rows, the prompt, the new tokens, the model, the dtype) get their own replay,
    equal to a fresh one; the same job on another GPU of the same workspace reuses it."""
    from vramplan.analytic import generate_replay

    docs = [_doc(), _doc(gpu="A10G"), _doc(gpu="H100-SXM"), _doc(batch_size=3), _doc(prompt_len=65),
            _doc(new_tokens=9), _doc(model="Qwen/Qwen2.5-0.5B"), _doc(dtype="fp16"), _doc(gpu="L4")]
    calls = [GenerateCall.of(resolve(d)) for d in docs]
    generate_replay._EXCESS.clear()
    warm = [cached_excess(g) for g in calls]
    fresh = []
    for g in calls:
        generate_replay._EXCESS.clear()
        fresh.append(cached_excess(g))
    assert warm == fresh
    # an H200 and an H100 take the same 32 MiB workspace (sm90): one replay serves both
    generate_replay._EXCESS.clear()
    cached_excess(calls[0])
    n = len(generate_replay._EXCESS)
    cached_excess(calls[2])
    assert len(generate_replay._EXCESS) == n
