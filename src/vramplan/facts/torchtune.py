"""torchtune's recipes as data: how QLoRA stores and dequantizes its base weights (torchao ``NF4Tensor``),
and the releases at which what the memory depends on changed.  Read off pytorch/torchtune at its tags
(v0.1.0 2024-04-15, v0.2.0 2024-07-16, v0.3.0 2024-09-17, v0.4.0 2024-11-13, v0.6.1 2025-04-07) and
pytorch/ao at v0.7.0 (``torchao/dtypes/nf4tensor.py``; the NF4 code is unchanged in the releases torchtune
pinned in 2024-2025).  docs/conventions.md, "torchtune (framework: torchtune)", explains each row.

**Weights** (``to_nf4(weight, block_size=64, scaler_block_size=256)``, ``NF4Tensor.from_tensor``): an
n-element weight keeps

* ``quantized_data``: uint8, two 4-bit codes a byte: n / 2 B;
* ``quantized_scalers``: int8, one per block of 64 (the block absmax, double-quantized): n / 64 B;
* ``quantization_factor``: one per 256 scalers, in the weight's dtype (bf16): 2 n / 16,384 B;
* ``scaler_mean`` (a scalar, 2 B) and the 16-entry ``nf4`` lookup table (32 B), per matrix.

Against bitsandbytes' ``nf4-dq`` (uint8 absmax per 64, fp32 absmax per 256 blocks): the same n / 2 + n / 64,
but a bf16 second-level factor instead of fp32: Llama-2-7B's 6.48 G quantized weights hold 0.79 MB less.
Measured on CPU with torchao 0.7.0: a 1,024 x 512 weight stores 262,144 + 8,192 + 64 + 2 + 32 = 270,434 B.

**Dequantization** (``LinearNF4.forward``: ``F.linear(input, weight.to(input.dtype))``; ``backward``:
``grad_output @ weight.to(grad_output.dtype)``; ``Tensor.to`` with a dtype calls ``get_original_weight``):
``get_original_weight`` keeps every intermediate bound to a local until it returns: the two code halves as
int64 (``.to(torch.long)``, 4 n B each), their looked-up values (n B each), the dequantized scalers (n / 32 B,
with an n / 32 B temporary and a quantization-factor-sized one), the two scaled halves (n B each, each made
beside an n B ``repeated.flatten()`` copy) and their ``torch.stack`` (2 n B, the result): 14 n + 3 n / 64 +
n / 8,192 bytes at its peak.  Measured on CPU with torchao 0.7.0 (every live storage tracked through a
``TorchDispatchMode``): 7,364,672 B for a 1,024 x 512 weight, 58,917,376 B for 4,096 x 1,024, the formula's
values.  The quantized weight itself is what ``LinearNF4`` saves for the backward: no input is kept (unlike
bitsandbytes < 0.43.2's ``MatMul4Bit``).
"""

from __future__ import annotations

__all__ = [
    "FROZEN_NF4_SINCE",
    "LABEL_SHIFT_SINCE",
    "NF4_BLOCK",
    "NF4_SCALER_BLOCK",
    "TORCHTUNE_DEFAULT",
    "TORCHTUNE_PRECISIONS",
    "TORCHTUNE_QUANTIZATION",
    "torchao_nf4_bytes",
    "torchao_nf4_dequant_peak_bytes",
]

NF4_BLOCK = 64  # to_nf4 block_size: one int8 scaler per 64 weights
NF4_SCALER_BLOCK = 256  # to_nf4 scaler_block_size: one quantization factor per 256 scalers
_NF4_PER_MATRIX = 2 + 16 * 2  # scaler_mean (a bf16 scalar) + the 16-entry bf16 lookup table

# the release read when software.torchtune is null
TORCHTUNE_DEFAULT = (0, 6, 1)
# v0.3.0: recipes shift the labels (torch.hstack with ignore_index) instead of copying the shifted logits,
# and the configs name CEWithChunkedOutputLoss; before, ``logits[..., :-1, :].contiguous()`` over the fp32
# model output (recipes/lora_finetune_single_device.py v0.2.0 ``train``)
LABEL_SHIFT_SINCE = (0, 3)
# v0.3.0: torchtune.modules.low_precision.FrozenNF4Linear quantizes the linears without adapters too; in
# v0.1-v0.2 the QLoRA builders quantize only LoRALinear's base (``quantize_base``), the others stay nn.Linear
FROZEN_NF4_SINCE = (0, 3)
# training.get_dtype: fp32 or bf16 (fp16 is refused by the recipes); the model is built in that dtype with no
# autocast (set_default_dtype), so its parameters, adapters, gradients and AdamW states all take it
TORCHTUNE_PRECISIONS = ("bf16-true", "fp32")
# QLoRA's only format: LoRALinear(quantize_base=True) / FrozenNF4Linear call to_nf4, which always
# double-quantizes the scalers: the nf4-dq layout, in torchao's tensors
TORCHTUNE_QUANTIZATION = ("none", "nf4-dq")


def torchao_nf4_bytes(numel: int, matrices: int = 1) -> int:
    """Bytes of ``numel`` weights in ``matrices`` torchao NF4 tensors (each a multiple of 64 x 256 elements,
    as ``NF4Tensor.from_tensor`` asserts for its blocks).

    >>> torchao_nf4_bytes(1024 * 512)    # 262,144 + 8,192 + 64 + 34: the CPU check's 270,434
    270434
    """
    return numel // 2 + numel // NF4_BLOCK + 2 * (numel // (NF4_BLOCK * NF4_SCALER_BLOCK)) + _NF4_PER_MATRIX * matrices


def torchao_nf4_dequant_peak_bytes(numel: int) -> int:
    """The live bytes of ``NF4Tensor.get_original_weight`` at its peak, the bf16 result included.

    >>> torchao_nf4_dequant_peak_bytes(1024 * 512)   # 14 x 524,288 + 3 x 8,192 + 64: the CPU check
    7364672
    """
    return 14 * numel + 3 * numel // NF4_BLOCK + numel // (NF4_BLOCK * NF4_SCALER_BLOCK) * 2
