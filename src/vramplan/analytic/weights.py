"""Weights: bytes of the parameters held on one GPU, by dtype and quantization format.

Quantized formats (payload bits from ``units.DTYPE_BITS``; the extra terms are the
metadata each format stores, per its reference implementation):

* ``nf4``/``fp4`` (bitsandbytes ``Linear4bit``, QLoRA arXiv 2305.14314 section 2):
  4 bits per weight plus one fp32 absmax per block of 64 -> 4 + 32/64 = 4.5 bits.
* ``nf4-dq`` (double quantization, QLoRA section 3): the block absmaxes are themselves
  quantized to 8 bits in blocks of 256, with one fp32 constant per such block:
  4 + 8/64 + 32/(64*256) = 4.127 bits per weight (QLoRA reports 0.127 bits of overhead).
  Worked example: a 7e9-weight model -> 7e9*4.127/8 = 3.61 GB; 4-bit payload alone 3.5 GB.
* ``int8`` (LLM.int8, arXiv 2208.07339): 1 byte per weight plus one fp32 scale per
  output row (``SCB``).
* ``gptq-4bit``/``awq-4bit`` (group size 128): 4-bit weights packed in int32, plus per
  group and output column one fp16 scale and one 4-bit zero point packed in int32:
  4 + 16/128 + 4/128 = 4.156 bits per weight.
* ``fp8`` (per-tensor scaled e4m3, as vLLM and transformers' FbgemmFp8/FineGrained
  loaders store it): 1 byte per weight plus one fp32 scale per output row (channelwise).

Only linear weights are quantized; embeddings, norms and the LM head stay in the
half dtype (bitsandbytes and GPTQ/AWQ skip ``lm_head`` by default; Lit-GPT under Lightning's
bitsandbytes plugin quantizes its head too: analytic/inference.py).
"""

from __future__ import annotations

from vramplan.analytic.layout import RankParams
from vramplan.units import ceil_div

NF4_BLOCK = 64  # bitsandbytes default blocksize for 4-bit weights
DQ_BLOCK = 256  # second-level block for double quantization
GPTQ_GROUP = 128


def quantized_linear_bytes(numel: int, out_features: int, fmt: str) -> int:
    """Bytes of ``numel`` linear weights with ``out_features`` rows stored in ``fmt``.

    >>> quantized_linear_bytes(4096 * 4096, 4096, "nf4")   # 8,388,608 payload + 262,144 * 4 absmax
    9437184
    """
    if fmt in ("nf4", "fp4"):
        blocks = ceil_div(numel, NF4_BLOCK)
        return ceil_div(numel, 2) + 4 * blocks
    if fmt == "nf4-dq":
        blocks = ceil_div(numel, NF4_BLOCK)
        return ceil_div(numel, 2) + blocks + 4 * ceil_div(blocks, DQ_BLOCK)
    if fmt == "int8":
        return numel + 4 * out_features
    if fmt in ("gptq-4bit", "awq-4bit"):
        groups = ceil_div(numel, GPTQ_GROUP)  # groups of 128 input features per output column
        return ceil_div(numel, 2) + 2 * groups + ceil_div(groups, 2)
    if fmt == "fp8":
        return numel + 4 * out_features
    raise ValueError(fmt)


def weights_bytes(rp: RankParams, dense_bytes: int, quant: str = "none") -> int:
    """All base weights on this rank: quantized linears plus everything else at ``dense_bytes``.

    The LM head is excluded from quantization, so it is charged at ``dense_bytes``.
    """
    if quant == "none":
        return rp.total * dense_bytes
    q = quantized_linear_bytes(rp.linear, rp.linear_out_features, quant)
    return q + (rp.total - rp.linear) * dense_bytes
