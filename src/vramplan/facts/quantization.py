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
  output column one fp16 scale and one 4-bit zero point: 4 + 16/128 + 4/128 = 4.156 bits.  AutoGPTQ
  (v0.7.1 ``qlinear_cuda_old.QuantLinear``) also stores ``g_idx`` (int32 per input feature) and, since
  ``make_quant`` builds every ``QuantLinear`` with ``bias=True``, an fp16 ``bias`` per output feature, whether the
  model's linear had one or not; AutoAWQ's ``WQLinear_GEMM`` stores neither.  Where the model's linear has its own
  bias (Qwen2's q/k/v) that bias is the same tensor and is also counted among the dense parameters: 2 B per such
  output feature counted twice, which no row can tell apart (vLLM skips the extra biases: ``serve/vllm.py``).
  4096 x 4096: 8,388,608 + 262,144 + 65,536 + 16,384 g_idx + 8,192 bias = 8,740,864 B.
* ``gptq-3bit``/``gptq-8bit``: the same tensors at 3 or 8 bits (``qweight`` [in/32 x bits, out], ``qzeros``
  [groups, out/32 x bits]).  Checked against TheBloke/Llama-2-13B-GPTQ's published file sizes in
  ``tests/test_prequantized_bytes.py``.
* ``ct-w4a16`` (compressed-tensors ``pack-quantized``, llm-compressor's W4A16, symmetric, group 128):
  ``weight_packed`` int32 [out, in/8] + a 16-bit ``weight_scale`` per group of 128 + ``weight_shape`` int64[2]
  per matrix (16 B): 4096 x 4096 = 8,388,608 + 262,144 + 16 = 8,650,768 B.
* ``ct-w8a8-int8``/``ct-fp8`` (``int-quantized``/``float-quantized``, channel-wise, symmetric, dynamic
  activations: no ``input_scale``): 1 B per weight + a 16-bit ``weight_scale`` [out, 1]: 4096 x 4096 =
  16,777,216 + 8,192 = 16,785,408 B.  The compressed-tensors reader is ``spec/families/compressed_tensors.py``.
* ``ct-nvfp4``/``ct-nvfp4a16`` (``nvfp4-pack-quantized``, tensor_group, group 16, symmetric: llm-compressor's
  NVFP4 and NVFP4A16): ``weight_packed`` uint8 [out, in/2] + an e4m3 ``weight_scale`` per 16 inputs of each row +
  an fp32 ``weight_global_scale`` per matrix, and with NVFP4's fp4 activations an fp32 ``input_global_scale``:
  4096 x 4096 = 8,388,608 + 1,048,576 + 8 (W4A4) or + 4 (A16) B, 4.5 bits per weight.
* ``modelopt-nvfp4`` (NVIDIA Model Optimizer's NVFP4 export, ``quant_method: modelopt``, ``quant_algo: NVFP4``):
  ``weight`` uint8 [out, in/2], ``weight_scale`` e4m3 [out, in/16], ``weight_scale_2`` and ``input_scale`` fp32 [1]:
  the bytes of ``ct-nvfp4``.
* ``modelopt-fp8`` (Model Optimizer's per-tensor FP8, ``quant_algo: FP8``): 1 B per weight + an fp32
  ``weight_scale`` and an fp32 static ``input_scale`` per matrix: 4096 x 4096 = 16,777,216 + 8 B.
* ``fp8-tensor``/``fp8-tensor-static`` (per-tensor e4m3: AutoFP8's checkpoints, quant_method fp8 without
  ``weight_block_size``; transformers' FineGrainedFP8 with ``weight_block_size: null``): 1 B per weight + an fp32
  ``weight_scale`` per matrix, + an fp32 ``input_scale`` with static activations: 4096 x 4096 = 16,777,216 + 4
  (+ 4) B.  ``ct-fp8-tensor``/``ct-fp8-tensor-static`` (compressed-tensors strategy tensor): the same with 16-bit
  scales, 16,777,216 + 2 (+ 2) B.
* ``fp8`` (per-channel scaled e4m3, as vLLM and transformers' FbgemmFp8/FineGrained loaders store
  it): 1 byte per weight plus one fp32 scale per output row.
* ``mxfp4`` (OCP Microscaling Formats (MX) Specification v1.0, sec. 5: MXFP4 = FP4 e2m1 elements with one
  E8M0 scale per block of 32): 4 + 8/32 = 4.25 bits per weight.  gpt-oss stores only its MoE experts so
  (``*_blocks``: uint8 [E, out, in/32, 16], two values per byte; ``*_scales``: uint8 [E, out, in/32]), one scale
  per 32 input features of each output row; ``modules_to_not_convert`` (attention, router, embeddings,
  lm_head) and the expert biases stay bf16 in the checkpoint.  Both engines hold the expert biases in fp32:
  transformers ``integrations/mxfp4.py`` ``Mxfp4GptOssExperts`` declares ``gate_up_proj_bias``/``down_proj_bias``
  fp32 (5.24), vLLM ``quantization/mxfp4.py`` ``Mxfp4MoEMethod.process_weights_after_loading`` converts
  ``w13_bias``/``w2_bias`` to fp32 on its Triton backend (commit 007d500).  4096 x 4096: 8,388,608 payload +
  4,096 x 128 scales = 8,912,896 B.
* ``fp8-block`` (DeepSeek-V3, arXiv 2412.19437 sec. 3.3.2; transformers ``FineGrainedFP8Config`` with
  ``weight_block_size`` [128, 128]): 1 byte per e4m3 weight plus one fp32 ``weight_scale_inv`` per 128 x 128
  tile of each matrix, ``ceil(out/128) x ceil(in/128)`` of them (transformers ``integrations/finegrained_fp8.py``
  ``FP8Linear``; vLLM ``quantization/fp8.py`` ``Fp8LinearMethod.create_weights`` with ``block_quant``):
  8 + 32/16384 bits per weight where the dimensions are multiples of 128.  4096 x 4096: 16,777,216 + 32 x 32
  x 4 = 16,781,312 B.  The MoE gate, embeddings, lm_head and norms stay bf16.
* ``hqq-4bit``/``hqq-8bit`` (Half-Quadratic Quantization, the ``hqq`` library's ``HQQLinear``, release 0.2.8;
  transformers ``HqqConfig`` defaults: group size 64, axis 1, ``skip_modules`` ``["lm_head"]``): ``Quantizer.quantize``
  reshapes the weight to ``[numel / 64, 64]`` and keeps one scale and one zero point per group of 64 consecutive
  values (``meta["scale"]``, ``meta["zero"]``, both floats that ``Quantizer.to_inplace`` casts to the compute dtype,
  16 bits with a half model); the codes are packed ``4bit_u8`` (two per uint8, ``BitPack.pack_4bit_u8``) or
  ``8bit_u8`` (one per uint8).  The scalars a serialized layer also writes (``nbits``, ``shape``, ``packing``...) are
  decoded to Python values on load (``HQQLinear.load_state_dict``), not held on the GPU; the layer's bias is the
  model's own.  4096 x 4096 at 4 bits: 8,388,608 payload + 262,144 groups x (2 B scale + 2 B zero) = 9,437,184 B;
  at 8 bits: 16,777,216 + 1,048,576 = 17,825,792 B.  A forward dequantizes the whole weight (``HQQLinear.dequantize``
  with the default ``PYTORCH`` backend): ``(W_r - zero) * scale`` holds three ``[out, in]`` copies in the compute
  dtype at once (``analytic/inference.py`` ``hqq_dequant_bytes``).
* ``ao-int4`` (torchao 0.18 ``Int4WeightOnlyConfig`` version 2 with the default ``plain`` packing, group size 128,
  as transformers 5.24 ``TorchAoConfig`` serializes it): ``Int4Tensor.from_hp`` stores ``qdata`` (two int4 codes per
  int8, ``[out, in / 2]``), ``scale`` and ``zero_point`` ``[in / 128, out]`` cast to the weight's dtype (bf16); its
  linear runs mslk's ``bf16i4bf16_rowwise`` on the packed weight.  4096 x 4096: 8,388,608 + 131,072 groups x
  (2 + 2) B = 8,912,896 B.
* ``ao-fp8`` (torchao 0.18 ``Float8DynamicActivationFloat8WeightConfig`` version 2 with ``PerRow`` granularity):
  ``Float8Tensor.from_hp`` stores ``qdata`` e4m3 ``[out, in]`` and an fp32 ``scale`` ``[out, 1]``
  (``_choose_scale_float8``); its linear quantizes the activation per row and runs mslk ``f8f8bf16_rowwise`` or
  ``torch._scaled_mm`` on the fp8 weight.  4096 x 4096: 16,777,216 + 4,096 x 4 = 16,793,600 B.
* ``ao-int8`` (torchao 0.18 ``Int8WeightOnlyConfig`` version 2, ``PerRow``): ``Int8Tensor.from_hp`` stores ``qdata``
  int8 ``[out, in]``, an fp32 ``scale`` and an int8 ``zero_point`` ``[out, 1]`` (``choose_qparams_affine`` symmetric:
  zeros, kept).  Its weight-only linear casts the whole int8 weight to the activation dtype before ``torch.mm``
  (``w_vals_int8_t.to(output_dtype)``): one ``[in, out]`` copy per forward.  4096 x 4096: 16,777,216 + 4,096 x
  (4 + 1) = 16,797,696 B.

``quantized_roles`` says which linear weights a format quantizes (``mxfp4``: the routed experts only); the
formats whose scales follow each matrix's shape (``row_block``, ``tile``) are sized matrix by matrix
(``matrix_bytes``, from ``RankParams.linear_shapes``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from vramplan.facts import row_named
from vramplan.units import DTYPE_BITS, ceil_div

__all__ = [
    "AO_INT4_GROUP", "CT_WEIGHT_SHAPE_BYTES", "DEFAULT_ROLES", "DQ_BLOCK", "FP8_TILE", "GPTQ_BIAS_BITS", "GPTQ_GROUP", "GPTQ_G_IDX_BITS",
    "HQQ_GROUP", "MX_BLOCK", "NF4_BLOCK", "NVFP4_BLOCK", "QUANT_FORMATS", "QuantFormat", "Scales", "bnb_formats", "quant_format", "quant_names",
]

NF4_BLOCK = 64  # bitsandbytes' default blocksize for 4-bit weights (functional.quantize_4bit)
DQ_BLOCK = 256  # second-level block of double quantization (QLoRA sec. 3)
GPTQ_GROUP = 128  # the group size GPTQ/AWQ checkpoints use by default
HQQ_GROUP = 64  # transformers HqqConfig(group_size=64), hqq BaseQuantizeConfig's default
AO_INT4_GROUP = 128  # torchao Int4WeightOnlyConfig.group_size default

Dequant = Literal["whole_weight", "int8_matmul", "fused_kernel"]
MX_BLOCK = 32  # OCP MX v1.0: elements sharing one E8M0 scale
FP8_TILE = 128  # DeepSeek-V3's weight_block_size [128, 128]
DEFAULT_ROLES = ("linear", "expert")
"""What a multi-token forward allocates: ``whole_weight`` = bitsandbytes 4-bit ``MatMul4Bit``
dequantizes the weight to a temporary ``[out, in]`` (again in the backward; HQQ's ``HQQLinear.dequantize`` too); ``int8_matmul`` = LLM.int8
quantizes the input row-wise and keeps it for the backward; ``fused_kernel`` = GPTQ/AWQ/fp8 kernels
read the packed weight (no weight-sized temporary; MXFP4: triton_kernels ``matmul_ogs``; block-wise fp8:
``w8a8_block_fp8_matmul``)."""


@dataclass(frozen=True, kw_only=True)
class Scales:
    """Scales stored beside a quantized payload."""

    # of the flattened weight / per output row / per input group / per ``size`` inputs of each output row
    # (MXFP4) / per ``size`` x ``size`` tile of each matrix (block-wise fp8) / one per matrix (per-tensor fp8)
    per: Literal["block", "row", "group", "row_block", "tile", "tensor"]
    size: int = 0  # values per block or group (0 for ``row``); the tile's side for ``tile``
    dtype: str = "fp32"  # a DTYPE_BITS name
    zero_point_bits: int = 0  # packed zero point per scale (GPTQ/AWQ)
    second_level: Scales | None = None  # double quantization: the scales quantized per block of ``size``

    @property
    def per_matrix(self) -> bool:
        """Whether the count depends on each matrix's shape (not only on its number of values)."""
        return self.per in ("row_block", "tile", "tensor")

    def count(self, numel: int, out_features: int) -> int:
        """How many scales a weight of ``numel`` values with ``out_features`` rows has (one matrix where
        ``per_matrix``: its input features are ``numel / out_features``)."""
        if self.per == "row":
            return out_features
        if self.per_matrix:
            return self.matrix_count(numel // max(1, out_features), out_features)
        return ceil_div(numel, self.size)

    def matrix_count(self, in_features: int, out_features: int) -> int:
        """Scales of one ``out_features`` x ``in_features`` matrix."""
        if self.per == "row_block":
            return out_features * ceil_div(in_features, self.size)
        if self.per == "tile":
            return ceil_div(out_features, self.size) * ceil_div(in_features, self.size)
        if self.per == "tensor":
            return 1
        if self.per == "group":  # AutoGPTQ/compressed-tensors: ceil(in / group_size) groups per output column
            return out_features * ceil_div(in_features, self.size)
        return self.count(in_features * out_features, out_features)

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
    library: Literal["bitsandbytes", "gptq", "awq", "fp8", "mxfp4", "compressed-tensors", "modelopt", "hqq", "torchao"]
    trainable_base: bool  # usable as a frozen base under PEFT training (TrainQuant)
    dequant: Dequant
    compute_dtype_rule: str
    hf_bnb_config: tuple[tuple[str, bool | str], ...] = ()  # BitsAndBytesConfig kwargs (compute dtype added)
    vllm_quantization: str  # vLLM's ``--quantization`` value ("" where vLLM has none: serving is refused)
    prequantized_checkpoint: bool = False  # needs a checkpoint quantized that way (no in-flight quantization)
    sources: tuple[str, ...] = ()
    quantized_roles: tuple[str, ...] = DEFAULT_ROLES  # the ParamGroup roles stored in this format
    expert_bias_dtype: str | None = None  # the dtype the engines hold the quantized experts' biases in
    # tensors the checkpoint stores beside each quantized matrix, by its shape: bits per input feature (GPTQ
    # ``g_idx`` int32), bits per output feature (AutoGPTQ's fp16 ``bias``), bytes per matrix (compressed-tensors
    # ``weight_shape`` int64[2])
    per_input_bits: int = 0
    per_output_bits: int = 0
    per_matrix_extra_bytes: int = 0
    # whole-weight copies in the model's dtype a forward holds for the largest linear, decode steps included (HQQ's
    # dequantize keeps three: the unpacked codes, minus zero, times scale; torchao's int8 weight-only linear casts
    # the weight once); 0: none, or bitsandbytes' multi-token rule (analytic/inference.py bnb_dequant_bytes)
    forward_weight_copies: int = 0
    # how Hugging Face generate holds the checkpoint's weights, stated in the report (task inference); "" for none.
    # ``{name}`` is the row's name.
    inference_note: str = ""

    @property
    def per_matrix(self) -> bool:
        """Sized matrix by matrix (its scales follow each shape, it quantizes only some roles, or it stores
        tensors per input feature, per output feature or per matrix)."""
        extras = self.per_input_bits or self.per_output_bits or self.per_matrix_extra_bytes
        return self.scales.per_matrix or self.quantized_roles != DEFAULT_ROLES or bool(extras)

    def matrix_bytes(self, in_features: int, out_features: int) -> int:
        """Bytes of one ``out_features`` x ``in_features`` matrix in this format.

        >>> quant_format("fp8-block").matrix_bytes(7168, 576)   # 4,128,768 B + 5 x 56 fp32 tiles
        4129888
        """
        n = in_features * out_features
        s = self.scales
        count = s.matrix_count(in_features, out_features)
        scales = ceil_div(count * DTYPE_BITS[s.dtype], 8) + ceil_div(count * s.zero_point_bits, 8)
        return ceil_div(n * self.bits, 8) + scales + self.extra_bytes(in_features, out_features)

    def extra_bytes(self, in_features: int, out_features: int) -> int:
        """The per-input, per-output and per-matrix tensors of one matrix (``g_idx``, AutoGPTQ's ``bias``,
        ``weight_shape``).

        >>> quant_format("gptq-8bit").extra_bytes(4096, 4096)   # int32 g_idx + fp16 bias: 16,384 + 8,192
        24576
        """
        return (ceil_div(in_features * self.per_input_bits, 8) + ceil_div(out_features * self.per_output_bits, 8)
                + self.per_matrix_extra_bytes)

    @property
    def double_quant(self) -> bool:
        return self.scales.second_level is not None

    def linear_bytes(self, numel: int, out_features: int) -> int:
        """Bytes of ``numel`` linear weights with ``out_features`` rows in this format.

        >>> quant_format("nf4").linear_bytes(4096 * 4096, 4096)   # 8,388,608 payload + 262,144 x 4 absmax
        9437184
        """
        extra = self.extra_bytes(numel // max(1, out_features), out_features)  # as one matrix
        return ceil_div(numel * self.bits, 8) + self.scales.bytes(numel, out_features) + extra


_BNB_4BIT_RULE = ("compute dtype = bnb_4bit_compute_dtype, replaced by the layer's first fp32 or bf16 input dtype "
                  "(Linear4bit.set_compute_type, bitsandbytes >= 0.41.0); the dequantized weight has the dtype it "
                  "was quantized from")
_BNB4_SRC = ("bitsandbytes functional.quantize_4bit / nn.Linear4bit", "QLoRA arXiv 2305.14314")
GPTQ_G_IDX_BITS = 32  # AutoGPTQ QuantLinear.g_idx: one int32 group index per input feature
GPTQ_BIAS_BITS = 16  # AutoGPTQ make_quant builds every QuantLinear with bias=True: an fp16 bias per output feature
CT_WEIGHT_SHAPE_BYTES = 16  # compressed-tensors pack-quantized ``weight_shape``: int64[2] per matrix
NVFP4_BLOCK = 16  # NVFP4: one e4m3 scale per 16 values of a row
_GPTQ_SRC = ("GPTQ arXiv 2210.17323",
             ("AutoGPTQ v0.7.1 nn_modules/qlinear/qlinear_cuda_old.py QuantLinear.__init__ (qweight int32 "
              "[in/32 x bits, out], qzeros int32 [ceil(in/group), out/32 x bits], scales fp16 [ceil(in/group), out], "
              "g_idx int32 [in], bias fp16 [out])"),
             "AutoGPTQ v0.7.1 modeling/_utils.py make_quant (QuantLinear(bits, group_size, in, out, True))")
_HQQ_SRC = (("hqq 0.2.8 core/quantize.py Quantizer.quantize (W_q packed per bit_to_packing, meta scale/zero per group) "
             "and HQQLinear.dequantize / forward_pytorch_backprop"),
            "transformers 5.24 utils/quantization_config.py HqqConfig (nbits 4, group_size 64, axis 1, skip lm_head)")
_CT_SRC = (("compressed-tensors compressors/quantized_compressors/base.py BaseQuantizationCompressor.compress "
            "(weight_scale kept; weight_zero_point dropped when symmetric)"),
           "scales in the dtype of the weights they were computed from (the checkpoint's torch_dtype)")

_FP8_TENSOR_SRC = (("AutoFP8 README.md (commit 505a7ed), Checkpoint structure: weight F8_E4M3, weight_scale F32, "
                    "input_scale F32 with activation_scheme static"),
                   "vLLM quantization/fp8.py Fp8Config.from_config (weight_block_size None: per-tensor)",
                   "transformers 5.24 integrations/finegrained_fp8.py FP8Linear (block_size None: scalar scales)")
_CT_FLOAT_SRC = "compressed-tensors naive_quantized.py FloatQuantizationCompressor (weight e4m3 [out, in])"

_PerTensorRow = tuple[str, Literal["fp8", "compressed-tensors"], str, int, str, tuple[str, ...]]
# name, library (also vLLM's --quantization), scale dtype, input_scale bytes per matrix, compute rule, sources
_PER_TENSOR_FP8_ROWS: tuple[_PerTensorRow, ...] = (
    ("fp8-tensor", "fp8", "fp32", 0, "fp8 matmul with a per-tensor weight scale and dynamic activation scales",
     _FP8_TENSOR_SRC),
    ("fp8-tensor-static", "fp8", "fp32", 4,
     "fp8 matmul with a per-tensor weight scale and a static per-tensor activation scale", _FP8_TENSOR_SRC),
    ("ct-fp8-tensor", "compressed-tensors", "bf16", 0,
     "fp8 matmul with a per-tensor weight scale and dynamic activation scales (or weight-only)",
     (*_CT_SRC, _CT_FLOAT_SRC)),
    ("ct-fp8-tensor-static", "compressed-tensors", "bf16", 2,
     "fp8 matmul with a per-tensor weight scale and a static per-tensor activation scale",
     (*_CT_SRC, _CT_FLOAT_SRC)),
)

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
    *(QuantFormat(
        name=f"gptq-{b}bit", bits=b, scales=Scales(per="group", size=GPTQ_GROUP, dtype="fp16", zero_point_bits=b),
        library="gptq", trainable_base=False, dequant="fused_kernel", compute_dtype_rule="fp16 kernels",
        vllm_quantization="gptq", prequantized_checkpoint=True,
        per_input_bits=GPTQ_G_IDX_BITS, per_output_bits=GPTQ_BIAS_BITS, sources=_GPTQ_SRC,
    ) for b in (4, 3, 8)),
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
    QuantFormat(
        name="mxfp4", bits=4, scales=Scales(per="row_block", size=MX_BLOCK, dtype="uint8"), library="mxfp4",
        trainable_base=False, dequant="fused_kernel",
        compute_dtype_rule="bf16 activations (vLLM Mxfp4Config.get_supported_act_dtypes; triton_kernels matmul_ogs)",
        vllm_quantization="mxfp4", prequantized_checkpoint=True, quantized_roles=("expert",),
        expert_bias_dtype="fp32",
        sources=("OCP Microscaling Formats (MX) Specification v1.0 (MXFP4: e2m1 elements, E8M0 scale per 32)",
                 "transformers 5.24 integrations/mxfp4.py Mxfp4GptOssExperts (uint8 blocks, fp32 expert biases)",
                 "vLLM quantization/mxfp4.py Mxfp4MoEMethod.create_weights (commit 007d500)"),
    ),
    QuantFormat(
        name="fp8-block", bits=8, scales=Scales(per="tile", size=FP8_TILE, dtype="fp32"), library="fp8",
        trainable_base=False, dequant="fused_kernel",
        compute_dtype_rule="fp8 matmul with 128 x 128 weight tiles and per-token groups of 128 activations",
        vllm_quantization="fp8", prequantized_checkpoint=True,
        sources=("DeepSeek-V3 arXiv 2412.19437 sec. 3.3.2 (fine-grained quantization)",
                 "transformers integrations/finegrained_fp8.py FP8Linear (weight, weight_scale_inv)",
                 "vLLM quantization/fp8.py Fp8LinearMethod.create_weights (block_quant)"),
    ),
    # per-tensor FP8: e4m3 ``weight`` [out, in] with one ``weight_scale`` per matrix, and with static activations one
    # ``input_scale`` per matrix.  ``fp8-tensor*``: quant_method fp8 without block scales, as AutoFP8 writes it
    # (``{"quant_method": "fp8", "activation_scheme": ...}``, fp32 scales: its README's checkpoint structure) and as
    # transformers' FineGrainedFP8Config writes ``weight_block_size: null`` (scalar fp32 ``weight_scale_inv`` and
    # ``activation_scale``, integrations/finegrained_fp8.py FP8Linear); vLLM's Fp8Config reads a missing
    # weight_block_size as None, per tensor.  ``ct-fp8-tensor*``: compressed-tensors' ``float-quantized`` FP8 with
    # strategy tensor (llm-compressor's FP8 scheme: static per-tensor activations), scales in the weights' dtype
    *(QuantFormat(
        name=name, bits=8, scales=Scales(per="tensor", dtype=dtype), library=lib, trainable_base=False,
        dequant="fused_kernel", compute_dtype_rule=rule, vllm_quantization=lib, prequantized_checkpoint=True,
        per_matrix_extra_bytes=extra, sources=src,
    ) for name, lib, dtype, extra, rule, src in _PER_TENSOR_FP8_ROWS),
    QuantFormat(
        name="ct-w4a16", bits=4, scales=Scales(per="group", size=GPTQ_GROUP, dtype="bf16"),
        library="compressed-tensors", trainable_base=False, dequant="fused_kernel",
        compute_dtype_rule="16-bit activations (weight-only int4; vLLM Marlin / machete kernels)",
        vllm_quantization="compressed-tensors", prequantized_checkpoint=True,
        per_matrix_extra_bytes=CT_WEIGHT_SHAPE_BYTES,
        sources=(*_CT_SRC, ("compressed-tensors compressors/quantized_compressors/pack_quantized.py "
                            "PackedQuantizationCompressor (weight_packed int32 [out, in/8], weight_shape int64[2])")),
    ),
    QuantFormat(
        name="ct-w8a8-int8", bits=8, scales=Scales(per="row", dtype="bf16"),
        library="compressed-tensors", trainable_base=False, dequant="fused_kernel",
        compute_dtype_rule="int8 matmul with per-channel weight scales and dynamic per-token activation scales",
        vllm_quantization="compressed-tensors", prequantized_checkpoint=True,
        sources=(*_CT_SRC, "compressed-tensors naive_quantized.py IntQuantizationCompressor (weight int8 [out, in])"),
    ),
    QuantFormat(
        name="ct-fp8", bits=8, scales=Scales(per="row", dtype="bf16"),
        library="compressed-tensors", trainable_base=False, dequant="fused_kernel",
        compute_dtype_rule="fp8 matmul with per-channel weight scales and dynamic per-token activation scales",
        vllm_quantization="compressed-tensors", prequantized_checkpoint=True,
        sources=(*_CT_SRC, _CT_FLOAT_SRC),
    ),
    # NVFP4 (compressed-tensors ``nvfp4-pack-quantized``, llm-compressor's NVFP4 and NVFP4A16 schemes): e2m1 values
    # two per uint8 (``weight_packed`` [out, in/2], pack_fp4_to_uint8), one e4m3 scale per 16 inputs of each row
    # (``weight_scale`` [out, in/16], scale_dtype float8_e4m3fn by default) and one fp32 ``weight_global_scale`` per
    # matrix; W4A4 (tensor_group activations) also stores an fp32 ``input_global_scale`` per matrix
    *(QuantFormat(
        name=name, bits=4, scales=Scales(per="row_block", size=NVFP4_BLOCK, dtype="fp8"),
        library="compressed-tensors", trainable_base=False, dequant="fused_kernel",
        compute_dtype_rule=rule, vllm_quantization="compressed-tensors", prequantized_checkpoint=True,
        per_matrix_extra_bytes=extra,
        sources=(("compressed-tensors compressors/nvfp4 NVFP4PackedCompressor (weight_packed uint8 [out, in/2] by "
                  "pack_fp4_to_uint8; weight_scale cast to scale_dtype, float8_e4m3fn by default; "
                  "weight_global_scale; input_global_scale with tensor_group input activations)"),
                 "NVIDIA NVFP4: e2m1 elements, one e4m3 scale per 16 elements, one fp32 per-tensor scale"),
    ) for name, extra, rule in (
        ("ct-nvfp4", 8, "fp4 matmul with per-16 e4m3 scales on weights and activations (W4A4)"),
        ("ct-nvfp4a16", 4, "16-bit activations (weight-only NVFP4)"))),
    # NVIDIA's Model Optimizer exports (``quant_method: modelopt``, the nvidia/*-FP4 and nvidia/*-FP8 checkpoints), per
    # linear: NVFP4 (``quant_algo: NVFP4``) ``weight`` uint8 [out, in/2] (e2m1 pairs), ``weight_scale`` float8_e4m3fn
    # [out, in/16], ``weight_scale_2`` and ``input_scale`` fp32 (the bytes of ``ct-nvfp4``); per-tensor FP8
    # (``quant_algo: FP8``) ``weight`` float8_e4m3fn [out, in], ``weight_scale`` and a static ``input_scale`` fp32
    *(QuantFormat(
        name=name, bits=bits, scales=scales, library="modelopt", trainable_base=False, dequant="fused_kernel",
        compute_dtype_rule=rule, vllm_quantization=method, prequantized_checkpoint=True, per_matrix_extra_bytes=extra,
        sources=((f"Model Optimizer's Hugging Face export of {algo} (nvidia/*-{algo[-3:]} checkpoints): {tensors} per "
                  f"linear; quantization_config quant_method modelopt, quant_algo {algo}"),
                 f"vLLM quantization/modelopt.py {cls} (--quantization {method})"),
    ) for name, bits, scales, extra, method, algo, tensors, cls, rule in (
        ("modelopt-nvfp4", 4, Scales(per="row_block", size=NVFP4_BLOCK, dtype="fp8"), 8, "modelopt_fp4", "NVFP4",
         "weight U8 [N, K/2], weight_scale F8_E4M3 [N, K/16], weight_scale_2 F32 [1], input_scale F32 [1]",
         "ModelOptNvFp4Config", "fp4 matmul with per-16 e4m3 scales on weights and activations (W4A4)"),
        ("modelopt-fp8", 8, Scales(per="tensor", dtype="fp32"), 4, "modelopt", "FP8",
         "weight F8_E4M3 [N, K], weight_scale F32 [], input_scale F32 []", "ModelOptFp8Config",
         "fp8 matmul with a per-tensor weight scale and a static per-tensor activation scale"))),
    # vLLM dropped its ``hqq`` method (HQQMarlinConfig: 4-bit, group 64) from quantization/__init__.py
    # QUANTIZATION_METHODS (absent at commit 05d9095): no ``--quantization`` value, serving is refused
    *(QuantFormat(
        name=f"hqq-{b}bit", bits=b, scales=Scales(per="block", size=HQQ_GROUP, dtype="fp16", zero_point_bits=16),
        library="hqq", trainable_base=False, dequant="whole_weight",
        compute_dtype_rule="the model's dtype (HQQLinear compute_dtype); scale and zero are cast to it",
        vllm_quantization="", prequantized_checkpoint=True, sources=_HQQ_SRC, forward_weight_copies=3,
        # transformers 5.24 HqqHfQuantizer defines no get_quantize_ops / load operations, so from_pretrained
        # reaches HfQuantizer.get_quantize_ops: NotImplementedError "hqq is not available yet"
        inference_note=("{name}: weights held as the hqq library's HQQLinear (release 0.2.8) holds them with its "
                        "default PYTORCH backend (packed uint8 W_q, scale and zero per group of 64 in the model's "
                        "dtype), as transformers 4.x HqqHfQuantizer loaded them; transformers 5.24 has no HQQ loading "
                        "path (HfQuantizer.get_quantize_ops raises NotImplementedError)"),
    ) for b in (4, 8)),
    # vLLM's torchao method (quantization/torchao.py TorchAOConfig) is not modelled: serving is refused
    QuantFormat(
        name="ao-int4", bits=4, scales=Scales(per="group", size=AO_INT4_GROUP, dtype="bf16", zero_point_bits=16),
        library="torchao", trainable_base=False, dequant="fused_kernel",
        compute_dtype_rule="bf16 activations (Int4Tensor: mslk bf16i4bf16_rowwise)",
        vllm_quantization="", prequantized_checkpoint=True,
        sources=("torchao 0.18 quantization/quant_api.py Int4WeightOnlyConfig (group_size 128, version 2, plain packing)",
                 ("torchao 0.18 quantize_/workflows/int4/int4_tensor.py Int4Tensor.from_hp (qdata [N, K/2], scale and "
                  "zero_point [K/group, N] in the weight's dtype)"),
                 "transformers 5.24 quantizers/quantizer_torchao.py (TorchAoDeserialize of qdata, scale, zero_point)"),
        inference_note=("{name}: weights held as transformers 5.24 TorchAoDeserialize rebuilds torchao 0.18's "
                        "Int4Tensor (qdata int8 [out, in/2], scale and zero_point [in/128, out] in bf16); its linear "
                        "runs mslk bf16i4bf16_rowwise on the packed weight (no dequantized copy), which takes bf16 "
                        "activations"),
    ),
    QuantFormat(
        name="ao-fp8", bits=8, scales=Scales(per="row", dtype="fp32"), library="torchao", trainable_base=False,
        dequant="fused_kernel",
        compute_dtype_rule="activations quantized to e4m3 per row (Float8Tensor: mslk f8f8bf16_rowwise / _scaled_mm)",
        vllm_quantization="", prequantized_checkpoint=True,
        sources=(("torchao 0.18 quantization/quant_api.py Float8DynamicActivationFloat8WeightConfig (version 2, "
                  "granularity PerRow)"),
                 ("torchao 0.18 quantize_/workflows/float8/float8_tensor.py Float8Tensor.from_hp (qdata e4m3, "
                  "scale fp32 [N, 1]) and _float8_addmm_impl"),
                 "transformers 5.24 quantizers/quantizer_torchao.py (TorchAoDeserialize of qdata, scale)"),
        inference_note=("{name}: weights held as transformers 5.24 TorchAoDeserialize rebuilds torchao 0.18's "
                        "Float8Tensor (qdata e4m3 [out, in], scale fp32 [out, 1]); its linear quantizes each activation "
                        "row to e4m3 and runs mslk f8f8bf16_rowwise (sm90+) or torch._scaled_mm on the fp8 weight"),
    ),
    QuantFormat(
        name="ao-int8", bits=8, scales=Scales(per="row", dtype="fp32", zero_point_bits=8), library="torchao",
        trainable_base=False, dequant="whole_weight",
        compute_dtype_rule="the activation dtype: the int8 weight is cast to it whole before torch.mm",
        vllm_quantization="", prequantized_checkpoint=True,
        sources=("torchao 0.18 quantization/quant_api.py Int8WeightOnlyConfig (version 2, granularity PerRow)",
                 ("torchao 0.18 quantize_/workflows/int8/int8_tensor.py Int8Tensor.from_hp (qdata int8, scale fp32, "
                  "zero_point int8 [N, 1]) and its aten.linear weight-only per-row path"),
                 "transformers 5.24 quantizers/quantizer_torchao.py (TorchAoDeserialize of qdata, scale, zero_point)"),
        # Int8Tensor's weight-only per-row linear: ``weight.qdata.t().to(output_dtype)``, one copy of the weight in
        # the activation dtype (the model's), at every forward
        forward_weight_copies=1,
        inference_note=("{name}: weights held as transformers 5.24 TorchAoDeserialize rebuilds torchao 0.18's "
                        "Int8Tensor (qdata int8 [out, in], scale fp32 and zero_point int8 [out, 1]); its weight-only "
                        "linear casts the whole int8 weight to the activation dtype for torch.mm (one copy per "
                        "forward)"),
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
