"""Families as adapters, behaviour as traits: the engines read ``ModelSpec.traits``, never a family's name, and
a family added to ``FAMILIES`` alone is estimated by the analytic engine and traced by the traced engine."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from vramplan.analytic.activations import ActContext, attention_saved
from vramplan.catalog.models import load_model
from vramplan.spec import families
from vramplan.spec.families import FAMILIES, llama_like, transformers_config
from vramplan.spec.hf_config import model_from_config
from vramplan.spec.model import Traits

SRC = Path(__file__).resolve().parents[1] / "src" / "vramplan"
# Layers below the adapter: none of them may name a family.
ENGINE_DIRS = ("analytic", "trace", "measure", "export", "plan")


def _engine_files() -> list[Path]:
    return sorted(f for d in ENGINE_DIRS for f in (SRC / d).rglob("*.py"))


def test_no_engine_file_names_model_type() -> None:
    named = [str(f.relative_to(SRC)) for f in _engine_files() if "model_type" in f.read_text(encoding="utf-8")]
    assert not named, named
    assert len(_engine_files()) > 50  # the walk found the packages (a wrong root would pass vacuously)


def test_no_engine_file_branches_on_the_family_name() -> None:
    # ``ModelSpec.family`` is for display (a note, a report); a comparison with it is a model_type test renamed
    branch = re.compile(r"\.family\s*(==|!=|\bin\b|\bnot in\b)")
    hits = [f"{f.relative_to(SRC)}:{i}" for f in _engine_files()
            for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1) if branch.search(line)]
    assert hits == []


def test_every_registered_family_names_its_modeling_file() -> None:
    assert len(FAMILIES) == 80  # 41 + llava, qwen2_vl, llava_next, mllama, paligemma, mistral3, idefics3, smolvlm,
    # qwen3_vl, qwen3_vl_moe, internvl, granitemoehybrid, nemotron_h; + t5, mt5, umt5, bart; + whisper; + mamba2,
    # mamba, falcon_mamba; + falcon_h1; + dbrx, hunyuan_v1_moe; + llama4_text, llama4; + jamba; + qwen3_next, lfm2;
    # + zamba2, recurrent_gemma, minimax; + rwkv; + qwen3_omni_moe; + gemma3n_text, gemma3n; + phi4_multimodal; + glm, glm4
    for model_type, fam in FAMILIES.items():
        assert re.fullmatch(r"modeling_\w+\.py", fam.modeling), model_type


def test_traits_are_set_by_the_adapters() -> None:
    phi3 = load_model("microsoft/Phi-3-mini-4k-instruct")
    assert phi3.traits.fused_gate_up and phi3.traits.qkv_modules == ("qkv_proj",)
    # modeling_phi3.py 5.24 line 184: q_embed = torch.cat([(q_rot * cos) + (rotate_half(q_rot) * sin), q_pass], dim=-1)
    assert phi3.traits.rotary_cat_copy
    oss = load_model("openai/gpt-oss-20b")
    assert "sdpa" not in oss.traits.attention_kernels and not oss.traits.experts_are_linears
    mixtral = load_model("mistralai/Mixtral-8x7B-v0.1")
    assert dict(mixtral.traits.expert_module_aliases) == {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
    gemma2 = load_model("google/gemma-2-2b")
    assert gemma2.traits.attn_logit_softcap and gemma2.final_logit_softcapping == 30.0
    # Gemma 3's configs hold no soft-cap: neither trait is set
    gemma3 = load_model("google/gemma-3-1b-pt")
    assert not gemma3.traits.attn_logit_softcap and gemma3.final_logit_softcapping is None
    assert load_model("tiiuae/falcon-7b").traits.mqa_sdpa_math
    # transformers 4.38.2 LlamaModel.__init__ registers a causal_mask buffer (4.37.2 and 4.39.3 do not); Mistral's none
    assert load_model("meta-llama/Llama-3.1-8B").traits == Traits(upcasts_all_logits=True,
                                                                  causal_mask_buffer_in=((4, 38), (4, 39)),
                                                                  rope_cache_in=((4, 28), (4, 41)),
                                                                  rope_cache_fp32_before=(4, 31),
                                                                  norm_embed_names=True)
    assert load_model("mistralai/Mistral-7B-v0.1").traits.causal_mask_buffer_in is None


def test_gemma2_without_attention_softcap_config() -> None:
    # transformers' Gemma2Attention soft-caps only when attn_logit_softcapping is set (default 50.0)
    cfg = {"model_type": "gemma2", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
           "vocab_size": 512, "intermediate_size": 512}
    assert model_from_config(cfg).traits.attn_logit_softcap
    assert not model_from_config({**cfg, "attn_logit_softcapping": None}).traits.attn_logit_softcap


def test_transformers_config_names_the_building_classes(monkeypatch: pytest.MonkeyPatch) -> None:
    gemma3 = {"model_type": "gemma3", "text_config": {"model_type": "gemma3_text", "hidden_size": 8,
                                                      "rope_scaling": None}, "tie_word_embeddings": True}
    assert transformers_config(gemma3) == {"model_type": "gemma3_text", "hidden_size": 8, "tie_word_embeddings": True}
    monkeypatch.setitem(FAMILIES, "llama_softcap", _softcap_family())
    assert transformers_config({"model_type": "llama_softcap", "hidden_size": 8})["model_type"] == "llama"


# ---- a fictitious family, registered in FAMILIES alone ------------------------------------------------------

def _softcap_family() -> families.Family:
    """A Llama whose eager attention soft-caps its scores (Gemma 2's quirk): one trait changed, built by
    transformers' Llama classes."""
    variant = replace(llama_like.VARIANTS["llama"], traits=Traits(attn_logit_softcap=True))
    return llama_like.family(variant, transformers_model_type="llama")


_TINY = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
         "intermediate_size": 256, "vocab_size": 512, "max_position_embeddings": 256, "torch_dtype": "bfloat16"}


def test_fictitious_family_is_estimated(monkeypatch: pytest.MonkeyPatch) -> None:
    from vramplan.engine import estimate

    monkeypatch.setitem(FAMILIES, "llama_softcap", _softcap_family())
    fict = model_from_config({**_TINY, "model_type": "llama_softcap"})
    llama = model_from_config({**_TINY, "model_type": "llama"})
    assert fict.family == "llama_softcap" and fict.traits.attn_logit_softcap
    assert fict.params == llama.params  # the same tensors; only the behaviour differs
    # eager attention, bf16, s = 64: tanh saves its output, c x heads x s = 2 x 2 x 64 = 256 B per token more
    ctx = ActContext(compute_bytes=2, residual_bytes=4, linear_input_bytes=2, autocast=True, attention="eager",
                     gqa_repeat=False, seq_len=64)
    layer = fict.layers[0]
    assert attention_saved(fict, layer, ctx) - attention_saved(llama, layer, ctx) == 256
    doc = {"hardware": {"gpu": "h100"}, "train": {"micro_batch_size": 1, "seq_len": 64, "attention": "eager"}}
    rep_f = estimate({**doc, "model": {**_TINY, "model_type": "llama_softcap"}})
    rep_l = estimate({**doc, "model": {**_TINY, "model_type": "llama"}})
    assert rep_f.model["model_type"] == "llama_softcap"
    assert rep_f.model["parameters"] == rep_l.model["parameters"]
    # the forward pass's peak holds both layers' saved tensors: 2 layers x 64 tokens x 256 B = 32,768 B more
    assert rep_f.per_gpu.phases["forward"] - rep_l.per_gpu.phases["forward"] == 32_768


def test_fictitious_family_is_traced(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.catalog.resolve import resolve
    from vramplan.trace.engine import trace

    monkeypatch.setitem(FAMILIES, "llama_softcap", _softcap_family())
    doc = {"model": {**_TINY, "model_type": "llama_softcap"}, "hardware": {"gpu": "h100"},
           "train": {"micro_batch_size": 1, "seq_len": 64, "attention": "eager"}}
    r, st = trace(resolve(doc))
    # built by transformers' LlamaForCausalLM: every parameter the adapter counts, once, fp32 under bf16-mixed
    # (embed 512 x 128 = 65,536; layer 4 x 128^2 + 3 x 128 x 256 + 2 x 128 = 164,096, x 2; norm 128; head 65,536)
    assert r.model.num_parameters == 65_536 + 2 * 164_096 + 128 + 65_536 == 459_392
    weights = sum(e.nbytes for e in st.events if e.nbytes > 0 and e.category == "weights")
    assert weights == 4 * 459_392
    assert [ph for _, ph in st.marks] == ["forward", "backward", "optimizer", "end"]


# The tables the engines tested model_type against before the traits existed (analytic/train.py and
# analytic/inference.py, with the sources cited there): the adapters must set the same behaviour.
_NO_SDPA = {"gpt_oss"}
_DYNAMIC_CACHE_SINCE = {"falcon": (4, 45), "gpt_neox": (4, 45), "bloom": (4, 44), "gemma2": (4, 44), "opt": (4, 49),
                        "gpt2": (4, 52), "gpt_bigcode": (4, 56)}
_FLOAT_LOGITS = {"cohere", "gemma", "gemma2", "llama", "mistral", "mixtral", "olmo", "phi", "phi3", "qwen2",
                 "qwen2_moe", "starcoder2",
                 # Qwen2.5-VL's language model is the qwen2 adapter's, with its traits
                 "qwen2_5_vl",
                 # so is Qwen2-VL's (the legacy outer keys are a qwen2 text config): Qwen2VLForConditionalGeneration
                 # .forward upcast the whole output when labels are given (transformers 4.45-4.47
                 # modeling_qwen2_vl.py ``logits = logits.float()`` under ``if labels is not None``)
                 "qwen2_vl",
                 # PaliGemma's language model is the gemma adapter's (text_config model_type gemma), with its traits:
                 # PaliGemmaForConditionalGeneration held an AutoModelForCausalLM (GemmaForCausalLM, whose 4.44 head
                 # upcast the whole output) as its language_model before the PaliGemmaModel refactor
                 "paligemma",
                 # Mistral 3's language model is the mistral adapter's (text_config model_type mistral), with its
                 # traits: Mistral3ForConditionalGeneration (transformers 4.50) held an AutoModelForCausalLM
                 # (MistralForCausalLM) as its language_model, as LLaVA did, before the Mistral3Model refactor
                 "mistral3",
                 # LLaVA's and Llama 3.2 Vision's language models are the llama adapter's (text_config model_type
                 # llama; mllama_text_config), with its traits: LlavaForConditionalGeneration held an
                 # AutoModelForCausalLM (LlamaForCausalLM) as its language_model before the LlavaModel refactor,
                 # and transformers 5.24 MllamaForCausalLM.forward still upcasts the whole output
                 # (modeling_mllama.py:1255 ``self.lm_head(hidden_states).float()``)
                 "llava", "mllama",
                 # LLaVA-NeXT's language model is the same llama adapter's (spec/families/llava_next.py builds it with
                 # llava_spec): LlavaNextForConditionalGeneration held an AutoModelForCausalLM as its language_model,
                 # as LLaVA did, before the LlavaNextModel refactor
                 "llava_next"}
_COMPUTE_DTYPE_SOFTMAX = {"gpt2", "falcon"}
# RecurrentGemma's decoder layer keeps four hidden-sized tensors through its MLP (spec/families/recurrent_gemma.py:
# raw_activations, inputs_normalized, residual and the normalized MLP input, modeling_recurrent_gemma.py 511-529)
_HIDDEN_KEPT_THROUGH_MLP = {"gpt2": 4, "stablelm": 5, "recurrent_gemma": 4}


def test_traits_reproduce_the_former_model_type_tables() -> None:
    from vramplan.catalog.models import list_models

    for entry in list_models():
        m = model_from_config(entry.config, entry.id)
        t, mt = m.traits, m.family
        assert (mt in _NO_SDPA) == ("sdpa" not in t.attention_kernels), entry.id
        assert (mt == "falcon") == t.mqa_sdpa_math, entry.id
        assert (mt == "falcon") == t.eager_probs_kept_by_loop, entry.id
        # Gemma 3n soft-caps its logits too (transformers 5.24 modeling_gemma3n.py:1838-1841 and :2284-2287), its
        # value in text_config; every task of it is refused, so no engine reads it yet
        cap = entry.config.get("final_logit_softcapping", (entry.config.get("text_config") or {}).get(
            "final_logit_softcapping"))
        assert (m.final_logit_softcapping is not None) == (mt in ("gemma2", "gemma3n") and cap is not None)
        assert _DYNAMIC_CACHE_SINCE.get(mt, (4, 42)) == t.dynamic_cache_since, entry.id
        assert (mt in _FLOAT_LOGITS) == t.upcasts_all_logits, entry.id
        assert (mt == "gpt_oss") == t.clamped_glu_experts, entry.id
        assert (mt in _COMPUTE_DTYPE_SOFTMAX) == t.eager_softmax_compute_dtype, entry.id
        assert _HIDDEN_KEPT_THROUGH_MLP.get(mt, 3) == t.hidden_kept_through_mlp, entry.id
        assert (mt == "gpt2") == t.keeps_attn_output, entry.id
