"""Zamba2 (``zamba2``, transformers ``modeling_zamba2.py``): Mamba2 layers with shared transformer blocks ahead of the
mixer in the "hybrid" layers, counted by hand and on transformers' meta device (blocks tied only under
tie_word_embeddings), generate estimated (the hybrid layers' KV cache, every layer's mixer state; analytic against
traced), and what is refused."""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import pytest

from meta_build import graph_saved_storages, meta_causal_lm_count
from vramplan import estimate
from vramplan.analytic import activations as act
from vramplan.analytic.inference import (
    kept_embeddings_bytes,
    shared_block_extra_bytes,
    shared_block_output_bytes,
)
from vramplan.analytic.kv_cache import kv_bytes_per_token
from vramplan.analytic.ssm_state import ssm_state_bytes, ssm_state_note
from vramplan.analytic.terms.mamba2 import mixer_saved_tensors
from vramplan.analytic.terms.shared_block import shared_block_attention_tensors, shared_block_mlp_tensors
from vramplan.errors import VramplanError
from vramplan.spec.hf_config import model_from_config

# A test input, not a released model: three hybrid layers served by two shared blocks (A, B, A), q/k/v adapters
TESTER: dict[str, Any] = {
    "model_type": "zamba2", "vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 6,
    "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid", "hybrid", "mamba"], "num_attention_heads": 4,
    "n_mamba_heads": 4, "mamba_d_state": 8, "num_mem_blocks": 2, "use_shared_attention_adapter": True,
    "adapter_rank": 4, "intermediate_size": 48, "use_mem_rope": True, "chunk_size": 16,
    "max_position_embeddings": 4096}


# untied, one block, no q/k/v adapters, biases, grouped KV heads
SECOND: dict[str, Any] = {
    "model_type": "zamba2", "vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 4,
    "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid"], "num_attention_heads": 4, "num_key_value_heads": 2,
    "n_mamba_heads": 4, "mamba_d_state": 16, "num_mem_blocks": 1, "adapter_rank": 8, "intermediate_size": 256,
    "chunk_size": 32, "tie_word_embeddings": False, "add_bias_linear": True}


def _meta_count(cfg: dict[str, Any]) -> int:
    return meta_causal_lm_count(cfg)


def test_tester_count_by_hand() -> None:
    # embed 99 x 32 = 3,168 (lm_head tied); final norm 32
    # mixer (inter 2 x 32 = 64, 4 heads of 16, conv_dim 64 + 2 x 1 x 8 = 80): conv1d 80 x 4 + 80 = 400; in_proj
    #   32 x (64 + 80 + 4) = 4,736; dt_bias, A_log, D 12; norm 64; out_proj 64 x 32 = 2,048 -> 7,260; with the layer's
    #   input_layernorm 32: 7,292, x 6 layers = 43,752
    # per hybrid layer: linear 32 x 32 = 1,024, x 3 = 3,072
    # a shared block (attention on 2 x 32 = 64, 4 heads of 16): q, k, v 64 x 64 = 4,096 each, o 64 x 32 = 2,048
    #   -> 14,336; gate_up 32 x 96 = 3,072, down 48 x 32 = 1,536; norms 64 + 32 -> 19,040, x 2 blocks = 38,080
    # adapters, one set per hybrid layer: q, k, v 3 x (64 x 4 + 4 x 64) = 1,536; gate_up 32 x 4 + 4 x 96 = 512
    #   -> 2,048, x 3 = 6,144
    # 3,168 + 32 + 43,752 + 3,072 + 38,080 + 6,144 = 94,248
    m = model_from_config(TESTER)
    assert m.num_parameters == 94_248
    assert m.mamba is not None and m.mamba.layers == tuple(range(6)) and m.mamba.shared_attention_layers == (1, 3, 4)
    # only the hybrid layers run the shared block's MLP
    assert [ls.intermediate_size for ls in m.layers] == [0, 48, 0, 48, 48, 0]


@pytest.mark.parametrize("extra", [
    {},
    # untied: transformers 5.24 ties the blocks only under tie_word_embeddings (get_expanded_tied_weights_keys), so
    # every hybrid layer holds its own block with all of its block's adapters
    {"tie_word_embeddings": False},
    {"tie_word_embeddings": False, "num_mem_blocks": 3},
    {"num_mem_blocks": 3},
    {"use_shared_attention_adapter": False, "num_mem_blocks": 1, "add_bias_linear": True, "num_key_value_heads": 2},
])
def test_count_matches_transformers_meta_module(extra: dict[str, Any]) -> None:
    cfg = {**TESTER, **extra}
    assert model_from_config(cfg).num_parameters == _meta_count(cfg)


def test_untied_count_by_hand() -> None:
    # the tied count 94,248, + lm_head 3,168, + a third block: each hybrid layer holds its own copy (19,040), + the
    # adapters: the two copies of block A (hybrid layers 0 and 2) hold both of block A's sets, the copy of block B its
    # one: 5 sets where the tied model held 3 (+ 2 x 2,048 = 4,096) -> 94,248 + 3,168 + 19,040 + 4,096 = 120,552
    assert model_from_config({**TESTER, "tie_word_embeddings": False}).num_parameters == 120_552


def test_default_configuration_matches_transformers() -> None:
    # Zamba2Config's defaults ("Zamba2-2.7B style": 54 layers, 9 of them hybrid, one shared block)
    cfg = {"model_type": "zamba2", "hidden_size": 2560, "num_attention_heads": 32, "vocab_size": 32000}
    m = model_from_config(cfg)
    assert m.num_layers == 54 and m.mamba is not None and len(m.mamba.shared_attention_layers) == 9
    assert m.num_parameters == _meta_count(cfg) == 2_481_848_336


def test_kv_cache_and_mixer_state() -> None:
    m = model_from_config(TESTER)
    # only the 3 hybrid layers cache keys and values: 3 x 2 x 4 KV heads x 16 (2 x 32 / 4) x 2 B = 768 B per token
    assert kv_bytes_per_token(m, 2) == 768
    # every layer keeps a mixer state: conv 80 x 4 x 2 B = 640, SSM 4 x 16 x 8 x 4 B = 2,048 -> 2,688, x 6 = 16,128
    assert ssm_state_bytes(m, 1, 2) == 16_128
    assert ssm_state_note(m, 2) == ("plus 16,128 B per sequence of Mamba2 convolution and SSM state in 6 mixer layers "
                                    "(beside the KV cache of the 3 that run a shared block), whatever the sequence "
                                    "length")


@pytest.mark.parametrize("prompt", [100, 200])
def test_traced_generate_agrees_with_the_analytic_engine(prompt: int) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.trace.engine import estimate as traced

    doc = {"task": "inference", "model": TESTER, "hardware": {"gpu": "A100-80GB"},
           "inference": {"batch_size": 2, "prompt_len": prompt, "new_tokens": 10}}
    a, t = estimate(doc).per_gpu.peak_allocated_bytes, traced(doc).per_gpu.peak_allocated_bytes
    # the mixers' einsum copies are not counted (as for Bamba, analytic/ssm_state.py)
    assert 0.95 < a / t <= 1.0


def test_shared_block_terms_of_the_prefill() -> None:
    m = model_from_config(TESTER)
    # b 2, p 100, bf16: the embeddings and their clone 2 x 2 x 100 x 32 x 2 = 25,600; the block's extra
    # max(32, 2 x 48) = 96 wide: 2 x 100 x 96 x 2 = 38,400; the block's output beside the mixer 2 x 100 x 32 x 2 = 12,800
    assert kept_embeddings_bytes(m, 2, 100, 2) == 25_600
    assert shared_block_extra_bytes(m, 2, 100, 2) == 38_400
    assert shared_block_output_bytes(m, 2, 100, 2) == 12_800


def _ctx(mode: str, seq: int) -> act.ActContext:
    c, r = (4, 4) if mode == "fp32" else (2, 4) if mode == "mixed" else (2, 2)
    return act.ActContext(compute_bytes=c, residual_bytes=r, linear_input_bytes=c, autocast=mode == "mixed",
                          attention="efficient", gqa_repeat=False, seq_len=seq)


def _shared_records(shape: dict[str, Any], mode: str, seq: int) -> list[act.SavedTensor]:
    m = model_from_config(shape)
    assert m.mamba is not None
    ls = m.layers[m.mamba.shared_attention_layers[0]]
    ctx = _ctx(mode, seq)
    return shared_block_attention_tensors(m, ls, ctx) + shared_block_mlp_tensors(m, ls, ctx)


def test_shared_block_saved_by_hand() -> None:
    # TESTER in bf16 (h 32, the attention on 2h = 64: 4 heads of 16; I 48; adapter rank 4), per token:
    # input_layernorm over 64: fp32 copy 4 x 64 + normalized 2 x 64 + rsqrt 4 = 388; q/k/v's shared input 2 x 64 = 128;
    # the kernel's q, k, v, output 4 x 128 = 512, logsumexp 4 x 4 heads = 16; q/k/v adapters' rank outputs 3 x 2 x 4
    # = 24; pre_ff_layernorm over o_proj's output 4 x 32 + 2 x 32 + 4 = 196; the MLP: input 64, gate and up 2 x 96,
    # activation 96, down's input 96 = 448; its adapter's rank output 8; linear's input 2 x 32 = 64
    # 388 + 128 + 512 + 16 + 24 + 196 + 448 + 8 + 64 = 1,784
    assert act.total_bytes(_shared_records(TESTER, "bf16", 40)) == 1_784
    # under autocast (fp32 residual, fp32 norm weights): the 2h norm saves 4 x 64 + 4 x 64 + 4 = 516; its fp32 output
    # is cast by each of q/k/v and the 3 adapters: 6 x 128 = 768; pre_ff's output (fp32: weight x bf16) cast by
    # gate_up_proj and the adapter, 2 x 64 = 128; the rest as in bf16: 512 + 16 + 24 + 196 + 4 x 96 + 8 + 64
    # 516 + 768 + 512 + 16 + 24 + 196 + 128 + 384 + 8 + 64 = 2,616
    assert act.total_bytes(_shared_records(TESTER, "mixed", 40)) == 2_616


def _graph_saved(shape: dict[str, Any], mode: str, batch: int, seq: int) -> int:
    """Bytes of the storages autograd's graph saves after a ``Zamba2AttentionDecoderLayer`` and the per-layer linear
    (parameters, their autocast copies and RoPE's cos and sin excluded)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.zamba2.modeling_zamba2 import Zamba2AttentionDecoderLayer, Zamba2RotaryEmbedding

    from vramplan.trace import cuda

    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = transformers.AutoConfig.for_model(**shape)
    cfg._attn_implementation = "sdpa"
    weights = torch.bfloat16 if mode == "bf16" else torch.float32
    with torch.device("meta"):
        block = Zamba2AttentionDecoderLayer(cfg, block_id=0).to(weights)
        linear = torch.nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False).to(weights)
        rope = Zamba2RotaryEmbedding(cfg)
    block.train()
    skip = {id(p.untyped_storage()) for p in [*block.parameters(), *linear.parameters()]}
    x, emb = (torch.empty(batch, seq, cfg.hidden_size, device="meta", dtype=weights, requires_grad=True)
              for _ in range(2))
    first = shape["layers_block_type"].index("hybrid")
    with cuda.cuda_behaviour(cuda.CudaSpec()):
        region = cuda.autocast(torch.bfloat16) if mode == "mixed" else contextlib.nullcontext()
        with region:
            pe = rope(x, torch.arange(seq, device="meta")[None]) if cfg.use_mem_rope else None
            skip |= {id(t.untyped_storage()) for t in pe or ()}
            out = linear(block(x, emb, layer_idx=first, attention_mask=None, position_embeddings=pe))
    return _walk(out, skip, ("_saved_mat2",))  # mm's second operand: a (cast) weight


def _walk(out: Any, skip: set[int], drop: tuple[str, ...] = ()) -> int:
    """The bytes of the storages autograd's graph behind ``out`` saves, those in ``skip`` and attributes ``drop``
    left out."""
    return sum(graph_saved_storages(out, skip, drop).values())


@pytest.mark.parametrize(("shape", "mode", "batch", "seq"), [
    (TESTER, "bf16", 2, 40), (TESTER, "fp32", 2, 40), (SECOND, "bf16", 1, 70)])
def test_mixer_saved_equals_the_autograd_graph(shape: dict[str, Any], mode: str, batch: int, seq: int) -> None:
    # Zamba2MambaMixer (modeling_zamba2.py line 646) saves what BambaMixer does (analytic/terms/mamba2.py), storage by
    # storage (its gated norm's rsqrt per mamba_ngroups group included)
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.zamba2.modeling_zamba2 import Zamba2MambaMixer

    from vramplan.trace import cuda

    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = transformers.AutoConfig.for_model(**shape)
    weights = torch.bfloat16 if mode == "bf16" else torch.float32
    with torch.device("meta"):
        mixer = Zamba2MambaMixer(cfg, layer_idx=0).to(weights)
    mixer.train()
    x = torch.empty(batch, seq, cfg.hidden_size, device="meta", dtype=weights, requires_grad=True)
    with cuda.cuda_behaviour(cuda.CudaSpec()):
        out = mixer(x)
    ms = model_from_config(shape).mamba
    assert ms is not None
    analytic = act.total_bytes(mixer_saved_tensors(ms, shape["hidden_size"], 4 if mode == "fp32" else 2, False,
                                                   batch, seq))
    assert _walk(out, {id(p.untyped_storage()) for p in mixer.parameters()}) == analytic


@pytest.mark.parametrize(("shape", "mode", "batch", "seq"), [
    (TESTER, "bf16", 2, 40), (TESTER, "fp32", 2, 40), (TESTER, "mixed", 3, 50), (SECOND, "bf16", 2, 40),
    (SECOND, "mixed", 1, 70)])
def test_shared_block_saved_equals_the_autograd_graph(shape: dict[str, Any], mode: str, batch: int, seq: int) -> None:
    records = _shared_records(shape, mode, seq)
    # the attention kernel's own records (q, k, v, logsumexp) are not in a meta-device graph walk: the SDPA node
    # exposes no saved tensors there; its output's record stands for o_proj's input (same size)
    kernel = {"shared.attention.q", "shared.attention.k", "shared.attention.v", "shared.attention.logsumexp"}
    analytic = act.total_bytes(t for t in records if t.name not in kernel) * batch * seq
    # exact: storage by storage
    assert _graph_saved(shape, mode, batch, seq) == analytic


@pytest.mark.parametrize(("shape", "precision", "checkpointing", "batch", "seq", "low", "high"), [
    (TESTER, "bf16-true", "none", 2, 100, 0.99, 1.0), (TESTER, "bf16-mixed", "none", 2, 100, 0.99, 1.0),
    (TESTER, "fp32", "none", 2, 100, 0.99, 1.0), (SECOND, "bf16-true", "none", 1, 300, 0.99, 1.0),
    (TESTER, "bf16-true", "full", 2, 100, 0.94, 1.0), (TESTER, "bf16-mixed", "full", 2, 100, 0.94, 1.0),
    (SECOND, "bf16-mixed", "full", 2, 300, 0.94, 1.0), (TESTER, "bf16-true", "eager", 2, 100, 0.99, 1.0),
    (SECOND, "bf16-true", "eager", 2, 100, 0.98, 1.0)])
def test_train_step_agrees_with_the_traced_engine(shape: dict[str, Any], precision: str, checkpointing: str,
                                                  batch: int, seq: int, low: float, high: float) -> None:
    pytest.importorskip("torch")
    from vramplan.trace.engine import estimate as traced

    # "eager": no checkpointing, eager attention (the block's s x s probabilities over its heads)
    eager = checkpointing == "eager"
    doc = {"task": "train", "model": shape, "hardware": {"gpu": "A100-80GB"},
           "train": {"micro_batch_size": batch, "seq_len": seq, "precision": precision, "optimizer": "adamw",
                     "gradient_checkpointing": "none" if eager else checkpointing,
                     "attention": "eager" if eager else "sdpa"}}
    a, t = estimate(doc), traced(doc)
    # the shared block's and the mixers' saved tensors are autograd's (above; tests/test_mamba2_train.py); what the
    # analytic engine leaves out is the gradients a mixer's backward makes inside its chunked scan (the assumption it
    # states): without checkpointing the peak is past them, under the trace by 0.3-0.5% (eager attention 0.4-1.0%);
    # with full checkpointing the peak is in a recomputed mixer's backward, under it by 1.6-2.1% (TESTER) and 5.2%
    # (SECOND, 300 tokens) when written (a pure Mamba2 model of SECOND's mixer, 3.7%).  Never above.
    assert low < a.per_gpu.peak_allocated_bytes / t.per_gpu.peak_allocated_bytes < high
    assert any("shared transformer block" in x for x in a.assumptions)


@pytest.mark.parametrize(("doc", "path"), [
    ({"task": "train", "train": {"seq_len": 128, "peft": {"method": "lora", "rank": 8}}}, "train.peft"),
    ({"task": "train", "train": {"seq_len": 128}, "software": {"transformers": "4.57.0"}}, "software.transformers"),
    ({"task": "train", "train": {"seq_len": 128, "gradient_checkpointing": "selective"}},
     "train.gradient_checkpointing"),
    ({"task": "train", "train": {"seq_len": 128}, "parallel": {"tp": 2}}, "parallel.tp"),
    # each hybrid layer's tied copy of the shared block would be gathered where it runs (not modelled)
    ({"task": "train", "train": {"seq_len": 128}, "hardware": {"gpu": "H100", "num_gpus": 2},
      "parallel": {"fsdp": "full_shard"}}, "parallel.fsdp"),
    ({"task": "train", "train": {"seq_len": 128}, "hardware": {"gpu": "H100", "num_gpus": 2},
      "parallel": {"zero_stage": 3}, "framework": "deepspeed"}, "parallel.zero_stage"),
    # vLLM serving is estimated (tests/test_serve_linear_mixers.py); the other engines' state pools are not modelled
    ({"task": "serve", "serve": {"engine": "sglang"}}, "serve.engine"),
    ({"task": "inference", "parallel": {"tp": 2}}, "parallel.tp"),
    ({"task": "inference", "software": {"transformers": "4.57.0"}}, "software.transformers"),
    ({"task": "inference", "inference": {"kv_cache_dtype": "fp8"}}, "inference.kv_cache_dtype"),
])
def test_what_is_not_modelled_is_refused(doc: dict[str, Any], path: str) -> None:
    with pytest.raises(VramplanError) as err:
        estimate({"model": TESTER, "hardware": {"gpu": "H100"}, **doc})  # a doc's hardware replaces this one
    assert path in str(err.value)


def test_a_layer_list_that_disagrees_with_the_layer_count_is_refused() -> None:
    with pytest.raises(VramplanError, match="layers_block_type names 6 layers"):
        model_from_config({**TESTER, "num_hidden_layers": 5})


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_traced_generate_agrees_on_a_second_shape(attention: str) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.trace.engine import estimate as traced

    doc = {"task": "inference", "model": SECOND, "hardware": {"gpu": "A100-80GB"},
           "inference": {"batch_size": 2, "prompt_len": 300, "new_tokens": 8, "attention": attention}}
    a, t = estimate(doc).per_gpu.peak_allocated_bytes, traced(doc).per_gpu.peak_allocated_bytes
    # sdpa: the mixer's peak, below the trace by the scan's einsum copies; eager: the shared block's MLP moment with
    # the kept probabilities, above it by the bound shared_block_extra_bytes takes (its 2 x intermediate adapter sum
    # counted over the whole MLP moment): 0.975 and 1.030 when written
    assert 0.95 < a / t < 1.05
