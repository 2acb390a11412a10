"""Analytic terms checked against their mechanism and against the traced engine.

* tied embeddings: the two gradient contributions of a tied parameter summed at the end of the
  backward pass (analytic/gradients.py ``tied_embedding_accumulation_bytes``);
* Adafactor's per-parameter step temporaries (analytic/optimizer.py);
* the prefill tensors of Hugging Face ``generate`` (analytic/inference.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.analytic.gradients import tied_embedding_accumulation_bytes
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate as analytic_estimate

# ---------------------------------------------------------------- tied embeddings


def test_tied_accumulation_bytes_by_hand() -> None:
    # GPT-2: V = 50,257, h = 768, fp32 gradients.  Head without autocast: the head's contribution is a
    # transposed view (TBackward), summed out of place -> 2 extra buffers: 2 * 50,257 * 768 * 4 = 308,779,008
    assert tied_embedding_accumulation_bytes(50_257, 768, 4, head_grad_is_view=True) == 308_779_008
    # autocast: ToCopyBackward hands a fresh fp32 tensor, summed in place -> 1 extra: 154,389,504
    assert tied_embedding_accumulation_bytes(50_257, 768, 4, head_grad_is_view=False) == 154_389_504
    # bf16-true gradients: 2 * 50,257 * 768 * 2 = 154,389,504
    assert tied_embedding_accumulation_bytes(50_257, 768, 2, head_grad_is_view=True) == 154_389_504


def _gpt2_sgd(precision: str) -> dict[str, Any]:
    # SGD without momentum has no step temporary, so the end of the backward pass is the step's peak
    return {"model": "gpt2", "hardware": {"gpu": "a100"},
            "train": {"micro_batch_size": 1, "seq_len": 128, "precision": precision, "optimizer": "sgd"}}


def test_tied_gpt2_end_of_backward_peak() -> None:
    # fp32 GPT-2 (124,439,808 parameters, 474.7 MiB): weights + all gradients + the two extra V x h fp32
    # buffers (294.5 MiB) + the two cuBLAS workspaces (2 x 8,320 KiB) = 1,260.1 MiB, at the backward's end
    rep = analytic_estimate(_gpt2_sgd("fp32"))
    pg = rep.per_gpu
    assert pg.peak_phase == "backward"
    assert pg.breakdown_detail["temporaries"] == {"tied embedding gradient contributions": 308_779_008}
    params = rep.model["parameters"]
    assert pg.peak_allocated_bytes == 2 * 4 * params + 308_779_008 + 2 * 8320 * 1024


def _trace_peak(doc: dict[str, Any]) -> int:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.trace.engine import trace
    from vramplan.trace.parallel import apply_parallel
    from vramplan.trace.report import peak_of

    r = resolve(doc)
    _, st = trace(r)
    events, marks, *_ = apply_parallel(r, st)
    return peak_of(events, marks).raw_bytes


def _tied_llama(precision: str, optimizer: str) -> dict[str, Any]:
    pytest.importorskip("torch")
    from vramplan.trace.shrink import catalog_config, shrink

    cfg = shrink(catalog_config("meta-llama/Llama-3.2-1B"), vocab=32000)
    return {"model": cfg, "hardware": {"gpu": "a100"},
            "train": {"micro_batch_size": 1, "seq_len": 128, "precision": precision, "optimizer": optimizer}}


@pytest.mark.parametrize("case", [("gpt2", "fp32"), ("gpt2", "bf16-true"), ("llama", "fp32"), ("llama", "bf16-true"),
                                  ("gpt2", "bf16-mixed"), ("llama", "bf16-mixed")])
def test_tied_matches_trace(case: tuple[str, str]) -> None:
    model, precision = case
    doc = _gpt2_sgd(precision) if model == "gpt2" else _tied_llama(precision, "sgd")
    traced = _trace_peak(doc)
    rep = analytic_estimate(doc)
    analytic = rep.per_gpu.peak_allocated_bytes
    # bf16-mixed: the head's contribution (ToCopyBackward, fresh) is summed in place in the trace as on
    # the GPU, although a TorchDispatchMode makes every tensor "subclass-like" (trace/tracker.py)
    assert abs(analytic / traced - 1) < 0.01, (analytic, traced)


# ---------------------------------------------------------------- Adafactor


def test_adafactor_step_bytes_by_hand() -> None:
    from vramplan.analytic.optimizer import adafactor_step_bytes

    # fp32 [1000 x 100] after a 500-element vector: 4 * (2 * 100,000 + max(500, 1000 + 100)) = 804,400
    assert adafactor_step_bytes([(500, 0, 0), (100_000, 1000, 100)], 4) == 804_400
    # bf16 parameters add the fp32 copies of the gradient and of the parameter: 4 * (4 * 100,000 + 1,100)
    assert adafactor_step_bytes([(500, 0, 0), (100_000, 1000, 100)], 2) == 1_604_400
    # a large predecessor stays bound to ``update`` during the square: 4 * (2 * 100,000 + 80,000) = 1,120,000
    assert adafactor_step_bytes([(80_000, 800, 100), (100_000, 1000, 100)], 4) == 1_120_000


def test_adafactor_llama8b_bf16_true_step() -> None:
    # Llama-3.1-8B bf16-true: the LM head follows the last down projection (docstring worked example):
    # 4 * 4 * 525,336,576 + 4 * 58,720,256 = 8,640,266,240 B of step temporaries
    rep = analytic_estimate({"model": "meta-llama/Llama-3.1-8B", "hardware": {"gpu": "h100"},
                             "train": {"micro_batch_size": 1, "seq_len": 512, "precision": "bf16-true",
                                       "optimizer": "adafactor"}})
    assert rep.per_gpu.peak_phase == "optimizer"
    assert rep.per_gpu.breakdown_detail["temporaries"]["optimizer step"] == 8_640_266_240


@pytest.mark.parametrize("family", ["meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.2-1B", "openai-community/gpt2",
                                    "mistralai/Mixtral-8x7B-v0.1"])
@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed", "bf16-true"])
def test_adafactor_matches_trace(family: str, precision: str) -> None:
    pytest.importorskip("torch")
    from vramplan.trace.shrink import catalog_config, shrink

    cfg = shrink(catalog_config(family), vocab=32000)
    doc = {"model": cfg, "hardware": {"gpu": "a100"},
           "train": {"micro_batch_size": 1, "seq_len": 128, "precision": precision, "optimizer": "adafactor"}}
    traced = _trace_peak(doc)
    analytic = analytic_estimate(doc).per_gpu.peak_allocated_bytes
    assert abs(analytic / traced - 1) < 0.01, (analytic, traced)


# ---------------------------------------------------------------- inference prefill


def test_softmax_bytes_per_score() -> None:
    from vramplan.analytic.inference import softmax_bytes_per_score

    llama = resolve({"model": "meta-llama/Llama-3.2-1B", "task": "inference", "hardware": {"gpu": "a100"}}).model
    gpt2 = resolve({"model": "gpt2", "task": "inference", "hardware": {"gpu": "a100"}}).model
    # bf16 upcast: masked scores 2 + ATen's fp32 copy 4 + fp32 softmax 4; fp16 on CUDA: fused half-to-float 2 + 4
    assert softmax_bytes_per_score(llama, "bf16") == 10
    assert softmax_bytes_per_score(llama, "fp16") == 6
    assert softmax_bytes_per_score(llama, "fp32") == 8
    # GPT-2's softmax in the compute dtype: matmul output and its scaled copy, 2 x 2
    assert softmax_bytes_per_score(gpt2, "bf16") == 4


INFERENCE_MATRIX = [
    (model, att, b, p)
    for model in ("meta-llama/Llama-3.2-1B", "openai-community/gpt2", "Qwen/Qwen2.5-0.5B", "mistralai/Mistral-7B-v0.1")
    for att in ("sdpa", "eager")
    for b, p in ((1, 512), (8, 1024), (2, 2048))
]


def test_prefill_matches_trace_matrix() -> None:
    """Llama-family and GPT-2 generate in bf16, eager and sdpa: analytic peak within 1% of the trace."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    lines = [f"{'model':<28} {'attn':<6} {'b x p':>10} {'trace MiB':>10} {'analytic MiB':>12} {'diff':>7}"]
    bad = []
    for model, att, b, p in INFERENCE_MATRIX:
        doc = {"model": model, "task": "inference", "hardware": {"gpu": "a100"},
               "inference": {"batch_size": b, "prompt_len": p, "new_tokens": 16, "dtype": "bf16", "attention": att}}
        traced = _trace_peak(doc)
        analytic = analytic_estimate(doc).per_gpu.peak_allocated_bytes
        d = analytic / traced - 1
        line = f"{model:<28} {att:<6} {b:>4} x {p:<4} {traced / 2**20:>10.2f} {analytic / 2**20:>12.2f} {100 * d:>+6.2f}%"
        lines.append(line)
        if abs(d) > 0.01:
            bad.append(line)
    print("\n" + "\n".join(lines))
    assert not bad, "prefill: analytic and trace differ by more than 1%:\n" + "\n".join(bad)
