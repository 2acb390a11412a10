"""Encoder-decoder families (spec/families/t5.py, spec/families/bart.py): parameters by hand and, tensor name by
tensor name, against transformers' ``AutoModelForSeq2SeqLM`` built on the meta device; the encoder stack's record
(``ModelSpec.encoder_decoder``); and the tasks vramplan refuses for them, with the reason."""

from __future__ import annotations

import re
from typing import Any

import pytest

from meta_build import meta_module
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


def test_bart_heads_that_do_not_divide_the_width_are_refused() -> None:
    with pytest.raises(ScenarioError, match="d_model 100 is not divisible by 16 heads"):
        model_from_config({"model_type": "bart", "d_model": 100, "vocab_size": 10})


@pytest.mark.parametrize(("task", "words"), [
    ("train", "train memory is not estimated for it yet"),
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
