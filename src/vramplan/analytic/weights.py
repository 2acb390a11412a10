"""Weights: bytes of the parameters held on one GPU, by dtype and quantization format.

The formats (payload bits, block/row/group scales, double quantization) are rows of
``facts/quantization.py``, with their worked bytes and sources; a quantized linear's bytes are
its row's ``linear_bytes``.  Worked example (nf4-dq): a 7e9-weight model -> 7e9 x 4.127 / 8 =
3.61 GB; the 4-bit payload alone is 3.5 GB.

Only linear weights are quantized; embeddings, norms and the LM head stay in the
half dtype (bitsandbytes and GPTQ/AWQ skip ``lm_head`` by default; Lit-GPT under Lightning's
bitsandbytes plugin quantizes its head too: analytic/inference.py, and for training
``StepContext.litgpt_head``).  A format sized matrix by matrix
(``QuantFormat.per_matrix``: MXFP4's per-row blocks of 32 on the routed experts only, block-wise fp8's
128 x 128 tiles) is summed over ``RankParams.linear_shapes``; MXFP4's expert biases are held in fp32 by
both engines (``QuantFormat.expert_bias_dtype``).

Worked example (gpt-oss-20b, one GPU): 24 layers x 32 experts x 3 matrices of 2880 x 2880 =
19,110,297,600 expert weights -> 9,555,148,800 B payload + 597,196,800 B E8M0 scales; the other
1,804,459,584 parameters in bf16 = 3,608,919,168 B: 13,761,264,768 B, the checkpoint's
``model.safetensors.index.json`` ``metadata.total_size``; held, the 6,635,520 expert biases in fp32 add
13,271,040 B.
"""

from __future__ import annotations

from vramplan.analytic.layout import RankParams
from vramplan.facts.quantization import QuantFormat, quant_format
from vramplan.units import DTYPE_BITS

__all__ = ["quantized_linear_bytes", "tower_quantized_elements", "weights_bytes"]


def quantized_linear_bytes(numel: int, out_features: int, fmt: str) -> int:
    """Bytes of ``numel`` linear weights with ``out_features`` rows stored in ``fmt``.

    >>> quantized_linear_bytes(4096 * 4096, 4096, "nf4")   # 8,388,608 payload + 262,144 * 4 absmax
    9437184
    """
    try:
        q = quant_format(fmt)
    except KeyError:
        raise ValueError(fmt) from None
    return q.linear_bytes(numel, out_features)


def weights_bytes(rp: RankParams, dense_bytes: int, quant: str = "none") -> int:
    """All base weights on this rank: quantized linears plus everything else at ``dense_bytes``.

    The LM head is excluded from quantization, so it is charged at ``dense_bytes``.
    """
    if quant == "none":
        return rp.total * dense_bytes
    fmt = quant_format(quant)
    tower = _tower_bytes(rp, fmt) - tower_quantized_elements(rp, quant) * dense_bytes
    if fmt.per_matrix:
        return _per_matrix_bytes(rp, dense_bytes, fmt) + tower
    q = quantized_linear_bytes(rp.linear, rp.linear_out_features, quant)
    return q + (rp.total - rp.linear) * dense_bytes + tower


def tower_quantized_elements(rp: RankParams, quant: str) -> int:
    """Elements of the vision tower's and projector's linears ``quant`` stores quantized on this rank: those the
    checkpoint does not skip (``RankParams.tower_linear_shapes``), where the format quantizes dense linears
    (MXFP4, the routed experts only, leaves them)."""
    if quant == "none" or "linear" not in quant_format(quant).quantized_roles:
        return 0
    return sum(i * o * n for i, o, n in rp.tower_linear_shapes)


def _tower_bytes(rp: RankParams, fmt: QuantFormat) -> int:
    """Bytes of those tower linears, each matrix quantized on its own (bitsandbytes' absmax blocks, a group's
    scales and the per-matrix tensors follow each weight: ``QuantFormat.linear_bytes`` of one matrix, or
    ``matrix_bytes`` for a format sized matrix by matrix); worked example in tests/test_vision_quant.py."""
    if "linear" not in fmt.quantized_roles:
        return 0
    if fmt.per_matrix:
        return sum(fmt.matrix_bytes(i, o) * n for i, o, n in rp.tower_linear_shapes)
    return sum(fmt.linear_bytes(i * o, o) * n for i, o, n in rp.tower_linear_shapes)


def _per_matrix_bytes(rp: RankParams, dense_bytes: int, fmt: QuantFormat) -> int:
    """``weights_bytes`` of a format sized matrix by matrix, on the roles it quantizes."""
    quantized = [s for s in rp.linear_shapes if s[0] in fmt.quantized_roles]
    # one instance's local matrix, its elements from split_on_rank (equal to in x out where tp divides)
    q = sum(fmt.matrix_bytes(fan_in, fan_out) * n for _, fan_in, fan_out, _, n in quantized)
    numel = sum(each * n for _, _, _, each, n in quantized)
    out = q + (rp.total - numel) * dense_bytes
    if fmt.expert_bias_dtype is not None and "expert" in fmt.quantized_roles:
        out += rp.expert_bias * (DTYPE_BITS[fmt.expert_bias_dtype] // 8 - dense_bytes)
    return out
