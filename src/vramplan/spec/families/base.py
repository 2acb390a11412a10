"""What every family adapter shares: the parameter table, config-key aliases, and the ``Family`` record.

An adapter turns one family's ``config.json`` into a ``ModelSpec``: its tensors (``Params``, named as in
the family's ``modeling_*.py``, the names PEFT's ``target_modules`` match), its shape, and the ``Traits``
the engines read.  Where a key is absent the default is the one the family's ``configuration_*.py`` uses,
named in the adapter so it can be checked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from vramplan.facts.quantization import AO_INT4_GROUP, FP8_TILE, GPTQ_GROUP, HQQ_GROUP, NVFP4_BLOCK
from vramplan.spec.families.compressed_tensors import read_compressed_tensors
from vramplan.spec.model import CheckpointQuant, LayerSpec, ModelSpec, ParamGroup, Role, TPSplit

Config = Mapping[str, Any]

# Config-key aliases as data, in the style of transformers' ``attribute_map`` (``GPT2Config.attribute_map``:
# hidden_size -> n_embd, num_hidden_layers -> n_layer, num_attention_heads -> n_head; ``BloomConfig`` and
# ``FalconConfig`` also read the legacy ``n_embed``).  The first key present (and not null) wins.
KEY_ALIASES: dict[str, tuple[str, ...]] = {
    "hidden_size": ("hidden_size", "n_embd", "n_embed", "d_model"),
    "num_hidden_layers": ("num_hidden_layers", "n_layer"),
    "num_attention_heads": ("num_attention_heads", "n_head"),
    "num_key_value_heads": ("num_key_value_heads",),
    "vocab_size": ("vocab_size",),
    "hidden_act": ("hidden_act", "hidden_activation"),
    "torch_dtype": ("torch_dtype", "dtype"),
}


# the outer keys a vision-language model's language model inherits when its text_config does not name them (the
# checkpoint's dtype and quantization apply to the whole model)
OUTER_KEYS = ("torch_dtype", "dtype", "quantization_config")


def inherit_outer(text: dict[str, Any], cfg: Config, keys: tuple[str, ...] = OUTER_KEYS) -> dict[str, Any]:
    """``text`` (a language model's config) with each of ``keys`` the outer ``cfg`` has and ``text`` lacks; returned."""
    for k in keys:
        if k in cfg and k not in text:
            text[k] = cfg[k]
    return text


def non_null(sub: Mapping[str, Any] | None) -> dict[str, Any]:
    """A sub-config's (``text_config``, ``vision_config``) entries without the nulls: its configuration class fills
    a null with its own default, so a null key says the same as a missing one."""
    return {k: v for k, v in dict(sub or {}).items() if v is not None}


def held_tower_states(layers: int, selected: tuple[int, ...] = ()) -> int:
    """Tower hidden states alive per tower token beyond the running layer's own while a ViT tower's last layer runs
    (``VisionSpec.kept_hidden_states``), for a tower whose forward hands its embeddings to an encoder that loops
    over the layers (``hidden_states = encoder_layer(hidden_states, ...)``).

    transformers 5.24: the vision model's forward keeps the encoder's input bound (``CLIPVisionTransformer.forward``
    ``hidden_states``, ``CLIPEncoder.forward`` ``inputs_embeds``) through every layer, one state beyond the running
    layer's input from the second layer on.  ``selected``: the hidden-state indices (negative from the end of the
    ``layers + 1``) the model asks ``capture_outputs`` for (``select_hidden_states``: only those are kept,
    utils/output_capturing.py ``install_output_capuring_hook``); index 0 is the encoder's input and index
    ``layers - 1`` the last layer's input, both alive anyway; each index in between is one state more."""
    if layers < 2:
        return 0
    picks = {k if k >= 0 else layers + 1 + k for k in selected}
    return 1 + sum(1 for j in picks if 1 <= j <= layers - 2)


def square_side(v: Any) -> int:
    """An ``image_size`` / ``patch_size`` (vision configs accept an int or a square pair)."""
    if isinstance(v, (list, tuple)):
        if len(v) != 2 or int(v[0]) != int(v[1]):
            raise ValueError(f"a non-square size {v!r} is not modelled")
        return int(v[0])
    return int(v)


def get(cfg: Config, *keys: str, default: Any = None) -> Any:
    """The first of ``keys`` present and not null in ``cfg`` (``default`` otherwise)."""
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    return default


def key(cfg: Config, name: str, default: Any = None) -> Any:
    """``name`` under any of its aliases (``KEY_ALIASES``)."""
    return get(cfg, *KEY_ALIASES.get(name, (name,)), default=default)


def prob(cfg: Config, name: str, default: float = 0.0) -> float:
    """A dropout probability; null counts as 0."""
    return float(cfg.get(name, default) or 0.0)


class Params:
    """Accumulates ParamGroup rows for one model."""

    def __init__(self) -> None:
        self.rows: list[ParamGroup] = []
        # a vision tower's and projector's nn.Linear weights, (name, in, out): ``VisionSpec.linears``
        self.vision_linears: list[tuple[str, int, int]] = []

    def add(self, name: str, numel: int, role: Role, layers: tuple[int, ...] = (), per_layer: int = 1,
            in_features: int = 0, out_features: int = 0, tp: TPSplit = "replicated", module: str = "") -> None:
        """``module``: the module that holds the tensor, when it is not the name's last part (a bare 3-D parameter
        of a module: NemotronHExperts' ``up_proj`` is a tensor of the module ``experts``, which peft's
        ``target_modules: [up_proj]`` does not match)."""
        if numel <= 0:
            return
        count = per_layer * (len(layers) if layers else 1)
        if count <= 0:
            return
        module = module or (name.split(".")[-2] if name.endswith((".weight", ".bias")) else name.split(".")[-1])
        self.rows.append(ParamGroup(name, module, numel, count, role, in_features, out_features, tp, layers))

    def linear(self, name: str, fan_in: int, fan_out: int, layers: tuple[int, ...], bias: bool, tp: TPSplit,
               role: Role = "linear", per_layer: int = 1) -> None:
        self.add(f"{name}.weight", fan_in * fan_out, role, layers, per_layer, fan_in, fan_out, tp)
        if bias:
            # a column-parallel bias is split with its output; a row-parallel one is replicated
            btp: TPSplit = "column" if tp == "column" else ("expert" if tp == "expert" else "replicated")
            self.add(f"{name}.bias", fan_out, "bias", layers, per_layer, tp=btp)

    def vision_linear(self, name: str, fan_in: int, fan_out: int, per_layer: int = 1, bias: bool = True) -> None:
        """A vision tower's or projector's ``nn.Linear`` (``name`` without ``.weight``): the weight with role "other"
        (neither adapted nor counted among the decoder's linears), its bias, and an entry of ``vision_linears``."""
        self.add(f"{name}.weight", fan_in * fan_out, "other", per_layer=per_layer)
        if bias:
            self.add(f"{name}.bias", fan_out, "bias", per_layer=per_layer)
        self.vision_linears.append((f"{name}.weight", fan_in, fan_out))

    def norm(self, name: str, width: int, layers: tuple[int, ...], bias: bool) -> None:
        self.add(f"{name}.weight", width, "norm", layers)
        if bias:
            self.add(f"{name}.bias", width, "bias", layers)

    def attention(self, prefix: str, h: int, n_heads: int, n_kv: int, hd: int, layers: tuple[int, ...],
                  bias: bool, out: str, o_bias: bool | None = None) -> None:
        """Separate q/k/v projections (column-parallel) and the output projection ``out`` (row-parallel)."""
        self.linear(f"{prefix}.q_proj", h, n_heads * hd, layers, bias, "column")
        self.linear(f"{prefix}.k_proj", h, n_kv * hd, layers, bias, "column")
        self.linear(f"{prefix}.v_proj", h, n_kv * hd, layers, bias, "column")
        self.linear(f"{prefix}.{out}", n_heads * hd, h, layers, bias if o_bias is None else o_bias, "row")

    def lm_head(self, name: str, vocab: int, h: int, bias: bool = False) -> None:
        """An untied LM head (vocabulary-parallel), with a bias for GPT-J and phi."""
        self.add(f"{name}.weight", vocab * h, "lm_head", in_features=h, out_features=vocab, tp="vocab")
        if bias:
            self.add(f"{name}.bias", vocab, "bias", tp="vocab")


def checkpoint_dtype(cfg: Config) -> str:
    raw = str(key(cfg, "torch_dtype", default="bfloat16"))
    return {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(raw, "bf16")


def checkpoint_quantization(cfg: Config) -> str | None:
    """The checkpoint's quantization in one word: the matching ``facts/quantization.py`` row, else the
    config's ``quant_method`` (None when the config declares none)."""
    cq = read_quantization_config(cfg)
    return None if cq is None else cq.format or cq.method


_DTYPE_WORDS = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
# the pre-quantized formats vramplan estimates as stored, for the error that names what is supported
PREQUANTIZED_SUPPORTED = ("bitsandbytes 8-bit (int8) and 4-bit (nf4, nf4 with double quantization, fp4)",
                          "GPTQ and AWQ 4-bit with group size 128", "fbgemm_fp8 (per-channel fp8)",
                          "fp8 e4m3 with 128 x 128 block scales (fp8-block)", "MXFP4 MoE experts (mxfp4)",
                          ("per-tensor fp8 e4m3 (fp8-tensor, fp8-tensor-static: AutoFP8's checkpoints and "
                           "weight_block_size null)"),
                          "GPTQ 3-bit and 8-bit with group size 128",
                          ("compressed-tensors W4A16 (pack-quantized, group 128, symmetric), W8A8 int8 and FP8 "
                           "(channel-wise weights, dynamic activations), per-tensor FP8 (static or dynamic "
                           "activations), NVFP4 and NVFP4A16 (nvfp4-pack-quantized)"),
                          "Model Optimizer NVFP4 (modelopt-nvfp4) and per-tensor FP8 (modelopt-fp8)",
                          "HQQ 4-bit and 8-bit with group size 64 (hqq-4bit, hqq-8bit)",
                          "torchao Int4WeightOnlyConfig, version 2, plain packing, group size 128 (ao-int4)",
                          "torchao Float8DynamicActivationFloat8WeightConfig, version 2, e4m3, PerRow (ao-fp8)",
                          "torchao Int8WeightOnlyConfig, version 2, PerRow (ao-int8)")
GPTQ_BITS = (4, 3, 8)  # the GPTQ widths with a row (facts/quantization.py gptq-<bits>bit)
HQQ_BITS = (4, 8)  # the HQQ widths with a row (facts/quantization.py hqq-<bits>bit)


def _bnb(q: Mapping[str, Any]) -> CheckpointQuant:
    """transformers' ``BitsAndBytesConfig`` as serialized (``to_dict`` writes ``_load_in_4bit`` beside
    ``load_in_4bit``); its defaults: quant type fp4, no double quantization, compute dtype fp32."""
    four = bool(q.get("load_in_4bit", q.get("_load_in_4bit", False)))
    eight = bool(q.get("load_in_8bit", q.get("_load_in_8bit", False)))
    skip = tuple(str(x) for x in (q.get("llm_int8_skip_modules") or q.get("modules_to_not_convert") or ()))
    if eight and not four:
        return CheckpointQuant("bitsandbytes", "bitsandbytes 8-bit (LLM.int8)", "int8", skip_modules=skip)
    if not four:
        return CheckpointQuant("bitsandbytes", "bitsandbytes without load_in_4bit or load_in_8bit",
                               why_not="neither load_in_4bit nor load_in_8bit is set")
    qt = str(q.get("bnb_4bit_quant_type", "fp4"))
    dq = bool(q.get("bnb_4bit_use_double_quant", False))
    cd = _DTYPE_WORDS.get(str(q.get("bnb_4bit_compute_dtype", "float32")).removeprefix("torch."), "fp32")
    words = f"bitsandbytes 4-bit {qt}{' with double quantization' if dq else ''}, compute dtype {cd}"
    fmt = {("nf4", False): "nf4", ("nf4", True): "nf4-dq", ("fp4", False): "fp4"}.get((qt, dq))
    why = "" if fmt else f"no row stores 4-bit {qt}{' with double quantization' if dq else ''}"
    return CheckpointQuant("bitsandbytes", words, fmt, why, skip_modules=skip, compute_dtype=cd)


def _grouped(method: str, q: Mapping[str, Any]) -> CheckpointQuant:
    """GPTQ (``GPTQConfig``: bits, group_size, desc_act, sym) and AWQ (``AwqConfig``: bits, group_size,
    zero_point, version; AutoAWQ writes w_bit and q_group_size): rows hold GPTQ at 3, 4 and 8 bits and AWQ at 4
    bits, with group size 128 (``desc_act`` and ``sym`` change no stored byte: AutoGPTQ always writes ``g_idx`` and
    ``qzeros``)."""
    bits = int(q.get("bits", q.get("w_bit", 4)))
    group = int(q.get("group_size", q.get("q_group_size", 128)))
    words = f"{method.upper()} {bits}-bit, group size {group}"
    if method == "gptq" and "gptqmodel" in str(q.get("meta", "")).lower():
        # the rows count the fp16 bias AutoGPTQ's make_quant adds to every QuantLinear; a checkpoint another
        # writer produced may lack it for bias-less linears, which the report then says
        words += (" (written by GPTQModel: the fp16 bias AutoGPTQ stores per output row of every quantized linear "
                  "is counted, 2 B per row more where the checkpoint has none)")
    widths = GPTQ_BITS if method == "gptq" else (4,)
    if bits in widths and group == GPTQ_GROUP:
        return CheckpointQuant(method, words, f"{method}-{bits}bit")
    said = "/".join(str(b) for b in widths)
    return CheckpointQuant(method, words, why_not=f"only {method.upper()} {said}-bit with group size 128 is modelled")


def _hqq_params(qc: Any) -> tuple[Mapping[str, Any] | None, str]:
    """The one ``weight_quant_params`` every quantized linear shares, or None with the reason."""
    if not isinstance(qc, Mapping):
        return None, "its quant_config is not a mapping"
    if "weight_quant_params" not in qc:
        # a dynamic_config: linear tag -> BaseQuantizeConfig (transformers integrations/hqq.py patch_params);
        # per-tag configs that differ (or a tag set to null, left unquantized) have no single row
        configs = list(qc.values())
        first = configs[0] if configs else None
        if not configs or not isinstance(first, Mapping) or any(c != first for c in configs):
            return None, "a dynamic_config with different settings per linear is not modelled"
        qc = first
    wq = qc.get("weight_quant_params")
    if not isinstance(wq, Mapping):
        return None, "its quant_config has no weight_quant_params"
    if qc.get("scale_quant_params") or qc.get("zero_quant_params") or qc.get("offload_meta"):
        # hqq 0.2.8 hqq_base_quant_config: quantized or offloaded meta-data is deprecated and "not supported for
        # quantized model serialization"
        return None, "quantized or offloaded scales and zero points (quant_scale, quant_zero, offload_meta)"
    return wq, ""


def _hqq(q: Mapping[str, Any]) -> CheckpointQuant:
    """transformers' ``HqqConfig`` as ``to_dict`` writes it: ``quant_config`` (hqq's ``BaseQuantizeConfig``:
    ``weight_quant_params`` nbits, group_size, axis; ``scale_quant_params``/``zero_quant_params`` None;
    ``offload_meta`` False), ``skip_modules`` (default ``["lm_head"]``).  Rows hold 4 and 8 bits with group
    size 64; the scale and zero count is numel / group_size on either axis (hqq ``Quantizer.quantize``)."""
    skip = tuple(str(x) for x in (q.get("skip_modules", ["lm_head"]) or ()))
    wq, why = _hqq_params(q.get("quant_config"))
    if wq is None:
        return CheckpointQuant("hqq", "HQQ", why_not=why, skip_modules=skip)
    bits, group = wq.get("nbits", 4), wq.get("group_size", HQQ_GROUP)
    if isinstance(bits, float) and bits.is_integer():  # JSON may hold 4.0; hqq also accepts 1.58
        bits = int(bits)
    words = f"HQQ {bits}-bit, group size {group}, axis {wq.get('axis', 1)}"
    if bits in HQQ_BITS and group == HQQ_GROUP:
        return CheckpointQuant("hqq", words, f"hqq-{bits}bit", skip_modules=skip)
    return CheckpointQuant("hqq", words, why_not=f"only HQQ 4-bit and 8-bit with group size {HQQ_GROUP} are modelled",
                           skip_modules=skip)


def _torchao(q: Mapping[str, Any]) -> CheckpointQuant:
    """transformers 5.24 ``TorchAoConfig.to_dict`` writes ``quant_type`` as ``{"default": config_to_dict(cfg)}``
    (torchao 0.18 ``core/config.py``: ``{"_type": "Int4WeightOnlyConfig", "_version": 2, "_data": {...}}``, an enum
    as ``{"_type": "Int4PackingFormat", "_data": "PLAIN"}``); a string quant type is rejected by
    ``TorchAoConfig.post_init``.  The row ``ao-int4`` holds Int4WeightOnlyConfig version 2 with plain packing and
    group size 128; every other config is named and refused."""
    skip = tuple(str(x) for x in (q.get("modules_to_not_convert") or ()))
    qt = q.get("quant_type")
    inner = qt.get("default") if isinstance(qt, Mapping) else qt
    if not isinstance(inner, Mapping):
        return CheckpointQuant("torchao", f"torchao {inner!r}", skip_modules=skip,
                               why_not=f"torchao quant_type {inner!r} is not a serialized AOBaseConfig")
    name, data = str(inner.get("_type", "an unnamed AOBaseConfig")), inner.get("_data") or {}
    packing = data.get("int4_packing_format") if isinstance(data, Mapping) else None
    packing_name = str(packing.get("_data", "")).upper() if isinstance(packing, Mapping) else str(packing or "PLAIN")
    group = data.get("group_size", AO_INT4_GROUP) if isinstance(data, Mapping) else None
    words = f"torchao {name}" + (f" (group size {group}, {packing_name.lower()} packing)" if name.startswith("Int4") else "")
    if (name == "Int4WeightOnlyConfig" and inner.get("_version", 2) == 2 and packing_name == "PLAIN"
            and group == AO_INT4_GROUP):
        return CheckpointQuant("torchao", words, "ao-int4", skip_modules=skip)
    if name == "Float8DynamicActivationFloat8WeightConfig" and inner.get("_version", 2) == 2:
        grans, dtype = _ao_granularities(data), _ao_data(data, "weight_dtype") or "float8_e4m3fn"
        words += f" ({' / '.join(grans) or 'PerTensor'}, {dtype})"
        if grans and all(g == "PerRow" for g in grans) and dtype == "float8_e4m3fn":
            return CheckpointQuant("torchao", words, "ao-fp8", skip_modules=skip)
    if name == "Int8WeightOnlyConfig" and inner.get("_version", 2) == 2:
        # granularity defaults to PerRow (a single value, not a list); group_size is version 1's
        g = data.get("granularity", {"_type": "PerRow"}) if isinstance(data, Mapping) else None
        grans = _ao_granularities({"granularity": g}) if isinstance(g, Mapping) else []
        words += f" ({grans[0] if grans else 'unreadable granularity'})"
        if grans and grans[0] == "PerRow" and not data.get("group_size"):
            return CheckpointQuant("torchao", words, "ao-int8", skip_modules=skip)
    return CheckpointQuant("torchao", words, skip_modules=skip,
                           why_not=(f"only torchao Int4WeightOnlyConfig (version 2, plain packing, group size "
                                    f"{AO_INT4_GROUP}), Float8DynamicActivationFloat8WeightConfig (version 2, e4m3, "
                                    f"PerRow) and Int8WeightOnlyConfig (version 2, PerRow) are modelled; {name}'s "
                                    "tensor layout has no row"))


def _ao_data(data: Any, key_: str) -> str:
    """A serialized torchao value's ``_data`` (a dtype or an enum), or ''."""
    v = data.get(key_) if isinstance(data, Mapping) else None
    return str(v.get("_data", "")) if isinstance(v, Mapping) else ""


def _ao_granularities(data: Any) -> list[str]:
    """The ``_type`` of each serialized granularity (activation, weight); [] when left at the default (PerTensor:
    torchao 0.18 ``float8/inference.py`` ``_normalize_granularity(None)``) or unreadable.  A ``PerRow`` over another
    dim than the last has no row."""
    g = data.get("granularity") if isinstance(data, Mapping) else None
    items = g if isinstance(g, list) else [g, g] if isinstance(g, Mapping) else []
    out = []
    for item in items:
        if not isinstance(item, Mapping):
            return []
        dim = (item.get("_data") or {}).get("dim", -1) if isinstance(item.get("_data") or {}, Mapping) else -1
        out.append(str(item.get("_type", "")) if dim in (-1, 1) else f"{item.get('_type')}(dim={dim})")
    return out


def _block_fp8(q: Mapping[str, Any], skip: tuple[str, ...]) -> CheckpointQuant:
    """``quant_method: fp8``.  transformers' ``FineGrainedFP8Config`` (``fmt`` e4m3, ``weight_block_size`` [128, 128]
    by default) writes the block size, or null for one scale per tensor; the row ``fp8-block`` holds e4m3 with
    128 x 128 tiles.  A config without the key is AutoFP8's (``{"quant_method": "fp8", "activation_scheme": ...}``,
    per-tensor fp32 ``weight_scale`` and, static, ``input_scale``: its README's checkpoint structure), which vLLM's
    ``Fp8Config.from_config`` reads as per-tensor (``weight_block_size`` None); transformers would read it with its
    128 x 128 default.  Per tensor: ``fp8-tensor``, or ``fp8-tensor-static`` with static activations."""
    fmt = str(q.get("fmt", "e4m3"))
    static = str(q.get("activation_scheme", "dynamic")).lower() == "static"
    if q.get("weight_block_size") is None:
        autofp8 = "weight_block_size" not in q
        words = (f"fp8 {fmt} with one fp32 scale per tensor, {'static' if static else 'dynamic'} activations"
                 + (" (AutoFP8's layout: no weight_block_size, read per tensor as vLLM's Fp8Config reads it; "
                    "transformers' FineGrainedFP8Config would assume 128 x 128 blocks)" if autofp8 else ""))
        if fmt != "e4m3":
            return CheckpointQuant("fp8", words, why_not="only e4m3 has a per-tensor row", trained_dequantized=True,
                                   skip_modules=skip)
        return CheckpointQuant("fp8", words, "fp8-tensor-static" if static else "fp8-tensor",
                               trained_dequantized=True, skip_modules=skip)
    block = q["weight_block_size"]
    words = f"fp8 {fmt} with block-wise scales ({block[0]} x {block[1]})"
    if fmt == "e4m3" and [int(b) for b in block] == [FP8_TILE, FP8_TILE]:
        return CheckpointQuant("fp8", words, "fp8-block", trained_dequantized=True, skip_modules=skip)
    return CheckpointQuant("fp8", words, why_not=f"only e4m3 with {FP8_TILE} x {FP8_TILE} blocks has a row",
                           trained_dequantized=True, skip_modules=skip)


def _modelopt(q: Mapping[str, Any]) -> CheckpointQuant:
    """NVIDIA Model Optimizer's export (``quant_method: modelopt``; hf_quant_config.json nests the same keys under
    ``quantization``): NVFP4 with groups of 16 is the row ``modelopt-nvfp4``; its ``exclude_modules`` are the skipped
    modules; per-tensor FP8 is ``modelopt-fp8``.  Other algorithms (W4A8, MIXED_PRECISION's per-layer choices) are
    refused naming them."""
    nested = q.get("quantization")
    inner: Mapping[str, Any] = nested if isinstance(nested, Mapping) else q
    algo = str(inner.get("quant_algo") or "").upper()
    skip = tuple(str(x) for x in (inner.get("exclude_modules") or ()))
    group = int(inner.get("group_size") or NVFP4_BLOCK)
    words = f"Model Optimizer {algo or '(no quant_algo)'}" + (f" group {group}" if algo == "NVFP4" else "")
    if algo == "NVFP4" and group == NVFP4_BLOCK:
        return CheckpointQuant("modelopt", words, "modelopt-nvfp4", skip_modules=skip)
    if algo == "FP8":
        return CheckpointQuant("modelopt", f"{words} (per-tensor e4m3)", "modelopt-fp8", skip_modules=skip)
    why = (f"NVFP4 in groups of {group} (the row holds groups of {NVFP4_BLOCK})" if algo == "NVFP4" else
           f"Model Optimizer's {algo or 'unnamed'} algorithm has no row (NVFP4 in groups of {NVFP4_BLOCK} and FP8 "
           "have)")
    return CheckpointQuant("modelopt", words, why_not=why, skip_modules=skip)


def read_quantization_config(cfg: Config) -> CheckpointQuant | None:
    """The checkpoint's ``quantization_config`` as a declared fact (None when the config has none).

    Each method maps to the ``facts/quantization.py`` row that stores it exactly, or to None with the
    reason; the engines then estimate the weights as stored or refuse (``spec/load.py``
    ``checkpoint_quantization_for``).  fp8 as transformers' ``FineGrainedFP8Config`` writes it
    (``quant_method: fp8``, ``fmt: e4m3``, ``weight_block_size`` [128, 128] by default: one fp32
    ``weight_scale_inv`` per 128 x 128 tile) is the row ``fp8-block``; MXFP4 (gpt-oss: 4-bit e2m1 in blocks
    of 32 with an E8M0 scale, ``Mxfp4Config``) the row ``mxfp4``.  Both load dequantized for training.
    """
    q = cfg.get("quantization_config")
    if not isinstance(q, Mapping):
        return None
    method = str(q.get("quant_method", "")).lower()
    skip = tuple(str(x) for x in (q.get("modules_to_not_convert") or ()))
    if method == "bitsandbytes":
        return _bnb(q)
    if method in ("gptq", "awq"):
        # modules_to_not_convert: AwqConfig's (Qwen2.5-VL-AWQ: ["visual"]), read by spec/vision_quant.py
        return replace(_grouped(method, q), skip_modules=skip)
    if method == "fbgemm_fp8":
        return CheckpointQuant(method, "fp8 e4m3 with one scale per output channel (fbgemm_fp8)", "fp8",
                               skip_modules=skip)
    if method == "fp8":
        return _block_fp8(q, skip)
    if method == "compressed-tensors":
        return read_compressed_tensors(q, str(key(cfg, "torch_dtype", default="bfloat16")))
    if method == "hqq":
        return _hqq(q)
    if method == "torchao":
        return _torchao(q)
    if method == "mxfp4":
        return CheckpointQuant(method, "MXFP4 (4-bit e2m1 in blocks of 32 with an E8M0 scale) on the MoE experts",
                               "mxfp4", trained_dequantized=True, skip_modules=skip)
    if method in ("modelopt", "modelopt_fp4"):
        return _modelopt(q)
    return CheckpointQuant(method or "unnamed", f"quant_method {method or '(missing)'}",
                           why_not=f"{method or 'a quantization_config without quant_method'} is not a known format")


def build_spec(cfg: Config, name: str, model_type: str, p: Params, *, windows: list[int | None] | None = None,
               moe_layers: frozenset[int] = frozenset(), **fields: Any) -> ModelSpec:
    """The ``ModelSpec`` of an adapter: ``fields`` are ModelSpec's own field names (no renaming).

    Defaults are those of a plain pre-norm decoder: no gating, LayerNorm, sequential residual, no q/k norm,
    no sandwich norms, head_dim = hidden / heads.  ``windows``: sliding window per layer (None: full).
    """
    n, inter = int(fields["num_layers"]), int(fields["intermediate_size"])
    win = windows or [None] * n
    layers = tuple(LayerSpec(i, i in moe_layers, 0 if i in moe_layers else inter, win[i]) for i in range(n))
    spec: dict[str, Any] = {"mlp_gated": False, "norm": "layer", "parallel_residual": False, "qk_norm": False,
                            "sandwich_norms": False,
                            "head_dim": int(fields["hidden_size"]) // int(fields["num_attention_heads"])}
    spec.update(fields)
    return ModelSpec(name=name, model_type=model_type, layers=layers, params=tuple(p.rows),
                     checkpoint_dtype=checkpoint_dtype(cfg), checkpoint_quantization=checkpoint_quantization(cfg),
                     checkpoint_quant=read_quantization_config(cfg),
                     config_use_cache=cfg.get("use_cache", True) is not False, **spec)


Builder = Callable[[Config, str, str], ModelSpec]  # (config, model_type, name) -> ModelSpec


@dataclass(frozen=True)
class Family:
    """One family's adapter: how its config.json becomes a ``ModelSpec``, and which transformers code it follows.

    ``required``: keys the config must hold, each a tuple of accepted spellings (the first is named in errors).
    ``transformers_model_type``: the transformers ``model_type`` whose configuration and causal-LM classes
    build this family (None: its own); the traced engine and ``measure`` instantiate that class.
    ``drop_null_keys``: keys a config may hold as null that the transformers configuration class rejects.
    ``float_keys``: keys whose integer value the transformers configuration class rejects as not a float.
    ``torchtitan_model``: torchtitan's name for the family where torchtitan ships it (its ``torchtitan/models/``).
    ``text_model_type``: a vision-language family's language model (``transformers_config`` builds it alone).
    """

    build: Builder
    modeling: str
    required: tuple[tuple[str, ...], ...] = (("hidden_size",), ("num_hidden_layers",), ("num_attention_heads",),
                                             ("vocab_size",))
    transformers_model_type: str | None = None
    drop_null_keys: tuple[str, ...] = ()
    # keys (dotted: a nested sub-config's) whose published integer the configuration class types as float and
    # refuses (DbrxFFNConfig's strict moe_normalize_expert_weights: float | None against the published 1)
    float_keys: tuple[str, ...] = ()
    torchtitan_model: str | None = None
    # a vision-language family: the ``model_type`` of its language model, which the traced engine and
    # ``measure`` build alone from ``text_config`` (``transformers_config``)
    text_model_type: str | None = None
    # the key of the sub-config that holds ``text_config`` and ``vision_config`` where they are nested one level down
    # (Qwen3-Omni's ``thinker_config``): ``transformers_config`` builds that sub-config's language model
    nested_config: str | None = None


def required(*keys: str) -> tuple[tuple[str, ...], ...]:
    """``Family.required`` from plain key names (one spelling each)."""
    return tuple((k,) for k in keys)
