"""Nemotron-H (``nemotron_h``, transformers ``modeling_nemotron_h.py``): single-purpose blocks (Mamba2, attention, MLP)
counted by hand and on transformers' meta device, generate estimated (analytic against traced), vLLM's state pages
with the SSM dtype vLLM takes from the config from 0.13, and what is refused."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from vramplan import estimate
from vramplan.analytic.kv_cache import kv_bytes_per_token
from vramplan.catalog.resolve import resolve
from vramplan.errors import VramplanError
from vramplan.serve.vllm import decide
from vramplan.spec.hf_config import model_from_config

# A test input: two mixers, one attention block and three MLP blocks ("M-*-M-")
TESTER: dict[str, Any] = {
    "model_type": "nemotron_h", "vocab_size": 99, "hidden_size": 32, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 64, "hybrid_override_pattern": "M-*-M-",
    "mamba_num_heads": 8, "mamba_head_dim": 8, "n_groups": 2, "ssm_state_size": 16, "conv_kernel": 4, "chunk_size": 16,
    "max_position_embeddings": 512, "num_hidden_layers": 6}

# Nemotron-H-8B's shape as its public description gives it (52 blocks: 24 Mamba2, 4 attention, 24 MLP; hidden 4096,
# 32 heads, 8 KV heads of 128, MLP 21504 relu2, 128 mixer heads of 64, 8 groups, state 128, vocab 131072, untied);
# its config.json could not be read verbatim, so it is a test input, not a catalog row
N8: dict[str, Any] = {
    "model_type": "nemotron_h", "vocab_size": 131072, "hidden_size": 4096, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 21504, "num_hidden_layers": 52,
    "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-", "mamba_num_heads": 128,
    "mamba_head_dim": 64, "n_groups": 8, "ssm_state_size": 128, "max_position_embeddings": 8192}


def test_tester_count_by_hand() -> None:
    # embed 99 x 32 = 3,168; lm_head 3,168 (untied); norm_f 32; a norm per block 6 x 32 = 192
    # mixer (inter 8 x 8 = 64, conv_dim 64 + 2 x 2 x 16 = 128): conv1d 128 x 4 + 128 = 640; in_proj 32 x (64 + 128 + 8)
    #   = 6,400; dt_bias, A_log, D 24; norm 64; out_proj 64 x 32 = 2,048 -> 9,176, x 2 = 18,352
    # attention: q 32 x 32 + k 32 x 16 + v 32 x 16 + o 32 x 32 = 3,072
    # MLP: up 32 x 64 + down 64 x 32 = 4,096, x 3 = 12,288
    # 3,168 + 3,168 + 32 + 192 + 18,352 + 3,072 + 12,288 = 40,272
    m = model_from_config(TESTER)
    assert m.num_parameters == 40_272
    assert m.mamba is not None and m.mamba.layers == (0, 4) and m.mamba.ffn_only_layers == (1, 3, 5)
    # only the MLP blocks hold an MLP; only the attention block caches keys and values (2 x 2 x 8 x 2 B per token)
    assert [ls.intermediate_size for ls in m.layers] == [0, 64, 0, 64, 0, 64]
    assert kv_bytes_per_token(m, 2) == 64


def test_8b_shape_matches_transformers_meta_module() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    spec = model_from_config(N8)
    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = transformers.AutoConfig.for_model(**N8)
        with torch.device("meta"):
            module = transformers.AutoModelForCausalLM.from_config(cfg)
    # embed and lm_head 2 x 131,072 x 4,096 = 1,073,741,824; norms 52 x 4,096 + 4,096 = 217,088
    # mixer (inter 8,192, conv_dim 10,240): conv1d 10,240 x 5 = 51,200; in_proj 4,096 x 18,560 = 76,021,760;
    #   384; norm 8,192; out_proj 33,554,432 -> 109,635,968, x 24 = 2,631,263,232
    # attention: 2 x 4,096^2 + 2 x 4,096 x 1,024 = 41,943,040, x 4 = 167,772,160
    # MLP: 2 x 4,096 x 21,504 = 176,160,768, x 24 = 4,227,858,432
    assert spec.num_parameters == sum(p.numel() for p in module.parameters()) == 8_100_852_736


# Nemotron 3's "E" blocks in a test input: "ME*EM-" (two mixers, two MoE blocks, one attention block, one MLP block),
# 8 routed plain experts of 48, top 2, a shared expert of 96
MOE: dict[str, Any] = {**TESTER, "hybrid_override_pattern": "ME*EM-", "n_routed_experts": 8, "num_experts_per_tok": 2,
                       "moe_intermediate_size": 48, "moe_shared_expert_intermediate_size": 96, "n_group": 1,
                       "topk_group": 1}


def test_moe_blocks_count_by_hand_and_on_the_meta_device() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    # TESTER's 40,272 holds 3 MLP blocks (3 x 4,096) and 3 x 32 block norms; "ME*EM-" keeps one MLP block:
    #   40,272 - 2 x 4,096 = 32,080 (two mixers, one attention, one MLP, six norms, embeddings, head, norm_f)
    # each "E" block: router 8 x 32 = 256 (+ its 8-element buffer e_score_correction_bias, counted as DeepSeek-V3's);
    #   experts up 8 x 48 x 32 = 12,288 and down 12,288; shared expert up 32 x 96 + down 96 x 32 = 6,144
    #   -> 256 + 8 + 12,288 + 12,288 + 6,144 = 30,984
    # 32,080 + 2 x 30,984 = 94,048 (transformers' module: 94,048 - 2 x 8 buffer elements = 94,032 parameters)
    m = model_from_config(MOE)
    assert m.num_parameters == 94_048
    assert m.moe is not None and not m.moe.gated
    assert (m.moe.num_experts, m.moe.top_k, m.moe.expert_intermediate_size, m.moe.shared_intermediate_size) == \
        (8, 2, 48, 96)
    assert [ls.moe for ls in m.layers] == [False, True, False, True, False, False]
    assert m.mamba is not None and m.mamba.ffn_only_layers == (1, 3, 5)  # neither attention nor a mixer there
    assert kv_bytes_per_token(m, 2) == 64  # the one attention block
    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = transformers.AutoConfig.for_model(**MOE)
        with torch.device("meta"):
            module = transformers.AutoModelForCausalLM.from_config(cfg)
    assert sum(p.numel() for p in module.parameters()) == 94_032


def test_plain_experts_saved_per_routed_token() -> None:
    from vramplan.analytic.activations import _grouped_experts_tensors
    from vramplan.analytic.terms.context import StepContext

    m = model_from_config(MOE)
    for precision, expected in (
        # bf16 weights: the gathered input 2 x 32, relu's output 2 x 48 (square saves the same tensor), the down
        # projection's input (the square) 2 x 48, the down output 2 x 32: 64 + 96 + 96 + 64 = 320
        ("bf16-true", 320),
        # mixed precision, fp32 experts (grouped_mm runs in the weight's dtype): 4 x 32 + 4 x 48 (pow needs no fp32
        # copy of an fp32 input) + 4 x 48 + 4 x 32 = 640
        ("bf16-mixed", 640)):
        doc = {"task": "train", "model": MOE, "hardware": {"gpu": "A100-80GB"},
               "train": {"micro_batch_size": 1, "seq_len": 64, "precision": precision, "optimizer": "adamw"}}
        ctx = StepContext(resolve(doc), 0, "flash", False).act
        assert sum(t.nbytes for t in _grouped_experts_tensors(m, ctx)) == expected


@pytest.mark.parametrize(("precision", "checkpointing"), [("bf16-mixed", "none"), ("bf16-true", "none"),
                                                          ("bf16-mixed", "full")])
def test_moe_training_agrees_with_the_traced_engine(precision: str, checkpointing: str) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.trace.engine import estimate as traced

    # a width at which the activations are most of the step (hidden 256, 8 experts of 384, 2 MoE blocks of 6)
    model = {**MOE, "hidden_size": 256, "head_dim": 64, "intermediate_size": 512, "mamba_head_dim": 32,
             "chunk_size": 64, "moe_intermediate_size": 384, "moe_shared_expert_intermediate_size": 768,
             "vocab_size": 1000}
    doc = {"task": "train", "model": model, "hardware": {"gpu": "A100-80GB"},
           "train": {"micro_batch_size": 4, "seq_len": 512, "precision": precision, "optimizer": "adamw",
                     "gradient_checkpointing": checkpointing}}
    a, t = estimate(doc).per_gpu.peak_allocated_bytes, traced(doc).per_gpu.peak_allocated_bytes
    assert 0.95 < a / t < 1.05


def test_vllm_fused_moe_width_of_plain_experts() -> None:
    from vramplan.serve.vllm import _routed_width

    m = resolve({"model": "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "task": "serve",
                 "hardware": {"gpu": "H100"}}).model
    # per token: top-6 x (max(I 1,856 (no gate half), h 2,688) + I 1,856) + 128 router logits = 6 x 4,544 + 128
    assert _routed_width(m, 1) == 27_392


@pytest.mark.parametrize("config", [{"hybrid_override_pattern": "M-*E", "moe_latent_size": 16},
                                    {"num_nextn_predict_layers": 1}])
def test_what_is_not_modelled_is_refused(config: dict[str, Any]) -> None:
    with pytest.raises(VramplanError, match="not modelled"):
        model_from_config({**TESTER, **config})


@pytest.mark.parametrize("prompt", [100, 200])
def test_traced_generate_agrees_with_the_analytic_engine(prompt: int) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.trace.engine import estimate as traced

    doc = {"task": "inference", "model": TESTER, "hardware": {"gpu": "A100-80GB"},
           "inference": {"batch_size": 2, "prompt_len": prompt, "new_tokens": 10}}
    a, t = estimate(doc).per_gpu.peak_allocated_bytes, traced(doc).per_gpu.peak_allocated_bytes
    assert 0.95 < a / t <= 1.0


@pytest.mark.parametrize(("version", "ssm_dtype", "expected"), [
    # conv_dim 8,192 + 2 x 8 x 128 = 10,240; conv state 3 x 10,240 x 2 B = 61,440; SSM 128 x 64 x 128 x 2 B =
    # 2,097,152 -> 2,158,592 B; attention 2 x 8 x 128 x 2 B = 4,096 per token: block 16 x cdiv(2,158,592, 65,536) =
    # 528, page 2,162,688; groups of 4: 1 attention + 24 / 4 = 6 mixer groups (the MLP blocks keep nothing);
    # 10,737,418,240 // 2,162,688 = 4,964 // 4 = 1,241 blocks; 1,241 // 7 x 528 = 93,456 tokens; per request
    # cdiv(8,192, 528) + 6 = 22
    ("0.11", None, (2_158_592, 528, 1241, 93_456, 22)),
    # 0.13 on, "auto" is the config's mamba_ssm_cache_dtype, else float16 (2 B, as bf16): the same
    ("0.13", None, (2_158_592, 528, 1241, 93_456, 22)),
    # a config saying float32: SSM 4,194,304 B -> 4,255,744; block 16 x cdiv(4,255,744, 65,536) = 1,040, page
    # 4,259,840; 10,737,418,240 // 4,259,840 = 2,520 // 4 = 630 blocks; 630 // 7 x 1,040 = 93,600 tokens;
    # per request cdiv(8,192, 1,040) + 6 = 14
    ("0.13", "float32", (4_255_744, 1040, 630, 93_600, 14)),
    # before 0.13 the config's dtype is not read: the model dtype
    ("0.12", "float32", (2_158_592, 528, 1241, 93_456, 22)),
])
def test_vllm_state_pages(version: str, ssm_dtype: str | None, expected: tuple[int, ...]) -> None:
    model = {**N8, **({"mamba_ssm_cache_dtype": ssm_dtype} if ssm_dtype else {})}
    doc = {"model": model, "task": "serve", "hardware": {"gpu": "H100"},
           "serve": {"vllm_version": version, "max_model_len": 8192, "kv_cache_memory_bytes": 10 * 1024**3}}
    d = decide(resolve(doc), version=version)
    got = (d.mamba_state_page_bytes, d.block_size, d.num_gpu_blocks, d.kv_cache_tokens, d.blocks_per_request)
    assert got == expected
    assert (d.layers_per_group, len(d.groups)) == (4, 7)
