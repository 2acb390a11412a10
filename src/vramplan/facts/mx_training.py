"""torchao MXFP8 training (``train.precision: mxfp8-torchao``) as data: the recipes, the casts one converted
linear's backward makes and the bytes each holds, read from torchao's source at v0.14.1 and torchtitan's converter.

MX formats (OCP Microscaling v1.0): e4m3 elements, 1 B each, and one e8m0 scale, 1 B, per block of 32 consecutive
elements along the cast's dimension: 1 + 1/32 B per element once cast.

torchao v0.14.1 ``torchao/prototype/mx_formats/mx_linear.py`` ``mx_mm`` (the autograd function ``MXLinear.forward``
calls):

* forward: ``ctx.save_for_backward(input_hp, weight_hp)``: the **high-precision** input and weight, as
  ``nn.Linear`` saves them (the weight as FSDP2 gathered it, freed after the forward and gathered again); no MX
  copy is saved.  The forward casts the input and the weight along dim0 (``MXTensor.to_mx``) for ``torch.mm``;
  both are locals, freed when the forward returns;
* backward: ``grad_output`` cast along dim0 and the weight along dim1 for grad_input; ``grad_output`` and the
  input along dim1 for grad_weight.  Each cast is a local of ``backward``, alive until it returns.  A dim1 cast
  is ``_to_mxfp8_dim1_kernel_wrapper`` (``MXFP8Dim1CastKernelChoice`` CUDA or TRITON), which writes only its
  output (``mxfp8_quantize_cuda``: ``output_colwise`` and ``scales_colwise``), or, with TORCH, ``to_mx`` of a
  transposed bf16 copy: ``weight_hp.t().contiguous()`` is bound to a local (``weight_hp_t_c``), alive until the
  backward returns; the copies of ``grad_output`` and the input are arguments, freed when their cast returns;
* ``mx_tensor.py`` ``to_mx`` (eager, the dim0 cast): ``torch.abs`` (bf16, freed by ``amax``), ``data_hp.to(
  torch.float32)`` (4 B per element, bound to ``data_hp`` until the cast returns), then with FLOOR scales
  ``data_lp = data_hp / scale_fp32`` (4) and ``torch.clamp`` (4) while the quotient is still referenced: 12 B
  per element at the cast's peak, then ``.to(float8_e4m3fn)`` (1) beside the fp32 copy and the clamped
  quotient (9); with RCEIL (``_to_mx_rceil``) ``torch.clamp(data_hp * descale_fp)``: the product (4) and its
  clamp (4) beside the fp32 copy, 12 B likewise.  Per block of 32 the scale arithmetic holds, at that peak,
  FLOOR: ``max_abs`` fp32 4, ``extracted_pow2`` int32 4, ``scale_e8m0_unbiased`` int32 4, ``scale_e8m0_biased``
  uint8 1, ``scale_fp32`` 4 = 17 B; RCEIL: ``max_abs`` 4, ``descale`` 4, ``exponent`` uint8 1, ``descale_fp``
  fp32 4 = 13 B.  The cast leaves the e4m3 data (1 B per element) and the e8m0 scale (1 B per block);
* ``mx_tensor.py`` ``_addmm_mx_dispatch``: with the CUBLAS gemm both operands are used as they are (it asserts
  ``a.qdata.is_contiguous()`` and ``b.qdata.t().is_contiguous()``: no operand copy) and each operand's scales are
  rearranged by ``utils.py`` ``to_blocked`` into cuBLAS's layout: a copy of ``32 x ceil(rows / 128)`` by
  ``16 x ceil(cols / 4)`` bytes (rows by K / 32 scales, padded to tiles of 128 x 4); with EMULATED each operand
  is dequantized to bf16 (``to_dtype``: ``data_lp.to(bf16)`` 2 B then ``data_hp * s_fp`` 2 B while the first is
  referenced: 4 B per element at its peak, 2 B after), the first operand's 2 B beside the second's 4.

``config.py`` ``MXLinearConfig.from_recipe_name``: mxfp8_emulated (``MXLinearConfig()``: EMULATED gemm, TORCH dim1
casts, FLOOR scales), mxfp8_cublas (CUBLAS gemm, CUDA dim1 casts, FLOOR), mxfp8_cublas_rceil (CUBLAS, CUDA,
RCEIL); block size 32, ``elem_dtype`` float8_e4m3fn for the input, the weight and the gradient.

Which linears and which GPUs: torchtitan's converter (``components/quantization/mx.py`` ``MXLinearConverter``,
commit f7a56e602c1d17565512aaae72a5d8f4c92f3ba6, 2025-10-16, the first after 58c5455 dropped its torchao-nightly
version check, so that it runs torchao 0.14.1) asserts ``has_cuda_capability(10, 0)`` ("MXFP8 is only supported on
SM100 or architectures") and calls ``quantize_(model, MXLinearConfig.from_recipe_name(recipe_name), filter_fn=
module_filter_fn)``: each ``nn.Linear`` with both dimensions multiples of 16 whose name matches no
``filter_fqns`` entry (default ``["output"]``, the LM head).  Its ``mxfp8_dim1_cast_kernel_choice`` is set on the
config as ``config.mxfp8_dim1_cast_kernel_choice``, an attribute ``MXLinearConfig`` v0.14.1 does not read (its field
is ``mxfp8_cast_kernel_choice``): the recipe's dim1 kernel runs.  The dim0 cast needs the last dimension a multiple
of 32 (``to_mx``: "must be divisible by block_size"); the CUDA dim1 cast both dimensions (``mxfp8_quantize_cuda``:
"rows must be a multiple of 32").  torchtitan HEAD (b5bcd76, 2026) converts with
``torchao.prototype.moe_training.mxfp8_linear.MXFP8Linear`` instead, absent from torchao 0.14.1: its
``MXFP8LinearConverter`` raises ValueError unless ``has_cuda_capability(10, 0)`` and swaps every ``Linear.Config``
whose name contains one of its ``fqns`` (all of them, the head included, when ``fqns`` is empty), with no
dimension filter; that layout is not modelled.

NVFP4 (e2m1 elements packed two per byte, one e4m3 scale per 16 elements, one fp32 per-tensor scale) training is
refused, ``NVFP4_REFUSAL``; the stacks read:

* torchao v0.14.1 and v0.16.0 have no NVFP4 training linear.  ``mx_formats`` offers NVFP4 inference (v0.14.1
  ``NVFP4InferenceConfig``; v0.16.0 ``NVFP4DynamicActivationNVFP4WeightConfig``, ``NVFP4WeightOnlyConfig``) and
  ``prototype/qat/nvfp4.py`` ``NVFP4FakeQuantizedLinear`` (quantization-aware training: the forward saves the
  NVFP4 input and weight, ``ctx.save_for_backward(_input, weight)``, and the backward dequantizes both and runs
  two bf16 ``torch.mm``); neither release has ``prototype/moe_training/nvfp4_training`` (v0.16.0's
  ``moe_training`` holds ``scaled_grouped_mm.py``, ``tensor.py``, ``conversion_utils.py``, ``kernels``, ``ep``),
  which torchtitan's ``nvfp4`` converter (commit bcc0929, 2026) imports (later torchao source has it:
  ``NVFP4TrainingConfig``, ``NVFP4Linear``);
* Transformer Engine has the ``NVFP4BlockScaling`` recipe from v2.8 (absent from v2.7;
  ``transformer_engine/common/recipe/__init__.py``): the input quantized with a random Hadamard transform on its
  columnwise copy, the weight with 16 x 16 (2D) blocks, the gradient with the Hadamard transform and stochastic
  rounding.  ``pytorch/tensor/nvfp4_tensor.py`` ``NVFP4Quantizer.make_empty``: rowwise data ``uint8`` of shape
  (M, K / 2), scales ``uint8`` (M rounded up to 128, ceil(K / 16) rounded up to 4), one fp32 amax; the columnwise
  copy the same on the transposed shape.  ``pytorch/module/linear.py`` ``_Linear.forward`` keeps only the
  input's columnwise copy for the backward (``update_usage(rowwise_usage=False, columnwise_usage=True)``) and the
  weight's quantized copy with its columnwise usage added, plus the bf16 weight
  (``prepare_for_saving(saved_inputmat, weightmat, weight, bias)``); the weight copy is cached across
  micro-batches under ``cache_name="weight"`` when ``is_first_microbatch`` is given.  The trainers that drive it
  (Megatron-Core's ``--fp4-format e2m1 --fp4-recipe nvfp4``) are not
  modelled in NVFP4: Megatron-Core is modelled with ``--bf16`` or fp32 only (spec/megatron.py), and the Transformer
  Engine rows of the precision table (``fp8-mixed``) count whole bytes per element.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["BLOCK_SIZE", "CAST_PEAK_PER_ELEMENT", "DIM_MULTIPLE", "MIN_CAPABILITY", "MX_RECIPES", "NVFP4_REFUSAL",
           "SAVED_FOR_BACKWARD", "SOURCE", "MXRecipeFacts", "mx_recipe"]

SOURCE = "torchao v0.14.1 torchao/prototype/mx_formats/mx_linear.py mx_mm"
# what the autograd function saves, by its variable names (the high-precision input and weight)
SAVED_FOR_BACKWARD = ("input_hp", "weight_hp")
# one e8m0 scale per 32 elements (MXLinearConfig.block_size; the CUBLAS gemm asserts 32)
BLOCK_SIZE = 32
# torchtitan's module_filter_fn (both dimensions multiples of 16); torchao's casts need 32 (BLOCK_SIZE)
DIM_MULTIPLE = 16
# eager dim0 cast (to_mx): the fp32 copy, the scaled fp32 data and its clamp, per element
CAST_PEAK_PER_ELEMENT = 12
# torchtitan MXLinearConverter: has_cuda_capability(10, 0)
MIN_CAPABILITY = (10, 0)

NVFP4_REFUSAL = ("NVFP4 training is not modelled: torchao 0.14.1 and 0.16.0 have no NVFP4 training linear (NVFP4 "
                 "inference, and quantization-aware training whose backward is bf16, prototype/qat/nvfp4.py), and "
                 "torchtitan's nvfp4 converter needs torchao.prototype.moe_training.nvfp4_training, in neither release; "
                 "Transformer Engine 2.8+ has NVFP4BlockScaling (Megatron-Core's --fp4-recipe nvfp4), but Megatron-Core "
                 "is modelled with --bf16 or fp32 only")

Gemm = Literal["cublas", "emulated"]
Dim1Cast = Literal["cuda", "torch"]
Scaling = Literal["floor", "rceil"]


@dataclass(frozen=True, kw_only=True)
class MXRecipeFacts:
    """One ``MXLinearRecipeName`` row: its gemm, its dim1 cast kernel and its scale calculation."""

    name: str
    gemm: Gemm  # MXGemmKernelChoice
    dim1_cast: Dim1Cast  # MXFP8Dim1CastKernelChoice
    scaling: Scaling  # ScaleCalculationMode
    source: str

    @property
    def scale_arithmetic_per_block(self) -> int:
        """Bytes per block of 32 the eager dim0 cast's scale arithmetic holds at its peak (module docstring)."""
        return 17 if self.scaling == "floor" else 13


MX_RECIPES: tuple[MXRecipeFacts, ...] = (
    MXRecipeFacts(name="mxfp8_cublas", gemm="cublas", dim1_cast="cuda", scaling="floor",
                  source="config.py from_recipe_name MXFP8_CUBLAS: CUBLAS gemm, CUDA dim1 cast"),
    MXRecipeFacts(name="mxfp8_cublas_rceil", gemm="cublas", dim1_cast="cuda", scaling="rceil",
                  source="config.py from_recipe_name MXFP8_CUBLAS_RCEIL: CUBLAS gemm, CUDA dim1 cast, RCEIL"),
    MXRecipeFacts(name="mxfp8_emulated", gemm="emulated", dim1_cast="torch", scaling="floor",
                  source="config.py from_recipe_name MXFP8_EMULATED: MXLinearConfig() defaults"),
)


def mx_recipe(name: str) -> MXRecipeFacts:
    """The row called ``name``."""
    for r in MX_RECIPES:
        if r.name == name:
            return r
    raise KeyError(f"no MX recipe {name!r}: one of {[r.name for r in MX_RECIPES]}")
