"""LoRA and QLoRA on MoE models.

QLoRA: the routed experts are stored and run as bitsandbytes 4-bit linears.

transformers 5 holds a MoE layer's experts as fused 3-D parameters, which its bitsandbytes
integration does not convert; transformers 4.x held them as per-expert ``nn.Linear`` and
quantized each.  The traced engine converts the fused experts back to per-expert
``QuantLinear`` (trace/quant.py ``QuantExperts``).

The model: a 2-layer Mixtral, hidden 128, expert intermediate 256, 4 experts (top-2), 4 query
and 2 key/value heads of 32, vocab 512.  Per layer the quantized linears are
q (128 x 128 = 16,384 weights), k and v (128 x 64 = 8,192 each), o (16,384), and
4 experts x gate/up/down (128 x 256 = 32,768 each); the router stays a plain parameter.

LoRA over the fused 3-D expert parameters (peft's ``ParamWrapper``): peft opens
``torch.autocast(device_type=W.device.type, enabled=False)`` around its fold of the adapter
into the expert stack; the trace maps it to the emulated CUDA autocast (trace/cuda.py).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from vramplan.analytic.weights import quantized_linear_bytes
from vramplan.catalog.resolve import resolve
from vramplan.trace.build import build_model
from vramplan.trace.quant import EXPERTS_NOTE, QuantExperts
from vramplan.trace.step import trace_train

MIXTRAL = {"model_type": "mixtral", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "num_local_experts": 4,
           "num_experts_per_tok": 2}
EXPERT_LINEARS = 2 * 4 * 3  # layers x experts x (gate, up, down)
EXPERT_NUMEL = 128 * 256


def _doc(quant: str) -> dict[str, object]:
    return {"model": MIXTRAL, "hardware": {"gpu": "a100"},
            "train": {"micro_batch_size": 2, "seq_len": 64, "peft": {"method": "qlora", "rank": 8},
                      "quantization": quant, "quantize_moe_experts": True}}


@pytest.mark.parametrize(("quant", "state_bytes"), [
    # nf4: per linear one fp32 absmax per 64 weights plus the 16-entry fp32 code (64 B).
    #   q, o: 16,384 / 64 = 256 blocks -> 1,024 + 64 = 1,088;  k, v: 128 blocks -> 512 + 64 = 576
    #   attention: 2 layers x (2 x 1,088 + 2 x 576) = 6,656
    #   experts: 32,768 / 64 = 512 blocks -> 2,048 + 64 = 2,112;  x 24 = 50,688
    #   total 57,344
    ("nf4", 57_344),
    # nf4-dq: uint8 absmax per block, one fp32 absmax per 256 blocks, an fp32 offset, the code (64 B)
    #   q, o: 256 + 4 * 1 + 4 + 64 = 328;  k, v: 128 + 4 * 1 + 4 + 64 = 200
    #   attention: 2 x (2 x 328 + 2 x 200) = 2,112
    #   experts: 512 + 4 * 2 + 4 + 64 = 588;  x 24 = 14,112
    #   the 256-entry fp32 dynamic map, shared: 1,024
    #   total 17,248
    ("nf4-dq", 17_248),
])
def test_expert_weights_are_stored_as_bitsandbytes_4bit(quant: str, state_bytes: int) -> None:
    st = trace_train(resolve(_doc(quant)), "meta")
    weights = [e for e in st.events if e.nbytes > 0 and e.category == "weights"]
    # the packed payload: two 4-bit codes per byte, 32,768 / 2 = 16,384 bytes per expert projection
    payload = [e for e in weights if ".mlp.experts." in e.op]
    assert len(payload) == EXPERT_LINEARS
    assert {e.nbytes for e in payload} == {EXPERT_NUMEL // 2}
    # no fused expert tensor in the load dtype (nor cast to fp32 by prepare_model_for_kbit_training)
    assert not [e for e in weights if e.op.endswith(("gate_up_proj", "experts.down_proj"))]
    assert sum(e.nbytes for e in weights if e.op == "quantization state") == state_bytes
    assert EXPERTS_NOTE in st.notes


@pytest.mark.parametrize("quant", ["nf4", "nf4-dq"])
def test_expert_bytes_match_the_analytic_formula(quant: str) -> None:
    # second check: the analytic engine's bytes per quantized linear (payload + absmax levels), plus
    # what it leaves out per tensor: the 16-entry fp32 code (64 B) and, with double quantization,
    # the fp32 offset (4 B)
    built = build_model(resolve(_doc(quant)))
    experts = [m for m in built.model.modules() if isinstance(m, QuantExperts)]
    assert len(experts) == 2
    per_linear = quantized_linear_bytes(EXPERT_NUMEL, 256, quant) + 64 + (4 if quant == "nf4-dq" else 0)
    for qe in experts:
        for proj in qe.projections():
            # state: absmax, code (, absmax2, offset, then the dynamic map shared by every linear)
            own = proj.weight.untyped_storage().nbytes() + sum(t.untyped_storage().nbytes() for t in proj.state[:4])
            assert own == per_linear
    # nf4: 16,384 + 4 * 512 + 64 = 18,496;  nf4-dq: 16,384 + 512 + 4 * 2 + 64 + 4 = 16,972
    assert per_linear == {"nf4": 18_496, "nf4-dq": 16_972}[quant]


def test_gpt_oss_style_experts_are_left_alone() -> None:
    # experts stored transposed with biases (gpt-oss) were never converted by bitsandbytes
    import torch

    from vramplan.trace.quant import _fused_experts

    class Transposed(torch.nn.Module):
        is_transposed = True
        has_bias = True

        def __init__(self) -> None:
            super().__init__()
            self.gate_up_proj = torch.nn.Parameter(torch.empty(4, 128, 512, device="meta"))
            self.down_proj = torch.nn.Parameter(torch.empty(4, 256, 128, device="meta"))
            self.act_fn = torch.nn.SiLU()

    class Fused(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate_up_proj = torch.nn.Parameter(torch.empty(4, 512, 128, device="meta"))
            self.down_proj = torch.nn.Parameter(torch.empty(4, 128, 256, device="meta"))
            self.act_fn = torch.nn.SiLU()

    assert not _fused_experts(Transposed())
    assert _fused_experts(Fused())


def _lora_doc() -> dict[str, object]:
    return {"model": MIXTRAL, "hardware": {"gpu": "a100"},
            "train": {"micro_batch_size": 2, "seq_len": 64, "precision": "bf16-mixed",
                      "peft": {"method": "lora", "rank": 8, "alpha": 16, "target_modules": "all-linear"}}}


def test_lora_on_fused_expert_parameters_is_traced() -> None:
    import torch

    autocast_before = torch.autocast
    st = trace_train(resolve(_lora_doc()), "meta")
    assert torch.autocast is autocast_before  # the emulation is undone on exit
    # trainable adapter parameters, fp32.  peft (transformers_weight_conversion.py) maps
    # "all-linear" on Mixtral to the v4 names: w1 + w3 fused into gate_up_proj at rank 2r = 16,
    # w2 = down_proj at rank r, and the router ``gate``.  ParamWrapper: A is (rank x E) x in,
    # B is out x (rank x E), with in/out of one expert.
    #   gate_up (E=4, in 128, out 512, rank 16): A 64 x 128 = 8,192, B 512 x 64 = 32,768
    #   down    (E=4, in 256, out 128, rank 8):  A 32 x 256 = 8,192, B 128 x 32 = 4,096
    #   router  (128 -> 4, rank 8):             A 8 x 128 = 1,024,   B 4 x 8 = 32
    #   q, o (128 -> 128): 2 x 2,048;  k, v (128 -> 64): 2 x (1,024 + 512) -> 7,168
    #   per layer 61,472; x 2 layers = 122,944 parameters x 4 B = 491,776 B
    lora = [e for e in st.events if e.nbytes > 0 and e.category == "weights" and ".lora_" in e.op]
    assert sum(e.nbytes for e in lora) == 491_776
    # the fold W + s * (B A) (baddbmm, bf16 like the base stack) is what the expert GEMMs read,
    # so each layer's merged stacks are kept for the backward:
    #   gate_up 4 x 512 x 128 x 2 B = 524,288; down 4 x 128 x 256 x 2 B = 262,144
    kept = [e.nbytes for e in st.events if e.nbytes > 0 and e.op == "aten.baddbmm.default"
            and e.category == "activations"]
    assert sorted(kept) == [262_144, 262_144, 524_288, 524_288]


def test_emulated_autocast_region_on_the_traced_device() -> None:
    import torch

    from vramplan.trace import cuda

    a = torch.empty((4, 4), device="meta")
    with cuda.cuda_behaviour(cuda.CudaSpec()), cuda.autocast(torch.bfloat16):
        assert torch.mm(a, a).dtype == torch.bfloat16
        with torch.autocast(device_type="meta", enabled=False):  # as on CUDA: autocast off inside
            assert torch.mm(a, a).dtype == torch.float32
            with torch.autocast(device_type="cuda"):  # re-enabled with the current dtype
                assert torch.mm(a, a).dtype == torch.bfloat16
        assert torch.mm(a, a).dtype == torch.bfloat16
    with torch.autocast(device_type="cpu", enabled=False):  # outside the trace: torch's own
        assert torch.mm(a, a).dtype == torch.float32
