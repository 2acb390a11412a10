"""The meta-device trace against a real CPU training step, measured by the same tracker.

The same code runs twice: once on the meta device (no memory, what the traced engine does) and
once on real CPU tensors.  Both runs go through the CUDA behaviour layer, so the CPU run takes
the CUDA paths too (attention kernels and bitsandbytes layers allocate without computing
values there); everything else (transformers' modelling code, peft, autograd, torch's
optimizer) is real.  Peaks, overall and per phase, must agree to the byte.

The tracker's own effect on the step is checked against autograd without it: where the engine
sums two gradients of one input in place (``InputBuffer::accumulate``), it must do so under the
tracker too (trace/tracker.py).
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from vramplan.catalog.resolve import resolve
from vramplan.trace.report import peak_of
from vramplan.trace.step import trace_train

GPT2 = {"model_type": "gpt2", "n_embd": 128, "n_layer": 2, "n_head": 4, "vocab_size": 1000, "n_positions": 256}
LLAMA = {"model_type": "llama", "hidden_size": 128, "intermediate_size": 344, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 1024}
MIXTRAL = {"model_type": "mixtral", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "num_local_experts": 4,
           "num_experts_per_tok": 2}

CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("gpt2 bf16-mixed eager dropout", GPT2, {"attention": "eager"}),
    ("gpt2 fp32 sdpa", GPT2, {"precision": "fp32"}),
    ("llama bf16-mixed sdpa", LLAMA, {}),
    ("llama checkpointing", LLAMA, {"gradient_checkpointing": "full"}),
    ("llama lora all-linear", LLAMA, {"peft": {"method": "lora", "rank": 8, "target_modules": "all-linear",
                                               "dropout": 0.1}}),
    ("llama qlora nf4-dq", LLAMA, {"peft": {"method": "qlora", "rank": 8}, "quantization": "nf4-dq"}),
    ("llama bf16-true sgd accumulation", LLAMA, {"precision": "bf16-true", "optimizer": "sgd-momentum",
                                                 "grad_accum_steps": 2}),
    ("mixtral bf16-mixed", MIXTRAL, {}),
    # per-expert 4-bit linears (trace/quant.py QuantExperts): the experts loop, dequantization temporaries (the experts
    # said quantized: stock bitsandbytes leaves transformers 5's fused experts 16-bit, train.quantize_moe_experts)
    ("mixtral qlora nf4-dq checkpointing", MIXTRAL, {"peft": {"method": "qlora", "rank": 8}, "quantization": "nf4-dq",
                                                     "gradient_checkpointing": "full", "quantize_moe_experts": True}),
    ("mixtral qlora all-linear", MIXTRAL, {"peft": {"method": "qlora", "rank": 8, "target_modules": "all-linear"},
                                           "quantization": "nf4", "quantize_moe_experts": True}),
    # LoRA on the fused 3-D expert parameters (peft ParamWrapper, its autocast-disabled fold)
    ("mixtral lora all-linear", MIXTRAL, {"peft": {"method": "lora", "rank": 8, "target_modules": "all-linear"}}),
]


@pytest.mark.parametrize(("name", "config", "train"), CASES, ids=[c[0] for c in CASES])
def test_meta_trace_matches_real_cpu_step(name: str, config: dict[str, Any], train: dict[str, Any]) -> None:
    doc = {"model": config, "hardware": {"gpu": "a100"},
           "train": {"micro_batch_size": 2, "seq_len": 64, **train}}
    r = resolve(doc)
    meta = trace_train(r, "meta")
    real = trace_train(r, "cpu")
    pm, pr = peak_of(meta.events, meta.marks), peak_of(real.events, real.marks)
    assert pm.allocated_bytes == pr.allocated_bytes
    assert meta.raw_peak_bytes == real.raw_peak_bytes
    assert pm.phases == pr.phases
    assert pm.breakdown == pr.breakdown
    # a step really happened: every phase allocated something
    assert set(pm.phases) == {"forward", "backward", "optimizer"}
    assert pm.allocated_bytes > 0


# ---------------------------------------------------------------- gradient sums under the tracker


def _w_used_twice(kind: str, w: Any) -> Any:
    import torch
    from torch.nn.functional import embedding, linear

    ids = torch.tensor([0, 2, 5])
    if kind == "fresh":  # two MulBackward0 outputs, each a new tensor
        return (w * 2.0).sum() + (w * 3.0).sum()
    # a tied embedding: the lookup runs first, so the head's gradient reaches w first
    x = torch.randn(3, 4) + embedding(ids, w)[:, :4] * 0.0
    if kind == "head reads w":  # MmBackward0 -> TBackward0: a transposed view
        return linear(x, w).sum()
    # "head reads a cast copy" (autocast): ToCopyBackward0 returns a new fp32 tensor
    return linear(x.bfloat16(), w.bfloat16()).float().sum()


def _summed_in_place(kind: str, tracked: bool, hold: bool) -> bool:
    """Whether w.grad is the buffer of the first gradient to reach w (the sum was in place)."""
    import torch

    from vramplan.trace.tracker import Tracker

    torch.manual_seed(0)
    w = torch.randn(6, 4, requires_grad=True)
    loss = _w_used_twice(kind, w)
    feeders, todo, seen = [], [loss.grad_fn], set()
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for i, (fn, _) in enumerate(node.next_functions):
            if fn is not None and type(fn).__name__ == "AccumulateGrad":
                feeders.append((node, i))
            todo.append(fn)
    first: list[int] = []
    held: list[Any] = []
    for node, i in feeders:
        def post(grad_inputs: Any, _grad_outputs: Any, i: int = i) -> None:
            if grad_inputs[i] is not None and not first:
                first.append(grad_inputs[i].data_ptr())
                if hold:  # a Python reference: the buffer no longer holds it alone
                    held.append(grad_inputs[i])
        node.register_hook(post)
    if tracked:
        with Tracker():
            loss.backward()
    else:
        loss.backward()
    assert w.grad is not None
    return bool(w.grad.data_ptr() == first[0])


@pytest.mark.parametrize("kind", ["fresh", "head reads w", "head reads a cast copy"])
@pytest.mark.parametrize("hold", [False, True])
def test_gradient_sums_in_place_as_without_the_tracker(kind: str, hold: bool) -> None:
    expected = {"fresh": True, "head reads w": False, "head reads a cast copy": True}[kind] and not hold
    assert _summed_in_place(kind, tracked=False, hold=hold) is expected  # autograd on its own
    assert _summed_in_place(kind, tracked=True, hold=hold) is expected


@pytest.mark.parametrize(("precision", "buffers"), [("bf16-mixed", 2), ("fp32", 3)])
def test_tied_embedding_sum_in_the_trace(precision: str, buffers: int) -> None:
    # GPT-2 above, 2 x 32 tokens: V x h = 1,000 x 128 fp32 gradient buffers of 512,000 B are made in
    # the backward by the head (bf16-mixed: ToCopyBackward's new fp32 tensor; fp32: MmBackward's,
    # reaching w through TBackward as a transposed view) and by embedding_dense_backward.  The sum
    # is in place for the new tensor (2 buffers) and out of place for the view, whose storage its
    # base shares (a third).  No other backward tensor has that size (fp32 logits: 256,000 B).
    doc = {"model": GPT2, "hardware": {"gpu": "a100"},
           "train": {"micro_batch_size": 2, "seq_len": 32, "precision": precision}}
    st = trace_train(resolve(doc), "meta")
    marks = {phase: seq for seq, phase in st.marks}
    made = [e for e in st.events[marks["backward"]:marks["optimizer"]] if e.nbytes == 512_000]
    assert len(made) == buffers
