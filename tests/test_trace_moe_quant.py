"""QLoRA on MoE models: the routed experts are stored and run as bitsandbytes 4-bit linears.

transformers 5 holds a MoE layer's experts as fused 3-D parameters, which its bitsandbytes
integration does not convert; transformers 4.x held them as per-expert ``nn.Linear`` and
quantized each.  The traced engine converts the fused experts back to per-expert
``QuantLinear`` (trace/quant.py ``QuantExperts``).

The model: a 2-layer Mixtral, hidden 128, expert intermediate 256, 4 experts (top-2), 4 query
and 2 key/value heads of 32, vocab 512.  Per layer the quantized linears are
q (128 x 128 = 16,384 weights), k and v (128 x 64 = 8,192 each), o (16,384), and
4 experts x gate/up/down (128 x 256 = 32,768 each); the router stays a plain parameter.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from vramplan.analytic.weights import quantized_linear_bytes
from vramplan.spec.load import resolve
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
                      "quantization": quant}}


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
