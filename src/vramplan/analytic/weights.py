"""Weights: bytes of the parameters held on one GPU, by dtype and quantization format.

The formats (payload bits, block/row/group scales, double quantization) are rows of
``facts/quantization.py``, with their worked bytes and sources; a quantized linear's bytes are
its row's ``linear_bytes``.  Worked example (nf4-dq): a 7e9-weight model -> 7e9 x 4.127 / 8 =
3.61 GB; the 4-bit payload alone is 3.5 GB.

Only linear weights are quantized; embeddings, norms and the LM head stay in the
half dtype (bitsandbytes and GPTQ/AWQ skip ``lm_head`` by default; Lit-GPT under Lightning's
bitsandbytes plugin quantizes its head too: analytic/inference.py).
"""

from __future__ import annotations

from vramplan.analytic.layout import RankParams
from vramplan.facts.quantization import quant_format

__all__ = ["quantized_linear_bytes", "weights_bytes"]


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
    q = quantized_linear_bytes(rp.linear, rp.linear_out_features, quant)
    return q + (rp.total - rp.linear) * dense_bytes
