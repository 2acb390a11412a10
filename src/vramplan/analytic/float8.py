"""torchao float8 training (``train.precision: fp8-torchao``): which linears are converted, and the float8
casts one converted linear's backward holds at its peak (facts/float8_training.py cites the source).

What does **not** change against bf16-mixed under FSDP (the ``fp8-torchao`` row of facts/precisions.py is
the ``bf16-mixed`` one): the model states, and the saved activations, since a converted linear saves its
high-precision input and weight (``SAVED_FOR_BACKWARD``) exactly as ``nn.Linear`` does.  What changes:

* the backward of each converted linear casts ``grad_output``, the weight and the input to float8 again,
  and copies the operands ``torch._scaled_mm`` wants transposed (``backward_peak_bytes``);
* with ``enable_fsdp_float8_all_gather`` the converted weights are all-gathered in float8: 1 byte per
  element in the all-gather buffers instead of 2 (``gathered_linear_params``);
* with ``precompute_float8_dynamic_scale_for_fsdp`` one fp32 scale per converted weight stays on the GPU.

Worked example (one linear, T = 4 tokens, in 32, out 16, tensorwise, weight not gathered in float8;
W = 32 x 16 = 512): the casts' instants of ``backward_peak_bytes`` are 9 x 64 = 576 (grad_output's cast),
68 + 9 x 512 = 4,676 (the weight's cast), 68 + 516 + 512 = 1,096 (grad_input's mm, the weight's copy),
68 + 516 + 576 = 1,160 (grad_output's second cast), 68 + 516 + 68 + 9 x 128 = 1,804 (the input's cast),
68 + 516 + 68 + 132 + 64 + 128 = 976 (grad_weight's mm and its two operand copies): 4,676 B.
"""

from __future__ import annotations

from vramplan.analytic import mx
from vramplan.facts.float8_training import DIM_MULTIPLE, Float8RecipeFacts, Granularity, float8_recipe
from vramplan.facts.mx_training import mx_recipe
from vramplan.spec.model import ModelSpec, ParamGroup
from vramplan.spec.scenario import Scenario
from vramplan.units import ceil_div

__all__ = [
    "CAST_PEAK_PER_ELEMENT",
    "backward_peak_bytes",
    "converted_layer_linears",
    "converts_head",
    "float8_assumptions",
    "float8_on",
    "head_backward_bytes",
    "layer_cast_peaks",
    "low_precision_linears",
    "mx_assumptions",
    "mx_on",
]

# eager hp -> float8 cast (float8_training_tensor.py _ToFloat8ConstrFunc.forward, float8_utils.to_fp8_saturated):
# the fp32 product (4) and its clamped copy (4) are referenced while the float8 result (1) is written
CAST_PEAK_PER_ELEMENT = 9
_SCALE = 4  # an fp32 scale per tensor, or per row (axiswise)


def float8_on(s: Scenario) -> bool:
    return s.task == "train" and s.train.precision == "fp8-torchao"


def mx_on(s: Scenario) -> bool:
    """torchao MXFP8 training (analytic/mx.py): the same converted linears, MX casts in their backward."""
    return s.task == "train" and s.train.precision == "mxfp8-torchao"


def low_precision_linears(s: Scenario) -> bool:
    """torchao swaps the large linears (float8 or MXFP8): their backward casts are terms (terms/float8.py)."""
    return float8_on(s) or mx_on(s)


def converts_head(s: Scenario) -> bool:
    """The LM head is converted: ``train.float8.convert_lm_head`` (``train.mx.convert_lm_head`` with MXFP8), else
    the framework's default (torchtitan's Llama 3 train configs and its ``[mx]`` section filter ``output``; plain
    ``convert_to_float8_training`` converts it)."""
    given = s.train.mx.convert_lm_head if mx_on(s) else s.train.float8.convert_lm_head
    return given if given is not None else s.effective_framework != "torchtitan"


def _scale(g: Granularity, rows: int) -> int:
    return _SCALE if g == "tensorwise" else _SCALE * rows


def _cast(g: Granularity, elements: int, rows: int) -> int:
    """Bytes a cast leaves (float8 data and its scale); 0 for an operand kept in high precision (no copy)."""
    return 0 if g == "high" else elements + _scale(g, rows)


def backward_peak_bytes(tokens: int, fan_in: int, fan_out: int, recipe: Float8RecipeFacts,
                        weight_in_float8: bool) -> int:
    """The most float8 bytes alive at once in one converted linear's backward (torchao v0.14.1, eager).

    The instants, in order (T tokens, W = fan_in x fan_out; each cast peaks at 9 B per element and leaves 1 B
    plus its scale): casting grad_output (T x out); casting the weight for grad_input (none when it was
    gathered in float8: the gathered tensor is used); grad_input's ``_scaled_mm``, which copies the weight into
    the layout it wants (``b_data.t().contiguous().t()``: W); casting grad_output again and the input again for
    grad_weight (``high``: no cast); grad_weight's ``_scaled_mm``, which copies both operands (``grad_output.t()``
    and the input: T x out + T x in).  The scales' reciprocals inside ``addmm_float8_unwrapped`` are not
    counted (4 B per row).
    """
    r, t, w = recipe, tokens, fan_in * fan_out
    go0 = _cast(r.grad_output, t * fan_out, t)
    wgi = 0 if weight_in_float8 else _cast(r.weight_for_grad_input, w, fan_in)
    instants = [CAST_PEAK_PER_ELEMENT * t * fan_out,
                go0 + (0 if weight_in_float8 else CAST_PEAK_PER_ELEMENT * w),
                go0 + wgi + w]
    if r.grad_output_for_grad_weight != "high":
        go1 = _cast(r.grad_output_for_grad_weight, t * fan_out, fan_out)
        in1 = _cast(r.input_for_grad_weight, t * fan_in, fan_in)
        instants += [go0 + wgi + CAST_PEAK_PER_ELEMENT * t * fan_out,
                     go0 + wgi + go1 + CAST_PEAK_PER_ELEMENT * t * fan_in,
                     go0 + wgi + go1 + in1 + t * fan_out + t * fan_in]
    return max(instants)


def _converted(p: ParamGroup) -> bool:
    # torchtitan module_filter_fn: both dimensions multiples of 16 (the model's, before tensor parallelism)
    return p.in_features % DIM_MULTIPLE == 0 and p.out_features % DIM_MULTIPLE == 0


def _local(p: ParamGroup, tp: int) -> tuple[int, int]:
    """(in, out) features of ``p`` on one tensor-parallel rank: column-parallel splits out, row-parallel in."""
    if p.tp == "column":
        return p.in_features, ceil_div(p.out_features, tp)
    if p.tp == "row":
        return ceil_div(p.in_features, tp), p.out_features
    return p.in_features, p.out_features


def _is_mlp(p: ParamGroup) -> bool:
    return any(word in p.name for word in ("mlp", "feed_forward", "ffn"))


def converted_layer_linears(m: ModelSpec, layer: int, tp: int) -> list[tuple[bool, int, int]]:
    """(in the MLP, in features, out features on this rank) of each converted linear of decoder layer ``layer``.

    Dense decoder linears only (``role == "linear"``): routed experts run grouped GEMMs, not ``nn.Linear``
    (torchtitan's float8 MoE path is a separate prototype), and routers are left as they are."""
    return [(_is_mlp(p), *_local(p, tp)) for p in m.params
            if p.role == "linear" and p.in_features and layer in p.layer_span and _converted(p)]


def layer_cast_peaks(s: Scenario, m: ModelSpec, layer: int, tp: int, tokens: int) -> tuple[int, int]:
    """(MLP part, attention part): the largest converted linear's backward float8 (or MX) peak in each part of the
    layer."""
    mlp = attn = 0
    for in_mlp, fan_in, fan_out in converted_layer_linears(m, layer, tp):
        b = _linear_peak(s, tokens, fan_in, fan_out, gathered=True)
        if in_mlp:
            mlp = max(mlp, b)
        else:
            attn = max(attn, b)
    return mlp, attn


def _linear_peak(s: Scenario, tokens: int, fan_in: int, fan_out: int, gathered: bool) -> int:
    """One converted linear's backward peak under the scenario's recipe (``gathered``: its weight may be gathered
    in float8, as the decoder's are and a tied head's is not)."""
    if mx_on(s):
        return mx.backward_peak_bytes(tokens, fan_in, fan_out, mx_recipe(s.train.mx.recipe_name))
    f8 = s.train.float8
    return backward_peak_bytes(tokens, fan_in, fan_out, float8_recipe(f8.recipe_name),
                               gathered and f8.enable_fsdp_float8_all_gather)


def head_backward_bytes(s: Scenario, m: ModelSpec, tp: int, tokens: int) -> int:
    """The converted LM head's backward float8 (or MX) peak (0 when it is not converted or not a multiple of 16)."""
    head = next((p for p in m.params if p.role == "lm_head"), None)
    # a tied head is still an nn.Linear (its weight the embedding's): hidden -> vocab
    fan_in, fan_out = (head.in_features, head.out_features) if head is not None else (
        (m.hidden_size, m.vocab_size) if m.tie_word_embeddings else (0, 0))
    if not (fan_in and converts_head(s)) or fan_in % DIM_MULTIPLE or fan_out % DIM_MULTIPLE:
        return 0
    return _linear_peak(s, tokens, fan_in, ceil_div(fan_out, tp), gathered=head is not None)


def float8_assumptions(s: Scenario) -> list[str]:
    """What the estimate of a torchao float8 step takes as given, each with its source."""
    if not float8_on(s):
        return []
    f8 = s.train.float8
    head = "converted" if converts_head(s) else "left in bf16 (filter_fqns = [\"output\"], as torchtitan's Llama 3 configs)"
    out = [
        f"torchao float8 training (torchao v0.14.1 Float8Linear, recipe {f8.recipe_name}): each decoder nn.Linear with "
        "both dimensions multiples of 16 is converted; routed experts and routers are not; the LM head is " + head,
        ("torchao float8: a converted linear saves its bf16 input and its weight, as nn.Linear does "
        "(matmul_with_hp_or_float8_args saves input_hp, weight_hp_t): saved activations as bf16-mixed"),
        ("torchao float8 casts run eagerly (9 B per element of the tensor being cast at its peak: the fp32 product and "
        "its clamp beside the float8 result); torch.compile, which torchtitan recommends, fuses them into fewer "
        "bytes: this is an upper bound for a compiled step"),
        ("torchao float8: the forward's casts (freed as each linear returns) and the allocator's fragmentation around "
        "the backward's casts are not counted (the allocator replay does not allocate them)"),
    ]
    if f8.enable_fsdp_float8_all_gather:
        out.append("torchao float8 all-gather: converted weights gathered by FSDP2 in float8 (1 B per element), "
                   "the rest in bf16")
    if f8.force_recompute_fp8_weight_in_bwd:
        out.append("float8.force_recompute_fp8_weight_in_bwd has no effect on memory: torchao saves the "
                   "high-precision weight and casts it again in the backward (deprecated, pytorch/ao#2251)")
    if s.parallel.tp > 1 and f8.recipe_name == "tensorwise":
        out.append("not modelled: torchtitan's float8 tensor parallelism (Float8ColwiseParallel / "
                   "Float8RowwiseParallel) all-gathers the sequence-parallel input in float8; it is counted as bf16")
    return out


def mx_assumptions(s: Scenario) -> list[str]:
    """What the estimate of a torchao MXFP8 step takes as given, each with its source."""
    if not mx_on(s):
        return []
    recipe = mx_recipe(s.train.mx.recipe_name)
    head = "converted" if converts_head(s) else "left in bf16 (torchtitan's filter_fqns default [\"output\"])"
    dim1 = ("the CUDA dim1 cast kernel writes only its output" if recipe.dim1_cast == "cuda" else
            "the TORCH dim1 casts cast a transposed bf16 copy")
    return [
        f"torchao MXFP8 training (torchao v0.14.1 MXLinear, recipe {recipe.name}: e4m3 elements, one e8m0 scale per 32): "
        "each decoder nn.Linear with both dimensions multiples of 16 is converted; routed experts and routers are not; "
        "the LM head is " + head,
        ("torchao MXFP8: a converted linear saves its bf16 input and its weight, as nn.Linear does (mx_mm saves "
         "input_hp, weight_hp): saved activations and all-gathers as bf16-mixed"),
        (f"torchao MXFP8 casts run eagerly (the dim0 cast holds 12 B per element at its peak: the fp32 copy, the scaled "
         f"data and its clamp; {dim1}); torch.compile, which torchtitan recommends, fuses them into fewer bytes: this is "
         "an upper bound for a compiled step"),
        ("torchao MXFP8: the forward's casts (freed as each linear returns) and the allocator's fragmentation around the "
         "backward's casts are not counted (the allocator replay does not allocate them)"),
    ]
