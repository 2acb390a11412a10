"""Memory-bound parts of a step: time = bytes through HBM / HBM bandwidth.

These kernels do a few FLOPs per byte, far below the GPU's FLOP:byte ratio (A100: 312e12 /
2.04e12 = 153), so they run at memory speed (the roofline argument; the seed article on
bandwidth lists "optimizer updates" and attention among the memory-bound operations).

* The optimizer step reads and writes every state once per step (a fused kernel):
  ``optimizer_bytes_per_param``.
* Gradient clipping (the Trainer's default ``max_grad_norm=1.0``) reads the gradients to take
  their norm and reads and writes them to scale them: 3 gradient passes.
* Eager attention writes the s x s scores to HBM and reads them back (FlashAttention,
  arXiv 2205.14135, sec. 3.1: standard attention needs Theta(N d + N^2) HBM accesses, the
  tiled kernel none for the N^2 part).
* bitsandbytes 4-bit layers dequantize the whole weight to the compute dtype before each
  matmul (``MatMul4Bit``: ``F.dequantize_4bit(B, quant_state).to(A.dtype)`` in the forward and
  again for the input gradient): read 0.5 B, write 2 B per weight and use.
"""

from __future__ import annotations

__all__ = [
    "DEQUANT_BYTES_PER_WEIGHT_USE", "clip_bytes_per_param", "eager_attention_bytes", "hbm_seconds",
    "optimizer_bytes_per_param",
]

DEQUANT_BYTES_PER_WEIGHT_USE = 0.5 + 2.0  # read the 4-bit payload, write the bf16 copy


def optimizer_bytes_per_param(optimizer: str, param_bytes: int, grad_bytes: int, master_bytes: int) -> float:
    """HBM bytes one optimizer step moves per trainable parameter held on the GPU.

    AdamW (fused: one read and one write of each tensor): read parameter, gradient, exp_avg,
    exp_avg_sq; write parameter, exp_avg, exp_avg_sq.  States have the optimizer's parameter
    dtype (fp32 masters when ``master_bytes``).  With fp32 parameters and gradients (HF autocast):
    4 * 4 + 3 * 4 = 28 B.  DeepSpeed (half params, fp32 masters): the half gradient is upcast to
    an fp32 copy (read 2, write 4), then the fp32 update (28 B) and the half copy of the new
    parameter is written (2): 36 B.  Pure bf16: 7 x 2 = 14 B.
    8-bit AdamW (bitsandbytes blockwise, arXiv 2110.02861): 1-byte states plus one fp32 absmax per
    256 per state, read and written: param and grad read 4 + 4, param written 4, states 2 + 2,
    two fp32 absmax per 256 parameters read and written (4 * 2 * 2 / 256) -> 16.0625 B with fp32 params.

    >>> optimizer_bytes_per_param("adamw-fused", 4, 4, 0), optimizer_bytes_per_param("adamw", 2, 2, 4)
    (28.0, 36.0)
    >>> optimizer_bytes_per_param("adamw-8bit", 4, 4, 0)
    16.0625
    """
    if optimizer in ("none", "sgd"):
        return 0.0
    if optimizer in ("adamw-8bit", "paged-adamw-8bit"):
        return 2.0 * param_bytes + grad_bytes + 2 * 2 + 4 * 2 * 2 / 256
    if master_bytes:
        return float(grad_bytes + 4) + 28.0 + param_bytes
    return 6.0 * param_bytes + grad_bytes  # read p, g, m, v; write p, m, v


def clip_bytes_per_param(grad_bytes: int) -> float:
    """Gradient clipping: read for the norm, read and write to scale: 3 passes over the gradients."""
    return 3.0 * grad_bytes


def eager_attention_bytes(heads: int, seq_len: int, sequences: int, compute_bytes: int) -> float:
    """HBM traffic of one layer's eager attention for ``sequences`` sequences (forward + backward).

    Per score element, forward: Q K^T writes the half scores (2), softmax reads them (2) and
    writes fp32 probabilities (4, ``softmax(..., dtype=float32)``), the cast reads (4) and writes
    a half copy (2), P V reads it (2): 16 B.  The backward touches the same tensors about twice
    (dP written and read, softmax backward reads P and dP and writes dS, dS read twice): 32 B.
    48 B per element in bf16; fp32 compute doubles the half-precision parts.

    >>> eager_attention_bytes(32, 4096, 1, 2) / 1e9   # 32 heads x 4096^2 x 48 B
    25.769803776
    """
    elements = heads * seq_len * seq_len * sequences
    half = compute_bytes
    forward = half + half + 4 + 4 + half + half
    return elements * 3.0 * forward


def hbm_seconds(nbytes: float, hbm_bytes_per_s: float) -> float:
    """Memory-bound time at the GPU's HBM bandwidth (catalog figure)."""
    if nbytes <= 0:
        return 0.0
    return nbytes / hbm_bytes_per_s
