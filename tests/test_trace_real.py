"""The meta-device trace against a real CPU training step, measured by the same tracker.

The same code runs twice: once on the meta device (no memory, what the traced engine does) and
once on real CPU tensors.  Both runs go through the CUDA behaviour layer, so the CPU run takes
the CUDA paths too (attention kernels and bitsandbytes layers allocate without computing
values there); everything else (transformers' modelling code, peft, autograd, torch's
optimizer) is real.  Peaks, overall and per phase, must agree to the byte.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from vramplan.spec.load import resolve
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
    # per-expert 4-bit linears (trace/quant.py QuantExperts): the experts loop, dequantization temporaries
    ("mixtral qlora nf4-dq checkpointing", MIXTRAL, {"peft": {"method": "qlora", "rank": 8}, "quantization": "nf4-dq",
                                                     "gradient_checkpointing": "full"}),
    ("mixtral qlora all-linear", MIXTRAL, {"peft": {"method": "qlora", "rank": 8, "target_modules": "all-linear"},
                                           "quantization": "nf4"}),
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
