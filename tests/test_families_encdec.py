"""Encoder-decoder families (spec/families/t5.py, spec/families/bart.py): parameters by hand and, tensor name by
tensor name, against transformers' ``AutoModelForSeq2SeqLM`` built on the meta device; the encoder stack's record
(``ModelSpec.encoder_decoder``); and the tasks vramplan refuses for them, with the reason."""

from __future__ import annotations

import re
from typing import Any

import pytest

from meta_build import generate_phase_peaks, meta_module
from vramplan.analytic.moment import K
from vramplan.catalog.resolve import resolve
from vramplan.errors import ScenarioError
from vramplan.spec.hf_config import model_from_config

# google-t5/t5-small's shape (T5 v1.0: relu feed-forward, tied head)
T5_SMALL: dict[str, Any] = {"model_type": "t5", "d_model": 512, "d_ff": 2048, "num_layers": 6, "num_heads": 8,
                            "d_kv": 64, "vocab_size": 32128, "feed_forward_proj": "relu"}
# google/flan-t5-base's shape (T5 v1.1: gated-gelu, the config's tie_word_embeddings false)
FLAN_T5_BASE: dict[str, Any] = {"model_type": "t5", "d_model": 768, "d_ff": 2048, "num_layers": 12,
                                "num_decoder_layers": 12, "num_heads": 12, "d_kv": 64, "vocab_size": 32128,
                                "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False}
# facebook/bart-large's shape (BartConfig's defaults)
BART_LARGE: dict[str, Any] = {"model_type": "bart", "d_model": 1024, "vocab_size": 50265}

CASES: list[dict[str, Any]] = [
    T5_SMALL, FLAN_T5_BASE,
    # d_kv x heads != d_model, fewer decoder than encoder layers
    {"model_type": "t5", "d_model": 64, "d_ff": 96, "num_layers": 3, "num_decoder_layers": 2, "num_heads": 4,
     "d_kv": 24, "vocab_size": 100},
    {"model_type": "mt5", "d_model": 64, "d_ff": 96, "num_layers": 3, "num_heads": 4, "d_kv": 16, "vocab_size": 100},
    {"model_type": "umt5", "d_model": 64, "d_ff": 96, "num_layers": 3, "num_decoder_layers": 4, "num_heads": 4,
     "d_kv": 16, "vocab_size": 100, "tie_word_embeddings": False},
    {"model_type": "bart", "d_model": 64, "vocab_size": 100, "encoder_layers": 2, "decoder_layers": 3,
     "encoder_attention_heads": 4, "decoder_attention_heads": 2, "encoder_ffn_dim": 80, "decoder_ffn_dim": 96,
     "max_position_embeddings": 50},
    # untied: BartModel's encoder/decoder embed_tokens and the lm_head are tensors of their own
    {"model_type": "bart", "d_model": 64, "vocab_size": 100, "encoder_layers": 2, "decoder_layers": 3,
     "encoder_attention_heads": 4, "decoder_attention_heads": 4, "max_position_embeddings": 50,
     "tie_word_embeddings": False},
    BART_LARGE,
]


def _by_name(module: Any) -> dict[str, int]:
    """The module's parameters summed per name with the block / layer index dropped (the adapters' row names)."""
    out: dict[str, int] = {}
    for name, p in module.named_parameters():
        key = re.sub(r"\.(block|layers)\.\d+\.", r".\1.", name)
        out[key] = out.get(key, 0) + p.numel()
    return out


@pytest.mark.parametrize("cfg", CASES, ids=lambda c: f"{c['model_type']}-{c['d_model']}-{c.get('tie_word_embeddings', '')}")
def test_rows_equal_transformers_module_on_the_meta_device(cfg: dict[str, Any]) -> None:
    spec = model_from_config(cfg)
    module = meta_module(cfg, "AutoModelForSeq2SeqLM")
    assert {p.name: p.total for p in spec.params} == _by_name(module)
    assert spec.num_parameters == sum(p.numel() for p in module.parameters())


def test_t5_small_by_hand() -> None:
    m = model_from_config(T5_SMALL, name="t5-small")
    # V = 32,128, d = 512, d_ff = 2,048, 6 + 6 layers, 8 heads of 64 (inner 512), 32 buckets:
    # shared 32,128 x 512 = 16,449,536
    # encoder layer: q, k, v, o 4 x 512 x 512 = 1,048,576; 2 norms 1,024; wi, wo 2 x 512 x 2,048 = 2,097,152
    #   = 3,146,752; x 6 = 18,880,512; + bias table 32 x 8 = 256, final norm 512 -> 18,881,280
    # decoder layer: 2 attentions 2,097,152; 3 norms 1,536; wi, wo 2,097,152 = 4,195,840; x 6 = 25,175,040
    #   + 256 + 512 -> 25,175,808
    # 16,449,536 + 18,881,280 + 25,175,808 = 60,506,624
    assert m.num_parameters == 60_506_624
    assert m.encoder_parameters == 18_881_280
    ed = m.encoder_decoder
    assert ed is not None and ed.encoder_layers == 6 and m.num_layers == 6
    assert (ed.relative_bias_layers, ed.relative_attention_num_buckets) == ("first", 32)
    assert not m.mlp_gated and m.hidden_act == "relu" and m.position == "relative" and m.norm == "rms"
    assert ed.encoder.num_attention_heads == 8 and ed.encoder.intermediate_size == 2048
    bias = [p for p in m.params if p.name.endswith("relative_attention_bias.weight")]
    # the first block of each stack only (T5Stack: has_relative_attention_bias=bool(i == 0))
    assert [(p.name.split(".")[0], p.layer_span) for p in bias] == [("encoder", (0,)), ("decoder", (0,))]
    assert m.summary()["encoder_decoder"] == {"encoder_layers": 6, "decoder_layers": 6,
                                              "encoder_parameters": 18_881_280}


def test_flan_t5_base_ties_the_head_as_transformers_5_24_does() -> None:
    m = model_from_config(FLAN_T5_BASE, name="flan-t5-base")
    # gated-gelu: wi_0, wi_1, wo; the checkpoint's separate lm_head (32,128 x 768 = 24,674,304) is tied to shared
    # by T5Config.__post_init__: 247,577,856 in the checkpoint, 247,577,856 - 24,674,304 = 222,903,552 held
    assert m.num_parameters == 222_903_552
    assert m.mlp_gated and m.hidden_act == "gelu_new" and m.tie_word_embeddings
    assert not any(p.role == "lm_head" for p in m.params)
    assert any("T5Config.__post_init__ forces tie_word_embeddings = True" in n for n in m.notes)
    # kept for transformers 4.x, which honours the key (spec/checks.py refuses it there)
    assert m.encoder_decoder is not None and m.encoder_decoder.config_untied_head
    tied = model_from_config({k: v for k, v in FLAN_T5_BASE.items() if k != "tie_word_embeddings"}, name="tied")
    assert tied.encoder_decoder is not None and not tied.encoder_decoder.config_untied_head


def test_umt5_holds_a_bias_table_in_every_self_attention() -> None:
    m = model_from_config({"model_type": "umt5", "d_model": 64, "d_ff": 96, "num_layers": 3, "num_decoder_layers": 4,
                           "num_heads": 4, "d_kv": 16, "vocab_size": 100})
    bias = {p.name.split(".")[0]: p.total for p in m.params if p.name.endswith("relative_attention_bias.weight")}
    # 32 buckets x 4 heads = 128 per layer: 3 encoder, 4 decoder layers
    assert bias == {"encoder": 3 * 128, "decoder": 4 * 128}
    assert m.encoder_decoder is not None and m.encoder_decoder.relative_bias_layers == "every"
    # MT5Config / UMT5Config default to gated-gelu
    assert m.mlp_gated


def test_bart_large_by_hand() -> None:
    m = model_from_config(BART_LARGE, name="bart-large")
    # V = 50,265, d = 1,024, ffn 4,096, 12 + 12 layers, 1,024 positions (+ 2 offset rows):
    # shared 50,265 x 1,024 = 51,471,360
    # encoder layer: q, k, v, out 4 x (1,024^2 + 1,024) = 4,198,400; 2 LayerNorms 4,096; fc1 4,198,400;
    #   fc2 4,195,328 = 12,596,224; x 12 = 151,154,688; + positions 1,026 x 1,024 = 1,050,624 and
    #   layernorm_embedding 2,048 -> 152,207,360
    # decoder layer: + encoder_attn 4,198,400 and its LayerNorm 2,048 = 16,796,672; x 12 = 201,560,064
    #   + 1,052,672 -> 202,612,736
    # 51,471,360 + 152,207,360 + 202,612,736 = 406,291,456
    assert m.num_parameters == 406_291_456
    assert m.encoder_parameters == 152_207_360
    assert m.position == "learned" and m.norm == "layer" and m.tie_word_embeddings
    assert m.encoder_decoder is not None and m.encoder_decoder.relative_bias_layers == "none"
    assert any("final_logits_bias" in n for n in m.notes)


def test_a_feed_forward_proj_transformers_rejects_is_refused() -> None:
    with pytest.raises(ScenarioError, match="feed_forward_proj 'gated-gelu-x'"):
        model_from_config({**T5_SMALL, "feed_forward_proj": "gated-gelu-x"})


@pytest.mark.parametrize("cfg", [{**T5_SMALL, "d_model": -8}, {**T5_SMALL, "num_heads": 0},
                                 {**T5_SMALL, "d_ff": 1 << 21}, {**BART_LARGE, "d_model": True},
                                 {**BART_LARGE, "decoder_layers": 0}])
def test_sizes_under_the_family_spellings_are_bounded(cfg: dict[str, Any]) -> None:
    # d_model is also checked for every family (hf_config._POSITIVE, DBRX's spelling): either message names it
    with pytest.raises(ScenarioError, match="must be (positive integers of at most 1,048,576|a positive integer)"):
        model_from_config(cfg)


def test_bart_heads_that_do_not_divide_the_width_are_refused() -> None:
    with pytest.raises(ScenarioError, match="d_model 100 is not divisible by 16 heads"):
        model_from_config({"model_type": "bart", "d_model": 100, "vocab_size": 10})


@pytest.mark.parametrize(("task", "words"), [
    ("serve", "vLLM served BART and Whisper only in some releases"),
])
def test_tasks_not_modelled_are_refused_with_the_reason(tmp_path: Any, task: str, words: str) -> None:
    import json

    (tmp_path / "config.json").write_text(json.dumps(T5_SMALL))
    with pytest.raises(ScenarioError) as err:
        resolve({"model": str(tmp_path / "config.json"), "hardware": {"gpu": "H100-80GB"}, "task": task})
    text = str(err.value)
    assert "is an encoder-decoder model (6 encoder layers, 6 decoder layers with cross-attention)" in text
    assert words in text


# ---- generate (analytic/encoder_decoder.py) -------------------------------------------------------------------------


def _generate(raw: dict[str, Any], **inference: Any) -> Any:
    from vramplan.analytic.generate import generate_step

    doc = {"model": raw, "hardware": {"gpu": "H100-80GB"}, "task": "inference", "inference": inference}
    return generate_step(resolve(doc))


def _parts(mo: Any, drop: tuple[str, ...] = ()) -> dict[str, int]:
    return {k: v for part in mo.parts.values() for k, v in part.items() if k not in drop}


def test_flan_t5_base_generate_by_hand() -> None:
    res = _generate(FLAN_T5_BASE, batch_size=1, prompt_len=512, new_tokens=128, dtype="bf16")
    enc_layer, buckets, first, first_logits, last = res.moments
    assert [mo.phase for mo in res.moments] == ["encoder", "encoder", "prefill", "prefill", "decode"]
    # h = q = 768 (12 heads x 64), I = 2,048, 12 + 12 layers, V = 32,128, b = 1, S = 512, c = 2
    # kept by the encoder: inputs_embeds 512 x 768 x 2 = 786,432 and the bias 12 x 512^2 x 2 = 6,291,456
    # running layer (from the second on): at SDPA (768 + 768 + 4 x 768) x 512 x 2 + 6,291,456 = 11,010,048; at o
    # (768 + 2 x 768 + 4 x 768) x 1,024 = 5,505,024; the gated gelu_new MLP (768 + 2 x 768 + 4 x 2,048) x 1,024 =
    # 10,747,904; at wo (768 + 3 x 768 + 2,048) x 1,024 = 5,242,880
    assert _parts(enc_layer) == {"parameters": 222_903_552 * 2,
                                 "encoder embeddings (kept by the encoder's forward)": 786_432 + 6_291_456,
                                 "encoder running layer": 11_010_048,
                                 "cuBLAS workspaces": enc_layer.get(K.CUBLAS)}
    # the first layer's buckets: 512^2 x 49 = 12,845,056, the positions 16 x 512 = 8,192, the normalised input and
    # q, k, v (768 + 3 x 768) x 1,024 = 3,145,728 -> 15,998,976, beside inputs_embeds alone
    assert buckets.get(K.ENCODER_LAYER) == 15_998_976 and buckets.get(K.ENCODER_KEPT) == 786_432
    # first decoder step: the encoder output 786,432; the cross cache 12 x 2 x 512 x 768 x 2 = 18,874,368; one
    # token's self cache 12 x 2 x 768 x 2 = 36,864; the last layer's k and v projections 2 x 512 x 768 x 2 =
    # 1,572,864 and the step's tensors (4 x 768 + 768) x 2 + 12 x 513 x 2 = 19,992
    assert _parts(first, ("parameters", "cuBLAS workspaces")) == {
        "encoder output (kept by generate)": 786_432,
        "cross-attention keys and values (encoder output)": 18_874_368, "all tokens": 36_864,
        "cross-attention keys and values being cached (one layer)": 1_572_864,
        "decoder layer (one token per sequence)": 19_992}
    # then the step's logits, 32,128 x (2 + 4 + 26) = 1,028,096, once the layers are done
    assert first_logits.get(K.LAST_LOGITS) == 1_028_096 and not first_logits.get(K.CROSS_KV_WRITE)
    # last decode step: 128 tokens' self cache 12 x 2 x 128 x 768 x 2 = 4,718,592, one layer's keys growing
    # 128 x 768 x 2 = 196,608, the logits 32,128 x (2 + 4 + 26) = 1,028,096
    assert _parts(last, ("parameters", "cuBLAS workspaces")) == {
        "encoder output (kept by generate)": 786_432,
        "cross-attention keys and values (encoder output)": 18_874_368, "all tokens": 4_718_592,
        "cache growth (torch.cat of one layer)": 196_608, "last-token logits and sampling": 1_028_096}
    assert res.peak is last
    assert res.final_cache_bytes == 4_718_592 + 18_874_368


def test_bart_generate_logits_add_the_final_bias() -> None:
    res = _generate(BART_LARGE, batch_size=2, prompt_len=100, new_tokens=20, dtype="fp16")
    last = res.moments[-1]
    # 2 x 50,265 x (2 + 4 + 26) = 3,216,960 and lm_logits + final_logits_bias, 2 x 50,265 x 2 = 201,060
    assert last.get(K.LAST_LOGITS) == 3_216_960 + 201_060
    # BART's encoder keeps inputs_embeds and the positions, 2 x (2 x 100 x 1,024 x 2) = 819,200; its running layer
    # is the MLP, (2 x 1,024 + 2 x 4,096) x 200 x 2 = 4,096,000 (at out_proj 6 x 1,024 x 400 = 2,457,600)
    enc = res.moments[0]
    assert (enc.get(K.ENCODER_KEPT), enc.get(K.ENCODER_LAYER)) == (819_200, 4_096_000)
    assert len(res.moments) == 4  # no bias buckets


TINY_T5 = {"model_type": "t5", "d_model": 64, "d_ff": 96, "num_layers": 3, "num_decoder_layers": 3, "num_heads": 4,
           "d_kv": 24, "vocab_size": 500, "decoder_start_token_id": 0}
TINY_BART = {"model_type": "bart", "d_model": 64, "vocab_size": 500, "encoder_layers": 2, "decoder_layers": 3,
             "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 96, "decoder_ffn_dim": 128,
             "max_position_embeddings": 256, "forced_eos_token_id": None, "forced_bos_token_id": None}


def _tracked(raw: dict[str, Any], b: int, s: int, n: int, dtype: str) -> tuple[int, int, int]:
    """transformers 5.24's generate of ``raw`` (random weights, in ``dtype``, SDPA) on the CPU, counted storage by storage
    (trace/tracker.py) beyond the weights, buffers and input ids: (the encoder's peak, the first decoder step's peak
    up to its last cross-attention write, the peak of the decoder steps)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = transformers.AutoModelForSeq2SeqLM.from_config(transformers.AutoConfig.for_model(**raw),
                                                             attn_implementation="sdpa").eval()
    model = model.to({"fp32": torch.float32, "bf16": torch.bfloat16}[dtype])
    ids = torch.randint(5, 400, (b, s))
    q = model.config.d_model if raw["model_type"] == "bart" else raw["num_heads"] * raw["d_kv"]
    c = 4 if dtype == "fp32" else 2
    # the first step's last cross-attention write: b x S x q x c bytes
    return generate_phase_peaks(model, {"input_ids": ids}, n, b * s * q * c)


@pytest.mark.parametrize(("raw", "b", "s", "dtype", "extra_encoder", "extra_first"), [
    # T5, relu: the encoder's peak is a layer's SDPA call; the CPU's flash kernel also returns its fp32 logsumexp
    # (b x heads x S x 4 = 2 x 4 x 40 x 4 = 1,280 B), which CUDA's kernels do not make without grad; 3 scalar tensors
    # (24 B) generate lifts; the decoder steps add generate's three int64 tensors of one entry per sequence (its
    # decoder ids, unfinished_sequences and their copies: 3 x 8 x b B)
    (TINY_T5, 2, 40, "fp32", 1_280 + 24, 24 + 3 * 8 * 2),
    # the same in bf16: T5LayerNorm's fp32 upcast runs, and the first layer's bias buckets (int64, whatever the dtype)
    # are now the encoder's peak
    (TINY_T5, 2, 40, "bf16", 24, 24 + 3 * 8 * 2),
    # T5, gated-gelu, a longer source: the peak is the first layer's bias buckets (no kernel output alive)
    ({**TINY_T5, "feed_forward_proj": "gated-gelu"}, 1, 200, "fp32", 24, 24 + 3 * 8 * 1),
    # BART: 4 scalar tensors (32 B); the per-sequence int64 tensors and an 8 B position offset
    (TINY_BART, 2, 40, "fp32", 32, 32 + 3 * 8 * 2 + 8),
    # wide MLPs, so that the encoder's peak is its MLP (no kernel output alive): T5's block input, attention sum,
    # normalised copy, wi's and the ReLU's outputs; BART's layer input, residual, fc1's and the GELU's outputs
    ({**TINY_T5, "d_ff": 700}, 2, 40, "fp32", 24, 24 + 3 * 8 * 2),
    # gated gelu_new: wi_0's output and the three I-wide temporaries of its chain of elementwise ops
    ({**TINY_T5, "d_ff": 700, "feed_forward_proj": "gated-gelu"}, 2, 40, "fp32", 24, 24 + 3 * 8 * 2),
    ({**TINY_BART, "encoder_ffn_dim": 700}, 2, 40, "fp32", 32, 32 + 3 * 8 * 2 + 8),
    (TINY_BART, 2, 40, "bf16", 32, 32 + 3 * 8 * 2 + 8),
], ids=["t5", "t5-bf16", "t5-gated-long", "bart", "t5-wide-mlp", "t5-gated-wide-mlp", "bart-wide-mlp",
                           "bart-bf16"])
def test_generate_against_transformers_on_the_cpu(raw: dict[str, Any], b: int, s: int, dtype: str,
                                                  extra_encoder: int, extra_first: int) -> None:
    n = 6
    enc, first, decode = _tracked(raw, b, s, n, dtype)
    res = _generate(raw, batch_size=b, prompt_len=s, new_tokens=n, dtype=dtype)
    outside = ("parameters", "cuBLAS workspaces")
    modelled = {mo.phase: 0 for mo in res.moments}
    for mo in res.moments:
        modelled[mo.phase] = max(modelled[mo.phase], sum(_parts(mo, outside).values()))
    write = next(mo for mo in res.moments if mo.get(K.CROSS_KV_WRITE))
    assert enc - modelled["encoder"] == extra_encoder
    assert first - sum(_parts(write, outside).values()) == extra_first
    # every later step is covered: the last step's moment is an upper bound (the logits' top-k/top-p sampling, 26 B
    # per entry, is assumed where this greedy call runs none, and the cache's growth is counted beside the logits)
    assert max(modelled["prefill"], modelled["decode"]) + extra_first >= decode


def test_generate_settings_not_modelled_are_refused() -> None:
    with pytest.raises(ScenarioError, match="modelled under SDPA only, not 'eager'"):
        _generate(T5_SMALL, attention="eager")
    with pytest.raises(ScenarioError, match="its generate is modelled on one GPU only"):
        resolve({"model": T5_SMALL, "hardware": {"gpu": "H100-80GB", "num_gpus": 2}, "task": "inference",
                 "parallel": {"tp": 2}})
    # transformers 5.24 builds the cache for num_layers (3) layers; the decoder's fourth finds none
    with pytest.raises(ScenarioError, match="the cache is built for num_layers = 3 layers and the decoder has 4"):
        _generate({**TINY_T5, "num_decoder_layers": 4})


def test_t5_bias_mask_padded_for_the_memory_efficient_kernel() -> None:
    from vramplan.analytic.encoder_decoder import encoder_layer_bytes

    m = model_from_config(FLAN_T5_BASE)
    # S = 500 (not a multiple of 8): at the SDPA call, besides (768 + 768 + 4 x 768) x 500 x 2 = 4,608,000 and the
    # contiguous bias 12 x 500^2 x 2 = 6,000,000, its copy padded to 504 keys a row, 12 x 500 x 504 x 2 = 6,048,000
    assert encoder_layer_bytes(m, 1, 500, 2) == 4_608_000 + 6_000_000 + 6_048_000


def test_bf16_before_sm80_is_refused() -> None:
    from vramplan.analytic.generate import generate_step

    r = resolve({"model": T5_SMALL, "hardware": {"gpu": "V100-32GB"}, "task": "inference",
                 "inference": {"dtype": "bf16"}})
    with pytest.raises(ScenarioError, match="runs its math kernel here"):
        generate_step(r)


def test_bart_positions_bound_both_stacks_and_the_solver() -> None:
    from vramplan.plan.solvers import max_prompt_len

    with pytest.raises(ScenarioError, match="its encoder has learned positions for 1,024 tokens, not 1,025"):
        _generate(BART_LARGE, prompt_len=1025, new_tokens=10)
    with pytest.raises(ScenarioError, match="its decoder has learned positions for 1,024 tokens, not 2,000"):
        _generate(BART_LARGE, prompt_len=10, new_tokens=2000)
    # the source alone is bounded by the encoder's 1,024 positions (not 1,024 - new_tokens: the decoder has its own)
    r = resolve({"model": BART_LARGE, "hardware": {"gpu": "H100-80GB"}, "task": "inference",
                 "inference": {"new_tokens": 512}})
    assert max_prompt_len(r) == 1024


def test_the_traced_engine_refuses_an_encoder_decoder_model() -> None:
    from vramplan.trace.engine import trace

    with pytest.raises(ScenarioError, match="traces a causal LM's generate only"):
        trace({"model": T5_SMALL, "hardware": {"gpu": "H100-80GB"}, "task": "inference"})


def test_kv_command_states_the_cross_attention_cache() -> None:
    from vramplan.analytic.encoder_decoder import encoder_decoder_cache_note

    note = encoder_decoder_cache_note(model_from_config(T5_SMALL), 2)
    # 6 layers x 2 x 512 x 2 = 12,288 B per source token; the encoder output 512 x 2 = 1,024 B
    assert note is not None and "12,288 B per source token" in note and "1,024 B per source token" in note
