"""torchao MXFP8 training (``train.precision: mxfp8-torchao``): the MX casts one converted linear's backward holds
at its peak (facts/mx_training.py cites the source).  Which linears are converted is float8's rule
(analytic/float8.py ``converted_layer_linears``: torchtitan's ``module_filter_fn`` is shared by both converters).

What does **not** change against bf16-mixed under FSDP (the ``mxfp8-torchao`` row of facts/precisions.py is the
``bf16-mixed`` one): the model states, the all-gathered weights (no MX all-gather in torchao 0.14.1) and the saved
activations, since ``mx_mm`` saves the high-precision input and weight (``SAVED_FOR_BACKWARD``) as ``nn.Linear``
does.  What changes: the backward's casts of each converted linear (``backward_peak_bytes``).

Worked example (one linear, T = 32 tokens, in 64, out 32, W = 2,048, mxfp8_cublas: FLOOR scales, 17 B of scale
arithmetic per block, CUDA dim1 casts, cuBLAS gemm): grad_output's dim0 cast 12 x 1,024 + 17 x 32 = 12,832; it
leaves 1,024 + 32 = 1,056; the weight's dim1 cast writes 2,048 + 64 = 2,112: 3,168; grad_input's gemm rearranges
the scales of grad_output (32 rows, K / 32 = 1: padded to 128 x 4 = 512, 3 x 512 while padding) and of the weight
(64 rows: 512): 3,168 + 512 + 1,536 = 5,216; grad_output's dim1 cast 1,056: 4,224; the input's 2,112: 6,336;
grad_weight's gemm 512 + 1,536: 8,384.  The peak is the first cast's, 12,832 B.
"""

from __future__ import annotations

from vramplan.facts.mx_training import BLOCK_SIZE, CAST_PEAK_PER_ELEMENT, MXRecipeFacts
from vramplan.units import ceil_div

__all__ = ["backward_peak_bytes", "cast_bytes", "scale_layout_bytes"]

_TILE_ROWS, _TILE_COLS = 128, 4  # utils.py to_blocked: scales padded to tiles of 128 rows by 4 columns


def cast_bytes(elements: int) -> int:
    """What a cast leaves: the e4m3 data (1 B per element) and one e8m0 scale (1 B) per block of 32."""
    return elements + ceil_div(elements, BLOCK_SIZE)


def _dim0_peak(elements: int, recipe: MXRecipeFacts) -> int:
    """The eager ``to_mx`` cast at its peak: 12 B per element and the scale arithmetic per block."""
    return CAST_PEAK_PER_ELEMENT * elements + recipe.scale_arithmetic_per_block * ceil_div(elements, BLOCK_SIZE)


def _dim1_peak(elements: int, recipe: MXRecipeFacts) -> int:
    """A dim1 cast at its peak: the CUDA kernel writes only its output; TORCH casts a transposed bf16 copy."""
    return cast_bytes(elements) if recipe.dim1_cast == "cuda" else 2 * elements + _dim0_peak(elements, recipe)


def scale_layout_bytes(rows: int, k: int) -> tuple[int, int]:
    """(peak, result) of ``to_blocked`` on a ``rows`` x ``k / 32`` scale: the result is the scales padded to tiles
    of 128 x 4; the reshape of the permuted blocks makes an intermediate copy of it, and a padded input a
    zero-filled third (``padded``) while the two are made."""
    cols = ceil_div(k, BLOCK_SIZE)
    p = ceil_div(rows, _TILE_ROWS) * _TILE_ROWS * ceil_div(cols, _TILE_COLS) * _TILE_COLS
    padded = rows % _TILE_ROWS != 0 or cols % _TILE_COLS != 0
    return (3 * p if padded else 2 * p), p


def _gemm_bytes(a_rows: int, b_rows: int, k: int, recipe: MXRecipeFacts) -> int:
    """Bytes ``_addmm_mx_dispatch`` adds for one gemm of an ``a_rows`` x k by k x ``b_rows`` product: cuBLAS's scale
    layout of both operands, or the emulated gemm's bf16 dequantized operands (4 B per element while one is made,
    2 B after)."""
    if recipe.gemm == "cublas":
        (a_peak, a), (b_peak, _) = scale_layout_bytes(a_rows, k), scale_layout_bytes(b_rows, k)
        return max(a_peak, a + b_peak)
    a_n, b_n = a_rows * k, b_rows * k
    return max(4 * a_n, 2 * a_n + 4 * b_n)


def backward_peak_bytes(tokens: int, fan_in: int, fan_out: int, recipe: MXRecipeFacts) -> int:
    """The most MX bytes alive at once in one converted linear's backward (torchao v0.14.1 ``mx_mm.backward``, eager).

    The instants, in order (T tokens, W = fan_in x fan_out; every cast stays alive to the end of the backward):
    grad_output's dim0 cast (T x out); the weight's dim1 cast (TORCH: its transposed bf16 copy, 2 B per element,
    stays bound to ``weight_hp_t_c``); grad_input's gemm (T rows by in, K = out); grad_output's dim1 cast; the
    input's dim1 cast (T x in; TORCH: the transposed copies are freed when their cast returns); grad_weight's
    gemm (out rows by in, K = T).  The gemms' outputs (the gradients) are the layer's gradient temporaries, not
    counted here; the emulated gemm's dequantized scales (a few bytes per block) are not counted.
    """
    go, x, w = tokens * fan_out, tokens * fan_in, fan_in * fan_out
    instants = [_dim0_peak(go, recipe)]
    held = cast_bytes(go)
    instants.append(held + _dim1_peak(w, recipe))
    held += cast_bytes(w) + (2 * w if recipe.dim1_cast == "torch" else 0)
    instants.append(held + _gemm_bytes(tokens, fan_in, fan_out, recipe))
    instants.append(held + _dim1_peak(go, recipe))
    held += cast_bytes(go)
    instants.append(held + _dim1_peak(x, recipe))
    held += cast_bytes(x)
    instants.append(held + _gemm_bytes(fan_out, fan_in, tokens, recipe))
    return max(instants)
