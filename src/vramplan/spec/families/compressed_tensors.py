"""A compressed-tensors ``quantization_config`` (llm-compressor's checkpoints) read as a declared fact.

compressed-tensors (``config/base.py`` ``CompressionFormat``; ``quantization/quant_config.py``
``QuantizationConfig``) writes ``quant_method: compressed-tensors``, a checkpoint-wide ``format``, the
``config_groups`` (each with ``targets``, ``weights`` and ``input_activations`` quantization args: ``num_bits``,
``type`` int/float, ``strategy`` tensor/channel/group/block/token, ``group_size``, ``symmetric``, ``dynamic``,
``actorder``), the ``ignore`` list (modules left unquantized, ``lm_head`` in llm-compressor's recipes) and
optionally ``kv_cache_scheme`` and ``sparsity_config``.  What each format stores per quantized linear
(``compressors/quantized_compressors``):

* ``pack-quantized`` (``PackedQuantizationCompressor``): ``weight_packed`` int32 ``[out, ceil(in / (32 / bits))]``,
  ``weight_scale`` ``[out, in / group]``, ``weight_shape`` int64 ``[2]``; ``weight_zero_point`` only when
  asymmetric; ``weight_g_idx`` int32 ``[in]`` with ``actorder: group``.
* ``int-quantized`` / ``float-quantized`` / ``naive-quantized`` (``NaiveQuantizationCompressor``): ``weight`` int8
  or float8_e4m3fn ``[out, in]``, ``weight_scale`` ``[out, 1]`` (channel) or ``[1]`` (tensor); ``input_scale``
  only for static (``dynamic: false``) activations; zero points dropped when symmetric
  (``BaseQuantizationCompressor.compress`` ``_skip_zp``).

* ``nvfp4-pack-quantized`` (``NVFP4PackedCompressor``): ``weight_packed`` uint8 ``[out, in / 2]`` (two e2m1 values
  a byte), ``weight_scale`` ``[out, in / 16]`` in ``scale_dtype`` (float8_e4m3fn by default), ``weight_global_scale``
  fp32 ``[1]``, and ``input_global_scale`` fp32 ``[1]`` with tensor_group input activations (W4A4).

Scales are computed in the dtype of the observed weight (``quantization/utils/helpers.py``
``calculate_qparams``), so 16 bits in a bf16 or fp16 checkpoint (NVFP4's per-16 scales are cast to e4m3).  Seven
schemes have a row (``facts/quantization.py``): W4A16 group 128 symmetric (``ct-w4a16``), W8A8 int8 channel-wise
with dynamic per-token activations (``ct-w8a8-int8``), FP8 channel-wise with dynamic activations or none
(``ct-fp8``, llm-compressor's ``FP8_DYNAMIC``), FP8 per tensor with static per-tensor activations (llm-compressor's
``FP8``: ``ct-fp8-tensor-static``, one ``input_scale`` per matrix) or dynamic ones (``ct-fp8-tensor``), NVFP4 with
fp4 activations (``ct-nvfp4``) and weight-only (``ct-nvfp4a16``); any other is refused naming what it declares.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vramplan.facts.quantization import GPTQ_GROUP, NVFP4_BLOCK
from vramplan.spec.model import CheckpointQuant

__all__ = ["read_compressed_tensors"]

_SIXTEEN_BIT = ("bfloat16", "float16")


def _args_words(w: Mapping[str, Any]) -> str:
    group = f" group {w.get('group_size')}" if w.get("strategy") == "group" else ""
    sym = "symmetric" if w.get("symmetric", True) else "asymmetric"
    return f"{w.get('type', 'int')}{w.get('num_bits')} {w.get('strategy')}{group} {sym}"


def _nvfp4_row(w: Mapping[str, Any], a: Mapping[str, Any] | None) -> tuple[str | None, str]:
    """NVFP4 (``nvfp4-pack-quantized``): the weight-only row without activations, the W4A4 row with fp4 tensor_group
    activations (their local scales dynamic, the stored ``input_global_scale`` calibrated: either way one per
    matrix)."""
    if (str(w.get("type", "int")), int(w.get("num_bits", 0))) != ("float", 4) or \
            str(w.get("strategy")) not in ("tensor_group", "group") or int(w.get("group_size") or 0) != NVFP4_BLOCK:
        return None, f"nvfp4-pack-quantized with weights {_args_words(w)} (the rows hold float4 in groups of 16)"
    if str(w.get("scale_dtype") or "float8_e4m3fn").removeprefix("torch.") != "float8_e4m3fn":
        return None, f"NVFP4 scales in {w.get('scale_dtype')} (the rows hold float8_e4m3fn scales)"
    if a is None:
        return "ct-nvfp4a16", ""
    if (str(a.get("type", "int")), int(a.get("num_bits", 0)), str(a.get("strategy"))) == ("float", 4, "tensor_group"):
        return "ct-nvfp4", ""
    return None, "NVFP4 weights with activations other than fp4 tensor_group are not modelled"


def _row(fmt: str, w: Mapping[str, Any], a: Mapping[str, Any] | None) -> tuple[str | None, str]:
    """The row storing weights ``w`` with activations ``a`` in checkpoint format ``fmt``, or the reason none does."""
    if not w.get("symmetric", True):
        return None, "asymmetric weights store zero points, not modelled"
    if fmt == "nvfp4-pack-quantized":
        return _nvfp4_row(w, a)
    kind = (str(w.get("type", "int")), int(w.get("num_bits", 0)), str(w.get("strategy")))
    static = a is not None and not a.get("dynamic", False)
    if kind == ("float", 8, "tensor") and fmt in ("float-quantized", "naive-quantized") and (
            a is None or (str(a.get("type", "int")), int(a.get("num_bits", 0))) == ("float", 8)):
        a_strategy = "" if a is None else str(a.get("strategy"))
        if static and a_strategy != "tensor":
            return None, f"static {a_strategy} activation scales are not modelled (per tensor are)"
        # llm-compressor's FP8 scheme: per-tensor weights, static per-tensor activations (one input_scale)
        return ("ct-fp8-tensor-static" if static else "ct-fp8-tensor"), ""
    if static:
        return None, "static activation scales (input_scale) are modelled for per-tensor FP8 weights only"
    if kind == ("int", 4, "group") and fmt == "pack-quantized" and a is None:
        if int(w.get("group_size") or 0) != GPTQ_GROUP:
            return None, f"only group size {GPTQ_GROUP} has a row"
        if w.get("actorder") == "group":
            return None, "actorder group stores weight_g_idx, not modelled"
        return "ct-w4a16", ""
    act = None if a is None else (str(a.get("type", "int")), int(a.get("num_bits", 0)))
    if kind == ("int", 8, "channel") and fmt in ("int-quantized", "naive-quantized") and act == ("int", 8):
        return "ct-w8a8-int8", ""
    if kind == ("float", 8, "channel") and fmt in ("float-quantized", "naive-quantized") and act in (None, ("float", 8)):
        return "ct-fp8", ""
    return None, ("rows exist for W4A16 pack-quantized group 128, W8A8 int8 channel-wise, FP8 channel-wise or per "
                  "tensor, and NVFP4 (nvfp4-pack-quantized)")


def read_compressed_tensors(q: Mapping[str, Any], torch_dtype: str) -> CheckpointQuant:
    """The row for a compressed-tensors config (``torch_dtype``: the config's, the scales' dtype)."""
    groups = q.get("config_groups") or {}
    skip = tuple(str(x) for x in (q.get("ignore") or ()))
    if len(groups) != 1:
        return CheckpointQuant("compressed-tensors", f"compressed-tensors with {len(groups)} config groups",
                               why_not="only a single config group is modelled", skip_modules=skip)
    g = next(iter(groups.values()))
    w, a = g.get("weights") or {}, g.get("input_activations")
    fmt = str(g.get("format") or q.get("format") or "")
    words = f"compressed-tensors {fmt} weights {_args_words(w)}" + (
        "" if a is None else f", activations {a.get('type', 'int')}{a.get('num_bits')} "
        f"{'dynamic' if a.get('dynamic') else 'static'}")
    row, why = _row(fmt, w, a)
    if "Linear" not in (g.get("targets") or ()):
        row, why = None, f"targets {g.get('targets')} (only the Linear target is modelled)"
    elif q.get("kv_cache_scheme") or q.get("sparsity_config"):
        row, why = None, "a kv_cache_scheme or sparsity_config is not modelled"
    elif torch_dtype not in _SIXTEEN_BIT:
        # NVFP4's scales are e4m3 whatever the checkpoint's dtype, but its unquantized tensors would not be 16-bit
        row, why = None, f"scales and unquantized tensors in {torch_dtype} (the rows hold 16-bit ones)"
    return CheckpointQuant("compressed-tensors", words, row, "" if row else why, skip_modules=skip)
