"""Which of a vision-language model's tower and projector linears are stored quantized.

Every adapter lists its tower's and projector's ``nn.Linear`` weights (``VisionSpec.linears``); which of them a
quantized model holds quantized is decided here, once per model, from the checkpoint's ``quantization_config``:

- **Quantized on load** (no ``quantization_config``; ``train``/``inference.quantization`` bitsandbytes, HQQ,
  torchao, or vLLM's in-flight ``serve.quantization``): transformers 5.24 replaces every ``nn.Linear`` outside
  ``modules_to_not_convert`` (``quantizers/base.py`` ``get_modules_to_not_convert``: ``get_keys_to_not_convert``'s
  tied weights, last parameter and output embeddings, i.e. the LM head, plus the config's skip list and the model's
  ``_keep_in_fp32_modules``; ``integrations/bitsandbytes.py`` ``replace_with_bnb_linear`` converts
  ``type(module) is nn.Linear``).  None of the vision-language classes modelled sets ``_keep_in_fp32_modules``
  (``modeling_gemma3.py``, ``modeling_llava.py``, ``modeling_qwen2_5_vl.py``, ... at 5.24), so the tower's and the
  projector's linears are quantized with the language model's.  vLLM likewise hands the model's ``quant_config`` to
  its vision towers and projectors (``models/qwen2_5_vl.py`` ``Qwen2_5_VisionTransformer(...,
  quant_config=...)``, ``models/llava.py`` ``init_vision_tower_for_llava``, ``models/gemma3_mm.py``).
- **A pre-quantized checkpoint** stores its tower as the tool that wrote it left it, and names what it left
  unquantized: ``modules_to_not_convert`` (AWQ, fp8), ``llm_int8_skip_modules`` (bitsandbytes), ``ignore``
  (compressed-tensors; ``re:`` entries are regular expressions), ``skip_modules`` (HQQ).  An instance whose module
  name (with its layer index, with or without the ``model.`` prefix transformers 5.x adds) contains a plain entry at
  a module boundary, or matches a ``re:`` entry from its start, is held unquantized (vLLM ``is_layer_skipped_awq``,
  ``is_layer_skipped_bnb``, compressed-tensors ``is_match``); every other instance is stored quantized.  E.g.
  Qwen/Qwen2.5-VL-7B-Instruct-AWQ's ``modules_to_not_convert: ["visual"]`` leaves the whole tower in fp16.
- **GPTQ** quantizes the decoder blocks only (optimum ``GPTQQuantizer.convert_model`` replaces the linears of
  ``block_name_to_quantize``, found by ``get_block_name_with_pattern`` among the decoder layers; vLLM's
  ``Qwen2VLForConditionalGeneration._maybe_ignore_quant_config`` returns None for ``GPTQConfig`` and
  ``GPTQMarlinConfig``: "GPTQ configs do not have a list of ignored modules, however AutoGPTQ seems to avoid vision
  encoder sections", Qwen/Qwen2-VL-2B-Instruct-GPTQ-Int4): the tower and projector are held in the model's dtype.

What is estimated is the checkpoint as stored, as vLLM loads it.  transformers 5.24 matches a skip entry against a
module name differently (``quantizers_utils.should_convert_module``: a regex anchored at the name's start, or a
suffix): a bare ``"visual"`` does not match ``model.visual.blocks.0.attn.qkv`` (its 5.x name), so its AWQ loader
would build AWQ linears for a tower the checkpoint stores in fp16 (only ``FineGrainedFP8HfQuantizer`` renames the
skip list to the model's names, ``_normalize_modules_to_not_convert``); that load is not modelled.

Refused (``VisionSpec.quant_refused``, ``tower_quant_problems``): an AWQ checkpoint whose skip list leaves tower or
projector linears quantized (AutoAWQ quantizes the decoder layers only, so such a checkpoint stores them
unquantized while transformers and vLLM would build AWQ linears for them), and a skip entry under one of the
model's tower prefixes (``visual``, ``vision_tower``, ``multi_modal_projector``, ...) that matches none of the
adapter's tower names (a legacy name such as ``vision_tower.vision_model.encoder``), whose bytes would otherwise be
guessed.  An entry naming a module the model lacks changes nothing.
"""

from __future__ import annotations

import re
from dataclasses import replace

from vramplan.errors import Problem
from vramplan.spec.model import ModelSpec
from vramplan.spec.scenario import Scenario

__all__ = ["skipped_by", "tower_quant_problems", "tower_quantized_linears", "transformers_unmatched",
           "with_tower_quantization"]


def _instances(name: str, count: int) -> list[str]:
    """The module name of each of ``count`` instances of the ParamGroup ``name`` (``visual.blocks.attn.qkv.weight``
    x 32 -> ``visual.blocks.0.attn.qkv`` ... ``visual.blocks.31.attn.qkv``): the index follows the first
    ``blocks``/``layers``/``layer``/``deepstack_merger_list`` component, as ``nn.ModuleList`` names it."""
    module = name.removesuffix(".weight")
    parts = module.split(".")
    if count > 1:
        for k, part in enumerate(parts):
            if part in ("blocks", "layers", "layer", "deepstack_merger_list"):
                return [".".join([*parts[: k + 1], str(i), *parts[k + 1:]]) for i in range(count)]
    return [module] * count


def _regex(pattern: str, name: str) -> bool:
    try:
        return re.match(pattern, name) is not None
    except re.error:
        return False


def skipped_by(module: str, entries: tuple[str, ...]) -> bool:
    """Whether a skip list leaves ``module`` (a tower module name without ``model.``) unquantized.

    >>> skipped_by("visual.blocks.3.attn.qkv", ("visual",)), skipped_by("visual.blocks.3.attn.qkv", ("re:.*lm_head",))
    (True, False)
    """
    for entry in entries:
        if entry.startswith("re:"):
            if _regex(entry[3:], module) or _regex(entry[3:], f"model.{module}"):
                return True
        elif f".{_renamed(entry.removeprefix('model.'))}." in f".{module}.":
            return True
    return False


def _renamed(key: str) -> str:
    """A checkpoint's CLIP or SigLIP tower name as transformers 5.x names the module: ``conversion_mapping.py``
    ``"CLIPVisionModel": [PrefixChange(prefix_to_remove="vision_model")]`` (``SiglipVisionModel`` maps to it), so
    ``vision_tower.vision_model.encoder.layers.23`` is ``vision_tower.encoder.layers.23``."""
    old = "vision_tower.vision_model"
    return "vision_tower" + key[len(old):] if key == old or key.startswith(old + ".") else key


def with_tower_quantization(m: ModelSpec) -> ModelSpec:
    """``m`` with ``VisionSpec.quantized_linears`` and ``quant_refused`` set from its checkpoint's
    ``quantization_config`` (module docstring); ``m`` itself when it has no vision tower."""
    v = m.vision
    if v is None or not v.linears:
        return m
    counts = {p.name: p.count for p in m.params}
    cq = m.checkpoint_quant
    if cq is not None and cq.method == "gptq":
        # the tower is never GPTQ-quantized (module docstring), so its skip entries name nothing to decide
        return replace(m, vision=replace(v, quantized_linears=tuple((n, i, o, 0) for n, i, o in v.linears),
                                         quant_refused=""))
    skip = cq.skip_modules if cq is not None else ()
    out: list[tuple[str, int, int, int]] = []
    matched: set[str] = set()
    for name, fan_in, fan_out in v.linears:
        kept = [n for n in _instances(name, counts.get(name, 1)) if not skipped_by(n, skip)]
        matched |= {e for e in skip for n in _instances(name, counts.get(name, 1)) if skipped_by(n, (e,))}
        out.append((name, fan_in, fan_out, len(kept)))
    refused = ""
    quantized = sum(n for *_, n in out)
    # an entry under one of this model's tower prefixes that matches no instance names the tower in a way not
    # modelled (a legacy name, an index past the last block); one naming a module this model lacks (unsloth's lists
    # carry "multi_modal_projector" and "modality_projection" for every architecture) changes nothing
    prefixes = tuple(p.removesuffix(".") for p in v.param_prefixes)
    aimed = [e for e in skip if e not in matched
             and e.removeprefix("re:").removeprefix("model.").split(".")[0] in prefixes]
    if aimed:
        refused = (f"the checkpoint's skip list names {aimed}, which match none of the tower's and projector's "
                   f"linears as named here (e.g. {v.linears[0][0].removesuffix('.weight')}): which of them are "
                   "stored quantized is not known")
    elif cq is not None and cq.method == "awq" and quantized:
        refused = (f"its modules_to_not_convert leaves {quantized} of the tower's and projector's linears "
                   "quantized, but AutoAWQ quantizes the decoder layers only (the checkpoint stores them "
                   "unquantized, while transformers and vLLM would build AWQ linears for them)")
    return replace(m, vision=replace(v, quantized_linears=tuple(out), quant_refused=refused))


def _transformers_skips(entry: str, name: str) -> bool:
    """transformers 5.24 ``quantizers_utils.should_convert_module``'s test for one entry (True: left unconverted)."""
    try:
        return bool(re.match(rf"(?:{entry})(?:(?<=\.)|(?=\.|$))", name)) or name.endswith(entry)
    except re.error:
        return False


def transformers_unmatched(m: ModelSpec) -> list[str]:
    """Skip entries of the checkpoint that leave tower instances unquantized here (and in vLLM) but that transformers
    5.24's ``should_convert_module`` does not match against the module's 5.x name (``model.`` + the name): its
    loader would build quantized linears where the checkpoint stores plain weights (module docstring)."""
    v, cq = m.vision, m.checkpoint_quant
    if v is None or cq is None or cq.method == "gptq":
        return []
    counts = {p.name: p.count for p in m.params}
    out: list[str] = []
    for name, *_ in v.linears:
        for inst in _instances(name, counts.get(name, 1)):
            for e in cq.skip_modules:
                if (not e.startswith("re:") and e not in out and skipped_by(inst, (e,))
                        and not _transformers_skips(e, f"model.{inst}")):
                    out.append(e)
    return out


def tower_quantized_linears(m: ModelSpec) -> int:
    """Tower and projector linear weights (elements) stored quantized when the model's weights are."""
    if m.vision is None:
        return 0
    return sum(i * o * n for _, i, o, n in m.vision.quantized_linears)


def tower_quant_problems(s: Scenario, m: ModelSpec) -> list[Problem]:
    """A quantized tower whose stored format cannot be told (``VisionSpec.quant_refused``)."""
    section = s.task
    quant: str = getattr(s, section).quantization
    if quant == "none" or m.vision is None or not m.vision.quant_refused:
        return []
    return [Problem(f"{section}.quantization", f"{m.name}'s vision tower under {quant}: not modelled "
                    f"({m.vision.quant_refused})",
                    "name the tower and projector in the quantization_config's skip list as the checkpoint stores "
                    "them (e.g. modules_to_not_convert: [\"visual\"]), or estimate the unquantized model")]
