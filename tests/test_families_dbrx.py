"""DBRX (``dbrx``, transformers 5.24 ``modeling_dbrx.py``): tensors counted by hand and against ``DbrxForCausalLM``
on the meta device, generate's prefill through the experts' loop, and training refused."""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.analytic.inference import inference_step
from vramplan.catalog.models import list_models, load_model
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.errors import ScenarioError
from vramplan.spec.families import transformers_config, typed_for_transformers
from vramplan.spec.hf_config import SUPPORTED_MODEL_TYPES, model_from_config

ID = "databricks/dbrx-base"


def _cfg() -> dict[str, Any]:
    return dict(next(r for r in list_models() if r.id == ID).config)


def test_dbrx_is_supported() -> None:
    assert "dbrx" in SUPPORTED_MODEL_TYPES


def test_dbrx_count_by_hand() -> None:
    # d_model 6144, 40 blocks, 48 heads of 128, kv_n_heads 8, 16 experts of ffn_hidden_size 10752 top-4, V 100352:
    # wte = lm_head = 100352 * 6144 = 616,562,688
    # block: Wqkv 6144 * (6144 + 2 * 8 * 128) = 50,331,648; out_proj 6144^2 = 37,748,736; norm_1 + norm_2 (no bias)
    #        2 * 6144 = 12,288; router 16 * 6144 = 98,304; w1, v1, w2 3 * 16 * 10752 * 6144 = 3,170,893,824
    #        -> 3,259,084,800, x 40 = 130,363,392,000
    # + 2 * 616,562,688 + norm_f 6,144 = 131,596,523,520 (the model card's "132B total")
    m = load_model(ID)
    assert m.num_parameters == 131_596_523_520
    assert m.moe is not None and (m.moe.num_experts, m.moe.top_k, m.moe.expert_intermediate_size) == (16, 4, 10752)
    assert (m.num_kv_heads, m.head_dim, m.norm, m.tie_word_embeddings) == (8, 128, "layer", False)
    # active: 131,596,523,520 - 40 * 3,170,893,824 * 12 / 16 = 131,596,523,520 - 95,126,814,720 = 36,469,708,800
    # (the model card's "36B parameters are active on any input")
    assert m.num_active_parameters == 36_469_708_800
    assert m.traits.qkv_modules == ("Wqkv",) and m.traits.out_proj_module == "out_proj"
    assert m.traits.sliced_expert_loop and not m.traits.experts_are_linears


def test_dbrx_tensors_equal_the_meta_module() -> None:
    from meta_build import meta_module

    module = meta_module(transformers_config(_cfg()), auto="AutoModelForCausalLM")
    theirs: dict[str, int] = {}
    for name, p in module.named_parameters():
        k = ".".join(x for x in name.removeprefix("transformer.").split(".") if not x.isdigit())
        theirs[k] = theirs.get(k, 0) + p.numel()
    m = load_model(ID)
    assert {p.name: p.total for p in m.params} == theirs
    assert m.num_parameters == sum(p.numel() for p in module.parameters())


def test_dbrx_nested_config_defaults() -> None:
    # configuration_dbrx.py defaults when the nested dictionaries are absent: kv_n_heads 1, ffn_hidden_size 3584,
    # 4 experts, top-1.  d_model 64, 4 heads of 16, 2 blocks, V 100:
    # block: Wqkv 64 * (64 + 2 * 16) = 6,144; out_proj 4,096; norms 128; router 4 * 64 = 256;
    #        experts 3 * 4 * 3584 * 64 = 2,752,512 -> 2,763,136, x 2 = 5,526,272; + wte, lm_head 2 * 6,400 + norm_f 64
    m = model_from_config({"model_type": "dbrx", "d_model": 64, "n_heads": 4, "n_layers": 2, "vocab_size": 100})
    assert m.num_parameters == 5_526_272 + 12_800 + 64 == 5_539_136
    assert m.moe is not None and (m.moe.num_experts, m.moe.top_k, m.num_kv_heads) == (4, 1, 1)


def _doc(task: str = "inference", **section: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"model": ID, "task": task, "hardware": {"gpu": "H200"}}
    if task == "inference":
        doc["inference"] = {"batch_size": 1, "prompt_len": 1024, "new_tokens": 16, "dtype": "bf16", **section}
    else:
        doc["train"] = {"micro_batch_size": 1, "seq_len": 512, **section}
    return doc


@pytest.mark.parametrize("transformers", ["5.24.0", "4.57.1"])
def test_dbrx_prefill_runs_the_experts_loop(transformers: str) -> None:
    # DbrxExperts loops over the experts hit in every release (no grouped GEMM under transformers 5 either): the running layer's widest moment is the MLP's, the layer input, the residual and the normed input (3h)
    # and one expert's gated MLP over (at most) every token plus the router logits (3 I + E):
    # (3 * 6144 + 3 * 10752 + 16) * 1024 tokens * 2 B = 50,704 * 2,048 = 103,841,792
    doc = _doc()
    doc["software"] = {"transformers": transformers}
    pre = next(m for m in inference_step(resolve(doc)).moments if m.phase == "prefill")
    assert int(pre.parts["activations"]["running layer"]) == 103_841_792


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true"])
def test_dbrx_training_is_refused(precision: str) -> None:
    with pytest.raises(ScenarioError) as exc:
        estimate(_doc("train", precision=precision))
    assert "DbrxExperts" in str(exc.value) and "task: inference" in str(exc.value)


def test_dbrx_config_typed_for_transformers() -> None:
    # transformers 5.24's strict DbrxFFNConfig types moe_normalize_expert_weights as float | None and refuses the
    # published integer 1 (StrictDataclassFieldValidationError): the traced engine and measure hand it 1.0
    cfg = _cfg()
    assert cfg["ffn_config"]["moe_normalize_expert_weights"] == 1
    out = transformers_config(cfg)
    assert isinstance(out["ffn_config"]["moe_normalize_expert_weights"], float)
    assert out["ffn_config"]["moe_top_k"] == 4 and isinstance(out["ffn_config"]["moe_top_k"], int)
    assert isinstance(cfg["ffn_config"]["moe_normalize_expert_weights"], int)  # the input is not changed
    # other families are left as they are
    llama = {"model_type": "llama", "rms_norm_eps": 1, "hidden_size": 8}
    assert typed_for_transformers(llama) == llama


def test_dbrx_shrinks_and_is_not_traced_on_the_meta_device() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.trace.engine import estimate as traced
    from vramplan.trace.shrink import catalog_config, shrink

    small = shrink(catalog_config(ID), vocab=2048)
    # d_model 256, 4 heads of 64 and 48 / 8 = 6 query heads per KV head kept: max(1, 4 // 6) = 1 KV head;
    # ffn_hidden_size 10752 * 256 / 6144 = 448; 8 experts, top-2
    m = model_from_config(small)
    assert (m.hidden_size, m.num_attention_heads, m.num_kv_heads, m.num_layers) == (256, 4, 1, 2)
    assert m.moe is not None and (m.moe.num_experts, m.moe.top_k, m.moe.expert_intermediate_size) == (8, 2, 448)
    doc = {"model": small, "task": "inference", "hardware": {"gpu": "a100"},
           "inference": {"batch_size": 1, "prompt_len": 64, "new_tokens": 4}}
    with pytest.raises(ScenarioError) as exc:
        traced(doc)
    assert "DbrxExperts" in str(exc.value) and "--engine analytic" in str(exc.value)
