"""Adapters on a Mamba2 hybrid (Nemotron-H, Bamba, Granite 4.0-H): the frozen mixers' records (analytic/terms/mamba2.py
``frozen_mixer_dropped``), the hybrid's frozen prefix (analytic/terms/frozen_prefix.py ``_hybrid_prefix``), each checked
against the traced engine, which runs transformers' and peft's own modules on the meta device; and what the analytic
engine leaves out (part of what a recomputed layer holds with checkpointing: stated, the band widened)."""

from __future__ import annotations

from typing import Any

import pytest

from vramplan import estimate
from vramplan.analytic.terms import StepContext
from vramplan.analytic.terms.layers import layer_activations
from vramplan.analytic.terms.mamba2 import frozen_mixer_dropped, mixer_saved_tensors
from vramplan.catalog.resolve import resolve
from vramplan.errors import VramplanError
from vramplan.spec.hf_config import model_from_config

# a Nemotron 3-like stack: mixers first and last, MLP, attention and MoE blocks between them
NH: dict[str, Any] = {
    "model_type": "nemotron_h", "vocab_size": 1000, "hidden_size": 256, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 512, "hybrid_override_pattern": "M-*-M-ME*M",
    "mamba_num_heads": 8, "mamba_head_dim": 32, "n_groups": 2, "ssm_state_size": 16, "conv_kernel": 4, "chunk_size": 64,
    "max_position_embeddings": 4096, "num_hidden_layers": 10, "n_routed_experts": 8, "num_experts_per_tok": 2,
    "moe_intermediate_size": 384, "moe_shared_expert_intermediate_size": 768}
ATTN_MLP = ["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"]


def _doc(model: dict[str, Any], targets: list[str] | None, checkpointing: str = "none", seq: int = 512,
         precision: str = "bf16-mixed") -> dict[str, Any]:
    train: dict[str, Any] = {"micro_batch_size": 4, "seq_len": seq, "precision": precision, "optimizer": "adamw",
                             "gradient_checkpointing": checkpointing}
    if targets is not None:
        train["peft"] = {"method": "lora", "rank": 16, "target_modules": targets}
    return {"task": "train", "model": model, "hardware": {"gpu": "A100-80GB"}, "train": train}


def test_frozen_mixer_records_by_hand() -> None:
    ms = model_from_config(NH).mamba
    assert ms is not None
    # T = 4 x 512 = 2,048 tokens, h 256, I = 8 x 32 = 256, bf16 under autocast: in_proj's input 2 x 2,048 x 256 =
    # 1,048,576 B and out_proj's 1,048,576 B go; the gated norm's three fp32 tensors 3 x 4 x 2,048 x 256 = 6,291,456 B
    # keep two of three (4,194,304 B)
    saved = {t.name: t.nbytes for t in mixer_saved_tensors(ms, 256, 2, True, 4, 512)}
    assert (saved["mixer.in_proj_input"], saved["mixer.out_proj_input"], saved["norm.gated"]) == \
        (1_048_576, 1_048_576, 6_291_456)
    # and ``D * pad(x)`` keeps no padded x, exp(A_log) no result; under autocast another op keeps the fp32 dt
    assert frozen_mixer_dropped(ms, frozenset(ATTN_MLP), True, 4, autocast=True) == {
        "mixer.out_proj_input": 1.0, "mixer.in_proj_input": 1.0, "norm.gated": 1 / 3,
        "scan.x_padded_D_residual": 1.0, "mixer.A": 1 / 2}
    # without autocast, in a half dtype, ``A * dt`` keeps no dt (one of mixer.dt's three fp32 tensors)
    assert frozen_mixer_dropped(ms, frozenset(ATTN_MLP), True, 4)["mixer.dt"] == 1 / 3
    # an adapter on in_proj saves that same input (lora_A's): kept
    assert "mixer.in_proj_input" not in frozen_mixer_dropped(ms, frozenset({"in_proj"}))


def test_mixers_before_the_first_adapter_record_nothing() -> None:
    # layer 0 is a mixer ("M") with a frozen in_proj on the frozen embeddings' output: nothing recorded; layer 1 is an
    # MLP block whose up_proj/down_proj carry adapters: it records, and the walk stops there
    c = StepContext(resolve(_doc(NH, ATTN_MLP)), 0, "sdpa", False)
    la = layer_activations(c)
    assert la.full[0] == 0 and la.full[1] > 0 and la.full[2] > 0
    # with in_proj adapted the first mixer records (its lora_A needs its input, which then requires grad onward)
    c = StepContext(resolve(_doc(NH, ["in_proj"])), 0, "sdpa", False)
    assert layer_activations(c).full[0] > 0


@pytest.mark.parametrize(("change", "seq", "precision", "targets"), [
    ({}, 512, "bf16-mixed", ATTN_MLP),
    ({}, 512, "bf16-mixed", ["in_proj"]),
    ({"mamba_num_heads": 16, "ssm_state_size": 64}, 256, "bf16-mixed", ATTN_MLP),
    ({"chunk_size": 32, "mamba_head_dim": 64}, 1024, "bf16-true", ATTN_MLP),
])
def test_adapters_without_checkpointing_agree_with_the_traced_engine(change: dict[str, Any], seq: int,
                                                                      precision: str, targets: list[str]) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from vramplan.trace.engine import estimate as traced

    doc = _doc({**NH, **change}, targets, seq=seq, precision=precision)
    a, t = estimate(doc).per_gpu.peak_allocated_bytes, traced(doc).per_gpu.peak_allocated_bytes
    assert 0.97 < a / t < 1.06


@pytest.mark.parametrize("targets", [["q_proj", "k_proj", "v_proj", "o_proj"], "all-linear"])
@pytest.mark.parametrize("model", ["bamba", "granitemoehybrid"])
def test_adapters_on_bamba_and_granite_agree_with_the_traced_engine(model: str, targets: list[str] | str) -> None:
    """Bamba (a mixer or attention, then an MLP, in every layer) and Granite 4.0-H with experts: ``all-linear`` adapts
    their mixers' ``in_proj`` and ``out_proj`` too (peft refuses ``out_proj`` on Nemotron-H only), whose inputs lora_A
    then saves."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    import json
    from pathlib import Path

    from vramplan.trace.engine import estimate as traced

    if model == "bamba":
        config = json.loads((Path(__file__).parent / "data" / "bamba-tester" / "config.json").read_text())
    else:
        from test_families_granitemoehybrid import MOE_TESTER as config
    doc = {"task": "train", "model": config, "hardware": {"gpu": "A100-80GB"},
           "train": {"micro_batch_size": 2, "seq_len": 512, "precision": "bf16-mixed", "optimizer": "adamw",
                     "gradient_checkpointing": "none", "peft": {"method": "lora", "rank": 8, "target_modules": targets}}}
    a, t = estimate(doc).per_gpu.peak_allocated_bytes, traced(doc).per_gpu.peak_allocated_bytes
    assert 0.96 < a / t < 1.06


@pytest.mark.parametrize(("change", "seq", "precision", "targets"), [
    ({}, 512, "bf16-mixed", ATTN_MLP),  # measured 0.915 (the MoE block's backward holds more than counted)
    ({}, 512, "bf16-mixed", ["in_proj"]),  # 0.941
    ({"mamba_num_heads": 16, "ssm_state_size": 64}, 256, "bf16-mixed", ATTN_MLP),  # 0.970 (0.811 before the mixer's
    # backward and recomputed forward were modelled)
    ({"chunk_size": 32, "mamba_head_dim": 64}, 1024, "bf16-true", ATTN_MLP),  # 0.990
    ({"hybrid_override_pattern": "MM*MMM*MMM"}, 512, "bf16-mixed", ATTN_MLP),  # 0.950
])
def test_adapters_with_checkpointing_agree_with_the_traced_engine(change: dict[str, Any], seq: int, precision: str,
                                                                   targets: list[str]) -> None:
    """With full checkpointing the peak falls in a recomputed layer: the mixer's recomputed forward and its backward
    are modelled (mixer_recompute_per_token, mixer_backward_per_token); what else the layer holds is not, and the
    report says so with the bound this test holds (under by at most 6%).  Before the frozen mixer's records were
    made exact (D's padded residual, exp(A_log)'s result and, without autocast, A * dt's dt are not kept: read off
    the frozen mixers' graphs) the over-count of those records hid part of this gap: 0.939-1.030 then, 0.915-0.990
    now.  The recomputed forward's temporaries are the half-weights-under-autocast figure, exact on the isolated mixer
    (benchmarks/mixer_backward_transient.py); what the layer holds beyond them is the stated gap."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from vramplan.trace.engine import estimate as traced

    doc = _doc({**NH, **change}, targets, checkpointing="full", seq=seq, precision=precision)
    r = estimate(doc)
    a, t = r.per_gpu.peak_allocated_bytes, traced(doc).per_gpu.peak_allocated_bytes
    assert 0.90 < a / t < 1.0
    assert any(x.startswith("not modelled: ") and "up to 9% with adapters" in x for x in r.assumptions)


@pytest.mark.parametrize(("change", "seq", "precision"), [
    ({}, 512, "bf16-mixed"),
    ({"chunk_size": 128}, 1024, "bf16-mixed"),
    ({"chunk_size": 32, "mamba_head_dim": 64}, 1024, "bf16-true"),
])
def test_full_fine_tuning_with_checkpointing_is_under_the_traced_engine_as_stated(change: dict[str, Any], seq: int,
                                                                                  precision: str) -> None:
    """What else a recomputed layer holds is not modelled (the report says so, with this bound); the mixer's recomputed
    forward (mixer_recompute_per_token, under autocast its half copies) and its backward's gradients
    (mixer_backward_per_token) are: the analytic peak is under the traced engine's by at most 4% on these shapes
    (0.971, 0.969, 0.993 measured), never over; with the fp32 figure standing for autocast's forward temporaries it had
    been 0.971, 0.911, 0.993, and without the backward's gradients 0.971, 0.887, 0.883."""
    pytest.importorskip("torch")
    from vramplan.trace.engine import estimate as traced

    doc = _doc({**NH, **change}, None, checkpointing="full", seq=seq, precision=precision)
    r = estimate(doc)
    a, t = r.per_gpu.peak_allocated_bytes, traced(doc).per_gpu.peak_allocated_bytes
    assert 0.96 < a / t <= 1.0
    assert any("up to 4% in full fine-tuning" in x for x in r.assumptions)


@pytest.mark.parametrize(("targets", "said"), [
    (["experts"], "NemotronHExperts"),  # 3-D expert parameters, not a layer peft adapts
    (["gate", "q_proj"], "NemotronHTopkRouter"),  # a router holding a bare weight
    (["out_proj", "q_proj"], "incompatible with Mamba-based models"),  # peft's own refusal on nemotron_h
    ("all-linear", "all-linear reaches them"),  # all-linear reaches out_proj
])
def test_what_peft_refuses_on_nemotron_h_is_refused(targets: list[str] | str, said: str) -> None:
    model = {**NH, "hybrid_override_pattern": "M-*E"}
    with pytest.raises(VramplanError, match=said):
        estimate(_doc(model, targets))  # type: ignore[arg-type]


def test_peft_itself_refuses_what_is_refused_on_nemotron_h() -> None:
    """The independent check of the refusals above: peft's own get_peft_model on transformers' module built on the
    meta device raises for all-linear (the mixers' out_proj) and for the experts' module."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    import warnings

    transformers.logging.set_verbosity_error()
    for targets, said in (("all-linear", "incompatible with Mamba-based models"), (["experts"], "not supported")):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cfg = transformers.AutoConfig.for_model(**{**NH, "hybrid_override_pattern": "M-*E"})
            with torch.device("meta"):
                module = transformers.AutoModelForCausalLM.from_config(cfg)
        with pytest.raises(ValueError, match=said):
            peft.get_peft_model(module, peft.LoraConfig(r=8, target_modules=targets))


def test_dora_on_a_hybrid_is_refused() -> None:
    """DoRA's per-layer records assume every layer holds the same adapted linears: on this hybrid the estimate was
    1.62x the traced engine's peak (445,446,070 B against 275,297,792 B), so it is refused rather than answered."""
    doc = _doc(NH, ATTN_MLP)
    doc["train"]["peft"]["method"] = "dora"
    with pytest.raises(VramplanError, match="DoRA on it is not estimated"):
        estimate(doc)


@pytest.mark.parametrize("model_type", ["mamba", "mamba2", "falcon_mamba", "falcon_h1", "nemotron_h"])
def test_peft_refused_targets_follow_peft_s_list(model_type: str) -> None:
    """peft 0.21 ``_check_lora_target_modules_mamba`` refuses out_proj and conv1d for these model types (read on the
    installed peft when present); every family of them declares it."""
    from vramplan.catalog.models import list_models

    row = next(r for r in list_models() if r.config.get("model_type") == model_type)
    assert set(model_from_config(row.config).traits.peft_refused_targets) == {"out_proj", "conv1d"}
    try:
        import inspect

        from peft.tuners import tuners_utils
    except ImportError:
        return
    source = inspect.getsource(tuners_utils._check_lora_target_modules_mamba)
    assert f'"{model_type}"' in source and '"out_proj"' in source and '"conv1d"' in source


@pytest.mark.parametrize(("change", "r", "frozen", "want"), [
    # h 256, I = 8 x 32 = 256, 2 groups (the NH tester's mixer), bf16 frozen: 2 x 256 + 20 x 256 - 4 x 2 = 5,624
    ({}, 2, True, 5_624),
    # trained: 2 x 256 + 14 x 256 - 8 = 4,088; fp32 trained: 4 x 256 + 12 x 256 - 8 = 4,088 (h = I here)
    ({}, 2, False, 4_088), ({}, 4, False, 4_088),
    # I = 16 x 32 = 512: frozen bf16 2 x 256 + 20 x 512 - 8 = 10,744; trained fp32 4 x 256 + 12 x 512 - 8 = 7,160
    ({"mamba_num_heads": 16}, 2, True, 10_744), ({"mamba_num_heads": 16}, 4, False, 7_160),
])
def test_mixer_backward_transient_by_hand(change: dict[str, Any], r: int, frozen: bool, want: int) -> None:
    from vramplan.analytic.terms.mamba2 import mixer_backward_per_token

    ms = model_from_config({**NH, **change}).mamba
    assert mixer_backward_per_token(ms, 256, r, frozen) == want


def test_mixer_backward_transient_matches_the_tracked_mixer() -> None:
    # the formula against transformers' own NemotronHMamba2Mixer on the meta device, a shape the fit did not use
    torch = pytest.importorskip("torch")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from mixer_backward_transient import transient_per_token

    from vramplan.analytic.terms.mamba2 import mixer_backward_per_token

    ms = model_from_config({**NH, "hidden_size": 384, "mamba_num_heads": 12, "mamba_head_dim": 48, "n_groups": 3,
                            "ssm_state_size": 32}).mamba
    for trained in (False, True):
        got = transient_per_token(h=384, heads=12, hd=48, groups=3, state=32, b=2, s=512, dtype=torch.bfloat16,
                                  trained=trained)
        per_layer = 0 if not trained else 2 * (12 * 48) * (384 + 1)  # out_proj's and the norm's weight gradients
        assert got * 1024 == mixer_backward_per_token(ms, 384, 2, not trained) * 1024 + per_layer


# an NemotronHMamba2Mixer shape the fit did not use: h 640, 10 heads of 40 = I 400, 5 groups, state 24, chunk 96
UNFITTED = {"hidden_size": 640, "mamba_num_heads": 10, "mamba_head_dim": 40, "n_groups": 5, "ssm_state_size": 24,
            "chunk_size": 96}


def _tracked_recompute(dtype_name: str, trained: bool, autocast: bool) -> int:
    """The forward peak above its end, per token (floored), of transformers' own NemotronHMamba2Mixer of ``UNFITTED``
    on the meta device over 2 x 768 tokens, its weights and input in ``dtype_name``; ``autocast``: under bf16 CUDA
    autocast as the traced engine emulates it (torch's own autocast casts no meta tensor)."""
    import contextlib

    import torch
    import transformers
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHMamba2Mixer

    from vramplan.trace import cuda
    from vramplan.trace.tracker import Tracker

    dtype = getattr(torch, dtype_name)
    cfg = transformers.AutoConfig.for_model(**{**NH, **UNFITTED, "hybrid_override_pattern": "M",
                                               "num_hidden_layers": 1, "use_mamba_kernels": False})
    with torch.device("meta"):
        mixer = NemotronHMamba2Mixer(cfg, layer_idx=0).to(dtype)
        x = torch.empty(2, 768, 640, dtype=dtype, requires_grad=True)
    mixer.requires_grad_(trained)
    tracker = Tracker()
    with tracker:
        with contextlib.ExitStack() as region:
            if autocast:
                region.enter_context(cuda.cuda_behaviour(cuda.CudaSpec()))
                region.enter_context(cuda.autocast(torch.bfloat16))
            y = mixer(x)  # held: its graph keeps the saved tensors
        extra = tracker.peak_bytes - tracker.live_bytes
    del y
    return extra // 1536  # per token: the per-micro-batch terms spread over 1,536 tokens


def test_mixer_recompute_transient_matches_the_tracked_mixer() -> None:
    # the recomputed forward's peak above its end against transformers' own mixer, on the unfitted shape
    pytest.importorskip("torch")
    from vramplan.analytic.terms.mamba2 import mixer_recompute_per_token

    ms = model_from_config({**NH, **UNFITTED}).mamba
    for dtype, r, trained in (("bfloat16", 2, False), ("bfloat16", 2, True), ("float32", 4, True)):
        assert _tracked_recompute(dtype, trained, False) == mixer_recompute_per_token(ms, 640, r, not trained, 2, 768)


def test_mixer_recompute_transient_under_autocast_matches_the_tracked_mixer() -> None:
    # fp32 weights and input under bf16 CUDA autocast (the mixed-precision Trainer): the einsums' half copies and
    # outputs, on the unfitted shape.  Frozen: exact; trained: within a convolution bias's half cast, 2 x 600 B a layer
    # (< 1 B a token).  By hand, frozen, per token: 12 I + 8 g n + 10 H + 8 H n + 4 H l - 4 g = 4,800 + 960 + 100 +
    # 1,920 + 3,840 - 20 = 11,600, and per micro-batch 2 b I n + 2 b (nc + 1) I n - 2 h I = 38,400 + 345,600 -
    # 512,000 = -128,000 over 1,536 tokens: -83.3 -> 11,516 (floored)
    pytest.importorskip("torch")
    from vramplan.analytic.terms.mamba2 import mixer_recompute_per_token

    ms = model_from_config({**NH, **UNFITTED}).mamba
    frozen = _tracked_recompute("float32", False, True)
    assert frozen == mixer_recompute_per_token(ms, 640, 4, True, 2, 768, autocast=True) == 11_516
    assert 0 <= _tracked_recompute("float32", True, True) - mixer_recompute_per_token(ms, 640, 4, False, 2, 768,
                                                                                       autocast=True) <= 1
    # the fp32 figure, which had stood for autocast, is far smaller
    assert mixer_recompute_per_token(ms, 640, 4, True, 2, 768) < 0.9 * frozen
    # half weights and input under autocast (adapters on a bf16 base under the mixed-precision Trainer): in_proj makes
    # no cast and keeps its half output; by hand, frozen, per token 8 I + 4 g n + 8 H + 8 H n + 4 H l - 4 g - 2 h =
    # 3,200 + 480 + 80 + 1,920 + 3,840 - 20 - 1,280 = 8,220, and the same -83.3 per token over the micro-batch: 8,136
    assert _tracked_recompute("bfloat16", False, True) == mixer_recompute_per_token(ms, 640, 2, True, 2, 768,
                                                                                     autocast=True) == 8_136


# LFM2 (gated short-convolution blocks and attention, every layer with an MLP named w1 / w3 / w2) at its released
# proportions (MLP about 3 x hidden), shrunk: convolution at 0, 1, 3, 5, attention at 2 and 4
LFM2: dict[str, Any] = {
    "model_type": "lfm2", "vocab_size": 4096, "hidden_size": 512, "block_ff_dim": 2048, "block_multiple_of": 256,
    "block_ffn_dim_multiplier": 1.0, "block_auto_adjust_ff_dim": True, "num_hidden_layers": 6,
    "num_attention_heads": 8, "num_key_value_heads": 2, "full_attn_idxs": [2, 4], "conv_L_cache": 3,
    "conv_bias": False, "max_position_embeddings": 4096}
LFM2_ALL = ["q_proj", "k_proj", "v_proj", "out_proj", "in_proj", "w1", "w2", "w3"]


def test_frozen_convolution_block_records_by_hand() -> None:
    ms = model_from_config(LFM2).mamba
    assert ms is not None and ms.kind == "short_conv" and ms.intermediate_size == 512
    # a frozen block drops in_proj's and out_proj's inputs unless an adapter needs them; B * x, C * conv and the
    # convolution keep their operands (each needs the other's gradient)
    assert frozen_mixer_dropped(ms, frozenset({"q_proj", "w1"})) == {"conv_block.in_proj_input": 1.0,
                                                                     "conv_block.out_proj_input": 1.0}
    assert frozen_mixer_dropped(ms, frozenset({"in_proj", "out_proj"})) == {}
    # the block's backward per token: r h + 3 c w frozen, r h + 2 c w trained; bf16 (r = c = 2), h = w = 512:
    # 1,024 + 3,072 = 4,096 and 1,024 + 2,048 = 3,072
    from vramplan.analytic.terms.mamba2 import mixer_backward_per_token

    assert (mixer_backward_per_token(ms, 512, 2, True, 2), mixer_backward_per_token(ms, 512, 2, False, 2)) == \
        (4_096, 3_072)


def test_lfm2_mlp_adapters_are_read_by_their_role() -> None:
    # w1 / w3 / w2 are LFM2's gate / up / down (Traits.mlp_module_roles): the activation terms read the adapters by
    # role, so an MLP adapted under its own names saves what lora_A needs (before, nothing was counted: 0.68-0.76 of
    # the traced engine)
    c = StepContext(resolve(_doc(LFM2, ["w1", "w2", "w3"])), 0, "sdpa", False)
    assert {"gate_proj", "up_proj", "down_proj"} <= c.act.lora_targets
    # layer 0 is a frozen convolution block on the frozen embeddings (nothing) whose MLP's adapters record
    assert layer_activations(c).full[0] > 0


@pytest.mark.parametrize(("targets", "checkpointing", "precision"), [
    (LFM2_ALL, "none", "bf16-mixed"),  # measured 0.993
    (LFM2_ALL, "none", "bf16-true"),  # 0.967
    (["q_proj", "k_proj", "v_proj", "out_proj"], "none", "bf16-mixed"),  # 1.021 (out_proj adapts the blocks too)
    (["w1", "w2", "w3"], "none", "bf16-true"),  # 1.000 (0.680 before the MLP's roles)
    (["in_proj", "out_proj"], "none", "bf16-mixed"),  # 0.997
    (LFM2_ALL, "full", "bf16-mixed"),  # 1.001
    (["w1", "w2", "w3"], "full", "bf16-true"),  # 1.001
])
def test_lfm2_adapters_agree_with_the_traced_engine(targets: list[str], checkpointing: str, precision: str) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from vramplan.trace.engine import estimate as traced

    doc = _doc(LFM2, targets, checkpointing, seq=512, precision=precision)
    doc["train"]["micro_batch_size"] = 2
    a, t = estimate(doc).per_gpu.peak_allocated_bytes, traced(doc).per_gpu.peak_allocated_bytes
    assert 0.95 < a / t < 1.05


def test_granite_shared_mlp_adapters_agree_with_the_traced_engine() -> None:
    # Granite 4.0-H's shared MLP is input_linear (gate and up, fused) and output_linear: read as gate_up_proj and
    # down_proj; measured 1.011 (0.737 before: the adapters' parameters were counted, not what they save)
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from test_families_granitemoehybrid import MICRO
    from vramplan.trace.engine import estimate as traced

    shape = {**MICRO, "num_hidden_layers": 6, "layer_types": ["mamba", "mamba", "attention", "mamba", "attention",
                                                                "mamba"], "hidden_size": 512,
             "shared_intermediate_size": 1536, "vocab_size": 4096, "mamba_n_heads": 16, "mamba_d_head": 64,
             "mamba_d_state": 32, "num_attention_heads": 8, "num_key_value_heads": 2}
    doc = _doc(shape, ["input_linear", "output_linear"])
    doc["train"]["micro_batch_size"] = 2
    a, t = estimate(doc).per_gpu.peak_allocated_bytes, traced(doc).per_gpu.peak_allocated_bytes
    assert 0.97 < a / t < 1.05
