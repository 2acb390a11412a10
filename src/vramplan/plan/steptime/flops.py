"""FLOPs of a training step, one term per function.

A matmul of a (t x k) input by a (k x n) weight costs 2*t*k*n FLOPs (a multiply and an add
per term), so each token costs 2 FLOPs per weight in the forward pass.  The backward pass runs
two matmuls per weight -- the input's gradient and the weight's -- so 4 FLOPs per weight, and a
step costs 6 * P * tokens (Kaplan et al., arXiv 2001.08361, sec. 2.1; Narayanan et al.,
arXiv 2104.04473, sec. 5.1).  A *frozen* weight (PEFT base) needs only the input's gradient:
2 + 2 = 4 FLOPs per weight and token.

Attention adds two weight-free matmuls per layer: Q K^T and P V.  Per query token and key they
cost 2 * (q width) + 2 * (v width) FLOPs, i.e. 4 * heads * head_dim for standard attention,
which over s keys reproduces PaLM's 12 * L * H * Q * T FLOPs per token for forward plus backward
(arXiv 2204.02311, appendix B).  Causal kernels that skip fully masked tiles (FlashAttention-2,
arXiv 2307.08691, sec. 3.1.1) touch (s+1)/2 keys per query on average; an eager implementation
computes the whole s x s score matrix and masks it.

Worked example, Llama-2-7B, 4096-token micro-batch (1 x 4096), full fine-tuning, flash:
matmuls 6 * 6.607e9 * 4096 = 1.624e14 FLOPs; attention forward per layer
4 * 4096 * 2048.5 * 4096 = 1.375e11 (x 32 layers = 4.40e12), backward 2.5x that.
"""

from __future__ import annotations

__all__ = [
    "attention_backward_factor", "attention_forward_flops", "keys_per_query", "matmul_backward_flops",
    "matmul_forward_flops",
]


def matmul_forward_flops(params: float, tokens: int) -> float:
    """2 FLOPs per weight and token.

    >>> matmul_forward_flops(4096 * 4096, 1)
    33554432.0
    """
    return 2.0 * params * tokens


def matmul_backward_flops(params: float, tokens: int, weights_trainable: bool) -> float:
    """Input gradient (2) plus, for trainable weights, the weight gradient (2) per weight and token.

    >>> matmul_backward_flops(10.0, 1, True), matmul_backward_flops(10.0, 1, False)
    (40.0, 20.0)
    """
    return (4.0 if weights_trainable else 2.0) * params * tokens


def keys_per_query(seq_len: int, window: int | None, skips_masked: bool) -> float:
    """Mean number of keys each query multiplies against in a causal layer.

    An eager kernel computes all ``seq_len`` scores and masks them.  A tile-skipping kernel
    does only the unmasked ones: query i sees min(i + 1, window) keys, whose mean over
    i = 0..s-1 is (s+1)/2 without a window and (w(w+1)/2 + (s-w) w)/s with one.

    >>> keys_per_query(4096, None, True), keys_per_query(4096, None, False)
    (2048.5, 4096.0)
    >>> keys_per_query(8, 4, True)   # (4*5/2 + 4*4) / 8
    3.25
    """
    if not skips_masked:
        return float(seq_len)
    w = seq_len if window is None or window >= seq_len else window
    return (w * (w + 1) / 2 + (seq_len - w) * w) / seq_len


def attention_forward_flops(attn_width: int, keys: float, tokens: int) -> float:
    """Q K^T and P V for ``tokens`` queries: 2 FLOPs per (query, key, q/v channel).

    ``attn_width`` = heads * (qk head dim + v head dim).  Llama-2-7B: 32 * (128 + 128) = 8192.

    >>> attention_forward_flops(8192, 2048.5, 4096)   # one layer, one 4096-token sequence
    137472507904.0
    """
    return 2.0 * attn_width * keys * tokens


def attention_backward_factor(kernel: str) -> float:
    """Backward over forward FLOPs of the attention core.

    Eager: dS and dQ, dK from Q K^T, dP and dV from P V -- four matmuls for the forward's two: 2.0.
    FlashAttention recomputes S = Q K^T inside the backward kernel, one more: 2.5
    (FlashAttention-2, arXiv 2307.08691, sec. 4.1 counts the backward as 2.5x the forward).
    """
    return 2.0 if kernel == "eager" else 2.5
