"""Memory-bound parts of a step: time = bytes through HBM / HBM bandwidth.

These kernels do a few FLOPs per byte, far below the GPU's FLOP:byte ratio (A100: 312e12 /
2.04e12 = 153), so they run at memory speed (the roofline argument; the seed article on
bandwidth lists "optimizer updates" and attention among the memory-bound operations).

* The optimizer step reads and writes every state once per step (a fused kernel):
  ``optimizer_bytes_per_param``, from the optimizer's row in ``facts/optimizers.py``.
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

from vramplan.facts.optimizers import hbm_bytes_per_param
from vramplan.facts.quantization import quant_format

__all__ = [
    "DEQUANT_BYTES_PER_WEIGHT_USE", "clip_bytes_per_param", "dequant_bytes_per_weight_use", "eager_attention_bytes",
    "hbm_seconds", "optimizer_bytes_per_param",
]

DEQUANT_BYTES_PER_WEIGHT_USE = 0.5 + 2.0  # read the 4-bit payload, write the bf16 copy (dequant_bytes_per_weight_use)


def optimizer_bytes_per_param(optimizer: str, param_bytes: int, grad_bytes: int, master_bytes: int) -> float:
    """HBM bytes one optimizer step moves per trainable parameter held on the GPU: read from the
    optimizer's row (``facts.optimizers.hbm_bytes_per_param``: parameter, gradient and every state
    read, parameter and states written, the fp32-master path for DeepSpeed).

    >>> optimizer_bytes_per_param("adamw-fused", 4, 4, 0), optimizer_bytes_per_param("adamw", 2, 2, 4)
    (28.0, 36.0)
    >>> optimizer_bytes_per_param("adamw-8bit", 4, 4, 0)
    16.0625
    """
    return hbm_bytes_per_param(optimizer, param_bytes, grad_bytes, master_bytes)


def dequant_bytes_per_weight_use(quant: str, compute_bytes: int = 2) -> float:
    """Dequantization traffic per weight and use of a format whose forward dequantizes the whole weight
    (``facts.quantization``: ``dequant == "whole_weight"``): read the packed payload, write the copy
    in the compute dtype; 0 for formats whose kernels read the packed weight.

    >>> dequant_bytes_per_weight_use("nf4"), dequant_bytes_per_weight_use("gptq-4bit")
    (2.5, 0.0)
    """
    q = quant_format(quant)
    return q.bits / 8 + compute_bytes if q.dequant == "whole_weight" else 0.0


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
