"""torchao float8 training (``train.precision: fp8-torchao``) as data: the recipes' casts and what a
converted linear keeps for its backward, read from torchao's source at v0.14.1 and torchtitan's converter.

torchao v0.14.1 ``torchao/float8/float8_linear.py`` ``matmul_with_hp_or_float8_args``:

* forward: ``ctx.save_for_backward(input_hp, weight_hp_t)``: the **high-precision** input (the linear's own
  bf16 input, as ``nn.Linear`` saves it) and the weight as the module holds it (under FSDP2 the unsharded
  parameter, which FSDP frees after the forward and gathers again for the backward; with float8 all-gather
  the gathered float8 tensor).  No float8 cast is saved: the input and the weight are cast again in the
  backward.  The forward casts the input and the weight (``hp_tensor_to_float8_dynamic``) for
  ``torch.mm``; both are locals, freed when the forward returns;
* backward: casts ``grad_output`` (for grad_input), the weight (for grad_input), ``grad_output`` again and
  the input again (for grad_weight), each per the recipe's cast config (``DISABLED``: kept in high precision,
  no copy).  All are locals of ``backward``, alive until it returns;
* ``float8_ops.py`` ``preprocess_addmm``: ``torch._scaled_mm`` wants its first operand row-major and its
  second column-major; a float8 operand laid out otherwise is copied (``a_data.contiguous()``,
  ``b_data.t().contiguous().t()``) for the call: the weight for grad_input, and both operands of grad_weight
  (``grad_output.t()`` and the input);
* ``float8_training_tensor.py`` ``_ToFloat8ConstrFunc.forward`` and ``float8_utils.py`` ``to_fp8_saturated``
  (eager): ``tensor.to(torch.float32) * scale`` (an fp32 copy and the fp32 product, 8 B per element while both
  exist), then ``clamp`` (another fp32 tensor) while the product is still referenced, then ``.to(float8)``:
  9 B per element at the cast's peak (product 4 + clamped 4 + float8 1), 1 B after it.

``config.py`` ``Float8LinearConfig.from_recipe_name``: tensorwise (``Float8LinearConfig()``: dynamic,
per-tensor scales; e4m3 input and weight, e5m2 gradients), rowwise (axiswise scales, e4m3 throughout,
power-of-2 scales), rowwise_with_gw_hp (axiswise input, weight and grad_output for the output and grad_input
gemms, a tensorwise weight for grad_input; the grad_weight gemm in high precision: ``cast_config_input_for_
grad_weight`` and ``cast_config_grad_output_for_grad_weight`` are ``ScalingType.DISABLED``).
``enable_fsdp_float8_all_gather`` is refused for any weight scaling but tensorwise (``__post_init__``).

Which linears: torchtitan's converter (``components/quantization/float8.py`` ``Float8Converter``, commit
000204a4a8bf3d0f31adc44fc29855fbb6ea13d8) calls ``convert_to_float8_training`` with ``module_filter_fn``
(``components/quantization/utils.py``): an ``nn.Linear`` whose both dimensions are multiples of 16 and whose
name matches no ``filter_fqns`` entry (its Llama 3 train configs: ``["output"]``, the LM head).  It refuses
GPUs below compute capability 8.9 (``has_cuda_capability(8, 9)``; ROCm gfx942 in later commits).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["DIM_MULTIPLE", "FLOAT8_RECIPES", "SAVED_FOR_BACKWARD", "SOURCE", "Float8RecipeFacts", "float8_recipe"]

SOURCE = "torchao v0.14.1 torchao/float8/float8_linear.py matmul_with_hp_or_float8_args"
# what the autograd function saves, by its variable names (the high-precision input and weight)
SAVED_FOR_BACKWARD = ("input_hp", "weight_hp_t")
# torch._scaled_mm needs both dimensions of each operand to be multiples of 16 (torchtitan module_filter_fn)
DIM_MULTIPLE = 16

Granularity = Literal["tensorwise", "rowwise", "high"]


@dataclass(frozen=True, kw_only=True)
class Float8RecipeFacts:
    """One recipe's six casts (``Float8LinearConfig``'s ``cast_config_*``): ``high`` is ``ScalingType.DISABLED``
    (the operand stays in high precision: no copy)."""

    name: str
    input: Granularity
    weight: Granularity
    grad_output: Granularity
    weight_for_grad_input: Granularity
    input_for_grad_weight: Granularity
    grad_output_for_grad_weight: Granularity

    @property
    def fsdp_float8_all_gather(self) -> bool:
        """Float8 all-gather casts the weight once, per tensor (``Float8LinearConfig.__post_init__``)."""
        return self.weight == "tensorwise"


FLOAT8_RECIPES: tuple[Float8RecipeFacts, ...] = (
    Float8RecipeFacts(name="tensorwise", input="tensorwise", weight="tensorwise", grad_output="tensorwise",
                      weight_for_grad_input="tensorwise", input_for_grad_weight="tensorwise",
                      grad_output_for_grad_weight="tensorwise"),
    Float8RecipeFacts(name="rowwise", input="rowwise", weight="rowwise", grad_output="rowwise",
                      weight_for_grad_input="rowwise", input_for_grad_weight="rowwise",
                      grad_output_for_grad_weight="rowwise"),
    Float8RecipeFacts(name="rowwise_with_gw_hp", input="rowwise", weight="rowwise", grad_output="rowwise",
                      weight_for_grad_input="tensorwise", input_for_grad_weight="high",
                      grad_output_for_grad_weight="high"),
)


def float8_recipe(name: str) -> Float8RecipeFacts:
    """The row called ``name``."""
    for r in FLOAT8_RECIPES:
        if r.name == name:
            return r
    raise KeyError(f"no float8 recipe {name!r}: one of {[r.name for r in FLOAT8_RECIPES]}")
