"""Quantization formats of linear weights as data: one frozen record per format.

Each row gives the packed payload (bits per weight), the scales the format stores beside it (per
block of the flattened weight, per output row, or per group of input features with a zero point,
and for double quantization the scales' own quantization), what a forward pass allocates to
dequantize, and the compute-dtype rule.  ``analytic/weights.py`` sizes a quantized linear from the
row, ``trace/quant.py`` allocates the same tensors, ``validate/rules.py`` reads the payload bits,
``plan/steptime`` the dequantization traffic, ``export/hf.py`` the ``BitsAndBytesConfig`` and
``export/vllm.py`` vLLM's ``--quantization``.

Worked bytes (``weights.quantized_linear_bytes``):

* ``nf4``/``fp4`` (bitsandbytes ``Linear4bit``, QLoRA arXiv 2305.14314 sec. 2): 4 bits per weight
  plus one fp32 absmax per block of 64 -> 4 + 32/64 = 4.5 bits.
* ``nf4-dq`` (double quantization, QLoRA sec. 3): the absmaxes are quantized to 8 bits in blocks of
  256 with one fp32 constant per such block: 4 + 8/64 + 32/(64 x 256) = 4.127 bits per weight.
* ``int8`` (LLM.int8, arXiv 2208.07339): 1 byte per weight plus one fp32 scale per output row (``SCB``).
* ``gptq-4bit``/``awq-4bit`` (group size 128): 4-bit weights packed in int32, plus per group and
  output column one fp16 scale and one 4-bit zero point: 4 + 16/128 + 4/128 = 4.156 bits.
* ``fp8`` (per-channel scaled e4m3, as vLLM and transformers' FbgemmFp8/FineGrained loaders store
  it): 1 byte per weight plus one fp32 scale per output row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from vramplan.facts import row_named
from vramplan.units import DTYPE_BITS, ceil_div

__all__ = [
    "DQ_BLOCK", "GPTQ_GROUP", "NF4_BLOCK", "QUANT_FORMATS", "QuantFormat", "Scales", "bnb_formats", "quant_format",
    "quant_names",
]

NF4_BLOCK = 64  # bitsandbytes' default blocksize for 4-bit weights (functional.quantize_4bit)
DQ_BLOCK = 256  # second-level block of double quantization (QLoRA sec. 3)
GPTQ_GROUP = 128  # the group size GPTQ/AWQ checkpoints use by default

Dequant = Literal["whole_weight", "int8_matmul", "fused_kernel"]
"""What a multi-token forward allocates: ``whole_weight`` = bitsandbytes 4-bit ``MatMul4Bit``
dequantizes the weight to a temporary ``[out, in]`` (again in the backward); ``int8_matmul`` = LLM.int8
quantizes the input row-wise and keeps it for the backward; ``fused_kernel`` = GPTQ/AWQ/fp8 kernels
read the packed weight (no weight-sized temporary)."""


@dataclass(frozen=True, kw_only=True)
class Scales:
    """Scales stored beside a quantized payload."""

    per: Literal["block", "row", "group"]  # of the flattened weight / per output row / per input group
    size: int = 0  # values per block or group (0 for ``row``)
    dtype: str = "fp32"  # a DTYPE_BITS name
    zero_point_bits: int = 0  # packed zero point per scale (GPTQ/AWQ)
    second_level: Scales | None = None  # double quantization: the scales quantized per block of ``size``

    def count(self, numel: int, out_features: int) -> int:
        """How many scales a weight of ``numel`` values with ``out_features`` rows has."""
        return out_features if self.per == "row" else ceil_div(numel, self.size)

    def bytes(self, numel: int, out_features: int) -> int:
        """Bytes of the scales (and zero points, and second-level constants)."""
        n = self.count(numel, out_features)
        out = ceil_div(n * DTYPE_BITS[self.dtype], 8) + ceil_div(n * self.zero_point_bits, 8)
        if self.second_level is not None:
            out += self.second_level.bytes(n, 0)
        return out


@dataclass(frozen=True, kw_only=True)
class QuantFormat:
    """One weight quantization format (``train.quantization``, ``inference``/``serve.quantization``)."""

    name: str
    bits: int  # payload bits per weight
    scales: Scales
    library: Literal["bitsandbytes", "gptq", "awq", "fp8"]
    trainable_base: bool  # usable as a frozen base under PEFT training (TrainQuant)
    dequant: Dequant
    compute_dtype_rule: str
    hf_bnb_config: tuple[tuple[str, bool | str], ...] = ()  # BitsAndBytesConfig kwargs (compute dtype added)
    vllm_quantization: str  # vLLM's ``--quantization`` value
    prequantized_checkpoint: bool = False  # needs a checkpoint quantized that way (no in-flight quantization)
    sources: tuple[str, ...] = ()

    @property
    def double_quant(self) -> bool:
        return self.scales.second_level is not None

    def linear_bytes(self, numel: int, out_features: int) -> int:
        """Bytes of ``numel`` linear weights with ``out_features`` rows in this format.

        >>> quant_format("nf4").linear_bytes(4096 * 4096, 4096)   # 8,388,608 payload + 262,144 x 4 absmax
        9437184
        """
        return ceil_div(numel * self.bits, 8) + self.scales.bytes(numel, out_features)


_BNB_4BIT_RULE = ("compute dtype = bnb_4bit_compute_dtype, replaced by the layer's first fp32 or bf16 input dtype "
                  "(Linear4bit.set_compute_type, bitsandbytes >= 0.41.0); the dequantized weight has the dtype it "
                  "was quantized from")
_BNB4_SRC = ("bitsandbytes functional.quantize_4bit / nn.Linear4bit", "QLoRA arXiv 2305.14314")

QUANT_FORMATS: tuple[QuantFormat, ...] = (
    QuantFormat(
        name="int8", bits=8, scales=Scales(per="row", dtype="fp32"), library="bitsandbytes", trainable_base=True,
        dequant="int8_matmul", compute_dtype_rule="the input is quantized row-wise from fp16 (LLM.int8, threshold 6)",
        hf_bnb_config=(("load_in_8bit", True),),
        vllm_quantization="bitsandbytes",
        sources=("bitsandbytes nn.Linear8bitLt (SCB)", "LLM.int8 arXiv 2208.07339"),
    ),
    QuantFormat(
        name="nf4", bits=4, scales=Scales(per="block", size=NF4_BLOCK, dtype="fp32"), library="bitsandbytes",
        trainable_base=True, dequant="whole_weight", compute_dtype_rule=_BNB_4BIT_RULE,
        hf_bnb_config=(("load_in_4bit", True), ("bnb_4bit_quant_type", "nf4"), ("bnb_4bit_use_double_quant", False)),
        vllm_quantization="bitsandbytes", sources=_BNB4_SRC,
    ),
    QuantFormat(
        name="nf4-dq", bits=4,
        scales=Scales(per="block", size=NF4_BLOCK, dtype="uint8",
                      second_level=Scales(per="block", size=DQ_BLOCK, dtype="fp32")),
        library="bitsandbytes", trainable_base=True, dequant="whole_weight", compute_dtype_rule=_BNB_4BIT_RULE,
        hf_bnb_config=(("load_in_4bit", True), ("bnb_4bit_quant_type", "nf4"), ("bnb_4bit_use_double_quant", True)),
        vllm_quantization="bitsandbytes", sources=(*_BNB4_SRC, "QLoRA sec. 3 (double quantization)"),
    ),
    QuantFormat(
        name="fp4", bits=4, scales=Scales(per="block", size=NF4_BLOCK, dtype="fp32"), library="bitsandbytes",
        trainable_base=True, dequant="whole_weight", compute_dtype_rule=_BNB_4BIT_RULE,
        hf_bnb_config=(("load_in_4bit", True), ("bnb_4bit_quant_type", "fp4"), ("bnb_4bit_use_double_quant", False)),
        vllm_quantization="bitsandbytes", sources=_BNB4_SRC,
    ),
    QuantFormat(
        name="gptq-4bit", bits=4, scales=Scales(per="group", size=GPTQ_GROUP, dtype="fp16", zero_point_bits=4),
        library="gptq", trainable_base=False, dequant="fused_kernel", compute_dtype_rule="fp16 kernels",
        vllm_quantization="gptq", prequantized_checkpoint=True,
        sources=("GPTQ arXiv 2210.17323; AutoGPTQ QuantLinear (qweight, qzeros, scales)",),
    ),
    QuantFormat(
        name="awq-4bit", bits=4, scales=Scales(per="group", size=GPTQ_GROUP, dtype="fp16", zero_point_bits=4),
        library="awq", trainable_base=False, dequant="fused_kernel",
        compute_dtype_rule="fp16 kernels (vLLM recommends dtype half for AWQ)",
        vllm_quantization="awq", prequantized_checkpoint=True,
        sources=("AWQ arXiv 2306.00978; AutoAWQ WQLinear_GEMM",),
    ),
    QuantFormat(
        name="fp8", bits=8, scales=Scales(per="row", dtype="fp32"), library="fp8", trainable_base=False,
        dequant="fused_kernel", compute_dtype_rule="fp8 matmul with per-channel scales",
        vllm_quantization="fp8", sources=("vLLM Fp8LinearMethod; transformers FbgemmFp8 / FineGrainedFP8",),
    ),
)


def quant_names() -> tuple[str, ...]:
    """Every format's name, in table order (read at call time)."""
    return tuple(q.name for q in QUANT_FORMATS)


def quant_format(name: str) -> QuantFormat:
    """The row for ``name``; KeyError names the known formats."""
    return row_named(QUANT_FORMATS, name, "quantization format")


def bnb_formats(bits: int | None = None) -> tuple[str, ...]:
    """The bitsandbytes formats (``bits``: only those of that width, e.g. 4 for ``Linear4bit``)."""
    return tuple(q.name for q in QUANT_FORMATS if q.library == "bitsandbytes" and bits in (None, q.bits))
