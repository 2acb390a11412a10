"""What a chunk-micro-batch keeps from its input-gradient pass (I) to its weight-gradient pass (W) under torch's
zero-bubble pipeline schedules (facts/pipeline_schedules.py, ``split`` rule).

torch 2.13 ``torch/distributed/pipelining/_backward.py``: ``stage_backward_input`` finds, with
``get_param_groups``, the autograd node where each parameter's reverse closure meets the stage inputs' closure
(the node of the op that consumes the parameter: a linear's ``mm``/``addmm``, a norm's weight ``mul`` or
``native_layer_norm``) and registers a pre-hook there that keeps the gradient flowing into it
(``param_group["grads"][i] = grad_inputs``) until ``stage_backward_weight``.  That gradient has the op's output
size and dtype.  ``PipelineStage.backward_one_chunk`` (stage.py) keeps the received output gradients in
``backward_state`` until W as well.  The saved tensors themselves stay too (``retain_graph=True``); they are the
saved-activation terms' bytes, not counted here.

Per token of one micro-batch, for the chunk's layers:

* each linear: its output, ``out_features`` elements in the compute dtype (a bias feeds the same ``addmm``
  node, and a LayerNorm's weight and bias the same ``native_layer_norm`` node: no second tensor);
* each norm with a weight: its output, ``hidden`` elements, in fp32 where the weight's op runs in fp32
  (autocast keeps fp32 weights, so Llama's ``weight * x.to(input_dtype)`` promotes to fp32 and autocast runs
  ``layer_norm`` in fp32; gpt-oss's, Gemma's and Cohere's norms multiply in fp32), else in the residual dtype;
* the last stage's head: ``vocab`` elements in the compute dtype (the logits' gradient into the head's matmul,
  tied or not) and the final norm as above;
* a stage other than the last: its output's gradient, ``hidden`` elements in the residual dtype.

The scenario check (spec/load.py ``_split_backward_problems``) refuses what this does not size: routed experts
and routers, per-head norms, other tensors, PEFT, tensor parallelism, activation checkpointing.

The first stage skips I and runs the whole backward at W (``backward_one_chunk``: ``if not self.is_first``), so
it keeps only the received output gradients.  Example, GPT-2 (h 768, vocab 50,257), bf16 under FSDP2 mixed
precision (residual and compute 2 B, no autocast), a middle chunk of one layer and 1,024 tokens:
linears 2,304 + 768 + 3,072 + 768 = 6,912, norms 2 x 768 = 1,536, output gradient 768: 9,216 elements x 2 B
x 1,024 = 18,874,368 B.
"""

from __future__ import annotations

from collections.abc import Iterable

from vramplan.spec.model import ModelSpec

__all__ = ["held_until_weight_pass", "norm_grad_bytes"]

# norm kinds whose weight multiplies in fp32 whatever the policy (spec/model.py norm kinds)
_FP32_NORMS = ("rms_fp32", "gemma_rms", "layer_fp32")


def norm_grad_bytes(kind: str, autocast: bool, residual_bytes: int) -> int:
    """Bytes per element of a norm's output, the gradient its weight's op receives (module docstring)."""
    return 4 if autocast or kind in _FP32_NORMS else residual_bytes


def _layer_elements(m: ModelSpec, layers: Iterable[int]) -> int:
    """Output elements per token of the linears in ``layers`` (instances per layer: count / span)."""
    held = set(layers)
    out = 0
    for p in m.params:
        if p.role == "linear" and p.layer_span:
            out += p.out_features * (p.count // len(p.layer_span)) * len(held.intersection(p.layer_span))
    return out


def _norms(m: ModelSpec, layers: Iterable[int], last: bool) -> int:
    """Weighted norms in ``layers``, and the final norm on the last stage."""
    held = set(layers)
    out = 0
    for p in m.params:
        if p.role == "norm":
            out += (p.count // len(p.layer_span)) * len(held.intersection(p.layer_span)) if p.layer_span else last
    return out


def held_until_weight_pass(m: ModelSpec, layers: Iterable[int], tokens: int, compute_bytes: int,
                           residual_bytes: int, autocast: bool, *, first: bool, last: bool) -> int:
    """Bytes one micro-batch of the chunk holding ``layers`` keeps from its I pass to its W pass (module
    docstring); ``first``/``last``: the chunk is the pipeline's first / last stage."""
    layers = tuple(layers)
    out_grad = 0 if last else tokens * m.hidden_size * residual_bytes
    if first:
        return out_grad
    linears = _layer_elements(m, layers) * compute_bytes + (m.vocab_size * compute_bytes if last else 0)
    norms = _norms(m, layers, last) * m.hidden_size * norm_grad_bytes(m.norm, autocast, residual_bytes)
    return out_grad + tokens * (linears + norms)
