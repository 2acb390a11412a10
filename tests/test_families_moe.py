"""The olmoe, granitemoe, phimoe, glm4_moe, smollm3, cohere2, exaone4, seed_oss and ernie4_5_moe families: tensors counted by hand from each modeling file
(transformers 5.24), and the activation terms that differ from the families they reuse."""

from __future__ import annotations

from vramplan.analytic.activations import ActContext, _router_saved, layer_norm_saved, mlp_saved
from vramplan.catalog.models import load_model
from vramplan.spec.families.llama_like import nope_pattern
from vramplan.spec.hf_config import SUPPORTED_MODEL_TYPES, model_from_config


def test_new_model_types_are_supported() -> None:
    assert {"olmoe", "granitemoe", "phimoe", "glm4_moe", "smollm3", "cohere2", "exaone4", "seed_oss", "ernie4_5_moe"} <= set(SUPPORTED_MODEL_TYPES)


def test_olmoe_count_by_hand() -> None:
    # OLMoE-1B-7B-0924: h 2048, 16 layers, 16 heads (MHA), 64 experts of I 1024 top-8, V 50304 untied:
    # embed = lm_head = 50304 * 2048 = 103,022,592
    # layer: q/k/v/o 4 * 2048^2 = 16,777,216; q_norm + k_norm over the full width 2 * 2048 = 4,096; two norms 4,096;
    #        router 64 * 2048 = 131,072; experts 64 * 3 * 2048 * 1024 = 402,653,184 -> 419,569,664, x 16 = 6,713,114,624
    # + 2 * 103,022,592 + final norm 2,048 = 6,919,161,856
    m = load_model("allenai/OLMoE-1B-7B-0924")
    assert m.num_parameters == 6_919_161_856
    assert m.moe is not None and (m.moe.num_experts, m.moe.top_k, m.moe.expert_intermediate_size) == (64, 8, 1024)
    assert m.qk_norm and {p.name for p in m.params} >= {"layers.self_attn.q_norm.weight", "layers.mlp.gate.weight"}
    # active: 6,919,161,856 - 16 * 402,653,184 * 56 / 64 = 6,919,161,856 - 5,637,144,576 = 1,282,017,280 (the paper's "1B active", 1.3B)
    assert m.num_active_parameters == 1_282_017_280


def test_granitemoe_count_by_hand() -> None:
    # granite-3.1-3b-a800m: h 1536, 32 layers, 24 heads / 8 KV heads of 64, 40 experts of I 512 top-8, V 49155 tied:
    # embed 49155 * 1536 = 75,502,080
    # layer: q + o 2 * 1536^2 = 4,718,592; k + v 2 * 1536 * 512 = 1,572,864; norms 3,072; router 40 * 1536 = 61,440;
    #        input_linear 40 * 1536 * 1024 = 62,914,560; output_linear 40 * 512 * 1536 = 31,457,280 -> 100,727,808,
    #        x 32 = 3,223,289,856;  + embed + final norm 1,536 = 3,298,793,472
    m = load_model("ibm-granite/granite-3.1-3b-a800m-instruct")
    assert m.num_parameters == 3_298_793_472
    names = {p.name for p in m.params}
    assert {"layers.block_sparse_moe.router.weight", "layers.block_sparse_moe.input_linear.weight",
            "layers.block_sparse_moe.output_linear.weight"} <= names
    # top-k on the logits, then a k-wide softmax; experts are parameters, not nn.Linear (no all-linear LoRA)
    assert m.traits.router_topk_first and not m.traits.experts_are_linears and m.tie_word_embeddings


def test_phimoe_count_by_hand() -> None:
    # Phi-3.5-MoE: h 4096, 32 layers, 32 heads / 8 KV heads of 128, 16 experts of I 6400 top-2, V 32064 untied,
    # biased attention, LayerNorm with bias, LM head with bias:
    # embed 32064 * 4096 = 131,334,144; lm_head 131,334,144 + 32,064
    # layer: q, o 2 * (4096^2 + 4096) = 33,562,624; k, v 2 * (4096 * 1024 + 1024) = 8,390,656; LN 2 * 2 * 4096 = 16,384;
    #        router 16 * 4096 = 65,536; experts 16 * 3 * 4096 * 6400 = 1,258,291,200 -> 1,300,326,400,
    #        x 32 = 41,610,444,800;  final LN 8,192  -> 41,873,153,344
    m = load_model("microsoft/Phi-3.5-MoE-instruct")
    assert m.num_parameters == 41_873_153_344
    assert m.norm == "layer" and "lm_head.bias" in {p.name for p in m.params}
    assert m.traits.sparsemixer_router and m.traits.moe_input_jitter  # input_jitter_noise 0.01


def test_phimoe_router_and_jitter_bytes() -> None:
    m = load_model("microsoft/Phi-3.5-MoE-instruct")
    ctx = _ctx()
    # sparsemixer: (c + 10) E + 2 (4 + 8 + 4) = 12 * 16 + 32 = 224 B per token, against Mixtral's (c + 4) E = 96
    assert _router_saved(m, ctx) == 224
    # the two in-place jitter multiplications keep their noise: 2 x (fp32 LayerNorm output under autocast) x h
    layer = next(ls for ls in m.layers if ls.moe)
    off = model_from_config({**_phimoe_cfg(), "input_jitter_noise": 0.0}, name="phimoe-no-jitter")
    assert mlp_saved(m, layer, ctx) - mlp_saved(off, layer, ctx) == 2 * 4 * 4096
    # eval mode (no dropout, no jitter): nothing extra
    quiet = _ctx(dropout=False)
    assert mlp_saved(m, layer, quiet) == mlp_saved(off, layer, quiet)


def _ctx(dropout: bool = True) -> ActContext:
    # bf16 mixed precision (fp32 residual, autocast), flash attention, full fine-tuning
    return ActContext(compute_bytes=2, residual_bytes=4, linear_input_bytes=2, autocast=True, attention="flash",
                      gqa_repeat=False, seq_len=512, dropout=dropout)


def _phimoe_cfg() -> dict[str, object]:
    from vramplan.catalog.models import list_models

    return dict(next(r for r in list_models() if r.id == "microsoft/Phi-3.5-MoE-instruct").config)


def test_glm4_moe_layout() -> None:
    # GLM-4.5-Air: layer 0 dense (first_k_dense_replace 1), 45 MoE layers of 128 experts (I 1408) top-8 with one
    # shared expert; q/k/v biases, no o_proj bias; no q/k norm (use_qk_norm false); no MTP layer
    m = load_model("zai-org/GLM-4.5-Air")
    assert [ls.moe for ls in m.layers[:2]] == [False, True] and len(m.layers) == 46
    names = {p.name for p in m.params}
    assert "layers.self_attn.q_proj.bias" in names and "layers.self_attn.o_proj.bias" not in names
    assert "layers.mlp.gate.e_score_correction_bias" in names and not m.qk_norm
    assert m.moe is not None and m.moe.shared_intermediate_size == 1408
    # the dense layer: q 4096 * 12288 + 12288 = 50,343,936; k, v 2 * (4096 * 1024 + 1024) = 8,390,656;
    # o 12288 * 4096 = 50,331,648; norms 8,192; MLP 3 * 4096 * 10944 = 134,479,872 -> 243,554,304
    assert m.layer_params(0) == 243_554_304


def test_glm4_moe_qk_norm_follows_use_qk_norm() -> None:
    cfg = {**_glm_cfg(), "use_qk_norm": True}
    m = model_from_config(cfg, name="glm-qk")
    assert m.qk_norm and "layers.self_attn.q_norm.weight" in {p.name for p in m.params}


def _glm_cfg() -> dict[str, object]:
    from vramplan.catalog.models import list_models

    return dict(next(r for r in list_models() if r.id == "zai-org/GLM-4.5-Air").config)


def test_smollm3_count_and_nope_layers() -> None:
    # SmolLM3-3B: h 2048, 36 layers, 16 heads / 4 KV heads of 128, I 11008, V 128256 tied:
    # embed 128256 * 2048 = 262,668,288
    # layer: q + o 2 * 2048^2 = 8,388,608; k + v 2 * 2048 * 512 = 2,097,152; MLP 3 * 2048 * 11008 = 67,633,152;
    #        norms 4,096 -> 78,123,008, x 36 = 2,812,428,288;  + embed + final norm 2,048 = 3,075,098,624
    m = load_model("HuggingFaceTB/SmolLM3-3B-Base")
    assert m.num_parameters == 3_075_098_624 and m.tie_word_embeddings
    # configuration_smollm3.py: no_rope_layers defaults to every no_rope_layer_interval-th layer without RoPE
    assert nope_pattern({"no_rope_layer_interval": 4}, 8) == [1, 1, 1, 0, 1, 1, 1, 0]
    # use_sliding_window puts the window on the NoPE layers only
    cfg = {**dict(_smol_cfg()), "use_sliding_window": True, "sliding_window": 4096}
    windows = [ls.sliding_window for ls in model_from_config(cfg, name="smol-swa").layers[:4]]
    assert windows == [None, None, None, 4096]


def _smol_cfg() -> dict[str, object]:
    from vramplan.catalog.models import list_models

    return dict(next(r for r in list_models() if r.id == "HuggingFaceTB/SmolLM3-3B-Base").config)


def test_cohere2_count_and_window_pattern() -> None:
    # Command R7B: h 4096, 32 layers, 32 heads / 8 KV heads of 128, I 14336, V 256000 tied, weight-only fp32
    # LayerNorm, one norm per parallel block, no q/k norm:
    # embed 256000 * 4096 = 1,048,576,000
    # layer: norm 4,096; q + o 2 * 4096^2 = 33,554,432; k + v 2 * 4096 * 1024 = 8,388,608; MLP 3 * 4096 * 14336 =
    #        176,160,768 -> 218,107,904, x 32 = 6,979,452,928;  + embed + final norm 4,096 = 8,028,033,024
    m = load_model("CohereForAI/c4ai-command-r7b-12-2024")
    assert m.num_parameters == 8_028_033_024
    assert m.parallel_residual and m.norm == "layer_fp32" and not m.qk_norm and m.tie_word_embeddings
    # sliding_window_pattern 4: three sliding layers of 4096, then one global (NoPE) layer
    assert [ls.sliding_window for ls in m.layers[:8]] == [4096, 4096, 4096, None] * 2
    # an explicit layer_types wins over the legacy pattern
    cfg = {**dict(_cfg("CohereForAI/c4ai-command-r7b-12-2024")), "num_hidden_layers": 2,
           "layer_types": ["full_attention", "sliding_attention"]}
    assert [ls.sliding_window for ls in model_from_config(cfg, name="c2").layers] == [None, 4096]


def _cfg(model_id: str) -> dict[str, object]:
    from vramplan.catalog.models import list_models

    return dict(next(r for r in list_models() if r.id == model_id).config)


def test_exaone4_count_and_post_norms() -> None:
    # EXAONE-4.0-32B: h 5120, 64 layers, 40 heads / 8 KV heads of 128, I 27392, V 102400 untied:
    # embed = lm_head = 102400 * 5120 = 524,288,000
    # layer: q + o 2 * 5120^2 = 52,428,800; k + v 2 * 5120 * 1024 = 10,485,760; q/k norms 2 * 128 = 256;
    #        post norms 2 * 5120 = 10,240; MLP 3 * 5120 * 27392 = 420,741,120 -> 483,666,176, x 64 = 30,954,635,264
    # + 2 * 524,288,000 + final norm 5,120 = 32,003,216,384
    m = load_model("LGAI-EXAONE/EXAONE-4.0-32B")
    assert m.num_parameters == 32_003_216_384
    names = {p.name for p in m.params}
    assert "layers.post_feedforward_layernorm.weight" in names and "layers.input_layernorm.weight" not in names
    assert m.traits.post_norms and m.qk_norm
    assert [ls.sliding_window for ls in m.layers[:4]] == [4096, 4096, 4096, None]
    # a post-norm normalizes the sublayer's output (c = 2): fp32 copy 4 + normalized tensor 2 = 6 B per element;
    # a pre-norm on the fp32 residual saves 4 + 4
    assert layer_norm_saved(m, _ctx()) == 6
    assert layer_norm_saved(load_model("meta-llama/Llama-3.1-8B"), _ctx()) == 8
    # the documented string pattern names each layer of the group
    cfg = {**_cfg("LGAI-EXAONE/EXAONE-4.0-32B"), "sliding_window_pattern": "LLGL", "num_hidden_layers": 4}
    assert [ls.sliding_window for ls in model_from_config(cfg, name="e4").layers] == [4096, 4096, None, 4096]


def test_seed_oss_count_biases_and_dropout() -> None:
    # Seed-OSS-36B: h 5120, 64 layers, 80 heads / 8 KV heads of 128, I 27648, V 155136 untied, q/k/v biases only:
    # embed = lm_head = 155136 * 5120 = 794,296,320
    # layer: q 5120 * 10240 + 10240 = 52,439,040; k + v 2 * (5120 * 1024 + 1024) = 10,487,808; o 10240 * 5120 =
    #        52,428,800; MLP 3 * 5120 * 27648 = 424,673,280; norms 10,240 -> 540,039,168, x 64 = 34,562,506,752
    # + 2 * 794,296,320 + final norm 5,120 = 36,151,104,512
    m = load_model("ByteDance-Seed/Seed-OSS-36B-Instruct")
    assert m.num_parameters == 36_151_104_512
    names = {p.name for p in m.params}
    assert "layers.self_attn.k_proj.bias" in names and "layers.self_attn.o_proj.bias" not in names
    # configuration_seed_oss.py defaults: attention_dropout 0.1, residual_dropout 0.1 (each sublayer's output)
    assert (m.attention_dropout, m.hidden_dropout) == (0.1, 0.1)
    on = model_from_config({**_cfg("ByteDance-Seed/Seed-OSS-36B-Instruct"), "attention_out_bias": True}, name="s")
    assert "layers.self_attn.o_proj.bias" in {p.name for p in on.params}


def test_ernie4_5_moe_count_and_fp32_router() -> None:
    # ERNIE-4.5-21B-A3B: h 2560, 28 layers, 20 heads / 4 KV heads of 128, V 103424 tied; layer 0 dense (I 12288),
    # layers 1-27 MoE: 64 experts of 1536 top-6, 2 shared experts (3072 wide), a frozen correction bias per expert:
    # attention q + o 2 * 2560^2 = 13,107,200; k + v 2 * 2560 * 512 = 2,621,440; norms 5,120
    # layer 0: 15,728,640 + 5,120 + 3 * 2560 * 12288 (94,371,840) = 110,105,600
    # MoE layer: router 64 * 2560 = 163,840; bias 64; experts 64 * 3 * 2560 * 1536 = 754,974,720; shared
    #            3 * 2560 * 3072 = 23,592,960; + 15,728,640 + 5,120 = 794,465,344, x 27 = 21,450,564,288
    # + embed 103424 * 2560 = 264,765,440 + final norm 2,560 = 21,825,437,888
    m = load_model("baidu/ERNIE-4.5-21B-A3B-PT")
    assert m.num_parameters == 21_825_437_888
    assert [ls.moe for ls in m.layers[:2]] == [False, True]
    assert "layers.mlp.gate.moe_statics.e_score_correction_bias" in {p.name for p in m.params}
    assert m.traits.fp32_router
    # the router keeps its fp32 softmax over the 64 experts and the int64 indices of the 6 chosen: 4 * 64 + 8 * 6
    assert _router_saved(m, _ctx()) == 304
