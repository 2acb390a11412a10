"""Falcon-H1 (transformers ``modeling_falcon_h1.py``): attention and a Mamba2 mixer side by side in every layer.
Tensors counted by hand and against transformers' module on the meta device, every layer's KV cache and mixer
state, the prefill's running layer, the traced engine's generate, and the refusals."""

from __future__ import annotations

from typing import Any

import pytest

from meta_build import graph_saved_storages, meta_module
from vramplan import estimate
from vramplan.analytic.inference import parallel_mixer_input_bytes, parallel_mixer_kept_bytes
from vramplan.analytic.kv_cache import attention_layers, kv_bytes_per_token
from vramplan.analytic.ssm_state import ssm_state_bytes
from vramplan.errors import ScenarioError
from vramplan.spec.hf_config import model_from_config

# A small Falcon-H1 (a test input, not a catalog model): every size differs from the others so that a swapped shape
# shows, head_dim set apart from hidden / heads (as Falcon-H1-7B's config does: 3072 / 12 heads with head_dim 128),
# the gated norm on and out_proj's bias on (projectors_bias) with in_proj's off, and muP multipliers that are not 1
SMALL = {"model_type": "falcon_h1", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 24, "vocab_size": 100, "mamba_d_ssm": 96,
         "mamba_n_heads": 4, "mamba_d_head": "auto", "mamba_n_groups": 2, "mamba_d_state": 8, "mamba_d_conv": 4,
         "mamba_chunk_size": 16, "mamba_rms_norm": True, "projectors_bias": True, "mamba_proj_bias": False,
         "tie_word_embeddings": False, "max_position_embeddings": 1024, "attention_in_multiplier": 1.2,
         "key_multiplier": 0.8, "ssm_multipliers": [0.9, 1.1, 0.8, 1.2, 1.3], "lm_head_multiplier": 0.5}
# FalconH1Config's defaults elsewhere: mamba_d_ssm null (the width is mamba_expand 2 x hidden), no gated norm
# (mamba_rms_norm False: nn.Identity), tied embeddings, in_proj's bias on (mamba_proj_bias), head_dim hidden / heads
TIED = {"model_type": "falcon_h1", "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
        "vocab_size": 100, "intermediate_size": 32, "mamba_d_ssm": None, "mamba_n_heads": 8, "mamba_d_state": 4,
        "tie_word_embeddings": True, "mamba_proj_bias": True}


def test_small_parameters_by_hand() -> None:
    m = model_from_config(SMALL)
    # per layer: MLP 3 x 64 x 96 = 18,432; conv_dim 96 + 2 x 2 x 8 = 128: conv1d 128 x 4 + 128 = 640;
    # in_proj 64 x (96 + 128 + 4) = 14,592; dt_bias, A_log, D 3 x 4 = 12; norm 96; out_proj 96 x 64 + 64 = 6,208;
    # attention q 64 x 96 + k, v 2 x 64 x 48 + o 96 x 64 = 18,432; two norms 128: 58,540
    # 2 layers 117,080 + embed 6,400 + lm_head 6,400 + final norm 64 = 129,944
    assert m.num_parameters == 129_944
    assert m.mamba is not None and m.mamba.parallel_attention and m.mamba.layers == (0, 1)
    assert (m.mamba.intermediate_size, m.mamba.head_dim, m.mamba.conv_dim) == (96, 24, 128)
    assert m.head_dim == 24


@pytest.mark.parametrize("cfg", [SMALL, TIED])
def test_parameters_match_transformers_meta_module(cfg: dict[str, object]) -> None:
    import re

    module = meta_module(dict(cfg), "AutoModelForCausalLM")
    m = model_from_config(cfg)
    assert m.num_parameters == sum(p.numel() for p in module.parameters())
    theirs = {re.sub(r"\.\d+\.", ".", n.removeprefix("model.")) for n, _ in module.named_parameters()}
    assert {p.name for p in m.params} == theirs


def test_tied_defaults_by_hand() -> None:
    m = model_from_config(TIED)
    # width 2 x 64 = 128, 8 heads of 16, 1 group of state 4: conv_dim 136; head_dim 64 / 4 = 16
    # per layer: MLP 3 x 64 x 32 = 6,144; conv1d 136 x 4 + 136 = 680; in_proj 64 x (128 + 136 + 8) + 272 = 17,680;
    # dt_bias, A_log, D 24; no norm; out_proj 128 x 64 = 8,192; attention (KV heads default 8 -> 8 x 16 = 128 wide)
    # q 64 x 64 + k, v 2 x 64 x 128 + o 64 x 64 = 24,576; two norms 128: 57,424
    # 3 layers 172,272 + embed 6,400 (tied, no lm_head) + final norm 64 = 178,736
    assert m.num_parameters == 178_736
    assert m.num_kv_heads == 8


def test_every_layer_keeps_a_kv_cache_and_a_mixer_state() -> None:
    m = model_from_config(SMALL)
    assert [ls.index for ls in attention_layers(m)] == [0, 1]
    # 2 layers x 2 (K and V) x 2 KV heads x 24 x 2 B = 384 B per token
    assert kv_bytes_per_token(m, 2) == 384
    # per layer and sequence: conv 128 x 4 x 2 B = 1,024 + SSM 4 x 24 x 8 x 4 B = 3,072; 2 layers, batch 3: 24,576
    assert ssm_state_bytes(m, 3, 2) == 24_576


def test_running_layer_holds_the_mixer_output_and_scaled_inputs() -> None:
    m = model_from_config(SMALL)
    # 2 x b p h c = 2 x 2 x 100 x 64 x 2 = 51,200 B on either side
    assert parallel_mixer_kept_bytes(m, 2, 100, 2) == parallel_mixer_input_bytes(m, 2, 100, 2) == 51_200
    bamba = {"model_type": "bamba", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
             "vocab_size": 100, "attn_layer_indices": [1], "mamba_n_heads": 4, "mamba_d_state": 8}
    assert parallel_mixer_kept_bytes(model_from_config(bamba), 2, 100, 2) == 0


@pytest.mark.parametrize("prompt", [100, 200])
def test_traced_generate_agrees_with_the_analytic_engine(prompt: int) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.trace.engine import estimate as traced

    doc = {"task": "inference", "model": SMALL, "hardware": {"gpu": "A100-80GB"},
           "inference": {"batch_size": 2, "prompt_len": prompt, "new_tokens": 10}}
    a, t = estimate(doc).per_gpu.peak_allocated_bytes, traced(doc).per_gpu.peak_allocated_bytes
    # traced on the CPU (transformers 5.24, the torch scan): 10,004,992 B at 100 tokens, 11,066,368 B at 200; the
    # analytic engine 0.3% under (the scan's einsum copies and the muP multipliers' short-lived copies, stated as not
    # counted)
    assert 0.99 < a / t <= 1.0


@pytest.mark.parametrize(("extra", "where"), [
    ({"task": "train", "train": {"precision": "bf16-mixed"}}, "bf16-mixed training is not estimated"),
    # LoRA is estimated (below); DoRA on a hybrid is not
    ({"task": "train", "train": {"precision": "bf16-true", "peft": {"method": "dora", "rank": 8,
                                                                     "target_modules": ["q_proj"]}}},
     "DoRA on it is not estimated"),
    ({"task": "serve", "serve": {"engine": "vllm"}}, "serving it with vllm is not estimated"),
    ({"task": "inference", "parallel": {"tp": 2}, "hardware": {"gpu": "A100-80GB", "num_gpus": 2}},
     "tensor parallelism is not estimated"),
    ({"task": "inference", "inference": {"kv_cache_dtype": "int8"}}, "QuantizedCache refuses"),
    ({"task": "inference", "framework": "lightning"}, "Lit-GPT ships no such model"),
])
def test_what_is_not_modelled_is_refused(extra: dict[str, object], where: str) -> None:
    doc: dict[str, object] = {"model": SMALL, "hardware": {"gpu": "A100-80GB"}, **extra}
    with pytest.raises(ScenarioError) as exc:
        estimate(doc)
    assert where in str(exc.value)


def test_inconsistent_mamba_heads_are_refused() -> None:
    with pytest.raises(ScenarioError, match="mamba_n_heads x mamba_d_head"):
        model_from_config({**SMALL, "mamba_d_head": 16})


def test_running_mixer_holds_the_layer_input_and_normalized_input() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.trace.engine import estimate as traced

    doc = {"task": "inference", "model": SMALL, "hardware": {"gpu": "A100-80GB"},
           "inference": {"batch_size": 4, "prompt_len": 512, "new_tokens": 4}}
    a, t = estimate(doc).per_gpu.peak_allocated_bytes, traced(doc).per_gpu.peak_allocated_bytes
    # the prefill's running mixer is the peak here (its scan 9,468,928 B against the attention side's 1,966,080 +
    # 524,288): traced on the CPU 20,016,640 B, the analytic 19,903,280 B (0.6% under: the scan's einsum copies);
    # without the layer's input and normalized input beside the mixer (2 x 4 x 512 x 64 x 2 = 524,288 B) it would be
    # 3.2% under
    assert 0.99 < a / t <= 1.0
    assert (a - parallel_mixer_input_bytes(model_from_config(SMALL), 4, 512, 2)) / t < 0.975


def test_transformers_before_5_18_broadcast_products_reach_its_mixers() -> None:
    from vramplan.analytic.ssm_state import broadcast_product_bytes

    # transformers 5.17.0's modeling_falcon_h1.py torch_chunk_scan has Bamba's broadcast products
    # (``G = (C[:, :, :, None, :, :] * B[:, :, None, :, :, :]).sum(dim=-1)``, read in the 5.17.0 wheel)
    doc = {"task": "inference", "model": SMALL, "hardware": {"gpu": "A100-80GB"},
           "inference": {"batch_size": 4, "prompt_len": 512, "new_tokens": 4}}
    old = {**doc, "software": {"transformers": "5.17.0"}}
    m = model_from_config(SMALL)
    assert m.mamba is not None
    # P = 4 x 512 = 2,048 positions, chunk 16, 4 heads of 24 (I = 96), state 8: G 2,048 x 16 x 4 x 8 x 4 = 4,194,304;
    # Y_diag 2,048 x 16 x 96 x 4 = 12,582,912; the states 2,048 x 96 x 8 x 4 = 6,291,456; the recurrence
    # 4 x 33^2 x 96 x 8 x 4 = 13,381,632: the recurrence's is the largest
    extra = broadcast_product_bytes(m.mamba, 4, 512)
    assert extra == 13_381_632
    assert (estimate(old).per_gpu.peak_allocated_bytes - estimate(doc).per_gpu.peak_allocated_bytes) == extra


def test_kv_command_counts_every_layer_and_its_mixer_state(tmp_path: object) -> None:
    import json
    from pathlib import Path

    from typer.testing import CliRunner

    from vramplan.cli.main import app

    path = Path(str(tmp_path)) / "config.json"
    path.write_text(json.dumps(SMALL))
    res = CliRunner().invoke(app, ["kv", str(path), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    # 2 layers of 2 x 2 x 24 x 2 = 192 B per token; 2 mixers of 1,024 conv + 3,072 SSM = 4,096 B per sequence
    assert (doc["bytes_per_token"], doc["layers"], doc["ssm_state_bytes_per_sequence"]) == (384, 2, 8_192)
    res = CliRunner().invoke(app, ["kv", str(path)], env={"COLUMNS": "200"})
    assert "beside the KV cache of the same layers" in res.output


def _mixer_graph_saved(config: dict[str, object], mode: str, batch: int, seq: int) -> int:
    """Bytes of the storages autograd's graph saves after one ``FalconH1Mixer`` forward on the meta device, less the
    parameters, the ``mup_vector`` buffer and the 0-dim wrapped Python numbers (8 B each, host memory on a GPU)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.falcon_h1.modeling_falcon_h1 import FalconH1Mixer, compute_mup_vector

    transformers.logging.set_verbosity_error()
    cfg = transformers.AutoConfig.for_model(**config)
    weights = torch.bfloat16 if mode == "bf16" else torch.float32
    with torch.device("meta"):
        mixer = FalconH1Mixer(cfg, 0)
        # FalconH1Model.__init__ registers the buffer in every mixer
        mixer.register_buffer("mup_vector", compute_mup_vector(cfg).to("meta"), persistent=False)
        mixer = mixer.to(weights)
    mixer.train()
    held = {id(p.untyped_storage()) for p in (*mixer.parameters(), *mixer.buffers())}
    x = torch.empty(batch, seq, cfg.hidden_size, device="meta", dtype=weights, requires_grad=True)
    out = mixer(x)
    saved = graph_saved_storages(out, held, nonscalar=True)
    return sum(saved.values())


def test_mixer_without_gated_norm_by_hand() -> None:
    from vramplan.analytic.activations import total_bytes
    from vramplan.analytic.terms.mamba2 import mixer_saved_tensors

    gated, plain = model_from_config(SMALL).mamba, model_from_config({**SMALL, "mamba_rms_norm": False}).mamba
    assert gated is not None and plain is not None and gated.gated_norm and not plain.gated_norm
    # b 2, s 40, bf16: T 80, I 96, 2 groups; the gated norm's records, gate.float() 4 x 80 x 96 = 30,720, SiLU,
    # product and normalized 3 x 30,720 = 92,160, rsqrt 4 x 80 x 2 = 640 (123,520), give way to SiLU's bf16 output
    # 80 x 96 x 2 = 15,360: 108,160 less
    diff = total_bytes(mixer_saved_tensors(gated, 64, 2, False, 2, 40)) - total_bytes(
        mixer_saved_tensors(plain, 64, 2, False, 2, 40))
    assert diff == 108_160


@pytest.mark.parametrize(("mode", "norm"), [("bf16", True), ("bf16", False), ("fp32", True), ("fp32", False)])
def test_mixer_saved_equals_the_autograd_graph(mode: str, norm: bool) -> None:
    from vramplan.analytic.activations import total_bytes
    from vramplan.analytic.terms.mamba2 import mixer_saved_tensors

    config = {**SMALL, "mamba_rms_norm": norm}
    ms = model_from_config(config).mamba
    assert ms is not None
    c = 4 if mode == "fp32" else 2
    # exact, storage by storage: the muP products (ssm_in_multiplier, mup_vector) save nothing of their own
    assert _mixer_graph_saved(config, mode, 2, 40) == total_bytes(mixer_saved_tensors(ms, 64, c, False, 2, 40))


@pytest.mark.parametrize(("norm", "precision", "checkpointing", "low", "high"), [
    (True, "bf16-true", "none", 0.99, 1.0), (False, "bf16-true", "none", 0.99, 1.0),
    (False, "bf16-true", "full", 0.99, 1.0),
    # fp32: 1.8% above the traced engine, the peak falling at another moment of the backward (Bamba's tester is
    # 0.5% above under fp32 too); its cause is not identified
    (False, "fp32", "none", 1.0, 1.02)])
def test_train_step_agrees_with_the_traced_engine(norm: bool, precision: str, checkpointing: str, low: float,
                                                   high: float) -> None:
    pytest.importorskip("torch")
    from vramplan.trace.engine import estimate as traced

    doc = {"task": "train", "model": {**SMALL, "mamba_rms_norm": norm}, "hardware": {"gpu": "A100-80GB"},
           "train": {"micro_batch_size": 2, "seq_len": 100, "precision": precision, "optimizer": "adamw",
                     "gradient_checkpointing": checkpointing}}
    a, t = estimate(doc).per_gpu.peak_allocated_bytes, traced(doc).per_gpu.peak_allocated_bytes
    # bf16-true: 0.15% to 0.55% under (the mixer's backward gradients inside the scan are not modelled, as Bamba's)
    assert low < a / t <= high


def test_transformers_before_5_18_broadcast_products_reach_its_training() -> None:
    from vramplan.analytic.ssm_state import broadcast_product_bytes

    doc = {"task": "train", "model": SMALL, "hardware": {"gpu": "A100-80GB"},
           "train": {"micro_batch_size": 2, "seq_len": 100, "precision": "bf16-true", "optimizer": "adamw"}}
    old = {**doc, "software": {"transformers": "5.17.0"}}
    m = model_from_config(SMALL)
    assert m.mamba is not None
    # each mixer's backward holds two full-size gradients of its largest product (analytic/terms/transients.py
    # mixer_scan_products): P = 2 x 112 = 224, chunk 16, I = 96, state 8, 7 chunks a sequence: Y_diag's
    # 224 x 16 x 96 x 4 = 1,376,256 B is the largest (G 458,752; the states 688,128; the recurrence 2 x 8^2 x 96 x 8 x
    # 4 = 393,216), twice 2,752,512 B
    assert 2 * broadcast_product_bytes(m.mamba, 2, 100) == 2_752_512
    diff = estimate(old).per_gpu.peak_allocated_bytes - estimate(doc).per_gpu.peak_allocated_bytes
    assert 0 < diff <= 2_752_512


def test_plan_searches_only_the_estimated_setups(tmp_path: object) -> None:
    import json
    from pathlib import Path

    from typer.testing import CliRunner

    from vramplan.cli.main import app

    path = Path(str(tmp_path)) / "config.json"
    path.write_text(json.dumps(SMALL))
    # the schema's default precision (bf16-mixed) is refused for its training under the Trainer or FSDP: the search
    # leaves those setups out (a refused candidate would end the plan with an error) and keeps DeepSpeed's
    res = CliRunner().invoke(app, ["plan", "--model", str(path), "--gpu", "H100", "--task", "train", "--seq-len",
                                   "512", "--global-batch", "8", "--num-gpus", "1-2", "--json"])
    assert res.exit_code == 0, res.output
    assert "DeepSpeed" in res.output


def test_traced_decode_cache_holds_both_states_in_every_layer() -> None:
    torch = pytest.importorskip("torch")
    from vramplan.trace.step import _filled_cache
    from vramplan.trace.tracker import Tracker

    model = meta_module(dict(SMALL), "AutoModelForCausalLM").to(torch.bfloat16)
    with Tracker() as tr:
        cache = _filled_cache(model, tr, 3, 10, "meta")
    for layer in cache.layers:
        # 3 sequences x 2 KV heads x 10 tokens x 24; conv (3, 128, 4) bf16 (mamba_d_ssm 96 + 2 x 2 x 8); fp32 SSM
        # (3, 4 heads, 24, 8)
        assert tuple(layer.keys.shape) == (3, 2, 10, 24)
        assert tuple(layer.conv_states[0].shape) == (3, 128, 4)
        assert tuple(layer.recurrent_states[0].shape) == (3, 4, 24, 8)


@pytest.mark.parametrize(("mode", "norm"), [("bf16", True), ("bf16", False), ("fp32", True), ("fp32", False)])
@pytest.mark.parametrize(("batch", "seq"), [(2, 40), (1, 64)])
def test_frozen_mixer_records_equal_the_autograd_graph(mode: str, norm: bool, batch: int, seq: int) -> None:
    # frozen (analytic/terms/mamba2.py frozen_mixer_dropped): no in_proj or out_proj input, a third of the gated
    # norm's fp32 tensors, no padded x for D's gradient, half of "mixer.A" (exp's result), and in bf16 a third of
    # "mixer.dt" (the fp32 dt A * dt kept for A's gradient): test_frozen_mixer_dropped_by_hand sums them by hand
    from vramplan.analytic.terms.mamba2 import frozen_mixer_dropped, mixer_saved_tensors

    config = {**SMALL, "mamba_rms_norm": norm}
    ms = model_from_config(config).mamba
    assert ms is not None
    c = 4 if mode == "fp32" else 2
    dropped = frozen_mixer_dropped(ms, frozenset(), c < 4, batch)
    analytic = sum(x.nbytes - round(x.nbytes * dropped.get(x.name, 0))
                   for x in mixer_saved_tensors(ms, 64, c, False, batch, seq))
    pytest.importorskip("transformers")
    from transformers.models.falcon_h1.modeling_falcon_h1 import FalconH1Mixer, compute_mup_vector

    from meta_build import mixer_graph_saved

    def make(cfg: Any, layer: int) -> Any:
        mixer = FalconH1Mixer(cfg, layer)
        # FalconH1Model.__init__ registers the buffer in every mixer
        mixer.register_buffer("mup_vector", compute_mup_vector(cfg).to("meta"), persistent=False)
        return mixer

    assert mixer_graph_saved(make, config, mode, batch, seq, frozen=True, nonscalar=True) == analytic


def test_frozen_mixer_dropped_by_hand() -> None:
    from vramplan.analytic.terms.mamba2 import frozen_mixer_dropped, mixer_saved_tensors

    ms = model_from_config(SMALL).mamba
    assert ms is not None
    # b 2, s 40 (T 80), bf16, P 48 padded tokens, I 96, 4 heads: in_proj's input 80 x 64 x 2 = 10,240; out_proj's
    # 80 x 96 x 2 = 15,360; a third of the gated norm's 3 x 4 x 80 x 96 = 30,720; D's padded x 4 x 2 x 48 x 96 = 36,864;
    # A's exp 4 x 4 = 16; a third of dt's 12 x 80 x 4 = 1,280: 94,480 B fewer than the trainable records
    saved = {x.name: x.nbytes for x in mixer_saved_tensors(ms, 64, 2, False, 2, 40)}
    dropped = frozen_mixer_dropped(ms, frozenset(), True, 2)
    assert sum(round(saved[k] * v) for k, v in dropped.items() if k in saved) == 94_480


@pytest.mark.parametrize(("targets", "layers"), [(["q_proj", "v_proj"], 6), (["in_proj"], 6),
                                                 (["q_proj", "k_proj", "v_proj", "o_proj", "in_proj", "gate_proj",
                                                   "up_proj", "down_proj"], 6)])
@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_lora_step_agrees_with_the_traced_engine(targets: list[str], layers: int, checkpointing: str) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from vramplan.trace.engine import estimate as traced

    doc = {"task": "train", "model": {**SMALL, "num_hidden_layers": layers}, "hardware": {"gpu": "A100-80GB"},
           "train": {"micro_batch_size": 2, "seq_len": 128, "precision": "bf16-true", "optimizer": "adamw",
                     "gradient_checkpointing": checkpointing,
                     "peft": {"method": "lora", "rank": 8, "target_modules": targets}}}
    a, t = estimate(doc).per_gpu.peak_allocated_bytes, traced(doc).per_gpu.peak_allocated_bytes
    # bf16: measured 0.987-1.009 (the first layer's frozen mixer records nothing when no mixer carries an adapter:
    # analytic/terms/frozen_prefix.py); fp32 runs 1.4-5% over (not asserted here; LoRA is trained in half weights)
    assert 0.98 <= a / t <= 1.01
